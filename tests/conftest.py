"""pytest configuration shared by the test files: the GPU-run guards,
hypothesis profiles for the property-based tests (tests/test_fuzz.py) and CUDA
memory hygiene.

Shards: --shard K/N runs every N-th collected test from the K-th on, so a
suite too long for one sitting (the GPU suite under a per-command limit) runs
as N parts that together cover each test once (scripts/gpu_check.sh:
TEST_SHARD).

GPU-run guards (a GPU run must never pass by skipping its CUDA cases):
  - a visible GPU (torch.cuda.is_available()) with a build of torch_oss that has
    no CUDA kernels fails the run at its start, unless TORCH_OSS_CPU_ONLY=1
    says the CPU-only build is meant;
  - a run that asks for the CUDA tests (TORCH_OSS_REQUIRE_CUDA=1, which
    scripts/gpu_check.sh sets, or a -m expression that selects "cuda") fails at
    its start without a usable GPU build, and fails at its end when it
    collected CUDA tests and none of them ran (passed or failed); a file with
    no CUDA tests at all (the generator's dispatch-table tests) passes as on
    the CPU.

Hypothesis profiles, chosen with TORCH_OSS_FUZZ_PROFILE (default "ci"):

  ci    derandomize=True (a fixed seed: every CI run draws the same cases), no
        example database, deadline=None; TORCH_OSS_FUZZ_CI_EXAMPLES examples
        per fuzz test and device (default 60: 240 CPU cases). Keeps
        tests/test_fuzz.py around a minute on a 2-core CPU.
  long  fresh random cases on each run, deadline=None;
        TORCH_OSS_FUZZ_LONG_EXAMPLES examples per fuzz test and device
        (default 3000: 4 fuzz tests x 3000 = 12,000 cases per device). Meant
        for the GPU:  TORCH_OSS_FUZZ_PROFILE=long pytest tests/test_fuzz.py -k cuda
  dev   a quick random smoke run (20 examples) while editing.

TORCH_OSS_FUZZ_NO_SHRINK=1 reports a failing case as drawn, without shrinking it,
and skips the replay of failures saved in the example database (fresh cases only).

A failing case prints its reproduction blob (print_blob=True); paste it into
@reproduce_failure or rerun with the same profile (ci is fully reproducible).

Random inputs: every test starts with torch's generators (CPU and CUDA) seeded
from its own name (file and test id) and TORCH_OSS_TEST_SEED (default 0), so a
test draws the same inputs alone, under -k, in any order and in any worker, and
a failure seen in a suite run reproduces by running that test alone. Another
TORCH_OSS_TEST_SEED draws fresh inputs everywhere ("random": a new one per run,
printed in the header).
"""

import os
import random
import zlib

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

_SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("TORCH_OSS_FUZZ_CI_EXAMPLES", "60")),
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("TORCH_OSS_FUZZ_LONG_EXAMPLES", "3000")),
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
settings.register_profile(
    "dev",
    max_examples=20,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
_SEED_ENV = os.environ.get("TORCH_OSS_TEST_SEED", "0")
TEST_SEED = random.randrange(2**31) if _SEED_ENV == "random" else int(_SEED_ENV)

FUZZ_PROFILE = os.environ.get("TORCH_OSS_FUZZ_PROFILE", "ci")
if os.environ.get("TORCH_OSS_FUZZ_NO_SHRINK", "") not in ("", "0"):
    # report the first failing case as drawn, without minimising it (shrinking
    # re-runs a failing test hundreds of times: too slow for a GPU session),
    # and draw fresh cases only: no replay of failures saved by earlier runs
    # (scripts/fuzz_chunks.sh counts fresh cases)
    settings.register_profile(FUZZ_PROFILE + "-noshrink", parent=settings.get_profile(FUZZ_PROFILE),
                              phases=[Phase.explicit, Phase.generate])
    FUZZ_PROFILE += "-noshrink"
settings.load_profile(FUZZ_PROFILE)


def pytest_report_header(config):
    import torch_oss

    return [f"TORCH_OSS_TEST_SEED={TEST_SEED} (each test's draws: its name and this seed)",
            f"hypothesis profile: {FUZZ_PROFILE} (max_examples={settings().max_examples}, "
            f"derandomize={settings().derandomize})",
            f"torch_oss: {torch_oss.__file__}, CUDA kernels: {torch_oss.build_info()['cuda']}, "
            f"GPU visible: {torch.cuda.is_available()}, CUDA tests required: {cuda_required(config)}"]


def _env_flag(name):
    return os.environ.get(name, "") not in ("", "0")


def cuda_required(config):
    """True when this run asked for the CUDA tests: TORCH_OSS_REQUIRE_CUDA=1, or
    a -m expression that selects the cuda marker (not one that excludes it)."""
    if _env_flag("TORCH_OSS_REQUIRE_CUDA"):
        return True
    expr = " ".join((config.getoption("markexpr", "") or "").split())
    return "cuda" in expr and "not cuda" not in expr


def pytest_sessionstart(session):
    import torch_oss

    config = session.config
    has_kernels = torch_oss.build_info()["cuda"]
    if torch.cuda.is_available() and not has_kernels and not _env_flag("TORCH_OSS_CPU_ONLY"):
        raise pytest.UsageError(
            f"a CUDA GPU is visible but torch_oss ({torch_oss.__file__}) was built without CUDA kernels: every "
            "CUDA test would be skipped. Rebuild with the CUDA toolkit, or set TORCH_OSS_CPU_ONLY=1 to test the "
            "CPU-only build on purpose.")
    if cuda_required(config) and not (torch.cuda.is_available() and has_kernels):
        raise pytest.UsageError(
            "the CUDA tests were requested (TORCH_OSS_REQUIRE_CUDA=1 or -m cuda) but "
            + ("no CUDA GPU is visible" if not torch.cuda.is_available() else
               f"torch_oss ({torch_oss.__file__}) was built without CUDA kernels"))


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N shards of the collected tests (1 <= K <= N): every N-th "
                          "test from the K-th on, so each shard takes a share of every file's slow and fast "
                          "cases; the N shards together run each test once")


def parse_shard(text):
    """(k, n) from "K/N" with 1 <= K <= N; raises pytest.UsageError naming --shard."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N (two integers, e.g. 1/3), got {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def pytest_configure(config):
    if config.getoption("shard") is not None:
        parse_shard(config.getoption("shard"))  # refused before anything is collected


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("shard")
    if shard is None:
        return
    k, n = parse_shard(shard)
    keep = [item for i, item in enumerate(items) if i % n == k - 1]
    drop = [item for i, item in enumerate(items) if i % n != k - 1]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


_CUDA_TESTS_RAN = [0]
_CUDA_TESTS_COLLECTED = [0]


def pytest_collection_finish(session):
    _CUDA_TESTS_COLLECTED[0] = sum(1 for item in session.items if "cuda" in item.keywords)


def pytest_runtest_logreport(report):
    # a CUDA test ran when its call phase passed or failed (a skip does not count)
    if report.when == "call" and "cuda" in report.keywords and (report.passed or report.failed):
        _CUDA_TESTS_RAN[0] += 1


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if cuda_required(config) and _CUDA_TESTS_COLLECTED[0] > 0 and _CUDA_TESTS_RAN[0] == 0 and exitstatus in (0, 5):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nERROR: the CUDA tests were requested (TORCH_OSS_REQUIRE_CUDA=1 or -m cuda); "
              f"{_CUDA_TESTS_COLLECTED[0]} were collected but none ran")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if cuda_required(config):
        terminalreporter.write_line(f"CUDA tests that ran: {_CUDA_TESTS_RAN[0]}")


@pytest.fixture(autouse=True)
def _seeded_draws(request):
    """Seeds torch's generators from the test's name and TEST_SEED (see the
    module docstring). The name is taken from the test file on, so the seed does
    not depend on the directory pytest runs from."""
    name = request.node.nodeid.split("/")[-1]
    torch.manual_seed((zlib.crc32(name.encode()) ^ TEST_SEED) & 0x7FFFFFFF)
    yield


@pytest.fixture
def cuda_memory_freed():
    """Frees cached CUDA memory after a test that allocates gigabytes, so the
    next test starts from an empty device."""
    yield
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
