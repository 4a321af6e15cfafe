"""Attention score variants: forward and forward+backward TFLOP/s of each variant
against the plain kernel at the same shape, and against FlexAttention (compiled)
expressing the same variant, in the same run.

Shapes: batch x seqlen = 16k tokens, heads x head dim = 2048, causal, bf16.
Variants: plain causal, a sliding window of 1024 keys (left), softcap 50, ALiBi,
sinks, a window with sinks (a gpt-oss local layer), dropout 0.1; the peers: FlexAttention at head dim 128, seqlen 8k (it
compiles per variant and shape; it has no sink term, nor dropout), and for
dropout SDPA's default backend with the same dropout_p at every point. FLOPs count the work inside the causal rule and the window (4 * visible
pairs * head dim for the forward, 2.5x that for the backward), so a window's
TFLOP/s is comparable with the plain kernel's. First, a window of 4k at seqlen 32k
is timed against full causal attention (time ratio). Every implementation's
output is checked once against a float32 PyTorch computation before timing
(with dropout, only that it differs from it by a plausible amount: the masks
are random; tests/test_dropout.py checks the values).

    python bench/variants.py              # GPU
    python bench/variants.py --no-flex    # without FlexAttention (no compilation)
    python bench/variants.py --variants dropout   # some variants only (plain always runs)
    python bench/variants.py --smoke      # tiny shapes, CPU or GPU, one rep (what a run without a GPU does)
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
import common  # noqa: E402

import torch_oss  # noqa: E402

WINDOW = 1024
SOFTCAP = 50.0
DROPOUT = 0.1
VARIANTS = ("plain", "window", "softcap", "alibi", "sinks", "window_sinks", "dropout")
FLEX_POINT = (128, 8192)  # FlexAttention compiles per variant and shape: one point keeps the run short


def visible_pairs(L, window):
    """(query, key) pairs under the causal rule and a left window (None: none)."""
    if window is None or window >= L:
        return L * (L + 1) // 2
    w = window + 1  # keys i - window .. i
    return w * (w + 1) // 2 + (L - w) * w


def variant_kwargs(name, H, device):
    if name == "window":
        return dict(window_size=(WINDOW, 0))
    if name == "softcap":
        return dict(softcap=SOFTCAP)
    if name == "alibi":
        return dict(alibi_slopes=torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], device=device))
    if name == "sinks":
        return dict(sinks=torch.randn(H, device=device))
    if name == "window_sinks":
        return dict(window_size=(WINDOW, 0), sinks=torch.randn(H, device=device))
    if name == "dropout":
        return dict(dropout_p=DROPOUT)
    return {}


def reference(q, k, v, kw):
    """float32 definition of the variant (causal, bottom-right = top-left here;
    without the dropout, which is random)."""
    L, D = q.shape[-2], q.shape[-1]
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D)
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    i = torch.arange(L, device=q.device)[:, None]
    j = torch.arange(L, device=q.device)[None, :]
    if "alibi_slopes" in kw:
        s = s - kw["alibi_slopes"].reshape(1, -1, 1, 1) * (i - j).abs().float()
    hidden = j > i
    if "window_size" in kw:
        hidden |= (i - j) > kw["window_size"][0]
    s = s.masked_fill(hidden, float("-inf"))
    if "sinks" in kw:
        s = torch.cat([s, kw["sinks"].float().reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1)[..., :L]
    return p @ v.float()


def flex_fn(name, kw, L, device):
    """FlexAttention (compiled) with the variant as score/mask modifiers, or None."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    if "sinks" in kw:
        return None  # no sink term in FlexAttention's softmax
    if name == "window":
        mask_mod = lambda b, h, q, k: (k <= q) & (q - k <= WINDOW)  # noqa: E731
    else:
        mask_mod = lambda b, h, q, k: k <= q  # noqa: E731
    score_mod = None
    if name == "softcap":
        score_mod = lambda s, b, h, q, k: SOFTCAP * torch.tanh(s / SOFTCAP)  # noqa: E731
    elif name == "alibi":
        slopes = kw["alibi_slopes"]
        score_mod = lambda s, b, h, q, k: s - slopes[h] * (q - k).abs()  # noqa: E731
    block_mask = create_block_mask(mask_mod, None, None, L, L, device=device)
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)


def window_32k(args, device, dtype, width, records):
    """A window of 4k keys at 32k against full causal attention, forward+backward time."""
    L, hd = (32 * 1024, 128) if not args.smoke else (256, 32)
    B, H = 1, width // hd
    q, k, v = (torch.randn(B, H, L, hd, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    times = {}
    for name, kw in (("causal", {}), ("window 4k", dict(window_size=(4096 if not args.smoke else 32, 0)))):
        times[name] = common.bench(lambda kw=kw: torch_oss.attention(q, k, v, is_causal=True, **kw).backward(dout),
                                   device, rep_ms=args.rep_ms)
    ratio = times["window 4k"] / times["causal"]
    print(f"\nseqlen {L}, hd {hd}: window 4k forward+backward {times['window 4k']:.2f} ms, full causal "
          f"{times['causal']:.2f} ms: {ratio:.3f} of causal")
    records.append(dict(seqlen=L, head_dim=hd, window_ms=times["window 4k"], causal_ms=times["causal"],
                        ratio=ratio))


def run(args):
    device = "cuda" if torch.cuda.is_available() and not args.device == "cpu" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokens, width = (16 * 1024, 2048) if not args.smoke else (256, 64)
    points = [(hd, L) for hd in ((64, 128) if not args.smoke else (32,)) for L in
              ((2048, 8192) if not args.smoke else (128,))]
    names = [n for n in VARIANTS if n == "plain" or n in args.variants]
    rows, records = [], []
    torch.manual_seed(0)
    if "window" in names:
        window_32k(args, device, dtype, width, records)
    for hd, L in points:
        B, H = max(1, tokens // L), width // hd
        q, k, v = (torch.randn(B, H, L, hd, device=device, dtype=dtype) for _ in range(3))
        dout = torch.randn_like(q)
        plain_t = {}
        for name in names:
            kw = variant_kwargs(name, H, device)
            pairs = visible_pairs(L, WINDOW if "window_size" in kw else None)
            fwd_flops = 4 * B * H * pairs * hd
            impls = {"torch_oss": lambda q, k, v, kw=kw: torch_oss.attention(q, k, v, is_causal=True, **kw)}
            if name == "dropout":
                impls["sdpa"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=DROPOUT,
                                                                               is_causal=True)
            elif not args.no_flex and device == "cuda" and (hd, L) == FLEX_POINT:
                f = flex_fn(name, kw, L, device)
                if f is not None:
                    impls["flex"] = f
            ref = reference(q[:1, :2], k[:1, :2], v[:1, :2], {n: (t[:2] if isinstance(t, torch.Tensor) else t)
                                                             for n, t in kw.items()})
            for impl, fn in impls.items():
                out = fn(q, k, v)
                err = ((out[:1, :2].float() - ref).abs().max() / ref.abs().max()).item()
                plausible = 1e-3 < err < 2 if name == "dropout" else err <= 2e-2
                if not plausible:
                    raise AssertionError(f"{impl} {name} hd{hd} L{L}: max error {err:.3e} against the reference "
                                         f"{'without dropout' if name == 'dropout' else ''}; not timing it")
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]

                def fb(fn=fn, leaves=leaves):
                    fn(*leaves).backward(dout)

                t_f = common.bench(lambda fn=fn: fn(q, k, v), device, rep_ms=args.rep_ms)
                t_fb = common.bench(fb, device, rep_ms=args.rep_ms)
                tf_f, tf_fb = fwd_flops / t_f / 1e9, 3.5 * fwd_flops / t_fb / 1e9
                if impl == "torch_oss" and name == "plain":
                    plain_t = {"f": tf_f, "fb": tf_fb}
                rec = dict(head_dim=hd, seqlen=L, batch=B, heads=H, variant=name, impl=impl, ms_fwd=t_f,
                           ms_fwd_bwd=t_fb, tflops_fwd=tf_f, tflops_fwd_bwd=tf_fb)
                if impl == "torch_oss" and plain_t:
                    rec.update(vs_plain_fwd=tf_f / plain_t["f"], vs_plain_fwd_bwd=tf_fb / plain_t["fb"])
                records.append(rec)
                print(f"hd {hd} L {L} {name:8s} {impl:9s} fwd {tf_f:6.1f} TFLOP/s  fwd+bwd {tf_fb:6.1f} TFLOP/s"
                      + (f"  ({tf_f / plain_t['f']:.2f} / {tf_fb / plain_t['fb']:.2f} of plain)"
                         if impl == "torch_oss" and plain_t else ""), flush=True)
        for name in names:
            ours = next(r for r in records if r["head_dim"] == hd and r["seqlen"] == L and r["variant"] == name
                        and r["impl"] == "torch_oss")
            flex = next((r for r in records if r["head_dim"] == hd and r["seqlen"] == L and r["variant"] == name
                         and r["impl"] in ("flex", "sdpa")), None)
            rows.append([hd, L, name, f"{ours['tflops_fwd']:.0f}", f"{ours['tflops_fwd_bwd']:.0f}",
                         f"{ours.get('vs_plain_fwd', 1):.2f}", f"{ours.get('vs_plain_fwd_bwd', 1):.2f}",
                         "-" if flex is None else f"{flex['tflops_fwd']:.0f}",
                         "-" if flex is None else f"{flex['tflops_fwd_bwd']:.0f}",
                         "-" if flex is None else f"{ours['tflops_fwd'] / flex['tflops_fwd']:.2f}",
                         "-" if flex is None else f"{ours['tflops_fwd_bwd'] / flex['tflops_fwd_bwd']:.2f}"])
    common.print_table(f"score variants, {dtype}, causal, TFLOP/s (work inside the window); peer: compiled "
                       f"FlexAttention, or SDPA for dropout",
                       ["hd", "L", "variant", "fwd", "fwd+bwd", "/plain fwd", "/plain f+b", "peer fwd",
                        "peer f+b", "/peer fwd", "/peer f+b"], rows)
    common.write_json("variants", dict(env=common.environment(device), records=records))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    args = p.parse_args()
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        p.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    args.smoke = args.smoke or not torch.cuda.is_available()  # no GPU: the smoke run
    if args.smoke:
        args.rep_ms = 1
    run(args)


if __name__ == "__main__":
    main()
