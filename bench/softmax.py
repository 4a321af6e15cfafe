"""Softmax benchmark (docs/performance.md): GB/s and % of the copy ceiling measured in
the same run, for torch_oss against F.softmax, torch.compile(F.softmax) and a
Triton fused softmax, forward and backward, over widths 128 ... 16M.

    python bench/softmax.py                 # GPU if visible, else CPU (smaller grid)
    python bench/softmax.py --dtypes bfloat16 --cols 1024,4096
    python bench/softmax.py --rounds 3      # 3 interleaved rounds per point: medians and trimmed means
"""

import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
import common  # noqa: E402

import torch_oss  # noqa: E402

COLS = [128, 512, 1024, 4096, 32768, 128256, 262144, 1048576, 16777216]


def triton_softmax():
    """A Triton fused softmax (one program per row, whole row in registers),
    or None when triton is missing. Written here as the Triton peer."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def softmax_rows_kernel(x_ptr, y_ptr, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, 0))
        y = e / tl.sum(e, 0)
        tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    def run(x):
        rows, cols = x.shape
        if cols > 65536:
            return None
        block = triton.next_power_of_2(cols)
        warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
        y = torch.empty_like(x)
        softmax_rows_kernel[(rows,)](x, y, x.stride(0), y.stride(0), cols, BLOCK=block, num_warps=warps)
        return y

    return run


def check(name, got, ref64, peer, dtype):
    """Refuse to time a kernel whose result is wrong (tolerance rule)."""
    eps = torch.finfo(dtype).eps
    err = ((got.double() - ref64).abs() - eps * ref64.abs()).max().item()
    bound = 2 * (peer.double() - ref64).abs().max().item() + {torch.float32: 1e-6}.get(dtype, 1e-4)
    if not err <= bound:
        raise AssertionError(f"{name}: max error {err:.3e} > {bound:.3e}; not timing a wrong kernel")


def record(op, dtype, rows, cols, name, stats, nbytes, copy_gbs):
    ms, per_round, ms_trimmed, trimmed_rounds = stats
    return dict(op=op, dtype=dtype, rows=rows, cols=cols, impl=name, ms=ms, ms_rounds=per_round,
                ms_trimmed=ms_trimmed, ms_trimmed_rounds=trimmed_rounds, gbs=nbytes / ms / 1e6,
                pct_copy=100 * nbytes / ms / 1e6 / copy_gbs, pct_copy_trimmed=100 * nbytes / ms_trimmed / 1e6 / copy_gbs)


def peers_ahead(records, key):
    """'op dtype cols: peer +gap' for every point where a peer beats torch_oss by
    the statistic `key` (pct_copy or pct_copy_trimmed), gap in points of copy."""
    out = []
    points = dict.fromkeys((r["op"], r["dtype"], r["cols"]) for r in records if r["op"] in ("forward", "backward"))
    for point in points:
        by_impl = {r["impl"]: r for r in records if (r["op"], r["dtype"], r["cols"]) == point}
        ours = by_impl.get("torch_oss")
        for name, r in by_impl.items():
            if ours and name != "torch_oss" and r[key] > ours[key]:
                out.append(f"{point[0]} {point[1]} {point[2]}: {name} +{r[key] - ours[key]:.2f}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", type=common.dtype_list, default=["float32", "bfloat16", "float16"])
    ap.add_argument("--cols", default=None)
    ap.add_argument("--total", type=int, default=None, help="elements per input (default 2**26 GPU, 2**22 CPU)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every implementation this many times per point, interleaved; report the median")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    device = args.device
    total = args.total or (2**26 if device == "cuda" else 2**22)
    cols_list = [int(c) for c in args.cols.split(",")] if args.cols else [c for c in COLS if c <= total // 4]
    env = common.environment(device)
    copy_gbs = common.copy_bandwidth_gbs(device)
    print(f"softmax benchmark on {env.get('gpu', env.get('cpu'))}, torch {env['torch']}, commit {env['commit']}")
    print(f"copy ceiling: {copy_gbs:.0f} GB/s (read + write); each point the median of {args.rounds} "
          f"interleaved round(s)")

    impls = {"torch_oss": lambda x: torch_oss.softmax(x, -1), "F.softmax": lambda x: F.softmax(x, -1)}
    bwd_impls = {
        "torch_oss": lambda dy, y: torch.ops.oss.softmax_backward(dy, y, -1, y.dtype),
        "F.softmax": lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype),
    }
    if not args.no_compile:
        # one specialised graph per (shape, dtype), as a user compiling for a fixed
        # shape gets; without raising the limit dynamo stops recompiling after 8
        # shapes and silently runs the rest eagerly
        torch._dynamo.config.recompile_limit = 1024
        impls["compile"] = torch.compile(lambda x: F.softmax(x, -1), dynamic=False)
        bwd_impls["compile"] = torch.compile(lambda dy, y: torch._softmax_backward_data(dy, y, -1, y.dtype),
                                             dynamic=False)
    if device == "cuda" and triton_softmax() is not None:
        impls["triton"] = triton_softmax()

    records, rows_out = [], []
    for dname in args.dtypes:
        dtype = common.DTYPES[dname]
        for cols in cols_list:
            rows = max(1, total // cols)
            x = torch.randn(rows, cols, dtype=dtype, device=device) * 3
            ref = F.softmax(x.double(), -1)
            peer = F.softmax(x, -1)
            nbytes = 2 * x.numel() * x.element_size()
            timed = {}
            for name, fn in impls.items():
                y = fn(x)
                if y is None:
                    continue
                check(f"{name} fwd {dname} {rows}x{cols}", y, ref, peer, dtype)
                del y
                timed[name] = lambda fn=fn: fn(x)
            for name, stats in common.time_rounds(timed, args.rounds, device).items():
                records.append(record("forward", dname, rows, cols, name, stats, nbytes, copy_gbs))
            if not args.no_backward:
                y = peer
                dy = torch.randn_like(x)
                ref_dx = torch._softmax_backward_data(dy.double(), ref, -1, torch.float64)
                peer_dx = torch._softmax_backward_data(dy, y, -1, dtype)
                nbytes3 = 3 * x.numel() * x.element_size()
                timed = {}
                for name, fn in bwd_impls.items():
                    check(f"{name} bwd {dname} {rows}x{cols}", fn(dy, y), ref_dx, peer_dx, dtype)
                    timed[name] = lambda fn=fn: fn(dy, y)
                for name, stats in common.time_rounds(timed, args.rounds, device).items():
                    records.append(record("backward", dname, rows, cols, name, stats, nbytes3, copy_gbs))
                del dy, ref_dx, peer_dx
            del x, ref, peer

    # softmax over dim=1 of a (B, C, H, W) tensor (the strided columns kernel), forward
    # and backward, against F.softmax and against torch_oss on the last dim of a tensor
    # of the same size
    dim1_ratios = []
    for dname in [d for d in ("float32", "bfloat16") if d in args.dtypes]:
        dtype = common.DTYPES[dname]
        shape = (32, 1024, 64, 64) if device == "cuda" else (4, 256, 32, 32)
        x = torch.randn(shape, device=device, dtype=dtype) * 3
        last = x.reshape(-1, shape[1])
        nbytes = 2 * x.numel() * x.element_size()
        y = torch_oss.softmax(x, 1)
        check(f"torch_oss dim=1 {dname}", y, F.softmax(x.double(), 1), F.softmax(x, 1), dtype)
        dy = torch.randn_like(x)
        ref_dx = torch._softmax_backward_data(dy.double(), F.softmax(x.double(), 1), 1, torch.float64)
        check(f"torch_oss dim=1 bwd {dname}", torch.ops.oss.softmax_backward(dy, y, 1, dtype), ref_dx,
              torch._softmax_backward_data(dy, y, 1, dtype), dtype)
        ylast, dylast = y.reshape(-1, shape[1]).contiguous(), dy.reshape(-1, shape[1]).contiguous()
        cases = (
            ("forward_dim1", nbytes, {"torch_oss": lambda: torch_oss.softmax(x, 1), "F.softmax": lambda: F.softmax(x, 1)}),
            ("forward_lastdim_same_size", nbytes, {"torch_oss": lambda: torch_oss.softmax(last, -1)}),
            ("backward_dim1", nbytes * 3 // 2,
             {"torch_oss": lambda: torch.ops.oss.softmax_backward(dy, y, 1, dtype),
              "F.softmax": lambda: torch._softmax_backward_data(dy, y, 1, dtype)}),
            ("backward_lastdim_same_size", nbytes * 3 // 2,
             {"torch_oss": lambda: torch.ops.oss.softmax_backward(dylast, ylast, -1, dtype)}),
        )
        ours = {}
        for op, nb, fns in cases:
            for name, stats in common.time_rounds(fns, args.rounds, device).items():
                if name == "torch_oss":
                    ours[op] = stats[0]
                records.append(record(op, dname, x.numel() // shape[1], shape[1], name, stats, nb, copy_gbs))
        for kind in ("forward", "backward"):
            dim1_ratios.append(f"{kind} {dname}: dim=1 runs at "
                               f"{ours[kind + '_lastdim_same_size'] / ours[kind + '_dim1']:.3f}x the per-byte speed "
                               f"of the last-dim case")
        del x, last, y, dy, ref_dx, ylast, dylast

    # table: one line per (op, dtype, shape), % of copy per implementation and our speed-up over each peer
    names = list(dict.fromkeys(r["impl"] for r in records))
    header = ["op", "dtype", "rows x cols"] + [f"{n} %copy" for n in names] + \
             [f"vs {n}" for n in names if n != "torch_oss"]
    keys = list(dict.fromkeys((r["op"], r["dtype"], r["rows"], r["cols"]) for r in records))
    for key in keys:
        by_impl = {r["impl"]: r for r in records if (r["op"], r["dtype"], r["rows"], r["cols"]) == key}
        ours = by_impl.get("torch_oss")
        line = [key[0], key[1], f"{key[2]} x {key[3]}"]
        line += [f"{by_impl[n]['pct_copy']:.0f}" if n in by_impl else "-" for n in names]
        line += [f"{by_impl[n]['ms'] / ours['ms']:.2f}x" if (n in by_impl and ours) else "-"
                 for n in names if n != "torch_oss"]
        rows_out.append(line)
    common.print_table(f"softmax: % of copy ({copy_gbs:.0f} GB/s); 'vs X' = X's time / torch_oss's time",
                       header, rows_out)
    for line in dim1_ratios:
        print(line)
    for key, what in (("pct_copy", "medians"), ("pct_copy_trimmed", "trimmed means (middle 80 % of the calls)")):
        ahead = peers_ahead(records, key)
        print(f"peers ahead of torch_oss by the {what}: {len(ahead)} point(s)" + "".join(f"\n  {a}" for a in ahead))
    common.write_json(f"softmax_{device}", dict(env=env, copy_gbs=copy_gbs, records=records))
    panels = {}
    for r in records:
        if r["op"] in ("forward", "backward"):
            panels.setdefault(f"{r['op']} {r['dtype']}", {}).setdefault(r["impl"], []).append((r["cols"], r["gbs"]))
    common.plot_lines(f"softmax_{device}", panels, "columns", "GB/s",
                      title=f"{env.get('gpu', env.get('cpu'))}, copy {copy_gbs:.0f} GB/s")


if __name__ == "__main__":
    main()
