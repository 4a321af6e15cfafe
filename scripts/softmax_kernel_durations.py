"""The GPU's own duration of each softmax kernel, next to the CUDA-event time
of the same calls, for torch_oss and torch.compile(F.softmax).

CUDA events resolve about 0.5 us, which is 0.5 % of a 2^26-element 16-bit
forward: bench/softmax.py cannot tell two kernels apart below that, and it
times the call from the start event, not the kernel. This script runs the
same protocol (a 256 MB write before each call, as triton.testing.do_bench
does) under torch.profiler, whose kernel records come from CUPTI with
nanosecond timestamps, and prints per implementation: the median and mean
kernel duration, the median event time, and the difference (what the event
pair holds besides the kernel: the launch as the GPU sees it).

    python3 scripts/softmax_kernel_durations.py --points fwd:bfloat16:128,fwd:float32:4096 --calls 200
"""

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import torch_oss

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import common  # noqa: E402
from softmax import DTYPES, check  # noqa: E402


def implementations(op):
    if op == "fwd":
        return {"torch_oss": lambda x, dy: torch_oss.softmax(x, -1),
                "compile": torch.compile(lambda x: F.softmax(x, -1), dynamic=False)}
    return {"torch_oss": lambda y, dy: torch.ops.oss.softmax_backward(dy, y, -1, y.dtype),
            "compile": torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="fwd:bfloat16:128,fwd:float16:128,fwd:float32:4096")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=26, help="2^size elements per input")
    args = ap.parse_args()
    if not 7 <= args.size <= 32:
        ap.error(f"--size must be 7..32 (2^size elements per input), got {args.size}")
    if args.calls < 1 or args.rounds < 1:
        ap.error(f"--calls and --rounds must be at least 1, got {args.calls} and {args.rounds}")
    points = [p.split(":") for p in args.points.split(",")]
    for p in points:
        if (len(p) != 3 or p[0] not in ("fwd", "bwd") or p[1] not in DTYPES or not p[2].isdigit()
                or not 1 <= int(p[2]) <= 1 << args.size):
            ap.error(f"--points: {':'.join(p)!r} is not OP:DTYPE:COLS (OP fwd or bwd, DTYPE one of {list(DTYPES)}, "
                     f"COLS 1..2^size = {1 << args.size})")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; 2^{args.size} elements per input, "
          f"{args.rounds} rounds of: CUDA events over 100 ms of calls, then {args.calls} calls under the profiler; "
          "a 256 MB write before each call")
    for op, dname, cols in points:
        point = f"{op}:{dname}:{cols}"
        dtype, cols = DTYPES[dname], int(cols)
        rows = (1 << args.size) // cols
        x = torch.randn(rows, cols, device="cuda", dtype=dtype) * 3
        dy = torch.randn_like(x)
        y = F.softmax(x, -1)
        a = x if op == "fwd" else y
        if op == "fwd":
            ref64, peer = F.softmax(x.double(), -1), y
        else:
            ref64 = torch._softmax_backward_data(dy.double(), F.softmax(x.double(), -1), -1, torch.float64)
            peer = torch._softmax_backward_data(dy, y, -1, dtype)
        impls = implementations(op)
        results = {name: ([], [], None) for name in impls}
        for name, fn in impls.items():
            if name == "torch_oss":
                call = lambda fn=fn: fn(a, dy)
            else:
                call = (lambda fn=fn: fn(a)) if op == "fwd" else (lambda fn=fn: fn(dy, a))
            check(f"{name} {point}", call(), ref64, peer, dtype)  # refuse to time a wrong kernel
            for _ in range(20):
                call()
            impls[name] = call
        del ref64, peer
        for _ in range(args.rounds):
            for name, call in impls.items():
                ev = [1000 * t for t in common.cuda_event_times_ms(call, flush.zero_)]
                kd, names = common.kernel_times_us(call, flush.zero_, args.calls)
                results[name] = (results[name][0] + ev, results[name][1] + kd, names)
        nbytes = x.numel() * x.element_size() * (2 if op == "fwd" else 3)
        print(f"\n{point} ({rows}, {cols}): us; GB/s from the kernel's median duration")
        for name, (ev, kd, names) in results.items():
            kmed, kmean, emed = statistics.median(kd), statistics.fmean(kd), statistics.median(ev)
            print(f"  {name:10s} kernel median {kmed:9.3f} mean {kmean:9.3f} [p10 {sorted(kd)[len(kd) // 10]:9.3f}]"
                  f"  event median {emed:8.2f}  event - kernel {emed - kmed:6.2f}  {nbytes / kmed / 1e3:7.1f} GB/s"
                  f"  ({'; '.join(n[:60] for n in names)})")


if __name__ == "__main__":
    main()
