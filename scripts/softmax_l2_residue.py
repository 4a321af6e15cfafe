"""What one CUDA softmax call leaves in the L2 cache, per L2-policy variant, for
Nsight Compute.

The row kernels load their input with an L2 evict_last policy and then set
each line back to evict_normal (the release; test knob 17 = 1 drops the policy,
= 2 keeps it without the release, see csrc/cuda/softmax.cu). A line left at
evict_last outlives normal traffic and takes L2 space from the kernels that
follow. For each variant (and torch.compile's kernels with --compile) this
script runs, once:

  1. flush the L2 (write a buffer 8x its size);
  2. one softmax call (forward on x, or backward on y and dy);
  3. optionally stream --stream times the L2's size through the SMs with plain
     loads (a sum);
  4. re-read (a sum) the call's input (--reread input) or its output
     (--reread output), between cudaProfilerStart and Stop.

Controls for --reread input: 'cold' (step 4 right after a flush) and 'warm'
(step 4 right after a first read of the input). Run it under

    ncu --profile-from-start off --cache-control none --replay-mode application \
        --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum \
        python3 scripts/softmax_l2_residue.py --compile --points bwd:bfloat16:32768

and read the L2 hits of step 4's kernels: after a 4x stream, hits on the input
are lines the call left at evict_last. With --profile softmax, step 2 is
profiled instead. Needs the extension built with the planner's test knobs
(TORCH_OSS_SOFTMAX_KNOBS=1, as scripts/softmax_variants.py).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from softmax import DTYPES  # noqa: E402
from softmax_variants import NKNOBS, knob_array, parse_points, parse_variant, point_shape  # noqa: E402

import torch_oss  # noqa: E402,F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="fwd:bfloat16:128,bwd:bfloat16:128,bwd:bfloat16:32768",
                    help="OP:DTYPE:COLS, comma-separated (OP fwd or bwd)")
    ap.add_argument("--variants", default="17=1;base;17=2", help="';'-separated variants, each 'i=v,i=v' or 'base'")
    ap.add_argument("--compile", action="store_true", help="also torch.compile's softmax (Inductor's kernels)")
    ap.add_argument("--mib", type=int, default=16, help="MiB per softmax input")
    ap.add_argument("--stream", type=int, default=4, help="step 3 streams this many times the L2's size (0: none)")
    ap.add_argument("--reread", choices=("input", "output"), default="input")
    ap.add_argument("--profile", choices=("reread", "softmax"), default="reread")
    args = ap.parse_args()
    if args.mib < 1 or args.stream < 0:
        ap.error(f"--mib must be at least 1 and --stream at least 0, got {args.mib} and {args.stream}")
    points = parse_points(ap, args.points)
    knobs = knob_array()
    variants = {v.strip() or "base": parse_variant(v) for v in args.variants.split(";")}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(8 * l2, dtype=torch.int8, device="cuda")
    stream = torch.ones(max(1, args.stream * l2 // 4), dtype=torch.float32, device="cuda")
    print(f"{torch.cuda.get_device_name()}, L2 {l2 / 2**20:.0f} MiB; {args.mib} MiB per input; stream "
          f"{args.stream}x L2; re-read the {args.reread}; profiled: {args.profile}")

    def set_knobs(values):
        for i in range(NKNOBS):
            knobs[i] = values.get(i, 0)

    def profiled(fn):
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        r = fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        return r

    for op, dname, cols in points:
        dtype = DTYPES[dname]
        shape, dim = point_shape(cols, args.mib * 2**20 // torch.tensor([], dtype=dtype).element_size())
        x = torch.randn(shape, dtype=dtype, device="cuda")
        y = F.softmax(x, dim)
        dy = torch.randn_like(x)
        inputs = (x,) if op == "fwd" else (y, dy)
        ours = (lambda: torch_oss.softmax(x, dim)) if op == "fwd" else \
            (lambda: torch.ops.oss.softmax_backward(dy, y, dim, y.dtype))  # noqa: E731
        steps = {name: (values, ours) for name, values in variants.items()}
        if args.compile:
            if op == "fwd":
                fn = torch.compile(lambda t: F.softmax(t, dim), dynamic=False)
                steps["compile"] = ({}, lambda: fn(x))
            else:
                fn = torch.compile(lambda g, t: torch._softmax_backward_data(g, t, dim, t.dtype), dynamic=False)
                steps["compile"] = ({}, lambda: fn(dy, y))
            steps["compile"][1]()  # compiled outside the profiled ranges

        def reread(tensors):
            for t in tensors:
                t.sum(dtype=torch.float32)

        print(f"{op}:{dname}:{cols} {tuple(shape)}, dim {dim}: steps in order", flush=True)
        if args.reread == "input" and args.profile == "reread":
            print("  cold", flush=True)
            flush.zero_()
            profiled(lambda: reread(inputs))
            print("  warm", flush=True)
            reread(inputs)
            profiled(lambda: reread(inputs))
        for name, (values, call) in steps.items():
            print(f"  {name}", flush=True)
            set_knobs(values)
            flush.zero_()
            out = profiled(call) if args.profile == "softmax" else call()
            set_knobs({})
            if args.stream:
                stream.sum()
            if args.profile == "reread":
                profiled(lambda: reread(inputs if args.reread == "input" else (out,)))


if __name__ == "__main__":
    main()
