"""Planner variants of the CUDA softmax against torch.compile, in interleaved
rounds: a steadier measure than one bench/softmax.py run for gaps of a point
or two of copy bandwidth.

Needs the extension built with the planner's test knobs (all zero = the normal
plans; their meaning is in csrc/cuda/softmax.cu):

    TORCH_OSS_SOFTMAX_KNOBS=1 pip install --no-build-isolation --no-deps -e .
    python3 scripts/softmax_variants.py --points fwd:bfloat16:128,bwd:float16:32768 \\
        --variants "base;5=2;15=64;5=2,15=64" --rounds 5

Each variant is a comma-separated list of knob=value ("base": none). Every
round times every variant and torch.compile once with do_bench (the L2 flushed
before each call by a 256 MB write, as bench/softmax.py does), in alternating order, at
2^--size elements per input. A round's figure is the mean of the middle 80 % of
its calls, not their median: CUDA events resolve about 0.5 us, which is 0.5 %
of a 2^26-element 16-bit call, and a median of such samples snaps to one of
those steps; the mean of many samples does not. The table gives, per
implementation, the median over the rounds as % of the copy ceiling measured in
the same run, the spread (min-max) over the rounds, and torch.compile's time
over the variant's. Every variant's result is checked against float64 before
it is timed, and its plan is printed.

--kernel-time adds, per round, the median of the kernels' own durations over
--kernel-calls calls under torch.profiler (CUPTI timestamps, nanoseconds;
bench/common.kernel_times_us), with the same 256 MB write before each call:
a second table that events' 0.5 us steps do not blur.

--flush times each implementation under several ways of emptying the L2
before each call, to see what the flush itself costs a call: "dirty" (a
256 MB write, do_bench's: the L2 is left full of dirty lines, written back
while the timed call runs), "clean" (a 256 MB read: the L2 is left full of
clean lines) and "none" (back to back). --same-traffic adds an element-wise
op that moves the point's bytes (forward: a copy; backward: an add of two
tensors into a third), the ceiling of a kernel that only streams, at the same
size and under the same flush.
"""

import argparse
import ctypes
import os
import statistics
import sys

import torch
import torch.nn.functional as F

import torch_oss

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import common  # noqa: E402
from softmax import DTYPES, check  # noqa: E402

NKNOBS = 27  # csrc/cuda/softmax.cu: oss_softmax_cuda_test_knobs


def knob_array():
    lib = ctypes.CDLL(torch_oss._C.__file__)
    try:
        return (ctypes.c_int * NKNOBS).in_dll(lib, "oss_softmax_cuda_test_knobs")
    except ValueError:
        raise SystemExit("this build of torch_oss has no softmax test knobs: rebuild with TORCH_OSS_SOFTMAX_KNOBS=1")


def parse_variant(text):
    if text.strip() in ("", "base"):
        return {}
    knobs = {}
    for item in text.split(","):
        i, v = (int(t) for t in item.split("="))
        if not 0 <= i < NKNOBS or i == 7:
            raise SystemExit(f"variant {text!r}: knob {i} is not a planner knob (0..{NKNOBS - 1}, not 7)")
        knobs[i] = v
    return knobs


def parse_points(ap, text):
    """--points as [OP, DTYPE, COLS] lists; a malformed one is an argparse error naming it."""
    points = [p.split(":") for p in text.split(",")]
    for p in points:
        if len(p) != 3 or p[0] not in ("fwd", "bwd") or p[1] not in DTYPES or not (p[2].isdigit() or p[2] == "dim1"):
            ap.error(f"--points: {':'.join(p)!r} is not OP:DTYPE:COLS (OP fwd or bwd, DTYPE one of {list(DTYPES)}, "
                     "COLS a number or dim1)")
    return points


def point_shape(cols, numel):
    """(shape, dim) of a point's input of about numel elements: rows of COLS over the last dim, or for
    'dim1' softmax over dim 1 of (B, 1024, 64, 64), the issue's dim=1 case (the columns kernel)."""
    if cols == "dim1":
        return (max(1, numel // (1024 * 64 * 64)), 1024, 64, 64), 1
    return (max(1, numel // int(cols)), int(cols)), -1


FLUSH_BYTES = 256 << 20


def flush_modes(names):
    buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    buf.zero_()
    words = buf.view(torch.int32)
    known = {"dirty": buf.zero_, "clean": lambda: words.amax(), "none": None}
    for name in names:
        if name not in known:
            raise SystemExit(f"--flush: {name!r} is not one of {list(known)}")
    return {name: known[name] for name in names}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="fwd:bfloat16:128,fwd:float16:128,bwd:bfloat16:32768,bwd:float16:32768",
                    help="OP:DTYPE:COLS, comma-separated (OP fwd or bwd)")
    ap.add_argument("--variants", default="base", help="';'-separated variants, each 'i=v,i=v' or 'base'")
    ap.add_argument("--size", type=int, default=26, help="log2 of the elements per input")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--flush", default=None,
                    help="comma-separated L2 flushes before each call (dirty, clean, none); default: do_bench's")
    ap.add_argument("--kernel-time", action="store_true",
                    help="also the kernels' own durations under torch.profiler (median per round)")
    ap.add_argument("--kernel-calls", type=int, default=100, help="profiled calls per round for --kernel-time")
    ap.add_argument("--same-traffic", action="store_true",
                    help="also time an element-wise op moving the point's bytes (a copy; an add for backward)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.kernel_calls < 1:
        ap.error(f"--kernel-calls must be at least 1, got {args.kernel_calls}")
    points = parse_points(ap, args.points)
    flushes = flush_modes(args.flush.split(",")) if args.flush else None
    knobs = knob_array()
    variants = {v.strip() or "base": parse_variant(v) for v in args.variants.split(";")}
    torch._dynamo.config.recompile_limit = 1024
    compiled_fwd = torch.compile(lambda x, dim: F.softmax(x, dim), dynamic=False)
    compiled_bwd = torch.compile(lambda dy, y, dim: torch._softmax_backward_data(dy, y, dim, y.dtype), dynamic=False)
    env = common.environment("cuda")
    copy_gbs = common.copy_bandwidth_gbs("cuda")
    print(f"{env['gpu']}, torch {env['torch']}, commit {env['commit']}; copy {copy_gbs:.0f} GB/s; "
          f"2^{args.size} elements per input, {args.rounds} rounds")

    def set_knobs(values):
        for i in range(NKNOBS):
            knobs[i] = values.get(i, 0)

    records = []
    dirty = flush_modes(["dirty"])["dirty"] if args.kernel_time else None  # the profiled calls' flush
    for op, dname, cols in points:
        point = f"{op}:{dname}:{cols}"
        dtype = DTYPES[dname]
        shape, dim = point_shape(cols, 2**args.size)
        x = torch.randn(shape, dtype=dtype, device="cuda") * 3
        y = F.softmax(x, dim)
        dy = torch.randn_like(x)
        if op == "fwd":
            ours = lambda: torch_oss.softmax(x, dim)  # noqa: E731
            peer = (lambda: compiled_fwd(x, dim)) if not args.no_compile else None
            ref, eager = F.softmax(x.double(), dim), y
            nbytes = 2 * x.numel() * x.element_size()
            sink = torch.empty_like(x)
            same = lambda: sink.copy_(x)  # noqa: E731
        else:
            ours = lambda: torch.ops.oss.softmax_backward(dy, y, dim, y.dtype)  # noqa: E731
            peer = (lambda: compiled_bwd(dy, y, dim)) if not args.no_compile else None
            ref = torch._softmax_backward_data(dy.double(), y.double(), dim, torch.float64)
            eager = torch._softmax_backward_data(dy, y, dim, dtype)
            nbytes = 3 * x.numel() * x.element_size()
            sink = torch.empty_like(x)
            same = lambda: torch.add(dy, y, out=sink)  # noqa: E731
        impls = {}
        for name, values in variants.items():
            set_knobs({**values, 7: 3})  # print the plan of the next call
            print(f"{point} {name}: ", end="", flush=True)
            check(f"{point} {name}", ours(), ref, eager, dtype)
            impls[name] = (values, ours)
        set_knobs({})
        if peer is not None:
            check(f"{point} compile", peer(), ref, eager, dtype)
            impls["compile"] = ({}, peer)
        if args.same_traffic:
            impls["same traffic"] = ({}, same)
        # (flush, implementation) pairs; flush None: do_bench's timing
        keys = [(f, name) for f in (flushes or [None]) for name in impls]
        times = {key: [] for key in keys}
        kernel_us = {name: [] for name in impls}
        for rnd in range(args.rounds):
            for f, name in (keys if rnd % 2 == 0 else keys[::-1]):
                values, fn = impls[name]
                set_knobs(values)
                if f is None:
                    times[(f, name)].append(common.bench_stats(fn, "cuda")[1])  # the trimmed mean
                else:
                    times[(f, name)].append(common.trimmed_mean(common.cuda_event_times_ms(fn, flushes[f])))
                if args.kernel_time and f == keys[0][0]:
                    kernel_us[name].append(statistics.median(common.kernel_times_us(fn, dirty, args.kernel_calls)[0]))
        set_knobs({})
        print(f"\n{point} {tuple(shape)}, dim {dim}: % of copy, median of {args.rounds} rounds of trimmed means [min-max]; "
              f"compile's time / this one's")
        for (f, name), ts in times.items():
            med = statistics.median(ts)
            pct = [100 * nbytes / t / 1e6 / copy_gbs for t in (med, max(ts), min(ts))]
            vs = f"{statistics.median(times[(f, 'compile')]) / med:.4f}x" if (f, "compile") in times else "-"
            label = name if f is None else f"{name} [{f} flush]"
            print(f"  {label:36} {pct[0]:6.2f} [{pct[1]:6.2f}-{pct[2]:6.2f}]  {med * 1e3:8.2f} us  {vs}", flush=True)
            records.append(dict(point=point, shape=list(shape), dim=dim, impl=name, flush=f or "do_bench",
                                knobs=impls[name][0], ms_rounds=ts, ms=med, pct_copy=pct[0]))
        if args.kernel_time:
            print(f"{point}: the kernels' own time (profiler, {args.kernel_calls} calls after a 256 MB write), "
                  f"median of {args.rounds} rounds' medians [min-max]; compile's time / this one's")
            for name, ks in kernel_us.items():
                med = statistics.median(ks)
                vs = f"{statistics.median(kernel_us['compile']) / med:.4f}x" if "compile" in kernel_us else "-"
                print(f"  {name:36} {med:9.3f} us [{min(ks):9.3f}-{max(ks):9.3f}]  "
                      f"{100 * nbytes / med / 1e3 / copy_gbs:6.2f} % of copy  {vs}", flush=True)
                records.append(dict(point=point, shape=list(shape), dim=dim, impl=name, flush="kernel_time",
                                    knobs=impls[name][0], us_rounds=ks, us=med))
        del x, y, dy, ref, eager, sink
    common.write_json("softmax_variants", dict(env=env, copy_gbs=copy_gbs, size=args.size, rounds=args.rounds,
                                               records=records))


if __name__ == "__main__":
    main()
