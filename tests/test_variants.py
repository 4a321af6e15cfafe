"""The attention score variants (sliding window, logit softcap, ALiBi slopes,
attention sinks) and the per-call deterministic flag: out, lse and the
gradients dq, dk, dv and d sinks against a float64 reference built from the
variants' definition (a dense bias, a boolean mask, an extra sink column),
combined with both causal alignments, boolean and additive masks, GQA,
Lq != Lk and awkward lengths, in every dtype; gradcheck; rows that see no key
but a sink; long key ranges under a tiny window; the broadcasting path, the
KV-cache op, opcheck and torch.compile.

The peer of the tolerance rule (docs/testing.md) is the same definition
computed with PyTorch ops in float32 (float64 for float64 inputs) and rounded
to the inputs' dtype: PyTorch has no kernel for softcap or sinks. For CUDA
float16/bfloat16 inputs, whose kernels multiply P and dS in 16 bits as
FlashAttention does, the peer is that computation emulated in PyTorch
(fa_style_peer): float32 scores and sums, P and dS rounded to the dtype before
they multiply, every result rounded once.

The CUDA cases (DEVICES) run the same checks; on CUDA the KV-cache entry
point and calls with few query rows run the variants in the split-KV decode
kernel, whose own cases (splits, pages, GQA, empty rows) are in
test_decode.py.
"""

import math
import zlib

import pytest
import torch
from _util import ATTENTION_ATOL, DEVICES, FLOAT_DTYPES, assert_tolerance, cuda_param

import torch_oss
from torch_oss._kernels import attention_kernels

CAUSAL = [(False, "top_left"), (False, "bottom_right"), (True, "top_left"), (True, "bottom_right")]
CAUSAL_IDS = ["none-tl", "none-br", "causal-tl", "causal-br"]

# (batch, heads_q, heads_kv, len_q, len_k, head_dim, head_dim_v)
SHAPES = [
    (2, 4, 2, 17, 67, 32, 32),
    (1, 2, 2, 130, 130, 64, 48),
    (1, 3, 1, 67, 17, 16, 24),
    (1, 1, 1, 1, 1, 8, 8),
    (1, 4, 2, 150, 200, 256, 200),  # the Hopper backward's column-split kernel, GQA, Dv < D
]

# name -> keyword arguments; "alibi" / "alibi_batch" / "sinks" are drawn per shape
VARIANTS = {
    "window_3_5": dict(window_size=(3, 5)),
    "window_0_0": dict(window_size=(0, 0)),
    "window_left_only": dict(window_size=(6, -1)),
    "window_right_only": dict(window_size=(-1, 2)),
    "window_0_open": dict(window_size=(0, -1)),
    "window_wider_than_seq": dict(window_size=(1000, 1000)),
    "softcap": dict(softcap=2.0),
    "alibi": dict(alibi="heads"),
    "alibi_batch": dict(alibi="batch"),
    "sinks": dict(sinks=True),
    "window_sinks": dict(window_size=(9, 3), sinks=True),
    "window_alibi_sinks": dict(window_size=(5, 20), alibi="heads", sinks=True),
    "all": dict(window_size=(9, 3), softcap=3.0, alibi="batch", sinks=True),
}


def hidden_keys(d, window_size, is_causal):
    """The (Lq, Lk) keys the window and the causal rule hide, from d = i + off - j."""
    left, right = window_size
    hidden = torch.zeros(d.shape, dtype=torch.bool, device=d.device)
    if left >= 0:
        hidden |= d > left
    if right >= 0:
        hidden |= -d > right
    if is_causal:
        hidden |= d < 0
    return hidden


def variant_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, alignment="top_left",
                      window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, compute_dtype=torch.float64,
                      dropout_factor=None):
    """Attention with the variants, from their definition (oss.h), in
    compute_dtype; differentiable in q, k, v and sinks. dropout_factor
    (B, Hq, Lq, Lk): each weight's dropout factor (1 / (1 - p) or 0), applied
    to the softmax's weights before they multiply v. Returns (out, lse)."""
    q, k, v = (t.to(compute_dtype) for t in (q, k, v))
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hq != Hkv:
        k, v = (t.repeat_interleave(Hq // Hkv, dim=1) for t in (k, v))
    scale = D ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    off = Lk - Lq if alignment == "bottom_right" else 0
    i = torch.arange(Lq, device=q.device)[:, None]
    j = torch.arange(Lk, device=q.device)[None, :]
    d = i + off - j
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(compute_dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, Hq, 1, 1)
        s = s - slopes * d.abs().to(compute_dtype)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.to(compute_dtype)
    s = s.masked_fill(hidden_keys(d, window_size, is_causal), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(compute_dtype).reshape(1, Hq, 1, 1).expand(B, Hq, Lq, 1)], -1)
    empty = (s == float("-inf")).all(-1, keepdim=True)
    s = s.masked_fill(empty, 0.0)
    p = torch.softmax(s, -1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, -1).masked_fill(empty.squeeze(-1), float("-inf"))
    p = p[..., :Lk]
    if dropout_factor is not None:
        p = p * dropout_factor.to(compute_dtype)
    return p @ v, lse


def _variant_scores(q, k, attn_mask, is_causal, scale, alignment, window_size, softcap, alibi_slopes):
    """The float32 scores of fa_style_peer with the variants applied, and the
    softcap's derivative (1 - tanh^2, or 1)."""
    B, Hq, Lq, D = q.shape
    Lk = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    dcap = torch.ones_like(s)
    if softcap:
        t = torch.tanh(s / softcap)
        s, dcap = softcap * t, 1 - t * t
    off = Lk - Lq if alignment == "bottom_right" else 0
    i = torch.arange(Lq, device=q.device)[:, None]
    j = torch.arange(Lk, device=q.device)[None, :]
    d = i + off - j
    if alibi_slopes is not None:
        s = s - alibi_slopes.float().reshape(-1 if alibi_slopes.dim() == 2 else 1, Hq, 1, 1) * d.abs().float()
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    return s.masked_fill(hidden_keys(d, window_size, is_causal), float("-inf")), dcap


def fa_style_peer(q, k, v, dout, sinks=None, attn_mask=None, is_causal=False, scale=None, alignment="top_left",
                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_factor=None, dlse=None):
    """A same-dtype FlashAttention-style computation of the variants, forward
    and backward by hand: float32 scores and sums, the unnormalised P rounded
    to the dtype before it multiplies V, out = (P V) / l rounded once, D from
    the rounded out, dS = P (dP - D) (times the softcap's derivative) rounded
    to the dtype before it multiplies K and Q. With dropout_factor F, P F
    takes P's place where it multiplies V (and dO for dV) and F dP that of dP.
    dlse (float32, lse's shape): lse's gradient, taken as D - dlse for D.
    Returns out, lse, dq, dk, dv and d sinks (float32, or None)."""
    dt = q.dtype
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    groups = Hq // Hkv
    kr, vr = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    scale_ = D ** -0.5 if scale is None else scale
    s, dcap = _variant_scores(q, kr, attn_mask, is_causal, scale, alignment, window_size, softcap, alibi_slopes)
    m = s.amax(-1, keepdim=True)
    if sinks is not None:
        sink = sinks.float().reshape(1, Hq, 1, 1)
        m = torch.maximum(m, sink)
    m_use = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    p = torch.exp(s - m_use)
    l = p.sum(-1, keepdim=True)
    if sinks is not None:
        l = l + torch.exp(sink - m_use)
    dead = l == 0
    l_safe = torch.where(dead, torch.ones_like(l), l)
    F = torch.ones_like(p) if dropout_factor is None else dropout_factor.float()
    out = (((p * F).to(dt).float() @ vr.float()) / l_safe).masked_fill(dead, 0.0).to(dt)
    lse = (m_use + torch.log(l_safe)).masked_fill(dead, float("-inf")).squeeze(-1)
    P = p / l_safe
    Dsum = (dout.float() * out.float()).sum(-1, keepdim=True)
    if dlse is not None:
        Dsum = Dsum - dlse.float().unsqueeze(-1).masked_fill(dead, 0.0)
    dP = dout.float() @ vr.float().transpose(-1, -2)
    dS = (P * (F * dP - Dsum) * dcap).to(dt).float()
    dq = (dS @ kr.float() * scale_).to(dt)
    dk = (dS.transpose(-1, -2) @ q.float() * scale_).reshape(B, Hkv, groups, Lk, D).sum(2).to(dt)
    dv = ((P * F).to(dt).float().transpose(-1, -2) @ dout.float()).reshape(B, Hkv, groups, Lk, -1).sum(2).to(dt)
    dsinks = None
    if sinks is not None:
        p_sink = torch.exp(sink - m_use) / l_safe
        dsinks = -(p_sink * Dsum).sum((0, 2, 3))
    return out, lse, dq, dk, dv, dsinks


def draw_variants(spec, B, Hq, device, sinks_dtype=torch.float32):
    """The keyword arguments of a VARIANTS entry with its tensors drawn. Sinks
    are float32 values (the kernels hold sinks in float32) in sinks_dtype."""
    kw = {k: v for k, v in spec.items() if k in ("window_size", "softcap")}
    if spec.get("alibi") == "heads":
        kw["alibi_slopes"] = torch.rand(Hq, device=device) * 0.5
    elif spec.get("alibi") == "batch":
        kw["alibi_slopes"] = torch.rand(B, Hq, device=device) * 0.5
    if spec.get("sinks"):
        kw["sinks"] = (torch.randn(Hq) * 2).to(sinks_dtype).float().to(sinks_dtype).to(device)
    return kw


def make_qkv(shape, dtype, device):
    B, Hq, Hkv, Lq, Lk, D, Dv = shape
    return (torch.randn(B, Hq, Lq, D, dtype=dtype, device=device) * 1.5,
            torch.randn(B, Hkv, Lk, D, dtype=dtype, device=device) * 1.5,
            torch.randn(B, Hkv, Lk, Dv, dtype=dtype, device=device))


def check_variant(q, k, v, kw, mask=None, is_causal=False, alignment="top_left", label="", grads=True, ours_kw=None):
    """out, lse and (with grads) dq, dk, dv and d sinks of torch_oss against
    the float64 reference, with the float32 (float64) computation as the peer.
    ours_kw: more keyword arguments for the torch_oss call only."""
    dtype = q.dtype
    gqa = q.shape[1] != k.shape[1]
    sinks = kw.get("sinks")
    peer_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = {}
    for name, cdt in (("ours", dtype), ("peer", peer_dtype), ("ref", torch.float64)):
        qkv = [t.detach().to(dtype if name == "ours" else cdt).requires_grad_(grads) for t in (q, k, v)]
        s = None if sinks is None else sinks.detach().to(sinks.dtype if name == "ours" else cdt).requires_grad_(grads)
        leaves[name] = (qkv, s)
    other = {key: val for key, val in kw.items() if key != "sinks"}
    qkv, s = leaves["ours"]
    out, lse = torch_oss.attention_with_lse(*qkv, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa,
                                            causal_alignment=alignment, sinks=s, **other, **(ours_kw or {}))
    if q.is_cuda and dtype in (torch.float16, torch.bfloat16):
        return _check_variant_fa_style(q, k, v, kw, other, mask, is_causal, alignment, label, grads, out, lse, leaves)
    results = {"ours": (out, lse)}
    for name in ("peer", "ref"):
        qkv_n, s_n = leaves[name]
        results[name] = variant_reference(*qkv_n, attn_mask=mask, is_causal=is_causal, alignment=alignment,
                                          sinks=s_n, compute_dtype=qkv_n[0].dtype, **other)
    atol = ATTENTION_ATOL[dtype]
    assert out.dtype == dtype and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    peer_out = results["peer"][0].to(dtype)
    assert_tolerance(f"out {label}", out, results["ref"][0], peer_out, atol)
    assert_tolerance(f"lse {label}", lse, results["ref"][1], results["peer"][1], atol)
    if not grads:
        return out, lse
    dout = torch.randn_like(out)
    for name in ("ours", "peer", "ref"):
        o = results[name][0]
        o.backward(dout.to(o.dtype))
    names = ["dq", "dk", "dv"] + (["dsinks"] if sinks is not None else [])
    for idx, gname in enumerate(names):
        get = (lambda n: leaves[n][1].grad) if gname == "dsinks" else (lambda n, idx=idx: leaves[n][0][idx].grad)
        ours = get("ours")
        expected_dtype = sinks.dtype if gname == "dsinks" else dtype
        assert ours is not None and ours.dtype == expected_dtype, f"{gname} {label}: {ours}"
        peer = get("peer").to(expected_dtype)
        if gname == "dsinks":
            # a sum over batch and rows of the kernel's double terms, written as float32
            # (oss.h dsinks), then cast to the sinks' dtype: one rounding of its own
            # magnitude, in float32 at best
            ours, peer = (t.float() if t.dtype == torch.float64 else t for t in (ours, peer))
        assert_tolerance(f"{gname} {label}", ours, get("ref"), peer, atol, per_element_eps=gname == "dsinks")
    return out, lse


def _check_variant_fa_style(q, k, v, kw, other, mask, is_causal, alignment, label, grads, out, lse, leaves):
    """check_variant for CUDA float16/bfloat16: fa_style_peer is the peer."""
    dtype = q.dtype
    sinks = kw.get("sinks")
    qkv64, s64 = leaves["ref"]
    ref_out, ref_lse = variant_reference(*qkv64, attn_mask=mask, is_causal=is_causal, alignment=alignment,
                                         sinks=s64, compute_dtype=torch.float64, **other)
    dout = torch.randn_like(out)
    peer = fa_style_peer(q, k, v, dout, sinks=sinks, attn_mask=mask, is_causal=is_causal, alignment=alignment,
                         **other)
    atol = ATTENTION_ATOL[dtype]
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_tolerance(f"out {label}", out, ref_out, peer[0], atol)
    assert_tolerance(f"lse {label}", lse, ref_lse, peer[1], atol)
    if not grads:
        return out, lse
    out.backward(dout)
    ref_out.backward(dout.double())
    qkv, s = leaves["ours"]
    for idx, gname in enumerate(("dq", "dk", "dv")):
        # A gradient of a handful of values (the one-query, one-key shape): dS rounds to 16
        # bits once in both, but from float32 values that differ in their last bits, so near
        # a rounding boundary the two take neighbouring 16-bit values; over so few elements
        # the peer's own largest error need not show one such flip. Each element is then also
        # allowed one rounding of its magnitude (docs/testing.md).
        few = qkv[idx].grad.numel() < 100
        assert_tolerance(f"{gname} {label}", qkv[idx].grad, qkv64[idx].grad, peer[2 + idx], atol,
                         per_element_eps=few)
    if sinks is not None:
        # d sinks sums a few rows' p_sink D, each D carrying the 16-bit output's rounding: a
        # handful of values whose maximum error, against the peer's, is a draw between two
        # computations of that precision. Judged in the inputs' dtype (the test's own cast,
        # one rounding of each element's magnitude allowed: docs/testing.md).
        assert s.grad.dtype == sinks.dtype, f"dsinks {label}: {s.grad.dtype}"
        assert_tolerance(f"dsinks {label}", s.grad.to(dtype), s64.grad, peer[5].to(dtype), atol,
                         per_element_eps=True)
    return out, lse


# ---------------------------------------------------------------------------
# Each variant, every dtype, causal alignments, GQA, Lq != Lk, awkward lengths
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("is_causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_forward_and_backward(device, dtype, is_causal, alignment, variant):
    torch.manual_seed(zlib.crc32(f"{variant} {alignment} {is_causal}".encode()))
    for shape in SHAPES:
        q, k, v = make_qkv(shape, dtype, device)
        kw = draw_variants(VARIANTS[variant], shape[0], shape[1], device)
        check_variant(q, k, v, kw, is_causal=is_causal, alignment=alignment,
                      label=f"{variant} {dtype} causal={is_causal}/{alignment} shape={shape}")


MASKS = ["bool", "additive", "bool_some_rows_empty"]


def draw_mask(kind, B, Hq, Lq, Lk, dtype, device):
    if kind == "bool":
        return torch.rand(B, 1, Lq, Lk, device=device) > 0.3
    if kind == "additive":
        m = torch.randn(1, Hq, Lq, Lk, dtype=torch.float64) * 2
        m[torch.rand(1, Hq, Lq, Lk) < 0.2] = float("-inf")
        return m.to(dtype=dtype, device=device)
    m = torch.rand(Lq, Lk, device=device) > 0.3
    m[::3] = False  # every third row sees no key: 0 output, lse -inf, or the sink alone
    return m


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("variant", ["window_3_5", "softcap", "alibi_batch", "sinks", "all"])
def test_variant_with_masks(device, dtype, mask_kind, variant):
    torch.manual_seed(zlib.crc32(f"{variant} {mask_kind}".encode()))
    shape = (2, 4, 2, 33, 70, 32, 32)
    B, Hq, _, Lq, Lk, _, _ = shape
    for is_causal, alignment in ((False, "top_left"), (True, "bottom_right")):
        q, k, v = make_qkv(shape, dtype, device)
        mask = draw_mask(mask_kind, B, Hq, Lq, Lk, dtype, device)
        kw = draw_variants(VARIANTS[variant], B, Hq, device)
        check_variant(q, k, v, kw, mask=mask, is_causal=is_causal, alignment=alignment,
                      label=f"{variant} {mask_kind} {dtype} causal={is_causal}/{alignment}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sinks_dtype", FLOAT_DTYPES, ids=str)
def test_sinks_any_dtype_gradient_in_its_dtype(device, sinks_dtype):
    torch.manual_seed(3)
    q, k, v = make_qkv((2, 4, 4, 20, 45, 16, 16), torch.float32, device)
    kw = draw_variants({"sinks": True}, 2, 4, device, sinks_dtype=sinks_dtype)
    check_variant(q, k, v, kw, is_causal=True, alignment="bottom_right", label=f"sinks {sinks_dtype}")


# ---------------------------------------------------------------------------
# Rows that see no key
# ---------------------------------------------------------------------------


def assert_sink_lse(lse, sinks):
    """The lse of rows that see only their sink is the sink: exactly where the
    kernels keep statistics in natural-log units (CPU, CUDA float32/float64),
    to within 2 float32 roundings where they keep them in log2 units (CUDA
    float16/bfloat16: sink * log2(e) * ln(2))."""
    if lse.is_cuda and lse.dtype == torch.float32:
        torch.testing.assert_close(lse, sinks, rtol=2 * 2 ** -24, atol=0)
    else:
        assert torch.equal(lse, sinks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_row_with_no_key_but_a_sink(device, dtype):
    """A row whose keys are all hidden: without a sink, output 0 and lse -inf;
    with one, output 0 and lse = the sink (it takes all the probability), no
    gradient through the row (its D is 0, so it adds nothing to d sinks)."""
    torch.manual_seed(5)
    B, H, Lq, Lk, D = 2, 3, 9, 12, 16
    q, k, v = make_qkv((B, H, H, Lq, Lk, D, D), dtype, device)
    mask = torch.ones(B, H, Lq, Lk, dtype=torch.bool, device=device)
    mask[:, :, 4] = False                      # row 4: nothing visible
    sinks = torch.tensor([0.5, -1.25, 3.0], device=device)
    out, lse = check_variant(q, k, v, {"sinks": sinks}, mask=mask, label=f"dead row {dtype}")
    assert (out[:, :, 4] == 0).all()
    assert_sink_lse(lse[:, :, 4], sinks.to(lse.dtype).expand(B, H))
    out0, lse0 = torch_oss.attention_with_lse(q, k, v, attn_mask=mask)
    assert (out0[:, :, 4] == 0).all() and torch.isneginf(lse0[:, :, 4]).all()
    # a window that hides every key of some rows (Lq > Lk, top-left: rows past Lk + 1)
    q2, k2, v2 = make_qkv((1, 3, 3, 20, 6, 16, 16), dtype, device)
    out2, lse2 = check_variant(q2, k2, v2, {"window_size": (1, 1), "sinks": sinks},
                               label=f"window dead rows {dtype}")
    assert (out2[:, :, 8:] == 0).all()
    assert_sink_lse(lse2[:, :, 8:], sinks.to(lse2.dtype)[None, :, None].expand(1, 3, 12))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_shapes(device):
    sinks = torch.zeros(2, device=device, requires_grad=True)
    q = torch.randn(0, 2, 5, 8, device=device, requires_grad=True)
    k = torch.randn(0, 2, 7, 8, device=device, requires_grad=True)
    out = torch_oss.attention(q, k, k, sinks=sinks, window_size=(1, 1))
    out.sum().backward()
    assert sinks.grad is not None and (sinks.grad == 0).all()
    q = torch.randn(1, 2, 5, 8, device=device)
    k = torch.randn(1, 2, 0, 8, device=device)
    out, lse = torch_oss.attention_with_lse(q, k, k, sinks=sinks.detach())
    assert (out == 0).all() and torch.equal(lse, sinks.detach()[None, :, None].expand(1, 2, 5))


# ---------------------------------------------------------------------------
# gradcheck (float64)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["all", "sinks_causal_window"])
def test_gradcheck(device, variant):
    """Numerical gradients of q, k, v and the sinks. The sinks are float32
    values and the step 2^-12 keeps sink +- step exact in float32 (the
    kernels hold sinks in float32)."""
    torch.manual_seed(11)
    B, Hq, Hkv, Lq, Lk, D = 1, 2, 1, 5, 7, 4
    q, k, v = (t.double().requires_grad_() for t in make_qkv((B, Hq, Hkv, Lq, Lk, D, D), torch.float64, device))
    sinks = torch.tensor([0.75, -0.5], dtype=torch.float64, device=device, requires_grad=True)
    if variant == "all":
        kw = dict(window_size=(2, 1), softcap=1.5, alibi_slopes=torch.tensor([0.25, 0.5], device=device))
        causal, alignment = False, "bottom_right"
    else:
        kw = dict(window_size=(1, -1))
        causal, alignment = True, "top_left"

    def f(q, k, v, sinks):
        return torch_oss.attention(q, k, v, is_causal=causal, causal_alignment=alignment, enable_gqa=True,
                                   sinks=sinks, **kw)

    assert torch.autograd.gradcheck(f, (q, k, v, sinks), eps=2 ** -12, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------------------
# Windows over long key ranges (the kernel skips the tiles outside)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_tiny_window_over_long_keys(device, alignment):
    """Lk = 20000 keys, a window of a few keys: the forward and backward visit
    only the tiles around the diagonal; every gradient outside them is 0."""
    torch.manual_seed(7)
    shape = (1, 2, 1, 70, 20000, 16, 16)
    q, k, v = make_qkv(shape, torch.float32, device)
    kw = {"window_size": (5, 2), "sinks": torch.randn(2, device=device)}
    check_variant(q, k, v, kw, is_causal=True, alignment=alignment, label=f"long keys {alignment}")
    k = k.detach().requires_grad_()
    torch_oss.attention(q, k, v, window_size=(5, 2), causal_alignment=alignment, enable_gqa=True).sum().backward()
    off = 20000 - 70 if alignment == "bottom_right" else 0
    touched = k.grad.abs().sum(-1)[0, 0] != 0
    assert not touched[: max(off - 5, 0)].any() and not touched[off + 70 + 2:].any()


@pytest.mark.parametrize("device_kernel", ["cpu-default", cuda_param("cuda-default"), cuda_param("cuda-mma")])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("others,alignment", [(True, "bottom_right"), (False, "bottom_right"), (False, "top_left")],
                         ids=["with_others", "window_alone", "window_alone_top_left"])
def test_window_with_inner_and_edge_tiles(device_kernel, dtype, is_causal, others, alignment):
    """A window of a few hundred keys over ~600 queries and ~700 keys, alone
    (on Hopper the plain kernels run it; either causal alignment) or with softcap, ALiBi and
    sinks: the kernels' key tiles fall wholly inside the window (where the
    tensor-core kernels skip the per-pair visibility test, fold the scale
    into the exponent without softcap and ALiBi, and count ALiBi's distances
    from one base per tile), across its edges, on the diagonal and past the
    last key, forward and backward; head dims 64 and 128. cuda-mma: the
    mma.sync kernels with the variants, which GPUs before Hopper run."""
    device, kernel = device_kernel.split("-")
    family = "mma" if kernel == "mma" else "best"
    if kernel == "mma" and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("the mma.sync kernels take float16 and bfloat16")
    torch.manual_seed(11 + others)
    for shape, window in (((2, 4, 2, 600, 700, 64, 64), (200, 50)), ((1, 4, 1, 650, 520, 128, 100), (260, 0))):
        q, k, v = make_qkv(shape, dtype, device)
        kw = {"window_size": window}
        if others:
            kw.update(softcap=4.0, alibi_slopes=torch.rand(shape[0], 4, device=device) * 0.05,
                      sinks=torch.randn(4, device=device))
        with attention_kernels(forward=family, backward=family):
            check_variant(q, k, v, kw, is_causal=is_causal, alignment=alignment,
                          label=f"inner and edge tiles {dtype} {device_kernel} causal={is_causal} {alignment} "
                                f"shape={shape} {sorted(kw)}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("scale", [None, 0.5, 0.0, -0.2], ids=["default", "large", "zero", "negative"])
def test_softcap_over_inner_and_edge_tiles_any_scale(device, dtype, scale):
    """A softcap alone and with ALiBi over several query blocks and key tiles (inner tiles,
    the diagonal, the end of the keys) at head dims 64 and 128, causal or not: on Hopper
    the plain forward caps the scores where the scale is positive, the variant kernels
    run the others. With scale 0.5 most scores pass the cap. Forward and gradients
    against float64."""
    torch.manual_seed(zlib.crc32(f"softcap {scale} {dtype}".encode()))
    for shape in ((2, 4, 2, 300, 400, 64, 64), (1, 2, 1, 260, 333, 128, 128)):
        q, k, v = make_qkv(shape, dtype, device)
        for kw in ({"softcap": 5.0}, {"softcap": 5.0, "alibi_slopes": torch.rand(shape[1], device=device) * 0.1}):
            kw["scale"] = scale
            for is_causal in (False, True):
                check_variant(q, k, v, kw, is_causal=is_causal, alignment="bottom_right",
                              label=f"softcap scale={scale} {dtype} {device} causal={is_causal} shape={shape} "
                                    f"{sorted(kw)}")


# ---------------------------------------------------------------------------
# deterministic=
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_flag(device):
    """deterministic=None / True / False: the same values (the CPU backward is
    always deterministic), bit for bit, under either global setting."""
    torch.manual_seed(13)
    q, k, v = make_qkv((2, 4, 2, 40, 50, 32, 32), torch.float32, device)
    sinks = torch.randn(4, device=device)
    dout = torch.randn(2, 4, 40, 32, device=device)
    grads = []
    for det in (None, True, False):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        out = torch_oss.attention(*leaves[:3], enable_gqa=True, sinks=leaves[3], window_size=(7, 7),
                                  deterministic=det)
        out.backward(dout)
        grads.append([t.grad for t in leaves])
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))
    prior = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        torch_oss.attention(*leaves, enable_gqa=True, deterministic=False).backward(dout)
    finally:
        torch.use_deterministic_algorithms(prior)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sinks", [True, False], ids=["window_sinks", "window_alone"])
def test_deterministic_variants_bitwise_and_correct(device, dtype, is_causal, sinks):
    """deterministic=True with a window (alone: on Hopper the plain backward
    kernel; with sinks: the one with the variants) and GQA over several key
    and query blocks (on Hopper the backward orders its dQ additions by
    counters here): correct by the tolerance rule, and every gradient bitwise
    identical over runs."""
    torch.manual_seed(23 + is_causal + 2 * sinks)
    q, k, v = make_qkv((2, 4, 2, 700, 900, 64, 64), dtype, device)
    kw = dict(window_size=(300, 200))
    if sinks:
        kw["sinks"] = (torch.randn(4) * 2).to(device)
    check_variant(q, k, v, kw, is_causal=is_causal, ours_kw=dict(deterministic=True),
                  label=f"deterministic {sorted(kw)} {dtype} causal={is_causal}")
    dout = torch.randn(2, 4, 700, 64, dtype=dtype, device=device)
    grads = []
    for _ in range(3):
        leaves = [t.detach().requires_grad_() for t in ((q, k, v, kw["sinks"]) if sinks else (q, k, v))]
        extra = dict(sinks=leaves[3]) if sinks else {}
        out = torch_oss.attention(*leaves[:3], is_causal=is_causal, enable_gqa=True, window_size=kw["window_size"],
                                  deterministic=True, **extra)
        out.backward(dout)
        grads.append([t.grad for t in leaves])
    for run, other in enumerate(grads[1:], 1):
        for name, a, b in zip(("dq", "dk", "dv", "dsinks"), other, grads[0]):
            assert torch.equal(a, b), f"{name} differs in run {run}"


# ---------------------------------------------------------------------------
# Other entry points: broadcasting, 3-D, the KV cache, opcheck, compile
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_and_3d_paths(device):
    torch.manual_seed(17)
    q = torch.randn(2, 3, 4, 11, 16, device=device, dtype=torch.float64)
    k = torch.randn(2, 3, 4, 13, 16, device=device, dtype=torch.float64)
    v = torch.randn(1, 3, 4, 13, 16, device=device, dtype=torch.float64)
    sinks = torch.randn(4, device=device)
    alibi = torch.rand(2, 3, 4, device=device)
    kw = dict(window_size=(3, 2), softcap=4.0, sinks=sinks, is_causal=True, causal_alignment="bottom_right")
    out, lse = torch_oss.attention_with_lse(q, k, v, alibi_slopes=alibi, **kw)
    for a in range(2):
        for b in range(3):
            ref_out, ref_lse = variant_reference(q[a, b][None], k[a, b][None], v[0, b][None], is_causal=True,
                                                 alignment="bottom_right", window_size=(3, 2), softcap=4.0,
                                                 alibi_slopes=alibi[a, b], sinks=sinks)
            assert_tolerance("broadcast out", out[a, b], ref_out[0], None, 1e-10)
            assert_tolerance("broadcast lse", lse[a, b], ref_lse[0], None, 1e-10)
    q3, k3, v3 = q[0, 0, :1], k[0, 0, :1], v[0, 0, :1]  # (N=1, L, E): one head
    out3, lse3 = torch_oss.attention_with_lse(q3, k3, v3, sinks=sinks[:1], window_size=(2, 2))
    ref_out, ref_lse = variant_reference(q3[:, None], k3[:, None], v3[:, None], window_size=(2, 2), sinks=sinks[:1])
    assert_tolerance("3-D out", out3, ref_out[:, 0], None, 1e-10)
    assert_tolerance("3-D lse", lse3, ref_lse[:, 0], None, 1e-10)


# (device, dtype) of the KV-cache test: CUDA takes float16/bfloat16 only
KVCACHE_DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cpu", torch.float16, id="cpu-float16"),
    pytest.param("cuda", torch.float16, id="cuda-float16", marks=DEVICES[1].marks),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=DEVICES[1].marks),
]


@pytest.mark.parametrize("device,dtype", KVCACHE_DEVICE_DTYPES)
def test_kvcache_variants(device, dtype):
    """attention_with_kvcache with the variants: per-sequence lengths, the
    window and ALiBi distances from the bottom-right diagonal of each length
    (on CUDA the split-KV decode kernel)."""
    torch.manual_seed(19)
    B, Lq, Hq, Hkv, D, Lmax = 3, 4, 4, 2, 32, 90
    q = torch.randn(B, Lq, Hq, D, dtype=dtype, device=device)
    k_cache = torch.randn(B, Lmax, Hkv, D, dtype=dtype, device=device)
    v_cache = torch.randn(B, Lmax, Hkv, D, dtype=dtype, device=device)
    seqlens = torch.tensor([90, 37, 4], dtype=torch.int32, device=device)
    kw = dict(window_size=(20, 0), softcap=3.0, alibi_slopes=torch.rand(B, Hq, device=device) * 0.1,
              sinks=torch.randn(Hq, device=device))
    with torch.no_grad():
        out, lse = torch_oss.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, return_lse=True,
                                                    **kw)
    for b in range(B):
        n = int(seqlens[b])
        qb, kb, vb = q[b:b + 1].transpose(1, 2), k_cache[b:b + 1, :n].transpose(1, 2), v_cache[b:b + 1, :n].transpose(1, 2)
        args = dict(is_causal=True, alignment="bottom_right", window_size=(20, 0), softcap=3.0,
                    alibi_slopes=kw["alibi_slopes"][b:b + 1], sinks=kw["sinks"])
        ref_out, ref_lse = variant_reference(qb, kb, vb, **args)
        peer_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        peer_out, peer_lse = variant_reference(qb, kb, vb, compute_dtype=peer_dtype, **args)
        atol = ATTENTION_ATOL[dtype]
        assert_tolerance(f"kvcache out b={b}", out[b:b + 1].transpose(1, 2), ref_out, peer_out.to(dtype), atol)
        assert_tolerance(f"kvcache lse b={b}", lse[b:b + 1], ref_lse, peer_lse, atol)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.manual_seed(23)
    q, k, v = (t.requires_grad_() for t in make_qkv((2, 4, 2, 9, 21, 16, 16), torch.float32, device))
    sinks = torch.randn(4, device=device, requires_grad=True)
    alibi = torch.rand(2, 4, device=device)
    args = (q, k, v, None, True, None, True, "bottom_right", [4, 1], 2.5, alibi, sinks, True)
    torch.library.opcheck(torch.ops.oss.attention.default, args)
    torch.library.opcheck(torch.ops.oss.attention_with_residual.default, args)
    out, lse = torch.ops.oss.attention(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    bwd = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, True, None, True,
           "bottom_right", False, None, [4, 1], 2.5, alibi, sinks.detach())
    torch.library.opcheck(torch.ops.oss.attention_backward.default, bwd)
    torch.library.opcheck(torch.ops.oss.attention_backward_with_sinks.default, bwd)


@pytest.mark.parametrize("device", DEVICES)
def test_compile(device):
    torch.manual_seed(29)
    q, k, v = make_qkv((1, 4, 2, 24, 40, 16, 16), torch.float32, device)
    sinks = torch.randn(4, device=device)
    alibi = torch.rand(4, device=device)

    def f(q, k, v, sinks):
        return torch_oss.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(6, 0), softcap=5.0,
                                   alibi_slopes=alibi, sinks=sinks, deterministic=True)

    compiled = torch.compile(f, fullgraph=True)
    grads = []
    for fn in (f, compiled):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        out = fn(*leaves)
        out.square().sum().backward()
        grads.append([out] + [t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_sinks_gradient_formula():
    """d sink_h = -sum_{b,i} exp(sink_h - lse_{b,h,i}) * D_{b,h,i}, D = rowsum(dout * out) (oss.h)."""
    torch.manual_seed(31)
    q, k, v = make_qkv((3, 2, 2, 10, 15, 8, 8), torch.float64, "cpu")
    sinks = torch.tensor([0.5, -2.0], dtype=torch.float64, requires_grad=True)
    out, lse = torch_oss.attention_with_lse(q, k, v, sinks=sinks, window_size=(3, 3))
    dout = torch.randn_like(out)
    out.backward(dout)
    D = (dout * out.detach()).sum(-1)
    expected = -(torch.exp(sinks.detach()[None, :, None] - lse) * D).sum((0, 2))
    assert torch.allclose(sinks.grad, expected, rtol=2 ** -23, atol=1e-12)  # written as float32 (oss.h)
    assert math.isfinite(float(sinks.grad.sum()))


def test_double_backward_with_sinks_and_softcap():
    """Second derivatives (the gradient of |grad|^2 in q and the sinks) against
    the variants' float64 definition."""
    torch.manual_seed(37)
    q, k, v = (t.requires_grad_() for t in make_qkv((1, 2, 2, 6, 9, 8, 8), torch.float64, "cpu"))
    sinks = torch.tensor([0.25, -1.5], dtype=torch.float64, requires_grad=True)  # exact in float32 (oss.h)
    results = []
    for fn in (lambda: torch_oss.attention(q, k, v, sinks=sinks, softcap=2.0, window_size=(3, 2)),
               lambda: variant_reference(q, k, v, sinks=sinks, softcap=2.0, window_size=(3, 2))[0]):
        grads = torch.autograd.grad(fn().square().sum(), (q, k, v, sinks), create_graph=True)
        results.append(torch.autograd.grad(sum(g.square().sum() for g in grads), (q, sinks)))
    # d sinks of the second order holds a term through the forward kernel's own
    # backward, whose d sinks is written as float32 (oss.h)
    for name, ours, ref, rtol in zip(("q", "sinks"), *results, (1e-9, 2**-22)):
        torch.testing.assert_close(ours, ref, rtol=rtol, atol=1e-11, msg=lambda m: f"d{name}: {m}")
