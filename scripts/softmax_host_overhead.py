"""Host-side cost per softmax call: the CPU time to enqueue one call of
torch_oss against F.softmax (and torch.compile), for small inputs of each
tier, where a call's host work (dispatch, planning, launch) and not the GPU
decides its latency.

Each point enqueues CALLS calls back to back and synchronises once; the GPU
work of these shapes is short enough that the launch queue never fills, so
the loop's wall time over CALLS is the host's cost per call. Median of
--reps loops.

    python3 scripts/softmax_host_overhead.py [--calls 200] [--reps 7]
    python3 scripts/softmax_host_overhead.py --breakdown   # where a forward call's time goes
    python3 scripts/softmax_host_overhead.py --varying     # a process whose widths keep changing

--varying: a long-running process sees many row widths, each with its own
launch configuration. It first calls the forward once on each of --history
widths, then times loops over 64 widths it has not seen yet (the one-CTA tier
with a shared-memory part, bfloat16): the cost per call once those are known,
against F.softmax on the same widths.
"""

import argparse
import statistics
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


def per_call_us(fn, calls, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append((t1 - t0) / calls * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--varying", action="store_true", help="many widths, then a working set of 64 new ones")
    ap.add_argument("--history", type=int, default=1500)
    ap.add_argument("--breakdown", action="store_true",
                    help="the layers of one forward call, (64, 1024) bfloat16: the public function, the op, "
                         "the op without autograd, and two one-kernel PyTorch ops for scale")
    args = ap.parse_args()
    print(f"torch_oss from {torch_oss.__file__}")
    if args.varying:
        buf = torch.randn(2 * 80000, device="cuda", dtype=torch.bfloat16)
        history = [40000 + 8 * k for k in range(args.history)]
        fresh = [62000 + 8 * k for k in range(64)]
        t0 = time.perf_counter()
        for w in history:
            torch_oss.softmax(buf[:2 * w].view(2, w), -1)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) / len(history) * 1e6
        xs = [buf[:2 * w].view(2, w) for w in fresh]

        def loop(fn):
            return lambda: [fn(x, -1) for x in xs]

        calls = max(1, args.calls // len(xs))
        ours = per_call_us(loop(torch_oss.softmax), calls, args.reps) / len(xs)
        eager = per_call_us(loop(F.softmax), calls, args.reps) / len(xs)
        print(f"{torch.cuda.get_device_name(0)}: bfloat16 (2, w) forward, host us per call")
        print(f"first call at each of {len(history)} widths (40000 + 8k): {first:8.2f}")
        print(f"then 64 new widths (62000 + 8k), in loops: torch_oss {ours:8.2f}   F.softmax {eager:8.2f}")
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

        for label, fn in (("torch_oss.softmax(x, -1)", lambda: torch_oss.softmax(x, -1)),
                          ("torch.ops.oss.softmax(x, -1)", lambda: torch.ops.oss.softmax(x, -1)),
                          ("torch.ops.oss.softmax.default(x, -1, None)", lambda: op(x, -1, None)),
                          ("the same in inference_mode", op_inference),
                          ("an empty inference_mode block", empty_inference),
                          ("F.softmax(x, -1)", lambda: F.softmax(x, -1)),
                          ("x.exp()", lambda: x.exp()),
                          ("torch.empty_like(x)", lambda: torch.empty_like(x))):
            print(f"{label:45} {per_call_us(fn, args.calls, args.reps):8.2f} us", flush=True)
        return
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}: host us per call (enqueue, median of "
          f"{args.reps} loops of {args.calls})")
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
            vals = [per_call_us(f, args.calls, args.reps) if f else float("nan") for f in (ours, eager, comp)]
            print(f"{label:32} {str(tuple(shape)):>18} {op:4} {vals[0]:10.2f} {vals[1]:10.2f} {vals[2]:10.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
