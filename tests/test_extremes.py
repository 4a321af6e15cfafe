"""Extreme values and degenerate shapes, forward and backward, matching PyTorch
(and the float64 reference) on CPU and CUDA:

- inputs of +-1e4 (and scores of that size in attention);
- +inf, -inf and NaN entries: NaN propagates as in PyTorch's math, -inf entries
  get probability exactly 0;
- rows of all -inf: softmax NaN as F.softmax; attention 0 output, -inf lse and
  zero gradients (torch_oss's definition of a fully masked row);
- float16 near its limits (values near 65504, a finfo.min mask, scores beyond
  the float16 range, subnormal inputs and outputs), bfloat16/float32 near theirs;
- length-1 rows and sequences;
- empty batches and zero-length rows/sequences: empty results, no errors.
"""

import pytest
import torch
import torch.nn.functional as F
from _reliability import SOFTMAX_OPS, check_attention, check_softmax, dtype_id, identity
from _util import DEVICES, FLOAT_DTYPES, assert_tolerance, attention_reference

import torch_oss

INF, NAN = float("inf"), float("nan")
LOW_PRECISION = [torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seed():
    # inputs are built from fixed seeds below; this fixes the random upstream
    # gradients drawn inside the checks too, so every failure reproduces
    torch.manual_seed(0)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(shape, seed, scale=1.0, dtype=torch.float64, device="cpu"):
    return (torch.randn(shape, generator=gen(seed), dtype=torch.float64) * scale).to(dtype=dtype, device=device)


# ---------------------------------------------------------------------------
# softmax / log_softmax
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
@pytest.mark.parametrize("width,dim", [(37, -1), (1030, -1), (37, 0)])
def test_softmax_values_of_1e4(device, dtype, op_name, width, dim):
    rows = 9
    x = randn((rows, width), 1, 3.0)
    x[0] += 1e4                      # all near +1e4
    x[1] -= 1e4                      # all near -1e4
    x[2, ::2] += 1e4                 # +-1e4 mixed
    x[2, 1::2] -= 1e4
    x[3] = 1e4                       # all exactly equal
    x[4, :] = -1e4
    x[4, width // 2] = 1e4           # one dominant entry
    x[5] = torch.linspace(-1e4, 1e4, width, dtype=torch.float64)
    x[6, 0] = -1e4                   # one outlier among ordinary values
    x = x.to(dtype=dtype, device=device)
    check_softmax(op_name, x, identity, dim, label=f"+-1e4 {dtype} {width} dim={dim}")


def special_rows(width, dtype, device):
    """Rows with +inf, -inf and NaN patterns (row index -> what it holds)."""
    x = randn((12, width), 2, 3.0)
    x[0] = -INF                      # all -inf: NaN
    x[1, ::3] = -INF                 # some -inf: probability 0
    x[2, 5] = INF                    # one +inf: NaN (inf - inf)
    x[3, [1, 7]] = INF               # two +inf: NaN
    x[4, 7] = NAN                    # NaN propagates to the row
    x[5] = NAN
    x[6, 2], x[6, 3] = INF, -INF
    x[7] = INF                       # all +inf: NaN
    x[8] = -INF
    x[8, width - 1] = 0.0            # one finite entry: probability 1, the rest 0
    x[9, : width // 2] = -INF        # half masked, -inf in the leading half
    x[10, 0] = -1e4
    x[10, 1] = -INF
    # row 11: ordinary values
    return x.to(dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
@pytest.mark.parametrize("width", [13, 1030])
def test_softmax_inf_and_nan_entries_forward_and_backward(device, dtype, op_name, width):
    # Gradients judged with one rounding of each element's magnitude allowed: in the
    # rows that keep finite values every nonzero gradient element sits beside
    # entries of +-inf, and the rule's max over a handful of elements is a draw
    # between two kernels that each round once (on an H100 a bfloat16 row of 1030
    # came out at 1.05x the bound without it).
    x = special_rows(width, dtype, device)
    ours = check_softmax(op_name, x, identity, -1, label=f"inf/nan rows {dtype} w={width}", per_element_eps=True)
    expected_nan_rows = [0, 2, 3, 4, 5, 6, 7]
    assert torch.isnan(ours[expected_nan_rows]).all(), "rows of all -inf, with +inf or NaN must be NaN"
    assert not torch.isnan(ours[[1, 8, 9, 10, 11]]).any()
    masked = torch.isneginf(x) & ~torch.isnan(ours)
    if op_name == "softmax":
        assert (ours[masked] == 0).all(), "-inf entries must get probability exactly 0"
        assert (ours[8, -1] == 1).all()
    else:
        assert torch.isneginf(ours[masked]).all(), "-inf entries must get log-probability -inf"
        assert (ours[8, -1] == 0).all()
    # the same patterns reduced along dim 0 (the strided/column kernels)
    check_softmax(op_name, x.t().contiguous(), identity, 0, label=f"inf/nan columns {dtype} w={width}",
                  per_element_eps=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
@pytest.mark.parametrize("n,lead", [(17, 16), (40, 33), (4097, 4096), (9000, 8500)])
def test_softmax_leading_minus_inf_entries(device, dtype, op_name, n, lead):
    """Rows whose first elements are all -inf (left padding, causal masks):
    the finite tail gets all the probability, no NaN. Long enough leading
    runs fill whole chunks of a streaming (online) implementation, whose
    running max is then still -inf."""
    x = randn((3, n), 8, 3.0)
    x[:, :lead] = -INF
    x[2, lead:] = -1e4
    x = x.to(dtype=dtype, device=device)
    ours = check_softmax(op_name, x, identity, -1, label=f"{lead} leading -inf of {n} {dtype}")
    assert not torch.isnan(ours).any(), "NaN from leading -inf entries"
    # the same along dim 0 (columns)
    ours = check_softmax(op_name, x.t().contiguous(), identity, 0, label=f"{lead} leading -inf, columns {dtype}")
    assert not torch.isnan(ours).any(), "NaN from leading -inf entries (columns)"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
def test_softmax_float16_near_its_limits(device, op_name):
    width = 300
    x = randn((8, width), 3, 3.0)
    x[0] = 65504.0                              # all at the float16 maximum: uniform
    x[1, :] = 65504.0
    x[1, 1::2] = -65504.0                       # +-max: x - max = -131008 overflows float16
    x[2] = 60000 + randn(width, 4, 2000.0).clamp(-5000, 5000)
    x[3] = torch.linspace(-65504, 65504, width, dtype=torch.float64)
    x[4] = randn(width, 5).sign() * 6e-8        # smallest subnormal (5.96e-8)
    x[5] = randn(width, 6) * 3e-5               # subnormal inputs
    x[6, :] = -30.0                             # outputs in float16's subnormal range
    x[6, :40] = -torch.arange(40, dtype=torch.float64) * 0.5
    x[7] = -65504.0
    x = x.to(dtype=torch.float16, device=device)
    ours = check_softmax(op_name, x, identity, -1, label="float16 limits")
    peer = SOFTMAX_OPS[op_name][1](x, -1)
    assert not torch.isnan(ours).any()
    if op_name == "softmax":
        torch.testing.assert_close(ours.float().sum(-1), torch.ones(8, device=device), atol=2e-2, rtol=0)
        # gradual underflow: where PyTorch stores a subnormal probability, so must we
        tiny = (peer != 0) & (peer.abs() < torch.finfo(torch.float16).tiny)
        assert tiny.any() and (ours[tiny] != 0).all(), "subnormal float16 probabilities were flushed to zero"
    else:
        # -131008 does not fit in float16: -inf, as PyTorch stores it
        assert torch.equal(torch.isinf(ours), torch.isinf(peer))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
def test_softmax_near_dtype_maximum(device, dtype, op_name):
    big = torch.finfo(dtype).max
    x = randn((4, 65), 7, 3.0)
    x[0] = big
    x[1, ::2], x[1, 1::2] = big, -big             # x - max overflows the compute type
    x[2] = torch.linspace(-big, big, 65, dtype=torch.float64)
    x[3, 0] = big
    x = x.to(dtype=dtype, device=device)
    ours = check_softmax(op_name, x, identity, -1, label=f"{dtype} near max")
    assert not torch.isnan(ours).any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
def test_softmax_length_one_rows(device, dtype, op_name):
    col = torch.tensor([[0.5], [1e4], [-1e4], [INF], [-INF], [NAN]], dtype=torch.float64).to(dtype=dtype,
                                                                                         device=device)
    ours = check_softmax(op_name, col, identity, -1, label=f"length-1 rows {dtype}")
    finite_value = 1.0 if op_name == "softmax" else 0.0
    assert (ours[:3] == finite_value).all() and torch.isnan(ours[3:]).all()
    check_softmax(op_name, col.t().contiguous(), identity, 0, label=f"length-1 columns {dtype}")
    check_softmax(op_name, col[:3].reshape(3, 1, 1), identity, 1, label=f"length-1 middle dim {dtype}")
    check_softmax(op_name, torch.tensor(7.0, dtype=dtype, device=device), identity, 0, label="0-dim")


EMPTY_SHAPES = [((0,), 0), ((0, 5), 0), ((0, 5), 1), ((5, 0), 0), ((5, 0), 1), ((0, 0), -1), ((2, 0, 3), 0),
                ((2, 0, 3), 1), ((2, 0, 3), 2), ((3, 4, 0), 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op_name", list(SOFTMAX_OPS))
def test_softmax_empty_forward_and_backward(device, dtype, op_name):
    ours_fn, torch_fn = SOFTMAX_OPS[op_name]
    for shape, dim in EMPTY_SHAPES:
        x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
        y = ours_fn(x, dim)
        assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
        y.sum().backward()
        assert x.grad.shape == x.shape and x.grad.dtype == dtype
        # dtype= and the backward ops directly
        cast = ours_fn(x.detach(), dim, dtype=torch.float32)
        assert cast.shape == x.shape and cast.dtype == torch.float32
        backward = getattr(torch.ops.oss, f"{op_name}_backward")
        dx = backward(torch.empty_like(y), y.detach(), dim, dtype)
        assert dx.shape == x.shape and dx.dtype == dtype
        assert torch_fn(x.detach(), dim).shape == y.shape


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def make_qkv(B, Hq, Hkv, Lq, Lk, D, Dv, dtype, device, seed, scale=1.0):
    return [randn(shape, seed + i, scale, dtype, device)
            for i, shape in enumerate(((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_values_of_1e4(device, dtype, is_causal):
    B, H, Lq, Lk, D = 1, 2, 37, 70, 64
    # q.k / sqrt(D) of order 1e4: the softmax is (nearly) one-hot
    q, k, _ = make_qkv(B, H, H, Lq, Lk, D, D, torch.float64, "cpu", 10, scale=100.0)
    v = randn((B, H, Lk, D), 13, 1e4)
    if dtype == torch.float32:
        # One query of +-1e4 gives scores of 1e6. Only for float32: in float16 /
        # bfloat16 a score of 1e6 is beyond what a float32 log-sum-exp holds
        # (its ulp of 0.06 makes the recomputed P of every FlashAttention-style
        # backward, PyTorch's fused kernels included, off by several percent, so
        # the comparison measures rounding luck), and in float64 the gradient
        # terms reach 1e10, where the absolute atol of 1e-10 is below one ulp.
        q[0, 0, 3] = 1e4 * torch.randn(D, generator=gen(14), dtype=torch.float64).sign()
    mask = randn((Lq, Lk), 15, 1e4)  # additive mask of +-1e4
    bases = [t.to(dtype=dtype, device=device) for t in (q, k, v)]
    # Gradients of 1e4-1e5 from a near one-hot softmax: each element may carry one
    # rounding of its own magnitude besides the rule's bound, whose max is set by
    # a few elements where the peer's rounding happens to be lucky (an H100's
    # float16 causal dq came out at 1.26x the bound without it).
    check_attention(bases, is_causal=is_causal, label=f"+-1e4 {dtype} causal={is_causal}", per_element_eps=True)
    check_attention(bases, mask=mask.to(dtype=dtype, device=device), is_causal=is_causal,
                    label=f"+-1e4 with a +-1e4 mask {dtype} causal={is_causal}", per_element_eps=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mask_dtype", ["same", "float32"])
def test_attention_minus_inf_mask_entries_get_probability_zero(device, dtype, mask_dtype):
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 45, 133, 32
    bases = make_qkv(B, Hq, Hkv, Lq, Lk, D, D, dtype, device, 20, scale=2.0)
    mdtype = dtype if mask_dtype == "same" else torch.float32
    mask = randn((B, 1, Lq, Lk), 24).to(mdtype)
    mask[..., ::3] = -INF                        # -inf keys (for every query)
    mask[0, 0, 5, :] = -INF                      # a fully masked row through -inf
    mask[1, 0, :, 1::3] = -INF
    mask = mask.to(device)
    out, lse = check_attention(bases, mask=mask, label=f"-inf mask {dtype}/{mdtype}")
    assert (out[0, :, 5] == 0).all() and torch.isneginf(lse[0, :, 5]).all()
    # probability exactly 0: changing the values and keys behind -inf entries changes nothing
    q, k, v = bases
    k2, v2 = k.clone(), v.clone()
    k2[..., ::3, :] = 1e3
    v2[..., ::3, :] = 1e4
    out2, lse2 = torch_oss.attention_with_lse(q, k2, v2, attn_mask=mask, enable_gqa=True)
    ok_rows = torch.isfinite(lse)
    torch.testing.assert_close(out2, out, atol=0, rtol=0)
    assert torch.equal(lse2[ok_rows], lse[ok_rows])
    # and the keys every query masks get exactly zero gradient
    leaves = [t.clone().requires_grad_() for t in bases]
    torch_oss.attention(*leaves, attn_mask=mask, enable_gqa=True).backward(torch.randn_like(out))
    assert (leaves[1].grad[..., ::3, :] == 0).all() and (leaves[2].grad[..., ::3, :] == 0).all()
    assert (leaves[0].grad[0, :, 5] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_attention_inf_and_nan_propagate_like_pytorch(device, dtype):
    """+inf or NaN in a score makes its row NaN; NaN or inf in a value column
    reaches every row that attends to it (as the float64 math and PyTorch's
    math SDPA backend do)."""
    B, H, Lq, Lk, D = 1, 2, 9, 20, 16
    q, k, v = make_qkv(B, H, H, Lq, Lk, D, D, torch.float64, "cpu", 30)
    mask = torch.zeros(1, H, Lq, Lk, dtype=torch.float64)
    mask[..., 1, 4] = INF            # +inf score: row 1 NaN
    mask[..., 2, 7] = NAN            # NaN score: row 2 NaN
    mask[0, 0, 3, :] = -INF          # fully masked (head 0 only): 0
    v[0, 1, 11, 3] = NAN             # value column 3 of head 1: NaN wherever key 11 is attended
    v[0, 1, 12, 5] = INF             # value column 5 of head 1: +inf
    to = dict(dtype=dtype, device=device)
    rows = torch.ones(B, H, Lq, dtype=torch.bool, device=device)
    rows[..., 1] = False  # lse of a row with a +inf score: logsumexp says +inf, NaN is accepted too
    out, lse = check_attention([q.to(**to), k.to(**to), v.to(**to)], mask=mask.to(**to), grad=False,
                               label=f"inf/nan {dtype}", lse_rows=rows)
    assert not torch.isfinite(lse[..., 1]).any()
    assert torch.isnan(out[:, :, 1]).all() and torch.isnan(out[:, :, 2]).all()
    assert (out[0, 0, 3] == 0).all() and torch.isneginf(lse[0, 0, 3]).all()
    assert torch.isnan(out[0, 1, [0, 3, 8], 3]).all() and torch.isposinf(out[0, 1, [0, 3, 8], 5]).all()
    assert torch.isfinite(out[0, 0, [0, 4, 8]]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("where", ["query", "key"])
def test_attention_nan_in_query_or_key_propagates(device, dtype, where):
    """A NaN in q[i] makes every score of row i NaN: the row's output and lse
    must be NaN (F.scaled_dot_product_attention's math, float64 SDPA, the
    reference). A row must not be reported as fully masked (0 output, -inf lse)
    because its scores are NaN. A NaN in k[j] reaches only the rows that see
    key j."""
    B, H, Lq, Lk, D = 1, 2, 6, 10, 16
    q, k, v = make_qkv(B, H, H, Lq, Lk, D, D, torch.float64, "cpu", 40)
    if where == "query":
        q[0, 1, 2, 5] = NAN
    else:
        k[0, 0, 7, 1] = NAN          # causal: rows 0..6 do not see key 7
    to = dict(dtype=dtype, device=device)
    out, lse = check_attention([q.to(**to), k.to(**to), v.to(**to)], is_causal=where == "key", grad=False,
                               label=f"NaN in {where} {dtype}")
    if where == "query":
        assert torch.isnan(out[0, 1, 2]).all() and torch.isnan(lse[0, 1, 2]), (
            f"NaN query row gave out={out[0, 1, 2, :3].tolist()}..., lse={lse[0, 1, 2].item()}")
    else:
        assert torch.isfinite(out[0, 0, :7]).all() and torch.isnan(out[0, 0, 7:]).all()
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=where == "key")  # float64: math backend
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("kind", ["bool", "additive", "bottom_right"])
def test_attention_fully_masked_rows_zero_output_and_gradients(device, dtype, kind):
    B, Hq, Hkv, Lq, Lk, D = 2, 4, 2, 40, 25, 64
    bases = make_qkv(B, Hq, Hkv, Lq, Lk, D, D, dtype, device, 50)
    mask, causal, dead = None, False, [0, 7, 8, 39]
    if kind == "bool":
        mask = torch.rand(B, 1, Lq, Lk, generator=gen(51)) > 0.4
        mask[:, :, dead] = False
    elif kind == "additive":
        mask = randn((Lq, Lk), 52).to(dtype)
        mask[dead] = -INF
    else:
        causal, dead = True, list(range(Lq - Lk))  # the first Lq - Lk rows see no key
    mask = None if mask is None else mask.to(device)
    out, lse = check_attention(bases, mask=mask, is_causal=causal, alignment="bottom_right",
                               label=f"fully masked {kind} {dtype}")
    assert (out[:, :, dead] == 0).all() and torch.isneginf(lse[:, :, dead]).all()
    leaves = [t.clone().requires_grad_() for t in bases]
    o = torch_oss.attention(*leaves, attn_mask=mask, is_causal=causal, enable_gqa=True,
                            causal_alignment="bottom_right")
    o.backward(torch.randn_like(o))
    assert (leaves[0].grad[:, :, dead] == 0).all()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_float16_near_its_limits(device):
    dtype = torch.float16
    B, H, Lq, Lk, D = 1, 2, 33, 70, 64
    q, k, v = make_qkv(B, H, H, Lq, Lk, D, D, torch.float64, "cpu", 60)
    v = (v.sign() * (60000 + 4000 * torch.rand(v.shape, generator=gen(61), dtype=torch.float64))).clamp(
        -65504, 65504)                                               # values near 65504
    fmin = torch.finfo(dtype).min
    mask = torch.zeros(Lq, Lk, dtype=torch.float64)
    mask[:, ::2] = fmin                                              # HF-style finfo.min padding mask
    mask[4, :] = fmin                                                # a row of finfo.min: finite, uniform shift
    to = dict(dtype=dtype, device=device)
    out, lse = check_attention([q.to(**to), k.to(**to), v.to(**to)], mask=mask.to(**to),
                               label="float16 values near 65504, finfo.min mask")
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "finfo.min is finite: no row is fully masked"
    # scores beyond float16's range (q.k/sqrt(D) ~ 3e5) must be computed in a wider type
    big = [(t.sign() * 200).to(**to) for t in (q, k)] + [v.to(**to)]
    big[1][0, 0, 3] = -big[1][0, 0, 3]
    out, _ = check_attention(big, grad=False, label="float16 scores beyond 65504")
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("device", DEVICES)
def test_attention_float16_subnormals(device):
    dtype = torch.float16
    B, H, Lq, Lk, D = 1, 2, 17, 50, 32
    q, k, _ = make_qkv(B, H, H, Lq, Lk, D, D, torch.float64, "cpu", 70, scale=1e-6)   # tiny: uniform weights
    v = 1e-5 + 5e-5 * torch.rand(B, H, Lk, D, generator=gen(71), dtype=torch.float64)  # subnormal values
    qf, kf, vf = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    assert (vf.abs() < torch.finfo(dtype).tiny).any()
    out = torch_oss.attention(qf, kf, vf)
    ref, _ = attention_reference(qf, kf, vf)
    peer = F.scaled_dot_product_attention(qf, kf, vf)
    assert (out != 0).all(), "subnormal outputs were flushed to zero"
    sub = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps   # 2^-24, one subnormal step
    # judged relative to the subnormal step rather than the absolute atol meant for values near 1
    assert_tolerance("float16 subnormal out (in units of 2^-24)", out.double() / sub, ref / sub, peer.double() / sub,
                     1.0)
    check_attention([qf, kf, vf], label="float16 subnormal inputs")


LENGTH_ONE = [
    (1, 1, 1, 1, 1, 32, 32),
    (2, 2, 2, 1, 37, 64, 64),
    (2, 4, 2, 37, 1, 64, 64),
    (1, 3, 1, 5, 1, 16, 24),
    (1, 1, 1, 1, 130, 128, 128),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("is_causal,alignment", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("case", LENGTH_ONE, ids=["b{}h{}-{}l{}-{}d{}-{}".format(*c) for c in LENGTH_ONE])
def test_attention_length_one_sequences(device, dtype, is_causal, alignment, case):
    B, Hq, Hkv, Lq, Lk, D, Dv = case
    bases = make_qkv(*case, dtype, device, 80, scale=2.0)
    out, lse = check_attention(bases, is_causal=is_causal, alignment=alignment,
                               label=f"length one {case} {dtype} causal={is_causal}/{alignment}")
    if Lk == 1 and not (is_causal and alignment == "bottom_right"):
        # one visible key: the output is that key's value
        expected = bases[2].repeat_interleave(Hq // Hkv, dim=1).expand(B, Hq, Lq, Dv)
        torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=dtype_id)
@pytest.mark.parametrize("case", [(1, 1, 1, 1, 130, 128, 128), (1, 2, 2, 70, 45, 100, 72)],
                         ids=["decode_l1-130_d128", "l70-45_d100-72"])
def test_attention_low_precision_gradients_over_many_draws(device, dtype, case):
    """The tolerance rule must hold for every draw, not most: 24 seeded draws
    of a decode-style single query row (and of a small prefill shape) in
    float16/bfloat16, gradients included."""
    for draw in range(24):
        torch.manual_seed(draw)
        bases = make_qkv(*case, dtype, device, 1000 + 3 * draw, scale=2.0)
        check_attention(bases, is_causal=case[3] > 1, alignment="bottom_right", label=f"{case} {dtype} draw {draw}")


EMPTY = [
    (0, 2, 2, 4, 5, 32, 32),
    (2, 2, 2, 0, 5, 32, 32),
    (2, 2, 2, 4, 0, 32, 32),
    (2, 4, 2, 0, 0, 16, 8),
    (0, 4, 1, 0, 7, 64, 64),
    (1, 6, 3, 3, 0, 64, 48),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("variant", ["plain", "causal_br", "bool_mask", "additive_mask"])
@pytest.mark.parametrize("case", EMPTY, ids=["b{}h{}-{}l{}-{}d{}-{}".format(*c) for c in EMPTY])
def test_attention_empty_batches_and_zero_lengths(device, dtype, variant, case):
    B, Hq, Hkv, Lq, Lk, D, Dv = case
    bases = make_qkv(*case, dtype, device, 90)
    mask = None
    if variant == "bool_mask":
        mask = (torch.rand(B, 1, Lq, Lk, generator=gen(91)) > 0.5).to(device)
    elif variant == "additive_mask":
        mask = randn((Lq, Lk), 92, dtype=dtype, device=device)
    causal = variant == "causal_br"
    out, lse = check_attention(bases, mask=mask, is_causal=causal, alignment="bottom_right",
                               label=f"empty {case} {variant} {dtype}")
    assert out.shape == (B, Hq, Lq, Dv) and lse.shape == (B, Hq, Lq)
    if Lk == 0:
        assert (out == 0).all() and torch.isneginf(lse).all()
    # 3-D (N, L, E) inputs with zero lengths
    if Hq == Hkv and mask is None:
        q3, k3, v3 = (t[:, 0] for t in bases)
        assert torch_oss.attention(q3, k3, v3, is_causal=causal).shape == (B, Lq, Dv)
