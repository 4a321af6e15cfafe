"""Host-side cost per softmax call: the CPU time to enqueue one call of
torch_oss against F.softmax (and torch.compile), for small inputs of each
tier, where a call's host work (dispatch, planning, launch) and not the GPU
decides its latency.

Each point enqueues CALLS calls back to back and synchronises once; the GPU
work of these shapes is short enough that the launch queue never fills, so
the loop's wall time over CALLS is the host's cost per call. The callables of
a point take turns loop by loop (--reps loops each), and the table gives the
fastest loop of each: the host is shared and its slow phases last whole
loops (medians moved by 2-10 us between processes on the H100 host, NOTES
v25), while nothing makes a loop faster than the work it does.

    python3 scripts/softmax_host_overhead.py [--calls 200] [--reps 15]
    python3 scripts/softmax_host_overhead.py --breakdown   # where a forward call's time goes
    python3 scripts/softmax_host_overhead.py --varying     # a process whose widths keep changing

--varying: a long-running process sees many row widths, and in the cluster
tier each width has its own launch configuration (the planner's occupancy
answers are remembered per configuration). It first calls the forward once on
each of --history widths, then times loops over 64 widths it has not seen
(bfloat16 rows of 300000 + 64k columns): the cost per call once those are
known, against F.softmax on the same widths.
"""

import argparse
import time

import torch
import torch.nn.functional as F

import torch_oss

# (label, shape, dim, dtype): one small input per planner tier
POINTS = [
    ("warp tier", (64, 1024), -1, torch.bfloat16),
    ("one CTA, registers", (8, 4096), -1, torch.bfloat16),
    ("one CTA, 1024 threads (bwd)", (8, 32768), -1, torch.bfloat16),
    ("one CTA + shared memory", (4, 65536), -1, torch.bfloat16),
    ("cluster", (2, 262144), -1, torch.bfloat16),
    ("cluster of 16 / spread", (1, 1048576), -1, torch.bfloat16),
    ("split", (1, 4194304), -1, torch.float32),
    ("columns (dim=1)", (2, 64, 8, 8), 1, torch.float32),
]


def per_call_us(fns, calls, reps):
    """Host us per call of each callable in fns: the fastest of reps loops of
    calls calls, the callables taking turns loop by loop."""
    for fn in fns:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            times[i].append((t1 - t0) / calls * 1e6)
    return [min(t) for t in times]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--varying", action="store_true", help="many widths, then a working set of 64 new ones")
    ap.add_argument("--history", type=int, default=1500)
    ap.add_argument("--breakdown", action="store_true",
                    help="the layers of one forward call, (64, 1024) bfloat16: the public function, the op, "
                         "the op without autograd, and two one-kernel PyTorch ops for scale")
    args = ap.parse_args()
    print(f"torch_oss from {torch_oss.__file__}")
    if args.varying:
        buf = torch.randn(310000, device="cuda", dtype=torch.bfloat16)
        history = [200000 + 64 * k for k in range(args.history)]
        fresh = [300000 + 64 * k for k in range(64)]
        assert max(history) < min(fresh) and max(fresh) <= buf.numel()
        t0 = time.perf_counter()
        for w in history:
            torch_oss.softmax(buf[:w].view(1, w), -1)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) / len(history) * 1e6
        t0 = time.perf_counter()
        for w in history:
            F.softmax(buf[:w].view(1, w), -1)
        torch.cuda.synchronize()
        first_eager = (time.perf_counter() - t0) / len(history) * 1e6
        xs = [buf[:w].view(1, w) for w in fresh]

        def loop(fn):
            return lambda: [fn(x, -1) for x in xs]

        ours, eager = (t / len(xs) for t in per_call_us([loop(torch_oss.softmax), loop(F.softmax)],
                                                         max(1, args.calls // len(xs)), args.reps))
        print(f"{torch.cuda.get_device_name(0)}: bfloat16 (1, w) forward, host us per call")
        print(f"first call at each of {len(history)} widths (200000 + 64k): torch_oss {first:8.2f}   "
              f"F.softmax {first_eager:8.2f}")
        print(f"then 64 new widths (300000 + 64k), in loops: torch_oss {ours:8.2f}   F.softmax {eager:8.2f}")
        return
    if args.breakdown:
        x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
        op = torch.ops.oss.softmax.default

        def op_inference():
            with torch.inference_mode():
                return op(x, -1, None)

        def empty_inference():
            with torch.inference_mode():
                return None

        labels, fns = [], []
        for label, fn in (("torch_oss.softmax(x, -1)", lambda: torch_oss.softmax(x, -1)),
                          ("torch.ops.oss.softmax(x, -1)", lambda: torch.ops.oss.softmax(x, -1)),
                          ("torch.ops.oss.softmax.default(x, -1, None)", lambda: op(x, -1, None)),
                          ("the same in inference_mode", op_inference),
                          ("an empty inference_mode block", empty_inference),
                          ("F.softmax(x, -1)", lambda: F.softmax(x, -1)),
                          ("x.exp()", lambda: x.exp()),
                          ("torch.empty_like(x)", lambda: torch.empty_like(x))):
            labels.append(label)
            fns.append(fn)
        for label, t in zip(labels, per_call_us(fns, args.calls, args.reps)):
            print(f"{label:45} {t:8.2f} us", flush=True)
        return
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: host us per call (enqueue, fastest of "
          f"{args.reps} interleaved loops of {args.calls})")
    print(f"{'point':32} {'shape':>18} {'op':4} {'torch_oss':>10} {'F.softmax':>10} {'compile':>10}")
    for label, shape, dim, dtype in POINTS:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        y = torch_oss.softmax(x, dim)
        dy = torch.randn_like(y)
        compiled_f = None if args.no_compile else torch.compile(lambda t, d=dim: F.softmax(t, d), dynamic=False)
        compiled_b = None if args.no_compile else torch.compile(
            lambda g, o, d=dim: torch._softmax_backward_data(g, o, d, o.dtype), dynamic=False)
        rows = {
            "fwd": (lambda: torch_oss.softmax(x, dim), lambda: F.softmax(x, dim),
                    compiled_f and (lambda: compiled_f(x))),
            "bwd": (lambda: torch.ops.oss.softmax_backward(dy, y, dim, y.dtype),
                    lambda: torch._softmax_backward_data(dy, y, dim, y.dtype),
                    compiled_b and (lambda: compiled_b(dy, y))),
        }
        for op, (ours, eager, comp) in rows.items():
            fns = [f for f in (ours, eager, comp) if f]
            vals = per_call_us(fns, args.calls, args.reps) + [float("nan")] * (3 - len(fns))
            print(f"{label:32} {str(tuple(shape)):>18} {op:4} {vals[0]:10.2f} {vals[1]:10.2f} {vals[2]:10.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
