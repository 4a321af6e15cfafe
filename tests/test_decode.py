"""Decode and the KV cache: the split-KV forward behind torch_oss.attention for
few query rows per head (every split count forced, GQA packing, masks, both
causal alignments, key counts around the tile sizes: 128 keys at head dim 64,
64 above), and
torch_oss.attention_with_kvcache (contiguous and paged caches, appends,
per-sequence lengths, its errors, torch.compile and CUDA-graph capture), each
against float64 references by the tolerance rule. The score variants in the
decode kernel (window, softcap, ALiBi, sinks) over KV caches and for few
query rows: forced split counts, pages, GQA with per-(batch, head) slopes,
rows that see no key, speculative rows; their peer is the variants'
definition computed in float32 (test_variants.variant_reference)."""

import pytest
import torch

import torch_oss
from torch_oss._kernels import attention_kernels

from _util import (ATTENTION_ATOL, DEVICES, NVCC_SKIP, assert_tolerance, attention_reference, cuda_param, lse_peer,
                   ptxas_report, sdpa_peer, seeded)
from test_variants import draw_variants, variant_reference

CUDA_ONLY = [cuda_param("cuda")]


def _randn(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


# ---------------------------------------------------------------------------
# the decode kernel behind torch_oss.attention (SDPA layout)
# ---------------------------------------------------------------------------

# (batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v)
DECODE_CASES = [
    (1, 8, 2, 1, 1, 64, 64),
    (2, 8, 2, 1, 15, 128, 128),
    (2, 4, 4, 1, 16, 128, 128),
    (1, 32, 8, 1, 17, 128, 128),
    (3, 12, 1, 1, 1000, 64, 64),
    (2, 16, 4, 2, 257, 64, 64),
    (1, 16, 2, 4, 4173, 128, 128),
    (2, 8, 8, 16, 777, 80, 80),
    (1, 6, 2, 7, 300, 192, 128),
    (1, 4, 1, 3, 2050, 256, 256),
    (2, 64, 8, 1, 2000, 128, 128),
]
DECODE_IDS = ["b{}_h{}-{}_q{}_k{}_d{}-{}".format(*c) for c in DECODE_CASES]
SPLITS = [1, 2, 3, 8, 256]  # up to 8 (sm_90) the splits merge in a cluster, above through the workspace


def _check_decode(q, k, v, mask=None, is_causal=False, alignment="top_left", label=""):
    gqa = q.shape[1] != k.shape[1]
    out, lse = torch_oss.attention_with_lse(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa,
                                            causal_alignment=alignment)
    ref_out, ref_lse = attention_reference(q, k, v, mask, is_causal, None, gqa, alignment)
    atol = ATTENTION_ATOL[q.dtype]
    assert_tolerance(f"out {label}", out, ref_out, sdpa_peer(q, k, v, mask, is_causal, None, gqa, alignment), atol)
    assert_tolerance(f"lse {label}", lse, ref_lse, lse_peer(q, k, v, mask, is_causal, None, gqa, alignment), atol)
    return out, lse


@pytest.mark.parametrize("device", CUDA_ONLY)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("case", DECODE_CASES, ids=DECODE_IDS)
def test_decode_every_split_count(device, dtype, splits, case):
    seeded(hash((splits, case)) % 1000)
    B, Hq, Hkv, Lq, Lk, D, Dv = case
    q, k = _randn((B, Hq, Lq, D), dtype, device, 2.0), _randn((B, Hkv, Lk, D), dtype, device, 2.0)
    v = _randn((B, Hkv, Lk, Dv), dtype, device)
    with attention_kernels(decode_splits=splits):
        for is_causal, alignment in [(False, "top_left"), (True, "bottom_right"), (True, "top_left")]:
            _check_decode(q, k, v, is_causal=is_causal, alignment=alignment,
                          label=f"{dtype} splits={splits} causal={is_causal}/{alignment} {case}")


@pytest.mark.parametrize("device", CUDA_ONLY)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_masks_and_padding(device, dtype):
    """Padding masks as Hugging Face passes them in batched decode (bool and
    additive, broadcast over heads and the query), and rows that see no key."""
    B, Hq, Hkv, Lq, Lk, D = 4, 8, 2, 2, 530, 128
    q, k, v = (_randn(s, dtype, device, 2.0) for s in [(B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)])
    lengths = torch.tensor([530, 1, 300, 0], device=device)
    keep = torch.arange(Lk, device=device)[None, :] < lengths[:, None]
    bool_mask = keep[:, None, None, :]
    additive = torch.zeros(B, 1, Lq, Lk, dtype=dtype, device=device).masked_fill(~keep[:, None, None, :], -1e4)
    for splits in (0, 1, 5):
        with attention_kernels(decode_splits=splits):
            out, lse = _check_decode(q, k, v, mask=bool_mask, label=f"bool padding splits={splits}")
            assert torch.equal(out[3], torch.zeros_like(out[3])) and bool(torch.isneginf(lse[3]).all())
            _check_decode(q, k, v, mask=additive, label=f"additive padding splits={splits}")


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_decode_kernel_against_the_tile_kernel(device):
    """The decode kernel (default) and the FA2/Hopper tile kernels
    (decode_splits=-1) on the same decode call, both against float64; the
    decode kernel gives the same bits on every call."""
    B, Hq, Hkv, Lk, D = 2, 32, 8, 3000, 128
    q, k, v = (_randn(s, torch.bfloat16, device, 2.0) for s in [(B, Hq, 1, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)])
    first, _ = _check_decode(q, k, v, label="decode kernel")
    assert torch.equal(torch_oss.attention(q, k, v, enable_gqa=True), first)
    with attention_kernels(decode_splits=-1):
        _check_decode(q, k, v, label="tile kernel")


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_decode_same_bits_on_every_call(device):
    """Splits merged in a cluster (4) and through the workspace (16) give the
    same bits on every call."""
    B, Hq, Hkv, Lk, D = 1, 32, 8, 2000, 128
    q, k, v = (_randn(s, torch.bfloat16, device) for s in [(B, Hq, 1, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)])
    for splits in (4, 16):
        with attention_kernels(decode_splits=splits):
            first, first_lse = _check_decode(q, k, v, label=f"splits={splits}")
            for _ in range(4):
                out, lse = torch_oss.attention_with_lse(q, k, v, enable_gqa=True)
                assert torch.equal(out, first) and torch.equal(lse, first_lse), f"splits={splits}"


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_decode_128k_keys(device):
    B, Hq, Hkv, Lk, D = 1, 32, 8, 131072, 128
    q, k, v = (_randn(s, torch.bfloat16, device) for s in [(B, Hq, 1, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)])
    _check_decode(q, k, v, is_causal=True, alignment="bottom_right", label="128k keys")


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_decode_nan_and_unaligned_rows(device):
    """A NaN key makes its rows NaN with every split count (merged in a cluster
    and through the workspace); rows not 16-byte aligned take the tile kernel
    and still match."""
    B, Hq, Hkv, Lk, D = 1, 4, 2, 1400, 64
    q, k, v = (_randn(s, torch.float16, device) for s in [(B, Hq, 1, D), (B, Hkv, Lk, D), (B, Hkv, Lk, D)])
    k[0, 1, 650, 3] = float("nan")
    for splits in (1, 4, 11):
        with attention_kernels(decode_splits=splits):
            out, lse = torch_oss.attention_with_lse(q, k, v, enable_gqa=True)
        assert bool(torch.isnan(out[0, 2:]).all()) and bool(torch.isnan(lse[0, 2:]).all())
        assert bool(torch.isfinite(out[0, :2]).all())
    k[0, 1, 650, 3] = 0.5
    storage = _randn((B, Hkv, Lk, D + 1), torch.float16, device)
    _check_decode(q, storage[..., 1:], v, label="unaligned k rows")


# ---------------------------------------------------------------------------
# attention_with_kvcache (FlashAttention layout)
# ---------------------------------------------------------------------------


def _make_cache(device, dtype, B, capacity, Hkv, D, Dv, page_size, spare_pages=3):
    """Caches filled with large values (so a kernel that reads past a
    sequence's length fails), and for a paged cache a scattered block table."""
    if page_size is None:
        kc = torch.full((B, capacity, Hkv, D), 50.0, dtype=dtype, device=device)
        vc = torch.full((B, capacity, Hkv, Dv), 50.0, dtype=dtype, device=device)
        return kc, vc, None
    per_seq = (capacity + page_size - 1) // page_size
    pages = B * per_seq + spare_pages
    kc = torch.full((pages, page_size, Hkv, D), 50.0, dtype=dtype, device=device)
    vc = torch.full((pages, page_size, Hkv, Dv), 50.0, dtype=dtype, device=device)
    table = torch.randperm(pages)[: B * per_seq].view(B, per_seq).to(torch.int32).to(device)
    return kc, vc, table


def _fill(kc, vc, table, lengths, dtype):
    """Writes random tokens 0 .. lengths[b] - 1 of each sequence; returns them
    per sequence as (K, V) of shape (length, Hkv, D)."""
    seqs = []
    for b, n in enumerate(lengths):
        K = _randn((n,) + tuple(kc.shape[2:]), dtype, kc.device, 2.0)
        V = _randn((n,) + tuple(vc.shape[2:]), dtype, vc.device)
        for j in range(n):
            page, row = (b, j) if table is None else (int(table[b, j // kc.shape[1]]), j % kc.shape[1])
            kc[page, row] = K[j]
            vc[page, row] = V[j]
        seqs.append((K, V))
    return seqs


def _kvcache_reference(q, seqs, causal, label, out, lse):
    """Per sequence: attention_reference over its keys in SDPA layout."""
    atol = ATTENTION_ATOL[q.dtype]
    for b, (K, V) in enumerate(seqs):
        qb = q[b : b + 1].transpose(1, 2)
        kb, vb = K.transpose(0, 1)[None], V.transpose(0, 1)[None]
        gqa = qb.shape[1] != kb.shape[1]
        ref_out, ref_lse = attention_reference(qb, kb, vb, None, causal, None, gqa, "bottom_right")
        peer = sdpa_peer(qb, kb, vb, None, causal, None, gqa, "bottom_right") if K.shape[0] else None
        peer_lse = lse_peer(qb, kb, vb, None, causal, None, gqa, "bottom_right") if K.shape[0] else None
        assert_tolerance(f"out[{b}] {label}", out[b : b + 1].transpose(1, 2), ref_out, peer, atol)
        assert_tolerance(f"lse[{b}] {label}", lse[b : b + 1], ref_lse, peer_lse, atol)


# (batch, len_q, heads_q, heads_kv, head_dim, head_dim_v, capacity, page_size, new tokens)
KVCACHE_CASES = [
    (3, 1, 8, 2, 64, 64, 200, None, 0),
    (3, 1, 8, 2, 64, 64, 200, 16, 1),
    (2, 4, 4, 4, 128, 128, 333, 256, 4),
    (2, 1, 32, 8, 128, 128, 1100, 16, 1),
    (2, 16, 8, 1, 80, 80, 150, 48, 16),
    (1, 2, 6, 2, 192, 128, 90, None, 2),
]
KVCACHE_IDS = ["b{}_q{}_h{}-{}_d{}-{}_cap{}_page{}_new{}".format(*c) for c in KVCACHE_CASES]


def _kvcache_dtypes(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", KVCACHE_CASES, ids=KVCACHE_IDS)
@pytest.mark.parametrize("causal", [True, False])
def test_kvcache_against_reference(device, case, causal):
    B, Lq, Hq, Hkv, D, Dv, capacity, page_size, new = case
    for dtype in _kvcache_dtypes(device):
        seeded(len(KVCACHE_IDS) + capacity)
        kc, vc, table = _make_cache(device, dtype, B, capacity, Hkv, D, Dv, page_size)
        # an empty sequence (only the new tokens, or no key at all), a full one, a short one
        lengths = [0, capacity - new, 17][:B] if B > 1 else [capacity - new]
        seqs = _fill(kc, vc, table, lengths, dtype)
        q = _randn((B, Lq, Hq, D), dtype, device, 2.0)
        kn = _randn((B, new, Hkv, D), dtype, device, 2.0) if new else None
        vn = _randn((B, new, Hkv, Dv), dtype, device) if new else None
        seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
        with torch.no_grad():
            out, lse = torch_oss.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table,
                                                        causal=causal, return_lse=True)
        if new:
            seqs = [(torch.cat([K, kn[b]]), torch.cat([V, vn[b]])) for b, (K, V) in enumerate(seqs)]
            for b, n in enumerate(lengths):  # the appended tokens landed in the cache
                for j in range(new):
                    pos = n + j
                    page, row = (b, pos) if table is None else (int(table[b, pos // page_size]), pos % page_size)
                    assert torch.equal(kc[page, row], kn[b, j]) and torch.equal(vc[page, row], vn[b, j])
        assert out.shape == (B, Lq, Hq, Dv) and lse.shape == (B, Hq, Lq)
        _kvcache_reference(q, seqs, causal, f"{dtype} {case} causal={causal}", out, lse)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_paged_equals_contiguous(device):
    """The same tokens in a contiguous cache and in pages of 16 and of 64 rows
    (same capacity, so the same kernel plan): bitwise equal outputs."""
    dtype = torch.bfloat16
    B, Hq, Hkv, D, capacity = 3, 16, 4, 128, 512
    q = _randn((B, 1, Hq, D), dtype, device)
    lengths = [512, 130, 1]
    kc, vc, _ = _make_cache(device, dtype, B, capacity, Hkv, D, D, None)
    seqs = _fill(kc, vc, None, lengths, dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    with torch.no_grad():
        contiguous = torch_oss.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens)
        for page_size in (16, 64):
            pk, pv, table = _make_cache(device, dtype, B, capacity, Hkv, D, D, page_size)
            for b, (K, V) in enumerate(seqs):
                for j in range(K.shape[0]):
                    pk[table[b, j // page_size], j % page_size] = K[j]
                    pv[table[b, j // page_size], j % page_size] = V[j]
            paged = torch_oss.attention_with_kvcache(q, pk, pv, cache_seqlens=seqlens, block_table=table)
            assert torch.equal(paged, contiguous), f"page size {page_size}"


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_whole_cache_without_seqlens(device):
    """cache_seqlens=None: every sequence is the whole cache, as
    torch_oss.attention sees it."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    q = _randn((2, 3, 8, 64), dtype, device)
    kc, vc = _randn((2, 90, 2, 64), dtype, device), _randn((2, 90, 2, 64), dtype, device)
    with torch.no_grad():
        out, lse = torch_oss.attention_with_kvcache(q, kc, vc, causal=True, return_lse=True)
    _kvcache_reference(q, [(kc[0], vc[0]), (kc[1], vc[1])], True, "whole cache", out, lse)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_errors_name_the_argument(device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q = _randn((2, 1, 4, 64), dtype, device)
    kc, vc, table = _make_cache(device, dtype, 2, 64, 2, 64, 64, 16)
    kn, vn = _randn((2, 1, 2, 64), dtype, device), _randn((2, 1, 2, 64), dtype, device)
    seqlens = torch.tensor([10, 63], dtype=torch.int32, device=device)
    f = torch_oss.attention_with_kvcache
    with pytest.raises(ValueError, match="cache_seqlens"):
        f(q, kc, vc, kn, vn, cache_seqlens=seqlens + 1, block_table=table)  # 64 + 1 new > 64
    with pytest.raises(ValueError, match="cache_seqlens"):
        f(q, kc, vc, cache_seqlens=seqlens - 20, block_table=table)
    bad = table.clone()
    bad[1, 0] = kc.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        f(q, kc, vc, cache_seqlens=seqlens, block_table=bad)
    with pytest.raises(TypeError, match="block_table"):
        f(q, kc, vc, cache_seqlens=seqlens, block_table=table.long())
    with pytest.raises(ValueError, match="cache_seqlens"):
        f(q, kc, vc, kn, vn, block_table=table)
    with pytest.raises(ValueError, match="k and v"):
        f(q, kc, vc, kn, None, cache_seqlens=seqlens, block_table=table)
    with pytest.raises(ValueError, match="heads"):
        f(_randn((2, 1, 3, 64), dtype, device), kc, vc, cache_seqlens=seqlens, block_table=table)
    with pytest.raises(ValueError, match="batch"):
        f(q, kc, vc, cache_seqlens=seqlens[:1], block_table=table)
    with pytest.raises(RuntimeError, match="no backward"):
        f(q.clone().requires_grad_(), kc, vc, cache_seqlens=seqlens, block_table=table)
    # the op itself (no Python-side value checks) still refuses bad host values
    if device == "cpu":
        with pytest.raises(ValueError, match="cache_seqlens"):
            torch.ops.oss.attention_with_kvcache(q, kc, vc, None, None, seqlens + 10, table, None, True)
        with pytest.raises(ValueError, match="block_table"):
            torch.ops.oss.attention_with_kvcache(q, kc, vc, None, None, seqlens, bad, None, True)


def _decode_step(device, dtype, Hq, Hkv, D, capacity, page_size, lengths):
    """The inputs of one decoding step over a paged cache holding `lengths`
    tokens per sequence: caches, block table, one query and one new token per
    sequence, and the lengths on the device."""
    B = len(lengths)
    kc, vc, table = _make_cache(device, dtype, B, capacity, Hkv, D, D, page_size)
    _fill(kc, vc, table, lengths, dtype)
    q = _randn((B, 1, Hq, D), dtype, device)
    kn, vn = _randn((B, 1, Hkv, D), dtype, device), _randn((B, 1, Hkv, D), dtype, device)
    return kc, vc, table, q, kn, vn, torch.tensor(lengths, dtype=torch.int32, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_under_compile(device):
    """torch.compile(fullgraph=True) of a decode step (append + attend): the
    same output and the same cache content as eager."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    kc, vc, table, q, kn, vn, seqlens = _decode_step(device, dtype, 8, 2, 64, 128, 16, [40, 100])

    def step(q, kc, vc, kn, vn, seqlens, table):
        return torch_oss.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table) * 2

    eager_k, eager_v = kc.clone(), vc.clone()
    with torch.no_grad():
        want = step(q, eager_k, eager_v, kn, vn, seqlens, table)
        torch._dynamo.reset()
        got = torch.compile(step, fullgraph=True)(q, kc, vc, kn, vn, seqlens, table)
    assert torch.equal(got, want)
    assert torch.equal(kc, eager_k) and torch.equal(vc, eager_v)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_kvcache_cuda_graph_decode_step(device):
    """A decode step captured in a CUDA graph (cache_seqlens and block_table
    on the device), replayed for new inputs: equal to eager on a copy of the
    cache."""
    dtype = torch.float16
    kc, vc, table, q, kn, vn, seqlens = _decode_step(device, dtype, 16, 4, 128, 2048, 256, [700, 1500])
    with torch.no_grad():
        torch_oss.attention_with_kvcache(q, kc.clone(), vc.clone(), kn, vn, cache_seqlens=seqlens,
                                         block_table=table)  # warm-up outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = torch_oss.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens, block_table=table)
        for step in range(3):
            q.copy_(_randn(q.shape, dtype, device))
            kn.copy_(_randn(kn.shape, dtype, device))
            vn.copy_(_randn(vn.shape, dtype, device))
            ref_k, ref_v = kc.clone(), vc.clone()
            want = torch_oss.attention_with_kvcache(q, ref_k, ref_v, kn, vn, cache_seqlens=seqlens,
                                                    block_table=table)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"replay {step}"
            assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)
            seqlens += 1


# ---------------------------------------------------------------------------
# the score variants in the decode kernel
# ---------------------------------------------------------------------------


def _check_variant_rows(label, out, lse, q, k, v, causal, alignment, kw, mask=None):
    """out (B, Hq, Lq, Dv) and lse against variant_reference in float64, the
    float32 computation as the peer. q, k, v: SDPA layout."""
    args = dict(attn_mask=mask, is_causal=causal, alignment=alignment, **kw)
    ref_out, ref_lse = variant_reference(q, k, v, **args)
    peer_out, peer_lse = variant_reference(q, k, v, compute_dtype=torch.float32, **args)
    atol = ATTENTION_ATOL[q.dtype]
    assert_tolerance(f"out {label}", out, ref_out, peer_out.to(q.dtype), atol)
    assert_tolerance(f"lse {label}", lse, ref_lse, peer_lse, atol)


# name -> (batch, len_q, heads_q, heads_kv, head_dim, capacity, page_size, lengths, causal, variants
# as test_variants.VARIANTS spells them, forced split counts on CUDA)
KV_VARIANT_CASES = {
    # GQA 4 with ALiBi slopes per (batch, head): a row given another head's slope fails;
    # a paged cache; an empty sequence (its rows: out 0, lse = the sink); the window's
    # 201 keys split 1 to 4 ways, the sink counted once
    "gqa4-paged-alibi_batch-sinks": (3, 1, 16, 4, 128, 1000, 16, [1000, 0, 333], True,
                                     dict(window_size=(200, 0), alibi="batch", sinks=True), [0, 3, 16]),
    # speculative rows: 5 queries x 4 heads = 20 packed rows, the second CTA spanning heads;
    # a window open on the right splits the whole cache, so the later splits see no key;
    # capped scores, so every key of the window weighs
    "spec5-window_open_right-softcap-sinks": (2, 5, 8, 2, 64, 700, None, [700, 450], False,
                                              dict(window_size=(40, -1), softcap=4.0, sinks=True), [1, 6]),
    # window (0, 0) with causal: each row sees its diagonal key at most; rows 0 and 1 of the
    # one-token sequence see none (out 0, lse -inf)
    "window_0_0-causal-hd256": (2, 3, 4, 2, 256, 300, 64, [300, 1], True,
                                dict(window_size=(0, 0), softcap=5.0, alibi="heads"), [0, 2]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(KV_VARIANT_CASES))
def test_kvcache_variants_in_the_decode_kernel(device, case):
    B, Lq, Hq, Hkv, D, capacity, page_size, lengths, causal, spec, split_counts = KV_VARIANT_CASES[case]
    for dtype in _kvcache_dtypes(device):
        seeded(capacity + Lq)
        kc, vc, table = _make_cache(device, dtype, B, capacity, Hkv, D, D, page_size)
        seqs = _fill(kc, vc, table, lengths, dtype)
        q = _randn((B, Lq, Hq, D), dtype, device, 2.0)
        kw = draw_variants(spec, B, Hq, device)
        seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
        for splits in split_counts if device == "cuda" else [0]:
            with torch.no_grad(), attention_kernels(decode_splits=splits):
                out, lse = torch_oss.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                                            causal=causal, return_lse=True, **kw)
            for b, (K, V) in enumerate(seqs):
                kwb = dict(kw)
                if "alibi_slopes" in kw and kw["alibi_slopes"].dim() == 2:
                    kwb["alibi_slopes"] = kw["alibi_slopes"][b:b + 1]
                _check_variant_rows(f"{case} {dtype} splits={splits} b={b}", out[b:b + 1].transpose(1, 2),
                                    lse[b:b + 1], q[b:b + 1].transpose(1, 2), K.transpose(0, 1)[None],
                                    V.transpose(0, 1)[None], causal, "bottom_right", kwb)


# name -> (batch, heads_q, heads_kv, len_q, len_k, head_dim, causal, alignment, variants, a padding
# mask, forced split counts on CUDA)
DECODE_VARIANT_CASES = {
    "q1-gqa4-causal_br-all": (2, 16, 4, 1, 900, 128, True, "bottom_right",
                              dict(window_size=(100, 0), softcap=3.0, alibi="batch", sinks=True), False, [0, 5]),
    "q7-top_left-window_3_5-alibi-mask": (2, 8, 2, 7, 300, 64, False, "top_left",
                                          dict(window_size=(3, 5), alibi="batch", sinks=True), True, [0, 3]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(DECODE_VARIANT_CASES))
def test_decode_variants_few_query_rows(device, case):
    """torch_oss.attention_with_lse with few query rows and the variants (on
    CUDA the decode kernel, not the tile kernels)."""
    B, Hq, Hkv, Lq, Lk, D, causal, alignment, spec, padded, split_counts = DECODE_VARIANT_CASES[case]
    for dtype in _kvcache_dtypes(device):
        seeded(Lk + Lq)
        q, k = _randn((B, Hq, Lq, D), dtype, device, 2.0), _randn((B, Hkv, Lk, D), dtype, device, 2.0)
        v = _randn((B, Hkv, Lk, D), dtype, device)
        kw = draw_variants(spec, B, Hq, device)
        mask = None
        if padded:  # batch 1 sees its first 4 keys only: rows past the window see none but the sink
            mask = (torch.arange(Lk, device=device) < torch.tensor([Lk, 4], device=device)[:, None])[:, None, None]
        for splits in split_counts if device == "cuda" else [0]:
            with attention_kernels(decode_splits=splits):
                out, lse = torch_oss.attention_with_lse(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True,
                                                        causal_alignment=alignment, **kw)
            _check_variant_rows(f"{case} {dtype} splits={splits}", out, lse, q, k, v, causal, alignment, kw, mask)


@NVCC_SKIP
def test_decode_kernels_do_not_spill(tmp_path):
    """The split-KV kernel keeps its warp's o, m, l in registers across the
    key loop and the combine kernel its column sums: a spill would put
    local-memory traffic into every key tile of a memory-bound kernel. Both
    must compile for sm_90a with no stack frame at every decode head dim
    (needs nvcc, not a GPU)."""
    import pathlib
    import re

    source = '#include "cuda/attention/mma/attention_decode.cuh"\n' + "".join(
        f"template oss_status oss_attn_dec_launch<__nv_bfloat16, {hd}>(const oss_attn_args *, cudaStream_t, "
        "const oss_device_info *);\n" for hd in (64, 128, 256))
    report = ptxas_report(source, tmp_path, pathlib.Path(__file__).resolve().parents[1] / "csrc")
    frames = re.findall(r"Function properties for (\S*oss_attn_dec_\S*)\s+(\d+) bytes stack frame", report)
    names = [name for name, _ in frames]
    assert sum("dec_kernel" in n for n in names) == 3 and sum("combine" in n for n in names) == 1, names
    spilled = [(name, int(size)) for name, size in frames if int(size) != 0]
    assert not spilled, f"decode kernels with a stack frame (bytes): {spilled}"
