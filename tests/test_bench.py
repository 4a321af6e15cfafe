"""The comparison benchmarks (`make bench`) run: each script on the CPU with a tiny
grid, in a subprocess, writing its JSON under a temporary results folder. Each
script checks every implementation's output against SDPA or PyTorch before
timing it, so a run that finishes also means torch_oss agreed with its peers
there. Speed is not asserted (CPU figures mean little); breakage of a script or
of an argument is."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

CASES = {
    "softmax": (["softmax.py", "--device", "cpu", "--cols", "128,1000", "--total", "65536", "--no-compile",
                 "--rounds", "1"], "softmax_cpu.json"),
    "attention": (["attention.py", "--device", "cpu", "--dtypes", "bfloat16,float32", "--hdims", "64",
                   "--seqlens", "128", "--modes", "fwd,train-fwd,fwd+bwd", "--tokens", "256", "--width", "128"],
                  "attention_cpu.json"),
    "attention_blhd_gqa": (["attention.py", "--device", "cpu", "--dtypes", "float32", "--hdims", "32",
                            "--seqlens", "64", "--causal", "1", "--modes", "train-fwd", "--tokens", "128",
                            "--width", "128", "--layout", "blhd", "--kv-heads", "2"], "attention_cpu.json"),
    "variants": (["variants.py"], "variants.json"),
    "varlen": (["varlen.py"], "varlen.json"),
    "decode": (["decode.py"], "decode_smoke.json"),
    "cross_entropy": (["cross_entropy.py", "--smoke", "--no-compile"], None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_benchmark_runs_on_the_cpu(case, tmp_path):
    args, result = CASES[case]
    env = dict(os.environ, TORCH_OSS_RESULTS=str(tmp_path), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / args[0]), *args[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    if result is not None:
        payload = json.loads((tmp_path / result).read_text())
        assert payload, f"{result} is empty"
    if args[0] == "attention.py":  # every requested mode timed for torch_oss and its peer
        modes = set(args[args.index("--modes") + 1].split(","))
        for impl in ("torch_oss", "sdpa-default"):
            timed = {r["mode"] for r in payload["records"] if r["impl"] == impl}
            assert timed == modes, (impl, timed)
