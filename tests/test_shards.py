"""The suite's --shard K/N option (tests/conftest.py): the N shards of a file's
collected tests are disjoint and together cover every test once, and a bad K/N
is refused naming the option. Runs pytest in subprocesses on a small file."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "test_kernel_table.py")


def collect(*extra):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           TARGET, *extra], capture_output=True, text=True, cwd=os.path.dirname(HERE))
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    return proc.returncode, ids, proc.stdout + proc.stderr


def test_shards_are_disjoint_and_cover_every_test_once():
    rc, everything, out = collect()
    assert rc == 0 and len(everything) >= 3, out
    n = 3
    shards = []
    for k in range(1, n + 1):
        rc, ids, out = collect("--shard", f"{k}/{n}")
        assert rc == 0, out
        assert ids == everything[k - 1::n]
        shards.append(ids)
    union = [t for ids in shards for t in ids]
    assert sorted(union) == sorted(everything) and len(set(union)) == len(union)


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1", "a/b", "1/2/3"])
def test_bad_shard_is_refused_naming_the_option(bad):
    rc, ids, out = collect("--shard", bad)
    assert rc == 4 and "--shard" in out and not ids, out
