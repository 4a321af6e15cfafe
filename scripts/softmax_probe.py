"""Minimal kernels (scripts/softmax_probe_kernels.cu) against torch_oss and
torch.compile, in one process, timed three ways (do_bench; the kernels' own
GPU time from the profiler's CUPTI records, the median of --calls calls, with
the L2 flushed by a 256 MB write before each call and without), at 2^26 and
2^28 elements, with t = t0 + bytes / rate fitted per implementation.
bfloat16 backward at 4096 columns and forward at 1024: the narrow-row points
where torch.compile led (bench/NOTES-softmax.md v18); the backward at 32768
(--bwd-cols, v27); the forward at 4096 (--fwd-cols, v28) and at 128 (v34,
with a plain copy of the same bytes), with bench/softmax.py's Triton fused
softmax as a further peer where triton is importable. The script stops at a
result further from float64 than a bfloat16 output allows.

    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared \\
        scripts/softmax_probe_kernels.cu -o build/libsoftmax_probe.so
    python3 scripts/softmax_probe.py [--bwd 1,3,6,15] [--fwd 11,14,17] [--sizes 26,28] [--rounds 1]
    python3 scripts/softmax_probe.py --bwd "" --fwd 54,55,56,57 --fwd-cols 4096
    python3 scripts/softmax_probe.py --bwd "" --fwd 60,61,62,63,64,65 --fwd-cols 128 --calls 100 --rounds 3
    ncu ... python3 scripts/softmax_probe.py --ncu     # one launch of each, for Nsight Compute
"""

import argparse
import ctypes
import os
import statistics
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))


def load(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.probe_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong,
                                 ctypes.c_void_p]

    def launch(which, a, b, out, rows):
        rc = lib.probe_launch(which, a.data_ptr(), b.data_ptr() if b is not None else 0, out.data_ptr(), rows,
                              torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"probe variant {which}: launch returned {rc}")
        return out

    return launch


def profile_once(fns):
    """Each call once to warm up, then once more between cudaProfilerStart and
    cudaProfilerStop (for ncu --profile-from-start off)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def ints(text):
    return [int(v) for v in text.split(",") if v]


def main():
    # torch_oss and the bench helpers are imported here, not at the top, so that
    # scripts/softmax_ncu_peers.py can take load(), ints() and profile_once() on
    # a machine where the extension is not built
    import common
    import softmax_timing_harness as harness

    import torch_oss

    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libsoftmax_probe.so")
    ap.add_argument("--bwd", default="1,3,6,15", help="backward variants (--bwd-cols columns)")
    ap.add_argument("--bwd-cols", type=int, default=4096,
                    help="the backward's columns: 4096 (variants 0-23) or 32768 (variants 40-46)")
    ap.add_argument("--fwd", default="11,14,17", help="forward variants (--fwd-cols columns)")
    ap.add_argument("--fwd-cols", type=int, default=1024,
                    help="the forward's columns: 1024 (variants 10-17, 30-33, 50-53), 4096 (54-59) or 128 (60-69)")
    ap.add_argument("--sizes", default="26,28", help="log2 of the elements per input")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, alternating the order")
    ap.add_argument("--calls", type=int, default=7,
                    help="calls per round for the kernels' own time (CUPTI records, median of the calls)")
    ap.add_argument("--ncu", action="store_true", help="one launch of each at 2^26 between cudaProfilerStart/Stop")
    args = ap.parse_args()
    wide = [v for v in ints(args.bwd) if v >= 40]
    if args.bwd_cols not in (4096, 32768) or (wide and args.bwd_cols != 32768) or \
            (len(wide) < len(ints(args.bwd)) and args.bwd_cols != 4096):
        ap.error(f"--bwd-cols {args.bwd_cols} with --bwd {args.bwd}: variants 40-46 take 32768 columns, "
                 "the others 4096 (the kernels have the row width built in)")
    fwd_cols = {v: 4096 if 54 <= v <= 59 else 128 if 60 <= v <= 69 else 1024 for v in ints(args.fwd)}
    if args.fwd_cols not in (128, 1024, 4096) or any(c != args.fwd_cols for c in fwd_cols.values()):
        ap.error(f"--fwd-cols {args.fwd_cols} with --fwd {args.fwd}: variants 54-59 take 4096 columns, 60-69 "
                 "128, the others 1024 (the kernels have the row width built in)")
    if args.calls < 1:
        ap.error(f"--calls must be at least 1, got {args.calls}")
    probe = load(args.lib)
    import softmax as bench_softmax  # bench/softmax.py, for its Triton peer
    triton_fwd = bench_softmax.triton_softmax()
    torch._dynamo.config.recompile_limit = 1024
    compiled_fwd = torch.compile(lambda x: F.softmax(x, -1), dynamic=False)
    compiled_bwd = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
    points = (("bwd", args.bwd_cols, ints(args.bwd)), ("fwd", args.fwd_cols, ints(args.fwd)))
    sizes = [26] if args.ncu else ints(args.sizes)
    copy_gbs = None if args.ncu else common.copy_bandwidth_gbs("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def kernel_ms(fn, flushed):
        """Median over --calls calls of the kernels' own time (CUPTI), after a
        256 MB write each (flushed) or back to back."""
        us, _ = common.kernel_times_us(fn, flush.zero_ if flushed else (lambda: None), args.calls)
        return statistics.median(us) / 1000

    if copy_gbs:
        print(f"{torch.cuda.get_device_name(0)}, copy {copy_gbs:.0f} GB/s; % of copy: do_bench, kernels (L2 "
              f"flushed), kernels (not flushed), the kernels' own time the median of {args.calls} calls; the "
              "kernels' flushed time in us; max relative error against float64")
    for op, cols, variants in points:
        fits = {}
        for log2 in sizes:
            rows = 2**log2 // cols
            x = torch.randn(rows, cols, dtype=torch.bfloat16, device="cuda") * 3
            y = F.softmax(x, -1)
            dy = torch.randn_like(x)
            out = torch.empty_like(x)
            if op == "fwd":
                impls = {"torch_oss": lambda: torch_oss.softmax(x, -1), "compile": lambda: compiled_fwd(x),
                         "copy": lambda: out.copy_(x)}
                if triton_fwd is not None:
                    impls["triton"] = lambda: triton_fwd(x)
                impls.update({f"v{v}": (lambda v=v: probe(v, x, None, out, rows)) for v in variants})
                ref = F.softmax(x.double(), -1)
                nbytes = 2 * x.numel() * x.element_size()
            else:
                impls = {"torch_oss": lambda: torch.ops.oss.softmax_backward(dy, y, -1, y.dtype),
                         "compile": lambda: compiled_bwd(dy, y)}
                impls.update({f"v{v}": (lambda v=v: probe(v, y, dy, out, rows)) for v in variants})
                ref = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
                nbytes = 3 * x.numel() * x.element_size()
            if args.ncu:
                profile_once(impls.values())
                continue
            order = list(impls.items())
            for rnd in range(args.rounds):
                for name, fn in (order if rnd % 2 == 0 else order[::-1]):
                    err = ((fn().double() - ref).abs() / (ref.abs() + 1e-3)).max().item()
                    if name != "copy" and not err < 0.05:  # bfloat16 output: 2^-8 relative, plus ex2.approx
                        raise RuntimeError(f"{name} {op}:bf16:{cols} 2^{log2}: relative error {err:.2e}")
                    ms = (common.bench(fn, "cuda"), kernel_ms(fn, True), kernel_ms(fn, False))
                    for timing, t in zip(("do_bench", "kernels", "noflush"), ms):
                        fits.setdefault((name, timing), []).append((nbytes, t))
                    pct = [100 * nbytes / t / 1e6 / copy_gbs for t in ms]
                    print(f"{op}:bf16:{cols} 2^{log2} r{rnd} {name:10} {pct[0]:6.1f} {pct[1]:6.1f} {pct[2]:6.1f}  "
                          f"us {ms[1] * 1e3:8.2f}  relerr {err:.1e}", flush=True)
            del x, y, dy, out
        if len(sizes) > 1:
            for (name, timing), pts in sorted(fits.items()):
                t0, rate = harness.fit_line(pts, copy_gbs)
                print(f"fit {op}:{cols} {name:10} {timing:9} fixed {t0:6.2f} us, streaming {rate:6.1f} %")


if __name__ == "__main__":
    main()
