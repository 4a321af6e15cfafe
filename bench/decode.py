"""Decode (inference) benchmark: one query token per sequence against a long KV
cache, torch_oss against every SDPA backend in the same run.

1. SDPA layout, q (B, Hq, 1, D), k/v (B, Hkv, L, D): torch_oss.attention against
   F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION / CUDNN_ATTENTION /
   EFFICIENT_ATTENTION), enable_gqa where Hq != Hkv. A backend that refuses a shape
   shows "-". Grid: batch x KV length x heads (Hq/Hkv) x head dim, plus two extra
   points; points whose K+V exceed 25 % of the GPU's memory are skipped.
2. KV-cache API, FlashAttention layout, q (B, 1, Hq, D): torch_oss.attention_with_kvcache
   on a contiguous cache (B, Lmax, Hkv, D) against a paged one (num_blocks, page_size,
   Hkv, D) with page sizes 16 and 256 and a block_table that scatters the pages in a
   random order (validate=False: the default value checks cost a host synchronisation
   per call); skipped when torch_oss has no attention_with_kvcache.

3. Score variants on the KV cache (contiguous cache, FlashAttention layout):
   attention_with_kvcache with a sliding window (Mistral-style, 4k keys), softcap
   (Gemma 2), ALiBi slopes, attention sinks (gpt-oss), and window + softcap and
   window + sinks together, each against the plain call at the same point. "speed vs
   plain" is the plain call's time over the variant's; a window's row also gives the
   bandwidth of the keys it can see (the bytes a windowed kernel must read).

Bytes counted: K + V read once, 2 * B * Hkv * L * D * element size; q and the output
(B * Hq * D elements each) are left out, being negligible next to the cache. Bandwidth
is given as % of a device-to-device copy's bandwidth (read + write) measured in the
same run. Times are common.bench_stats medians (triton's do_bench, the L2 flushed
before each call) after short warm-up, each implementation timed once in each of
--rounds rounds (alternating order) and the median over the rounds kept; the JSON also
has the trimmed means. Every implementation's output is checked once per shape, before
timing, against a float32 reference; a wrong result stops the run.

    python bench/decode.py                  # full grid on the GPU (bf16), sized for under ~3 min on an H100
    python bench/decode.py --quick          # reduced grid
    python bench/decode.py --dtype float16
    python bench/decode.py --smoke          # tiny shapes, CPU (or GPU if visible), one rep: runs end to end
                                            # (what a run without a GPU does)
"""

import argparse
import math
import sys
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
import common  # noqa: E402

import torch_oss  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
K = 1024


def grid(quick, smoke):
    """[(batch, kv length, Hq, Hkv, head dim)]"""
    if smoke:
        return [(2, L, hq, hkv, D) for D in (32, 64) for (hq, hkv) in ((4, 2), (4, 4)) for L in (64, 100)]
    if quick:
        batches, lens, heads, hdims = (1, 8, 32), (4 * K, 32 * K), ((32, 8), (32, 32)), (128,)
    else:
        batches, lens, heads, hdims = (1, 8, 32, 128), (K, 4 * K, 32 * K, 128 * K), ((32, 8), (32, 32), (64, 8)), \
            (64, 128)
    points = [(B, L, hq, hkv, D) for D in hdims for (hq, hkv) in heads for B in batches for L in lens]
    for extra in ((1, 64 * K, 16, 2, 64), (1, 128 * K, 64, 8, 128)):
        if extra not in points:
            points.append(extra)
    return points


def kv_bytes(B, L, Hkv, D, dtype):
    return 2 * B * Hkv * L * D * torch.tensor([], dtype=dtype).element_size()


def fmt_len(L):
    return f"{L // K}k" if L % K == 0 and L >= K else str(L)


def reference(q, k, v):
    """float32 attention of q (B, Hq, 1, D) over k/v (B, Hkv, L, D), query head h
    reading KV head h // (Hq / Hkv) (SDPA's enable_gqa), a few sequences at a time
    so that the float32 copies of K and V stay near 1 GiB."""
    B, Hq, _, D = q.shape
    Hkv = k.shape[1]
    out = torch.empty(B, Hq, 1, D, dtype=torch.float32, device=q.device)
    chunk = max(1, 2**30 // (2 * k[0].numel() * 4))
    for b0 in range(0, B, chunk):
        b1 = min(B, b0 + chunk)
        qs = q[b0:b1].float().reshape(b1 - b0, Hkv, Hq // Hkv, D)
        s = torch.matmul(qs, k[b0:b1].float().transpose(-1, -2)) / math.sqrt(D)
        out[b0:b1] = torch.matmul(torch.softmax(s, -1), v[b0:b1].float()).reshape(b1 - b0, Hq, 1, D)
        del qs, s
    return out


def check(name, got, ref, dtype, where):
    """Refuse to time a wrong result: max |got - ref| relative to max |ref| (the
    output's scale shrinks as L grows, so an absolute bound would pass zeros)."""
    err = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    if not err <= tol:
        raise AssertionError(f"{name} {where}: max error {err:.3e} of max |ref| (> {tol:g}); "
                             "not timing a wrong kernel")


def sdpa_backends():
    """name -> context manager factory selecting an SDPA backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return {name: (lambda b=backend: sdpa_kernel(b)) for name, backend in (
        ("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
        ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION))}


def try_call(fn, ctx=nullcontext):
    """(result, None), or (None, first line of the error) for an implementation that
    refuses the shape (SDPA's 'no available kernel' warnings silenced)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with ctx():
                return fn(), None
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
        if isinstance(e, torch.OutOfMemoryError):
            torch.cuda.empty_cache()
        return None, (str(e).strip().splitlines() or [type(e).__name__])[0][:100]


def time_in_rounds(fns, device, timing, rounds):
    """{name: (median ms, trimmed-mean ms)} of the implementations fns (name -> (fn,
    context factory)) at one point, by common.time_rounds. Every point takes rounds:
    the implementation timed first at a point that follows a heavy one can run slow (by
    up to 13 % on short calls), so one round would charge that to whichever goes first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = common.time_rounds({name: fn for name, (fn, _) in fns.items()}, rounds, device,
                                   contexts={name: ctx for name, (_, ctx) in fns.items()}, **timing)
    return {name: (med, trimmed) for name, (med, _, trimmed, _) in stats.items()}


def point_record(nbytes, copy_gbs, stats, **fields):
    ms, ms_trimmed = stats
    return dict(fields, us=ms * 1e3, us_trimmed=ms_trimmed * 1e3, gbs=nbytes / ms / 1e6,
                pct_copy=100 * nbytes / ms / 1e6 / copy_gbs,
                pct_copy_trimmed=100 * nbytes / ms_trimmed / 1e6 / copy_gbs)


def cell(r):
    return f"{r['us']:.1f} ({r['pct_copy']:.0f}%)" if r else "-"


def decode_sdpa_layout(points, dtype, device, copy_gbs, timing, mem_cap, rounds):
    """Section 1: torch_oss.attention against the SDPA backends."""
    impls = {"torch_oss": nullcontext, **sdpa_backends()}
    records, rows, skipped, unavailable = [], [], [], {}
    for (B, L, Hq, Hkv, D) in points:
        nbytes = kv_bytes(B, L, Hkv, D, dtype)
        label = f"B{B} L{fmt_len(L)} {Hq}/{Hkv} hd{D}"
        if mem_cap is not None and nbytes > mem_cap:
            skipped.append(label)
            print(f"  skipped {label}: K+V {nbytes / 2**30:.1f} GiB > 25% of GPU memory")
            continue
        gqa = Hq != Hkv
        q = torch.randn(B, Hq, 1, D, dtype=dtype, device=device)
        k = torch.randn(B, Hkv, L, D, dtype=dtype, device=device)
        v = torch.randn(B, Hkv, L, D, dtype=dtype, device=device)
        ref = reference(q, k, v)
        fns = {}
        for name, ctx in impls.items():
            if name == "torch_oss":
                def fn():
                    return torch_oss.attention(q, k, v, enable_gqa=gqa)
            else:
                def fn():
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            got, err = try_call(fn, ctx)
            if got is None:
                unavailable.setdefault((name, err), []).append(label)
                continue
            check(name, got, ref, dtype, label)
            del got
            fns[name] = (fn, ctx)
        by = {}
        for name, stats in time_in_rounds(fns, device, timing, rounds).items():
            by[name] = point_record(nbytes, copy_gbs, stats, section="sdpa_layout", impl=name, batch=B, kv_len=L,
                                    hq=Hq, hkv=Hkv, hdim=D, kv_bytes=nbytes)
            records.append(by[name])
        del q, k, v, ref
        if device == "cuda":
            torch.cuda.empty_cache()
        sdpa = [r for n, r in by.items() if n != "torch_oss"]
        best = min(sdpa, key=lambda r: r["us"]) if sdpa else None
        ours = by.get("torch_oss")
        ratio = ours["us"] / best["us"] if ours and best else None
        if ours:
            ours["vs_best_sdpa"] = ratio
            ours["best_sdpa"] = best["impl"] if best else None
        rows.append([B, fmt_len(L), f"{Hq}/{Hkv}", D, f"{nbytes / 2**20:.1f}"] + [cell(by.get(n)) for n in impls]
                    + [best["impl"].replace("sdpa-", "") if best else "-", f"{ratio:.2f}" if ratio else "-"])
    header = ["B", "L", "Hq/Hkv", "hd", "K+V MiB"] + [f"{n} us (%copy)" for n in impls] + ["best sdpa", "oss/best"]
    common.print_table("decode, SDPA layout: median us (% of copy bandwidth, K+V bytes); "
                       "oss/best = torch_oss time / best SDPA backend's time", header, rows)
    for (name, err), labels in unavailable.items():
        print(f"  {name} refused {len(labels)} point(s) ({', '.join(labels[:3])}{', ...' if len(labels) > 3 else ''}): "
              f"{err}")
    return records, skipped


def paged_copy(k_cache, v_cache, seqlen, page, fill):
    """Contiguous caches (B, Lmax, Hkv, D) -> (k_pages, v_pages, block_table): pages
    (B * n, page, Hkv, D), n = ceil(seqlen / page), block_table (B, n) int32 a random
    permutation of the pages (so a sequence's pages are scattered); positions past
    seqlen in a last partial page hold `fill`."""
    B, _, Hkv, D = k_cache.shape
    n = -(-seqlen // page)
    table = torch.randperm(B * n, device=k_cache.device).reshape(B, n)
    out = []
    for cache in (k_cache, v_cache):
        padded = torch.full((B, n * page, Hkv, D), fill, dtype=cache.dtype, device=cache.device)
        padded[:, :seqlen] = cache[:, :seqlen]
        pages = torch.empty(B * n, page, Hkv, D, dtype=cache.dtype, device=cache.device)
        pages[table.reshape(-1)] = padded.reshape(B * n, page, Hkv, D)
        out.append(pages)
        del padded
    return out[0], out[1], table.to(torch.int32)


def decode_kvcache(shapes, dtype, device, copy_gbs, timing, rounds):
    """Section 2: attention_with_kvcache on a contiguous against a paged cache."""
    kvcache = getattr(torch_oss, "attention_with_kvcache", None)
    if kvcache is None:
        print("\nnote: torch_oss.attention_with_kvcache does not exist in this build; KV-cache section skipped")
        return []
    layouts = ("contiguous", "paged-16", "paged-256")
    records, rows = [], []
    fill = 100.0  # past cache_seqlens: dominates the scores if a kernel reads it unmasked
    for (B, L, Hq, Hkv, D) in shapes:
        nbytes = kv_bytes(B, L, Hkv, D, dtype)
        label = f"kvcache B{B} L{fmt_len(L)} {Hq}/{Hkv} hd{D}"
        lmax = -(-L // 256) * 256
        q = torch.randn(B, 1, Hq, D, dtype=dtype, device=device)
        k_cache = torch.full((B, lmax, Hkv, D), fill, dtype=dtype, device=device)
        v_cache = torch.full((B, lmax, Hkv, D), fill, dtype=dtype, device=device)
        k_cache[:, :L].normal_()
        v_cache[:, :L].normal_()
        seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
        ref = reference(q.transpose(1, 2), k_cache[:, :L].transpose(1, 2), v_cache[:, :L].transpose(1, 2))
        ref = ref.transpose(1, 2)  # (B, 1, Hq, D)
        fns = {}
        for layout in layouts:
            if layout == "contiguous":
                kc, vc, table = k_cache, v_cache, None
            else:
                kc, vc, table = paged_copy(k_cache, v_cache, L, int(layout.split("-")[1]), fill)

            def fn(kc=kc, vc=vc, table=table):
                # validate=False: the inputs are known good, and the value checks cost a host sync
                return kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True, validate=False)

            got, err = try_call(fn)
            if got is None:
                print(f"  {layout} unavailable for {label}: {err}")
                continue
            check(f"attention_with_kvcache {layout}", got, ref, dtype, label)
            del got
            fns[layout] = (fn, nullcontext)
        by = {}
        for layout, stats in time_in_rounds(fns, device, timing, rounds).items():
            by[layout] = point_record(nbytes, copy_gbs, stats, section="kvcache", impl=f"torch_oss-{layout}",
                                      layout=layout, batch=B, kv_len=L, hq=Hq, hkv=Hkv, hdim=D, kv_bytes=nbytes)
            records.append(by[layout])
        del fns
        base = by.get("contiguous")
        for layout in layouts[1:]:
            if base and layout in by:
                by[layout]["vs_contiguous"] = by[layout]["us"] / base["us"]
        rows.append([B, fmt_len(L), f"{Hq}/{Hkv}", D, f"{nbytes / 2**20:.1f}"] + [cell(by.get(x)) for x in layouts]
                    + [f"{by[x]['vs_contiguous']:.2f}" if x in by and base else "-" for x in layouts[1:]])
        del q, k_cache, v_cache, seqlens, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    header = ["B", "L", "Hq/Hkv", "hd", "K+V MiB"] + [f"{x} us (%copy)" for x in layouts] + \
        [f"{x}/contig" for x in layouts[1:]]
    common.print_table("decode, attention_with_kvcache: median us (% of copy bandwidth, K+V bytes); "
                       "paged/contig = time ratio", header, rows)
    return records


def variant_reference(q, k, v, seqlens, window_left=-1, softcap=0.0, alibi=None, sinks=None):
    """float32 attention of the newest query (position seqlen - 1 of each
    sequence) of q (B, 1, Hq, D) over the cache k/v (B, Lmax, Hkv, D) with the
    score variants, FlashAttention's conventions (ALiBi bias -slope * distance,
    the sink one more logit in each row's softmax with no value); one sequence
    at a time."""
    B, _, Hq, D = q.shape
    Hkv = k.shape[2]
    out = torch.empty(B, 1, Hq, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        n = int(seqlens[b])
        kb = k[b, :n].float().transpose(0, 1).repeat_interleave(Hq // Hkv, 0)  # (Hq, n, D)
        vb = v[b, :n].float().transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        s = torch.matmul(q[b].float().transpose(0, 1), kb.transpose(-1, -2))[:, 0] / math.sqrt(D)  # (Hq, n)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        dist = (n - 1 - torch.arange(n, device=q.device)).float()
        if alibi is not None:
            s = s - alibi[:, None] * dist
        if window_left >= 0:
            s = s.masked_fill(dist > window_left, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks[:, None].float()], 1)
        p = torch.softmax(s, -1)[:, :n]
        out[b, 0] = torch.matmul(p[:, None], vb)[:, 0]
    return out


def decode_variants(shapes, dtype, device, copy_gbs, timing, window, rounds):
    """Section 3: attention_with_kvcache with the score variants against the plain call."""
    kvcache = getattr(torch_oss, "attention_with_kvcache", None)
    if kvcache is None:
        return []
    records, rows = [], []
    for (B, L, Hq, Hkv, D) in shapes:
        nbytes = kv_bytes(B, L, Hkv, D, dtype)
        label = f"variants B{B} L{fmt_len(L)} {Hq}/{Hkv} hd{D}"
        q = torch.randn(B, 1, Hq, D, dtype=dtype, device=device)
        k_cache = torch.randn(B, L, Hkv, D, dtype=dtype, device=device)
        v_cache = torch.randn(B, L, Hkv, D, dtype=dtype, device=device)
        seqlens = torch.full((B,), L, dtype=torch.int32, device=device)
        alibi = torch.rand(Hq, device=device) * 2**-8
        sinks = torch.randn(Hq, device=device)
        variants = {
            "plain": ({}, {}),
            "window": (dict(window_size=(window, 0)), dict(window_left=window)),
            "softcap": (dict(softcap=30.0), dict(softcap=30.0)),
            "alibi": (dict(alibi_slopes=alibi), dict(alibi=alibi)),
            "sinks": (dict(sinks=sinks), dict(sinks=sinks)),
            "window+softcap": (dict(window_size=(window, 0), softcap=30.0), dict(window_left=window, softcap=30.0)),
            "window+sinks": (dict(window_size=(window, 0), sinks=sinks), dict(window_left=window, sinks=sinks)),
        }
        fns = {}
        for name, (kw, ref_kw) in variants.items():
            def fn(kw=kw):
                return kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, validate=False, **kw)

            got, err = try_call(fn)
            if got is None:
                print(f"  {name} unavailable for {label}: {err}")
                continue
            check(f"attention_with_kvcache {name}", got, variant_reference(q, k_cache, v_cache, seqlens, **ref_kw),
                  dtype, label)
            del got
            fns[name] = (fn, nullcontext)
        by = {}
        for name, stats in time_in_rounds(fns, device, timing, rounds).items():
            visible = nbytes * min(L, window + 1) // L if "window" in name else nbytes
            by[name] = point_record(visible, copy_gbs, stats, section="variants", impl=f"torch_oss-{name}",
                                    variant=name, batch=B, kv_len=L, hq=Hq, hkv=Hkv, hdim=D, kv_bytes=visible)
            records.append(by[name])
        base = by.get("plain")
        for name, r in by.items():
            if base:
                r["speed_vs_plain"] = base["us"] / r["us"]
            rows.append([B, fmt_len(L), f"{Hq}/{Hkv}", D, name, f"{r['us']:.1f}", f"{r['pct_copy']:.0f}",
                         f"{r['speed_vs_plain']:.2f}" if base else "-"])
        del q, k_cache, v_cache, seqlens
        if device == "cuda":
            torch.cuda.empty_cache()
    common.print_table(f"decode with score variants, attention_with_kvcache (window = {window} keys back): median us, "
                       "% of copy bandwidth for the keys the call can see, speed vs the plain call",
                       ["B", "L", "Hq/Hkv", "hd", "variant", "us", "%copy", "speed vs plain"], rows)
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--quick", action="store_true", help="reduced grid: batch 1/8/32, KV 4k/32k, heads 32/8 and "
                                                         "32/32, hd 128 (plus the two extra points)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (GPU if visible), one timing rep: "
                                                         "checks the script and the results, not the speed")
    ap.add_argument("--warmup-ms", type=float, default=10)
    ap.add_argument("--rep-ms", type=float, default=40)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per point, every implementation timed once a round in alternating order; "
                         "the median over rounds (default 3; --smoke: 1)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        print("no GPU visible: the decode benchmark measures CUDA kernels; running the --smoke check instead")
        args.smoke = True
    dtype = DTYPES[args.dtype]
    timing = dict(warmup_ms=1, rep_ms=1) if args.smoke else dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    rounds = 1 if args.smoke else max(1, args.rounds)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference
    torch.manual_seed(0)

    env = common.environment(device)
    copy_gbs = common.copy_bandwidth_gbs(device, 2**24 if args.smoke else None)
    mem_cap = torch.cuda.get_device_properties(0).total_memory // 4 if device == "cuda" else None
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    print(f"decode benchmark ({mode}, {args.dtype}) on {env.get('gpu', env.get('cpu'))}, torch {env['torch']}, "
          f"commit {env['commit']}")
    print(f"copy ceiling: {copy_gbs:.0f} GB/s (read + write); bytes per point = K + V read once")

    records, skipped = decode_sdpa_layout(grid(args.quick, args.smoke), dtype, device, copy_gbs, timing, mem_cap, rounds)
    kv_shapes = [(2, L, 4, 2, D) for L in (64, 100) for D in (32, 64)] if args.smoke else \
        [(B, L, 32, 8, 128) for B in (1, 8) for L in (8 * K, 32 * K)]
    records += decode_kvcache(kv_shapes, dtype, device, copy_gbs, timing, rounds)
    var_shapes = [(2, 100, 4, 2, 64)] if args.smoke else [(1, 32 * K, 32, 8, 128), (8, 8 * K, 32, 8, 128)]
    records += decode_variants(var_shapes, dtype, device, copy_gbs, timing, 30 if args.smoke else 4 * K, rounds)
    if skipped:
        print(f"\nskipped (K+V > 25% of GPU memory): {', '.join(skipped)}")
    common.write_json("decode_smoke" if args.smoke else "decode",
                      dict(env=env, mode=mode, dtype=args.dtype, copy_gbs=copy_gbs, timing=timing, rounds=rounds,
                           bytes="K+V read once: 2*B*Hkv*L*D*elem_size", skipped=skipped, records=records))


if __name__ == "__main__":
    main()
