"""Attention dropout (dropout_p > 0): out, lse and the gradients against a
float64 reference that applies the very weights' mask the kernels draw,
rebuilt here by an independent Philox4x32-7 (numpy) from the rule in
docs/design-attention.md; the mask recovered from the outputs equals that
mask bit for bit; the kept fraction within statistical bounds; the same seed
gives the same bits and another seed other bits; dropout_p = 0 and 1; the
score variants, GQA, masks and both causal alignments with dropout; the bad
inputs; opcheck, torch.compile and (CUDA) graph capture.

The peer of the tolerance rule (docs/testing.md) is the same computation in
float32 (float64 for float64 inputs), or for CUDA float16/bfloat16 the
FlashAttention-style emulation of test_variants (P F and dS rounded to the
dtype before they multiply), given the same mask.
"""

import zlib

import numpy as np
import pytest
import torch
from _util import (ATTENTION_ATOL, CUDA_OK, CUDA_SKIP_REASON, DEVICES, FLOAT_DTYPES, assert_tolerance,
                   capture_cuda_graph)
from test_variants import draw_variants, fa_style_peer, make_qkv, variant_reference

import torch_oss
from torch_oss.functional import _dropout_seed

# ---------------------------------------------------------------------------
# The mask, from its definition
# ---------------------------------------------------------------------------

_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-7 on numpy uint64 arrays holding 32-bit words."""
    c0, c1, c2, c3, k0, k1 = (np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3, k0, k1))
    for _ in range(7):
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2  # 32 x 32 bits: exact in 64
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & _MASK32, (k1 + np.uint64(0xBB67AE85)) & _MASK32
    return c0, c1, c2, c3


def test_philox_known_answers():
    """Random123's known-answer vectors for Philox4x32-7."""
    cases = [
        ((0, 0, 0, 0, 0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
        ((0xFFFFFFFF,) * 6, (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0),
         (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
    ]
    for args, want in cases:
        assert tuple(int(w) for w in philox4x32(*args)) == want


def dropout_factor(seed, B, Hq, Lq, Lk, p):
    """(B, Hq, Lq, Lk) float64: 1 / (1 - p) where weight (b, h, i, j) is kept,
    else 0. Weight (bh = b Hq + h, i, j) takes half j & 1 (the low 16 bits for
    even j) of word ((i >> 3) & 1) * 2 + ((j >> 3) & 1) of Philox4x32-7 with
    key = the seed's low and high words and counter (i & ~8, j & ~9, bh's low
    and high words); kept when those 16 bits are >= round(p 2^16)."""
    s = int(seed.item()) & (2**64 - 1)
    bh = np.arange(B * Hq, dtype=np.uint64).reshape(B * Hq, 1, 1)
    i = np.arange(Lq, dtype=np.uint64).reshape(1, Lq, 1)
    j = np.arange(Lk, dtype=np.uint64).reshape(1, 1, Lk)
    words = philox4x32(i & ~np.uint64(8), j & ~np.uint64(9), bh & _MASK32, bh >> np.uint64(32), s & 0xFFFFFFFF,
                       s >> 32)
    pick = ((i >> np.uint64(3)) & np.uint64(1)) * np.uint64(2) + ((j >> np.uint64(3)) & np.uint64(1))
    word = np.choose(pick.astype(np.int64) + np.zeros((B * Hq, Lq, Lk), dtype=np.int64), words)
    bits = (word >> (np.uint64(16) * (j & np.uint64(1)))) & np.uint64(0xFFFF)
    if p >= 1:
        return torch.zeros(B, Hq, Lq, Lk, dtype=torch.float64)
    keep = bits >= np.uint64(int(p * 65536 + 0.5))
    return torch.from_numpy(keep.reshape(B, Hq, Lq, Lk)).double() / (1 - p)


def seeded_call(fn, device, salt):
    """fn() after torch.manual_seed(salt), and the dropout seed the call draws
    (the first draw from the device's generator after that seed)."""
    torch.manual_seed(salt)
    seed = _dropout_seed(device)
    torch.manual_seed(salt)
    return fn(), seed


# ---------------------------------------------------------------------------
# Against the float64 reference with the same mask
# ---------------------------------------------------------------------------

CAUSAL = [(False, "top_left"), (True, "top_left"), (True, "bottom_right")]
SHAPES = [  # (batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v)
    (2, 4, 2, 17, 67, 32, 32),
    (1, 2, 2, 130, 130, 64, 48),
    (1, 3, 1, 67, 150, 128, 128),
    (1, 2, 1, 130, 200, 256, 256),  # the Hopper backward's column-split kernel
]
VARIANTS = {
    "plain": {},
    "window_softcap": dict(window_size=(20, 7), softcap=3.0),
    "alibi_sinks": dict(alibi="batch", sinks=True),
}


def check_dropout(q, k, v, p, kw, mask=None, is_causal=False, alignment="top_left", label="", salt=0):
    """out, lse, dq, dk, dv (and d sinks) of torch_oss with dropout_p = p
    against the float64 reference given the mask the call drew."""
    dtype, device = q.dtype, q.device
    gqa = q.shape[1] != k.shape[1]
    sinks = kw.get("sinks")
    other = {key: val for key, val in kw.items() if key != "sinks"}
    qkv = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    s = None if sinks is None else sinks.detach().clone().requires_grad_(True)
    (out, lse), seed = seeded_call(lambda: torch_oss.attention_with_lse(
        *qkv, attn_mask=mask, dropout_p=p, is_causal=is_causal, enable_gqa=gqa, causal_alignment=alignment,
        sinks=s, **other), device, salt)
    B, Hq, Lq = q.shape[:3]
    F = dropout_factor(seed.cpu(), B, Hq, Lq, k.shape[2], p).to(device)
    dout = torch.randn_like(out)
    out.backward(dout)

    leaves = {}
    peer_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for name, cdt in (("peer", peer_dtype), ("ref", torch.float64)):
        qkv_n = [t.detach().to(cdt).requires_grad_(True) for t in (q, k, v)]
        s_n = None if sinks is None else sinks.detach().to(cdt).requires_grad_(True)
        o_n, l_n = variant_reference(*qkv_n, attn_mask=mask, is_causal=is_causal, alignment=alignment, sinks=s_n,
                                     compute_dtype=cdt, dropout_factor=F, **other)
        o_n.backward(dout.to(cdt))
        leaves[name] = (o_n, l_n, [t.grad for t in qkv_n], None if s_n is None else s_n.grad)
    ref_out, ref_lse, ref_grads, ref_dsinks = leaves["ref"]
    if q.is_cuda and dtype in (torch.float16, torch.bfloat16):
        fa = fa_style_peer(q, k, v, dout, sinks=sinks, attn_mask=mask, is_causal=is_causal, alignment=alignment,
                           dropout_factor=F, **other)
        peer_out, peer_lse, peer_grads, peer_dsinks = fa[0], fa[1], fa[2:5], fa[5]
    else:
        peer_out, peer_lse, peer_grads, peer_dsinks = leaves["peer"]
        peer_out, peer_grads = peer_out.to(dtype), [g.to(dtype) for g in peer_grads]
    atol = ATTENTION_ATOL[dtype]
    assert_tolerance(f"out {label}", out, ref_out, peer_out, atol)
    assert_tolerance(f"lse {label}", lse, ref_lse, peer_lse, atol)
    for name, ours, ref, peer in zip(("dq", "dk", "dv"), (t.grad for t in qkv), ref_grads, peer_grads):
        assert ours.dtype == dtype
        assert_tolerance(f"{name} {label}", ours, ref, peer, atol)
    if sinks is not None:
        # written as float32 by the kernels (oss.h dsinks): judged in float32 at best
        sdt = torch.float32 if dtype == torch.float64 else dtype
        assert_tolerance(f"dsinks {label}", s.grad.to(sdt), ref_dsinks, peer_dsinks.to(sdt), ATTENTION_ATOL[sdt],
                         per_element_eps=True)
    return F


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("is_causal,alignment", CAUSAL, ids=["none", "causal-tl", "causal-br"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dropout_forward_and_backward(device, dtype, is_causal, alignment, variant):
    salt = zlib.crc32(f"{variant} {alignment} {is_causal} {dtype}".encode())
    torch.manual_seed(salt)
    for n, shape in enumerate(SHAPES):
        q, k, v = make_qkv(shape, dtype, device)
        kw = draw_variants(VARIANTS[variant], shape[0], shape[1], device)
        for p in (0.17, 0.6):
            F = check_dropout(q, k, v, p, kw, is_causal=is_causal, alignment=alignment, salt=salt + n,
                              label=f"{variant} {dtype} causal={is_causal}/{alignment} shape={shape} p={p}")
            assert 0 < (F == 0).double().mean() < 1  # the reference really drops some weights, not all


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dropout_with_mask(device, dtype):
    torch.manual_seed(11)
    B, Hq, Lq, Lk = 2, 2, 45, 77
    q, k, v = make_qkv((B, Hq, Hq, Lq, Lk, 64, 64), dtype, device)
    mask = torch.rand(B, 1, Lq, Lk, device=device) > 0.3
    check_dropout(q, k, v, 0.3, {}, mask=mask, label=f"bool mask {dtype}")


# ---------------------------------------------------------------------------
# The mask itself, recovered from the outputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("p", [0.5, 0.1, 0.99999, 0.999995])
def test_mask_recovered_from_outputs(device, dtype, p):
    """q = 0 makes every weight 1 / Lk, and v = the identity makes out[i, j]
    that weight after dropout: the mask, recovered exactly, equals the rule's
    (every bh, row and key, so every tile layout of every kernel), and the kept
    fraction is 1 - p within 5 standard deviations. Near p = 1 the threshold
    is the last 16-bit value (0.99999: only bits 0xFFFF are kept) or past it
    (0.999995 rounds to 2^16: nothing is kept)."""
    B, Hq, Hkv, Lq, L = 2, 6, 3, 300, 128
    q = torch.zeros(B, Hq, Lq, 32, dtype=dtype, device=device)
    k = torch.randn(B, Hkv, L, 32, dtype=dtype, device=device)
    v = torch.eye(L, dtype=dtype, device=device).expand(B, Hkv, L, L)
    out, seed = seeded_call(lambda: torch_oss.attention(q, k, v, dropout_p=p, enable_gqa=True), device, 5)
    kept = (out.float() > 0).cpu()
    want = dropout_factor(seed.cpu(), B, Hq, Lq, L, p) > 0
    assert torch.equal(kept, want), f"{int((kept != want).sum())} of {kept.numel()} weights differ from the rule"
    n = kept.numel()
    frac = kept.double().mean().item()
    assert abs(frac - (1 - p)) <= 5 * (p * (1 - p) / n) ** 0.5, f"kept fraction {frac:.4f} for p={p}"
    scale = 1 / (L * (1 - p))  # a kept weight's value
    assert torch.allclose(out[kept.to(device)].double(), torch.full((), scale, dtype=torch.float64, device=device),
                          rtol=2 * torch.finfo(dtype).eps, atol=0)


# ---------------------------------------------------------------------------
# Seeds, limits and bad inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 100, 140, 64, 64), (2, 4, 2, 100, 300, 256, 256)], ids=["d64", "d256"])
def test_same_seed_same_bits_other_seed_other_bits(device, deterministic, shape):
    torch.manual_seed(3)
    q, k, v = make_qkv(shape, torch.bfloat16, device)
    runs = []
    for salt in (7, 7, 8):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        torch.manual_seed(salt)
        out = torch_oss.attention(*leaves, dropout_p=0.3, is_causal=True, enable_gqa=True,
                                  deterministic=deterministic)
        out.backward(torch.ones_like(out))
        runs.append([out.detach()] + [t.grad for t in leaves])
    same = [torch.equal(a, b) for a, b in zip(runs[0], runs[1])]
    assert all(same) if deterministic else same[0], same  # the default backward may reorder dQ's sums
    assert not any(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_zero_and_one(device):
    torch.manual_seed(4)
    q, k, v = make_qkv((1, 2, 2, 33, 40, 16, 16), torch.float32, device)
    assert torch.equal(torch_oss.attention(q, k, v, dropout_p=0.0), torch_oss.attention(q, k, v))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = torch_oss.attention_with_lse(*leaves, dropout_p=1.0)
    _, lse0 = torch_oss.attention_with_lse(q, k, v)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, lse0)
    out.backward(torch.randn_like(out))
    for t in leaves:
        assert torch.equal(t.grad, torch.zeros_like(t.grad))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_dropout_arguments(device):
    q = torch.randn(1, 1, 4, 8, device=device)
    seed = torch.zeros(1, dtype=torch.int64, device=device)
    for bad in (-0.1, 1.5, float("nan"), True, "0.1"):
        with pytest.raises(ValueError, match="dropout_p"):
            torch_oss.attention(q, q, q, dropout_p=bad)
    op = torch.ops.oss.attention
    args = (q, q, q, None, False, None, False, "top_left", [-1, -1], 0.0, None, None, None)
    with pytest.raises(ValueError, match="dropout_seed"):
        op(*args, 0.5, None)
    with pytest.raises(TypeError, match="dropout_seed"):
        op(*args, 0.5, seed.int())
    with pytest.raises(TypeError, match="dropout_seed"):
        op(*args, 0.5, torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="dropout_p"):
        op(*args, 2.0, seed)
    if device == "cuda":
        with pytest.raises(ValueError, match="dropout_seed is on cpu"):
            op(*args, 0.5, seed.cpu())


# ---------------------------------------------------------------------------
# The op contract: opcheck, torch.compile, CUDA graphs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.manual_seed(6)
    q, k, v = make_qkv((1, 2, 2, 20, 24, 16, 16), torch.float32, device)
    seed = torch.tensor([123456789], dtype=torch.int64, device=device)
    args = (q, k, v, None, True, None, False, "top_left", [-1, -1], 0.0, None, None, None, 0.25, seed)
    torch.library.opcheck(torch.ops.oss.attention.default, args)
    out, lse = torch.ops.oss.attention(*args)
    bwd = (torch.randn_like(out), q, k, v, out, lse, None, True, None, False, "top_left", False, None, [-1, -1],
           0.0, None, None, False, 0.25, seed)
    torch.library.opcheck(torch.ops.oss.attention_backward.default, bwd)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_matches_eager(device):
    """Under torch.compile (fallback_random: the seed drawn as eager draws it)
    the same seed gives eager's bits, forward and backward."""
    torch.manual_seed(8)
    q, k, v = make_qkv((2, 2, 2, 40, 40, 32, 32), torch.float32, device)

    def f(q, k, v):
        return torch_oss.attention(q, k, v, dropout_p=0.2, is_causal=True)

    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        with torch._inductor.config.patch(fallback_random=True):
            torch.manual_seed(9)
            out = fn(*leaves)
        out.backward(torch.ones_like(out))
        results.append([out.detach()] + [t.grad for t in leaves])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason=CUDA_SKIP_REASON)
def test_cuda_graph_replays_draw_new_masks():
    """Captured in a CUDA graph, each replay draws a new seed on the device:
    two replays give different outputs, both different from attention without
    dropout."""
    torch.manual_seed(10)
    q, k, v = make_qkv((1, 4, 4, 64, 64, 64, 64), torch.float16, "cuda")
    g, static_out = capture_cuda_graph(lambda: torch_oss.attention(q, k, v, dropout_p=0.3))
    outs = []
    for _ in range(2):
        g.replay()
        outs.append(static_out.clone())
    assert not torch.equal(outs[0], outs[1])
    plain = torch_oss.attention(q, k, v)
    assert not torch.equal(outs[0], plain) and not torch.equal(outs[1], plain)
