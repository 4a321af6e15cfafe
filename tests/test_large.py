"""Large tensors on the GPU: index arithmetic past 2^31 elements.

- softmax / log_softmax (forward and backward) over tensors of more than 2^31
  elements: many rows of 1024 or 4096, a dim-0 (column) reduction, and one row of
  2^31 + 1024 elements; sampled rows (each in full) against a float64
  reference, plus a cheap check of every row (sums to 1 / logsumexp 0);
- attention (forward and backward) whose B*H*N*D passes 2^31, once through q
  (and out, dq) with a (B, L, H, D) layout, once through k and v with a
  key-padding mask; sampled heads against a float64 reference computed on
  slices.

CUDA-only and marked slow: `pytest tests/test_large.py` on an H100 runs in
about a minute; each test holds at most ~22 GB and frees it afterwards.
"""

import pytest
import torch
import torch.nn.functional as F
from _util import (ATTENTION_ATOL, BUILD, CUDA_OK, CUDA_SKIP_REASON, SOFTMAX_ATOL, assert_rounded_to_nearest,
                   assert_tolerance, attention_reference, sdpa_peer, ulp)

import torch_oss

pytestmark = [pytest.mark.slow, pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason=CUDA_SKIP_REASON),
              pytest.mark.usefixtures("cuda_memory_freed")]

TWO_31 = 2**31
GiB = 2**30


def need_memory(nbytes):
    free, _ = torch.cuda.mem_get_info()
    if free < nbytes:
        pytest.skip(f"needs {nbytes / GiB:.1f} GiB of free GPU memory, {free / GiB:.1f} GiB free")


def randn_(t, seed, scale=3.0):
    """Fills t (any float dtype, on the GPU, dense in some order of its dims,
    as empty_like of a transposed view is) with randn * scale, chunk by chunk
    in memory order."""
    g = torch.Generator(device=t.device).manual_seed(seed)
    flat = t.permute(sorted(range(t.dim()), key=lambda d: -t.stride(d))).view(-1)
    step = 2**28
    for i in range(0, flat.numel(), step):
        chunk = flat[i:i + step]
        chunk.copy_(torch.randn(chunk.shape, device=t.device, generator=g, dtype=torch.float32).mul_(scale))
    return t


def sample_rows(total, row_elems, extra=48, seed=0):
    """Rows to check in full: the ends, the middle, the rows holding elements
    2^31 - 1 and 2^31 (where 32-bit offsets wrap), and random ones."""
    rows = {0, 1, total // 2, total - 1, (TWO_31 - 1) // row_elems, TWO_31 // row_elems,
            min(total - 1, TWO_31 // row_elems + 1)}
    g = torch.Generator().manual_seed(seed)
    rows |= set(torch.randint(0, total, (extra,), generator=g).tolist())
    return torch.tensor(sorted(r for r in rows if 0 <= r < total), device="cuda")


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [1024, 4096])
def test_softmax_rows_past_2_31_elements(dtype, cols):
    """Rows of 1024 columns (the warp tier on the GPU) and of 4096 (one CTA per
    row, 524,290 rows in the grid's x dimension), 2^31 + 2 * cols elements."""
    rows = (TWO_31 + cols) // cols + 1
    need_memory(4 * rows * cols * 2 + 2 * GiB)
    x = randn_(torch.empty(rows, cols, dtype=dtype, device="cuda"), 1)
    idx = sample_rows(rows, cols)
    xs = x[idx]
    for op_name, ours_fn, torch_fn in (("softmax", torch_oss.softmax, F.softmax),
                                       ("log_softmax", torch_oss.log_softmax, F.log_softmax)):
        y = ours_fn(x, -1)
        assert y.shape == x.shape and y.dtype == dtype
        assert_tolerance(f"{op_name} {dtype} sampled rows of {rows}x{cols}", y[idx], torch_fn(xs.double(), -1),
                         torch_fn(xs, -1), SOFTMAX_ATOL[dtype])
        # every row: sums to 1 (softmax) or has logsumexp 0 (log_softmax); catches unwritten or misplaced rows
        worst = 0.0
        for chunk in y.split(2**18):
            c = chunk.float()
            dev = (c.sum(-1) - 1) if op_name == "softmax" else c.logsumexp(-1)
            worst = max(worst, dev.abs().max().item())
        tol = 8 * torch.finfo(dtype).eps
        assert worst <= tol, f"{op_name} {dtype}: a row deviates by {worst:.3g} (> {tol:.3g}) from normalisation"
        if op_name == "softmax":
            keep_y = y
        del y
    # backward through the op over all rows; sampled rows against the formula in float64
    del x
    y = keep_y
    dy = randn_(torch.empty_like(y), 2, 1.0)
    dx = torch.ops.oss.softmax_backward(dy, y, -1, dtype)
    ys, dys = y[idx].double(), dy[idx].double()
    ref = ys * (dys - (ys * dys).sum(-1, keepdim=True))
    peer = torch.ops.aten._softmax_backward_data(dy[idx], y[idx], -1, dtype)
    assert_tolerance(f"softmax_backward {dtype} sampled rows", dx[idx], ref, peer, SOFTMAX_ATOL[dtype])
    assert torch.isfinite(dx).all()


def test_softmax_columns_past_2_31_elements():
    dtype = torch.bfloat16
    n, inner = 1025, 2**21                               # dim 0 of 1025: offsets i * 2^21 + j pass 2^31
    need_memory(2 * n * inner * 2 + 2 * GiB)
    x = randn_(torch.empty(n, inner, dtype=dtype, device="cuda"), 3)
    g = torch.Generator().manual_seed(4)
    cols = torch.cat([torch.tensor([0, 1, inner // 2, inner - 1]), torch.randint(0, inner, (60,), generator=g)]).cuda()
    for op_name, ours_fn, torch_fn in (("softmax", torch_oss.softmax, F.softmax),
                                       ("log_softmax", torch_oss.log_softmax, F.log_softmax)):
        y = ours_fn(x, 0)
        xs = x[:, cols]
        assert_tolerance(f"{op_name} columns {n}x{inner}", y[:, cols], torch_fn(xs.double(), 0), torch_fn(xs, 0),
                         SOFTMAX_ATOL[dtype])
        worst = 0.0
        for chunk in y.split(2**16, dim=1):
            c = chunk.float()
            dev = (c.sum(0) - 1) if op_name == "softmax" else c.logsumexp(0)
            worst = max(worst, dev.abs().max().item())
        assert worst <= 8 * torch.finfo(dtype).eps, f"{op_name}: a column deviates by {worst:.3g}"
        del y


def test_softmax_one_row_of_2_31_plus_1024_elements():
    dtype = torch.bfloat16
    n = TWO_31 + 1024
    need_memory(3 * n * 2 + 2 * GiB)
    x = randn_(torch.empty(1, n, dtype=dtype, device="cuda"), 5)
    # exact statistics of the row in float64, chunk by chunk
    m = x.max().double()
    total = sum(torch.exp(c.double() - m).sum() for c in x.view(-1).split(2**26))
    lse = (m + torch.log(total)).item()
    pieces = [slice(0, 2**20), slice(TWO_31 - 2**19, TWO_31 + 2**19), slice(n - 2**20, n)]
    y = torch_oss.log_softmax(x, -1)
    for s in pieces:
        ref = x[0, s].double() - lse
        name = f"log_softmax one row, elements {s.start}..{s.stop}"
        # y = x - lse is about -26 +- 15 here (x = 3 randn): bfloat16 rounds it by up to 0.125, so no
        # absolute atol can judge it. Each element must be the reference rounded to nearest (the bias
        # bound is loose: x's coarse bfloat16 grid leaves only a few rounding offsets), and the row's
        # log-sum-exp the kernel used, bracketed by every element's rounding interval, must be lse.
        assert_rounded_to_nearest(name, y[0, s], ref, max_bias=0.1)
        xd, yd = x[0, s].double(), y[0, s].double().cpu()
        half = ulp(yd, dtype) / 2  # the binade's half ulp, never below the true half gap
        lo = (xd.cpu() - yd - half).max().item() - 1e-4  # 1e-4: the float32 statistics and x - lse
        hi = (xd.cpu() - yd + half).min().item() + 1e-4
        assert lo <= lse <= hi, f"{name}: the kernel's log-sum-exp is in [{lo:.6f}, {hi:.6f}], not {lse:.6f}"
    del y
    y = torch_oss.softmax(x, -1)
    for s in pieces:
        ref = torch.exp(x[0, s].double() - lse)
        got = y[0, s].double()
        # values are ~1/n: judge them relative to their own size
        rel = ((got - ref).abs() / ref).max().item()
        assert rel <= 2 * torch.finfo(dtype).eps, f"softmax one row, {s}: relative error {rel:.3g}"
    s = sum(c.double().sum() for c in y.view(-1).split(2**26)).item()
    assert abs(s - 1) <= 8 * torch.finfo(dtype).eps, f"softmax one row sums to {s}"


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def large_head_dim():
    dims = BUILD["attention_head_dims"]
    return 128 if (not dims or 128 in dims or max(dims) >= 128) else max(dims)


def check_heads(q, k, v, out, lse, grads, dout, heads, mask, is_causal, label):
    """out, lse and the gradients of the (b, h) heads in `heads` against the
    float64 reference computed on those slices (no GQA: every head of out and
    dq/dk/dv depends on its own slice only)."""
    dtype = q.dtype
    for b, h in heads:
        sl = [t[b:b + 1, h:h + 1].detach() for t in (q, k, v)]
        m = None if mask is None else mask[b:b + 1]
        leaves = [t.double().requires_grad_() for t in sl]
        ref_out, ref_lse = attention_reference(*leaves, m, is_causal)
        ref_out.backward(dout[b:b + 1, h:h + 1].double())
        peer_leaves = [t.clone().requires_grad_() for t in sl]
        peer = sdpa_peer(*peer_leaves, m, is_causal)
        peer.backward(dout[b:b + 1, h:h + 1])
        name = f"{label} head ({b}, {h})"
        assert_tolerance(f"out {name}", out[b:b + 1, h:h + 1], ref_out, peer, ATTENTION_ATOL[dtype])
        assert_tolerance(f"lse {name}", lse[b:b + 1, h:h + 1], ref_lse, None, 1e-3)
        for i, g in enumerate(("dq", "dk", "dv")):
            assert_tolerance(f"{g} {name}", grads[i][b:b + 1, h:h + 1], leaves[i].grad, peer_leaves[i].grad,
                             ATTENTION_ATOL[dtype])


def heads_to_check(B, H, per_head, seed):
    """(b, h) pairs: the first and last heads, the heads around element offset
    2^31 for a (B, H, L, D) layout, and random ones."""
    flat = {0, B * H - 1, (TWO_31 - 1) // per_head, TWO_31 // per_head}
    g = torch.Generator().manual_seed(seed)
    flat |= set(torch.randint(0, B * H, (4,), generator=g).tolist())
    return sorted(divmod(f, H) for f in flat if f < B * H)


def test_attention_query_past_2_31_elements_blhd_layout():
    dtype, D = torch.bfloat16, large_head_dim()
    B, Lq, Lk = 2, 1024, 256
    H = -(-(TWO_31 + 2**20) // (B * Lq * D))            # B*H*Lq*D just past 2^31
    n_q = B * H * Lq * D
    assert n_q > TWO_31
    need_memory(2 * (4 * n_q + 4 * B * H * Lk * D) + 3 * GiB)
    # (B, L, H, D) storage seen as (B, H, L, D): the offset of (b, l, h) is ((b*L + l)*H + h)*D
    q = randn_(torch.empty(B, Lq, H, D, dtype=dtype, device="cuda"), 10, 1.0).transpose(1, 2).requires_grad_()
    k = randn_(torch.empty(B, H, Lk, D, dtype=dtype, device="cuda"), 11, 1.0).requires_grad_()
    v = randn_(torch.empty(B, H, Lk, D, dtype=dtype, device="cuda"), 12, 1.0).requires_grad_()
    out, lse = torch_oss.attention_with_lse(q, k, v, is_causal=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    dout = randn_(torch.empty_like(out), 13, 1.0)
    out.backward(dout)
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    # batch 1 rows sit past element 2^31 in this layout; check heads of both batches
    heads = [(0, 0), (0, H - 1), (1, 0), (1, H // 2), (1, H - 1)]
    check_heads(q, k, v, out.detach(), lse, [q.grad, k.grad, v.grad], dout, heads, None, True,
                f"q {tuple(q.shape)} (B,L,H,D) layout")


def test_attention_key_value_past_2_31_elements_with_mask():
    dtype, D = torch.float16, large_head_dim()
    B, Lq, Lk = 2, 256, 1024
    H = -(-(TWO_31 + 2**20) // (B * Lk * D))
    n_kv = B * H * Lk * D
    assert n_kv > TWO_31
    need_memory(2 * (4 * n_kv + 4 * B * H * Lq * D) + 3 * GiB)
    q = randn_(torch.empty(B, H, Lq, D, dtype=dtype, device="cuda"), 20, 1.0).requires_grad_()
    k = randn_(torch.empty(B, H, Lk, D, dtype=dtype, device="cuda"), 21, 1.0).requires_grad_()
    v = randn_(torch.empty(B, H, Lk, D, dtype=dtype, device="cuda"), 22, 1.0).requires_grad_()
    mask = torch.ones(B, 1, 1, Lk, dtype=torch.bool, device="cuda")
    mask[1, ..., Lk - 100:] = False                        # key padding in the second batch
    out, lse = torch_oss.attention_with_lse(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    dout = randn_(torch.empty_like(out), 23, 1.0)
    out.backward(dout)
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (k.grad[1, :, Lk - 100:] == 0).all() and (v.grad[1, :, Lk - 100:] == 0).all()
    heads = heads_to_check(B, H, Lk * D, 24)
    check_heads(q, k, v, out.detach(), lse, [q.grad, k.grad, v.grad], dout, heads, mask, False,
                f"k/v {tuple(k.shape)} with key padding")
