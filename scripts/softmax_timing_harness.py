"""Where does a gap between torch_oss and torch.compile in bench/softmax.py come
from: the kernels, or how the benchmark times them? For a few (op, dtype, cols)
points, times torch_oss and torch.compile(F.softmax) (and the backward through
torch._softmax_backward_data) four ways, all in one run:

- do_bench:  triton.testing.do_bench as bench/softmax.py uses it (the L2 is
             flushed by writing a 256 MB buffer before each timed call, and each
             call has its own pair of events);
- loop:      20 calls back to back between one pair of events, no flush;
- kernels:   the GPU time of the kernels alone (torch.profiler), with the same
             flush before each call as do_bench;
- kernels-noflush: the same without the flush.

Each figure is % of a device-to-device copy measured in the same run.

With --sizes (log2 of the elements per input, e.g. 25,26,28), each point is
timed at every size, and a line t = t0 + bytes / rate fitted per
implementation separates a fixed cost per call (t0, us: ramp-up and the last
wave's tail) from the streaming rate (% of copy). The fit is printed for the
kernels' GPU time (L2 flushed, and not flushed: the flush leaves dirty lines
in the L2 whose write-back can land in the timed kernel) and for do_bench; the do_bench one also holds
host-side cost where a call's launch outlasts the flush (torch.compile at
small sizes).

    python3 scripts/softmax_timing_harness.py [--points fwd:bfloat16:128,bwd:bfloat16:4096] [--sizes 26]
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

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_POINTS = ("fwd:bfloat16:128,fwd:bfloat16:1024,bwd:bfloat16:128,bwd:bfloat16:4096,"
                  "bwd:bfloat16:32768,fwd:float32:4096,bwd:float16:4096")


def loop_ms(fn, calls=20, reps=15):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def kernel_ms(fn, flush, reps=7):
    """Median over reps of the summed GPU time of the kernels fn launches."""
    cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(reps):
        if flush:
            cache.zero_()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        us = sum(e.self_device_time_total for e in prof.key_averages())
        per_call.append(us / 1000)
    return statistics.median(per_call)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--sizes", default="26", help="log2 of the elements per input, comma-separated")
    args = ap.parse_args()
    sizes = sorted({int(v) for v in args.sizes.split(",")})  # distinct sizes: the fit needs two or more
    torch._dynamo.config.recompile_limit = 1024
    compiled_fwd = torch.compile(lambda x: F.softmax(x, -1), dynamic=False)
    compiled_bwd = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
    copy_gbs = common.copy_bandwidth_gbs("cuda")
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; copy {copy_gbs:.0f} GB/s; % of copy")
    print(f"{'point':22} {'2^':>3} {'impl':10} {'do_bench':>9} {'loop':>7} {'kernels':>8} {'kernels-noflush':>16}")
    for point in args.points.split(","):
        op, dname, cols = point.split(":")
        cols = int(cols)
        dtype = DTYPES[dname]
        fits = {}  # (timing, impl) -> [(bytes, ms)]
        for log2 in sizes:
            rows = max(1, 2**log2 // cols)
            x = torch.randn(rows, cols, dtype=dtype, device="cuda") * 3
            y = F.softmax(x, -1)
            dy = torch.randn_like(x)
            if op == "fwd":
                impls = {"torch_oss": lambda: torch_oss.softmax(x, -1), "compile": lambda: compiled_fwd(x)}
                nbytes = 2 * x.numel() * x.element_size()
            else:
                impls = {"torch_oss": lambda: torch.ops.oss.softmax_backward(dy, y, -1, y.dtype),
                         "compile": lambda: compiled_bwd(dy, y)}
                nbytes = 3 * x.numel() * x.element_size()
            for name, fn in impls.items():
                ms = (common.bench(fn, "cuda"), loop_ms(fn), kernel_ms(fn, True), kernel_ms(fn, False))
                fits.setdefault(("kernels", name), []).append((nbytes, ms[2]))
                fits.setdefault(("kernels-noflush", name), []).append((nbytes, ms[3]))
                fits.setdefault(("do_bench", name), []).append((nbytes, ms[0]))
                pct = [100 * nbytes / t / 1e6 / copy_gbs for t in ms]
                print(f"{point:22} {log2:3} {name:10} {pct[0]:9.1f} {pct[1]:7.1f} {pct[2]:8.1f} {pct[3]:16.1f}",
                      flush=True)
            del x, y, dy
        if len(sizes) > 1:
            for (timing, name), pts in sorted(fits.items()):
                t0_us, rate_pct = fit_line(pts, copy_gbs)
                print(f"{point:22} fit {name:10} {timing:15} fixed {t0_us:6.1f} us per call, "
                      f"streaming at {rate_pct:5.1f} % of copy", flush=True)


def fit_line(pts, copy_gbs):
    """Least-squares t = t0 + bytes * s over (bytes, ms) points: t0 in us and 1/s in % of copy."""
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    mt = sum(t for _, t in pts) / n
    s = sum((b - mb) * (t - mt) for b, t in pts) / sum((b - mb) ** 2 for b, _ in pts)
    t0 = mt - s * mb
    return t0 * 1e3, 100 * (1 / s) / 1e6 / copy_gbs


if __name__ == "__main__":
    main()
