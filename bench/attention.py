"""Attention benchmark (docs/performance.md, FlashAttention's setup): batch x seqlen =
16k tokens, model width 2048 (head dim 64 -> 32 heads, 128 -> 16, 256 -> 8),
seqlen 512 ... 16k, causal and not, bf16 and fp16, forward and forward+backward,
torch_oss against every SDPA backend in the same run. TFLOP/s: forward
4*B*H*N^2*D (halved when causal), backward 2.5x forward.

    python bench/attention.py                       # GPU if visible, else a small CPU grid
    python bench/attention.py --hdims 128 --seqlens 2048,8192 --dtypes bfloat16
    python bench/attention.py --with-mma    # also torch_oss with its mma.sync forward forced
                                            # (on Hopper hd 64/128 otherwise run the wgmma kernel)
    python bench/attention.py --with-uncentred  # also torch_oss without the backward's dQ centring
                                                # (what it costs)
    python bench/attention.py --with-deterministic  # also torch_oss with deterministic=True
    python bench/attention.py --modes train-fwd  # the forward of a training step (inputs that require
                                                 # grad: it keeps what the backward needs)
    python bench/attention.py --kernels     # also the kernels of each mode (us per call; fwd+bwd: the
                                            # backward's): torch_oss's and cuDNN's (GPU)
    python bench/attention.py --mask padding --causal 0
        # with a mask tensor: padding (B, 1, 1, N) bool, bool (B, 1, N, N), or additive
        # (1, H, N, N) in the inputs' dtype (a position bias), or causal-padding (B, 1, N, N) in the
        # inputs' dtype (Hugging Face's causal mask with padding); SDPA takes no causal flag with one
    python bench/attention.py --mask bool --causal 0 --with-mask-elementwise
        # also torch_oss given the same mask in rows the copy engine cannot address (16 bytes
        # + one element apart), which the kernel reads element by element from global memory
    python bench/attention.py --layout blhd --kv-heads 8 --hdims 64
        # as a model's attention function calls it: q, k, v are (B, L, H, D) memory seen as
        # (B, H, L, D), and each forward ends in out.transpose(1, 2).contiguous(); grouped-query
        # attention with 8 key/value heads
"""

import argparse
import functools
import sys
from contextlib import nullcontext

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
import common  # noqa: E402

import torch_oss  # noqa: E402
from torch_oss._kernels import attention_kernels  # noqa: E402


def sdpa_backends(device):
    """name -> context manager factory selecting an SDPA backend."""
    out = {"sdpa-default": nullcontext}
    if device != "cuda":
        return out
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):
        out[name] = lambda b=backend: sdpa_kernel(b)
    return out


def make_mask(kind, B, H, N, dtype, device):
    """The --mask tensor (None for "none"); every row keeps some keys."""
    g = torch.Generator().manual_seed(0)
    if kind == "none":
        return None
    if kind == "padding":  # each sequence keeps its first N - r keys, r < N / 4
        cut = torch.randint(0, max(1, N // 4), (B,), generator=g)
        return (torch.arange(N) < (N - cut)[:, None]).view(B, 1, 1, N).to(device)
    if kind == "bool":
        m = torch.rand(B, 1, N, N, generator=g) > 0.1
        return (m | torch.eye(N, dtype=torch.bool)).to(device)
    if kind == "causal-padding":  # Hugging Face's mask for SDPA with padding: 0 where a key is visible
        cut = torch.randint(0, max(1, N // 4), (B,), generator=g)
        keep = (torch.arange(N) < (N - cut)[:, None]).view(B, 1, 1, N) & torch.ones(N, N, dtype=torch.bool).tril()
        return torch.zeros(B, 1, N, N, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min).to(device)
    return torch.randn(1, H, N, N, generator=g).to(dtype=dtype, device=device)


def flops(B, H, N, D, causal, mode):
    f = 4 * B * H * N * N * D / (2 if causal else 1)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", type=common.dtype_list, default=None, help="e.g. bfloat16,float16 or bf16")
    ap.add_argument("--hdims", default=None)
    ap.add_argument("--seqlens", default=None)
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--modes", default="fwd,fwd+bwd",
                    help="comma-separated: fwd (no grad), train-fwd (the forward with inputs that require grad, "
                         "as in a training step: it also keeps what the backward needs), fwd+bwd")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--with-mma", action="store_true",
                    help="also time torch_oss with its mma.sync kernels where Hopper ones exist "
                         "(column torch_oss-mma)")
    ap.add_argument("--with-uncentred", action="store_true",
                    help="also time torch_oss without the 16-bit backward's dQ centring, to see what it costs "
                         "(column torch_oss-uncentred)")
    ap.add_argument("--with-deterministic", action="store_true",
                    help="also time torch_oss with deterministic=True (bitwise reproducible backward; "
                         "column torch_oss-deterministic)")
    ap.add_argument("--with-block-rows", action="store_true",
                    help="also time torch_oss with the Hopper forward's blocks of 128 and of 192 query rows where "
                         "kernels of both serve the call (head dims 64 and 96; columns torch_oss-rows128, "
                         "torch_oss-rows192)")
    ap.add_argument("--with-persistent", action="store_true",
                    help="also time torch_oss with the Hopper forward on a persistent grid of one CTA per SM "
                         "and on a grid of one CTA per block of query rows (columns torch_oss-persistent, "
                         "torch_oss-per-block)")
    ap.add_argument("--layout", choices=("bhld", "blhd"), default="bhld",
                    help="blhd: inputs that are (B, L, H, D) memory seen as (B, H, L, D), and each forward "
                         "followed by out.transpose(1, 2).contiguous(), as a model's attention function does")
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: as many as query heads)")
    ap.add_argument("--mask", choices=("none", "padding", "bool", "additive", "causal-padding"), default="none",
                    help="a mask tensor with every call (see above)")
    ap.add_argument("--with-mask-elementwise", action="store_true",
                    help="also torch_oss with the mask in rows the copy engine cannot address")
    ap.add_argument("--kernels", action="store_true",
                    help="also the GPU time of each kernel of torch_oss's and SDPA cuDNN's calls, for each mode "
                         "(fwd: the forward; train-fwd: the forward with inputs that require grad; fwd+bwd: "
                         "the backward alone) (torch.profiler, us per call)")
    args = ap.parse_args()
    device = args.device
    if args.kernels and device != "cuda":
        ap.error("--kernels times CUDA kernels: it needs --device cuda")
    gpu = device == "cuda"
    dtypes = args.dtypes or (["bfloat16", "float16"] if gpu else ["float32"])
    hdims = [int(x) for x in (args.hdims or ("64,128,192,256" if gpu else "64")).split(",")]
    seqlens = [int(x) for x in (args.seqlens or ("512,1024,2048,4096,8192,16384" if gpu else "256,512,1024")).split(",")]
    tokens = args.tokens or (16384 if gpu else 2048)
    width = args.width or (2048 if gpu else 256)
    causals = [bool(int(c)) for c in args.causal.split(",")]
    modes = args.modes.split(",")
    kernel_parts = {"fwd": "forward", "train-fwd": "training forward", "fwd+bwd": "backward"}
    for mode in modes:
        if mode not in kernel_parts:
            ap.error(f"--modes: unknown mode {mode!r} ({', '.join(kernel_parts)})")
    env = common.environment(device)
    print(f"attention benchmark on {env.get('gpu', env.get('cpu'))}, torch {env['torch']}, commit {env['commit']}")

    impls = {"torch_oss": lambda: attention_kernels(forward="best", backward="best", dq_centring=True)}
    if args.with_mma:
        impls["torch_oss-mma"] = lambda: attention_kernels(forward="mma", backward="mma", dq_centring=True)
    if args.with_uncentred:
        impls["torch_oss-uncentred"] = lambda: attention_kernels(forward="best", backward="best", dq_centring=False)
    if args.with_persistent:
        impls["torch_oss-persistent"] = lambda: attention_kernels(forward="best", backward="best", dq_centring=True,
                                                                  forward_ctas_per_sm=1)
        impls["torch_oss-per-block"] = lambda: attention_kernels(forward="best", backward="best", dq_centring=True,
                                                                 forward_ctas_per_sm=-1)
    if args.with_block_rows:
        for rows in (128, 192):
            impls[f"torch_oss-rows{rows}"] = functools.partial(attention_kernels, forward="best", backward="best",
                                                               dq_centring=True, forward_block_rows=rows)
    if args.with_mask_elementwise:  # the same kernel choices; fwd() passes the mask in unaligned rows
        if args.mask == "none":
            ap.error("--with-mask-elementwise needs --mask")
        impls["torch_oss-elementwise-mask"] = impls["torch_oss"]
    if args.with_deterministic:  # the same kernel choices; fwd() passes deterministic=True
        impls["torch_oss-deterministic"] = impls["torch_oss"]
    impls.update(sdpa_backends(device))
    records, breakdowns = [], []
    for dname in dtypes:
        dtype = common.DTYPES[dname]
        for D in hdims:
            H = width // D
            for N in seqlens:
                B = max(1, tokens // N)
                Hkv = args.kv_heads or H
                gqa = Hkv != H
                blhd = args.layout == "blhd"
                # leaves (B, L, H, D) where a model's projections would give them, viewed as (B, H, L, D)
                q, k, v = ((torch.randn(B, N, h, D, dtype=dtype, device=device, requires_grad=True).transpose(1, 2)
                            if blhd else torch.randn(B, h, N, D, dtype=dtype, device=device, requires_grad=True))
                           for h in (H, Hkv, Hkv))
                dout = torch.randn(B, N, H, D, dtype=dtype, device=device) if blhd else \
                    torch.randn(B, H, N, D, dtype=dtype, device=device)
                mask = make_mask(args.mask, B, H, N, dtype, device)
                unaligned = None
                if mask is not None and args.with_mask_elementwise:
                    pitch = N + 16 // mask.element_size() + 1
                    unaligned = mask.new_zeros(*mask.shape[:-1], pitch)[..., :N]
                    unaligned.copy_(mask)
                for causal in causals:
                    if mask is not None and causal:
                        continue
                    with torch.no_grad():
                        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                                  enable_gqa=gqa)
                        if blhd:
                            expected = expected.transpose(1, 2)
                    for name, ctx in impls.items():
                        with ctx():  # the SDPA backend, or torch_oss's kernel choices
                            def fwd():
                                if name.startswith("torch_oss"):
                                    m = unaligned if name == "torch_oss-elementwise-mask" else mask
                                    out = torch_oss.attention(q, k, v, attn_mask=m, is_causal=causal, enable_gqa=gqa,
                                                              deterministic=name == "torch_oss-deterministic")
                                else:
                                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                                         enable_gqa=gqa)
                                return out.transpose(1, 2).contiguous() if blhd else out

                            try:
                                with torch.no_grad():
                                    got = fwd()
                            except RuntimeError as e:  # a backend that does not take this shape
                                print(f"  {name} unavailable for {dname} hd{D} N{N}: {str(e).splitlines()[0][:80]}")
                                continue
                            # beyond one rounding of each value's own magnitude (an output of 4 or
                            # more is a bfloat16 step of 2^-5 from its neighbours, past the bound)
                            eps = torch.finfo(dtype).eps
                            err = ((got.float() - expected.float()).abs() - eps * expected.float().abs()).max().item()
                            tol = 2e-2 if dtype != torch.float32 else 1e-4
                            if not err <= tol:
                                raise AssertionError(f"{name} {dname} hd{D} N{N} causal={causal}: max diff {err:.3e} "
                                                     "from SDPA; not timing a wrong kernel")
                            del got
                            for mode in modes:
                                if mode == "fwd":
                                    def run():
                                        with torch.no_grad():
                                            fwd()
                                elif mode == "train-fwd":  # autograd records: what a training step's forward writes
                                    run = fwd
                                else:
                                    leaves = [t._base if blhd else t for t in (q, k, v)]

                                    def run():
                                        for t in leaves:
                                            t.grad = None
                                        fwd().backward(dout)
                                if gpu:
                                    torch.cuda.synchronize()
                                    torch.cuda.reset_peak_memory_stats()
                                base = torch.cuda.memory_allocated() if gpu else 0
                                ms = common.bench(run, device)
                                peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if gpu else None
                                tflops = flops(B, H, N, D, causal, mode) / (ms * 1e-3) / 1e12
                                records.append(dict(dtype=dname, hdim=D, heads=H, kv_heads=Hkv, layout=args.layout,
                                                    mask=args.mask,
                                                    batch=B, seqlen=N, causal=causal, mode=mode, impl=name, ms=ms,
                                                    tflops=tflops, peak_extra_mib=peak))
                                if args.kernels and name in ("torch_oss", "sdpa-cudnn"):
                                    if mode == "fwd+bwd":  # the backward's kernels alone
                                        out = fwd()
                                        kernels = common.kernel_breakdown_us(
                                            lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                                        del out
                                    else:
                                        kernels = common.kernel_breakdown_us(run)
                                    breakdowns.append(dict(dtype=dname, hdim=D, seqlen=N, causal=causal, impl=name,
                                                           part=kernel_parts[mode], kernels=kernels))
                del q, k, v, dout, expected, mask, unaligned

    names = list(dict.fromkeys(r["impl"] for r in records))
    peers = [n for n in names if not n.startswith("torch_oss")]
    header = ["dtype", "hd", "causal", "seqlen", "mode"] + names + [f"vs {p.replace('sdpa-', '')}" for p in peers]
    keys = list(dict.fromkeys((r["dtype"], r["hdim"], r["causal"], r["seqlen"], r["mode"]) for r in records))
    rows = []
    for key in keys:
        by = {r["impl"]: r for r in records if (r["dtype"], r["hdim"], r["causal"], r["seqlen"], r["mode"]) == key}
        line = [key[0], key[1], "yes" if key[2] else "no", key[3], key[4]]
        line += [(f"{by[n]['tflops']:.0f}" if by[n]["tflops"] >= 10 else f"{by[n]['tflops']:.3f}") if n in by else "-"
                 for n in names]
        ours = by.get("torch_oss")
        for peer in peers:
            line.append(f"{ours['tflops'] / by[peer]['tflops']:.2f}x" if ours and peer in by else "-")
        rows.append(line)
    masked = "" if args.mask == "none" else f", {args.mask} mask"
    common.print_table(f"attention TFLOP/s{masked} ('vs X' = torch_oss speed / X's speed)", header, rows)
    for b in breakdowns:
        rows = [[name, f"{us:.1f}"] for name, us in sorted(b["kernels"].items(), key=lambda kv: -kv[1])]
        rows.append(["total", f"{sum(b['kernels'].values()):.1f}"])
        common.print_table(f"{b['impl']} {b['part']} kernels, {b['dtype']} hd{b['hdim']} N{b['seqlen']} "
                           f"{'causal' if b['causal'] else 'full'} (us per call)", ["kernel", "us"], rows)
    common.write_json(f"attention_{device}", dict(env=env, records=records, kernels=breakdowns))
    panels = {}
    for r in records:
        panel = f"{r['dtype']} hd{r['hdim']} {'causal' if r['causal'] else 'full'} {r['mode']}"
        panels.setdefault(panel, {}).setdefault(r["impl"], []).append((r["seqlen"], r["tflops"]))
    if len(panels) > 8:  # keep the figure readable: bf16 only
        panels = {k: v for k, v in panels.items() if k.startswith(dtypes[0])}
    common.plot_lines(f"attention_{device}", panels, "seqlen", "TFLOP/s", title=env.get("gpu", env.get("cpu", "")))


if __name__ == "__main__":
    main()
