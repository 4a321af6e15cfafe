"""One launch each of torch.compile's bfloat16 softmax backward and of minimal
probe kernels (scripts/softmax_probe_kernels.cu) at 4096 columns and 2^26
elements, between cudaProfilerStart and cudaProfilerStop, for Nsight Compute.
It needs torch and the probe library but not torch_oss, so it runs on a
machine where the extension is not built; the library's own kernels at the
same point come from the self-test's `fixed` mode under the same ncu flags
(bench/NOTES-softmax.md v35). Every result is checked against float64 before
the profiled launches (each then runs once more to warm up, once profiled); a
result further off than a bfloat16 output allows stops the script.

    ncu --profile-from-start off --target-processes all --section ... \\
        python3 scripts/softmax_ncu_peers.py --lib sbin/libsoftmax_probe.so --bwd 0,6,15
"""

import argparse
import sys

import torch

from softmax_probe import ints, load, profile_once

BWD_4096 = set(range(10)) | {15, 20, 21, 22, 23}  # softmax_probe_kernels.cu's probe_launch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libsoftmax_probe.so")
    ap.add_argument("--bwd", default="0,6,15", help="backward probe variants of 4096 columns (0-9, 15, 20-23)")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile's kernel out")
    args = ap.parse_args()
    try:
        variants = ints(args.bwd)
    except ValueError:
        ap.error(f"--bwd {args.bwd!r}: expected comma-separated variant numbers")
    if any(v not in BWD_4096 for v in variants):
        ap.error(f"--bwd {args.bwd}: the 4096-column backward variants are 0-9, 15 and 20-23")
    if not torch.cuda.is_available():
        sys.exit("softmax_ncu_peers.py: no CUDA device")
    probe = load(args.lib)
    cols = 4096
    rows = 2**26 // cols
    x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda") * 3
    y = torch.softmax(x, -1)
    dy = torch.randn_like(x)
    impls = {}
    if not args.no_compile:
        compiled = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
        impls["compile"] = lambda: compiled(dy, y)
    for v in variants:
        out = torch.empty_like(x)
        impls[f"v{v}"] = lambda v=v, out=out: probe(v, y, dy, out, rows)
    ref = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
    for name, fn in impls.items():
        got = fn().double()
        err = ((got - ref).abs() / (ref.abs() + 1e-3)).max().item()
        print(f"{name}: max relative error {err:.1e} against float64")
        if not err < 2e-2:
            sys.exit(f"softmax_ncu_peers.py: {name} is off by {err:.1e}")
    profile_once(list(impls.values()))
    print("profiled:", ", ".join(impls))


if __name__ == "__main__":
    main()
