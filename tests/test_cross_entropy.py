"""torch.ops.oss.cross_entropy / cross_entropy_backward, torch_oss.cross_entropy
and torch_oss.linear_cross_entropy against float64 references (F.cross_entropy
on float64 logits, the z-loss term written out), with PyTorch's own kernel on
the same inputs as the tolerance rule's peer; edge cases, gradients, opcheck
and torch.compile.

The ops' loss and lse are float32 for 16-bit logits, so their peer is
F.cross_entropy computed in float32 on the same (16-bit) values; the
gradient of the logits has their dtype, and its peer is F.cross_entropy's
gradient in that dtype.

The CUDA kernels (csrc/cuda/cross_entropy/cross_entropy.cu) run every case
parametrised over DEVICES (among them vocabularies of 50257, 128256 and
151936 in every dtype, rows on both sides of the warp-per-row / CTA-per-row
switch at 2048 classes, misaligned and strided rows, ±1e4 and -inf logits, the
fused and in-place forward+backward ops), plus the CUDA-only ones: bad
targets (NaN rows instead of an error) and bitwise reproducibility."""

import pytest
import torch
import torch.nn.functional as F
from _util import (CUDA_OK, CUDA_SKIP_REASON, DEVICES, FLOAT_DTYPES, NVCC_SKIP, SOFTMAX_ATOL, assert_tolerance,
                   awkward_randn, cuda_param, derived_atol, ptxas_report)

import torch_oss

IGNORE = -100
# (label_smoothing, z_loss)
SMOOTHING_Z = [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.25, 1e-2)]


def peer_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def lse_atol(dtype, ref_lse):
    """The rule's atol for the log-sum-exp: it is stored in float64 (m + log d
    taken in float64), but for float32 and 16-bit logits its sum d is a float32
    sum, so its atol is float32's (derived from the reference), not float64's."""
    return derived_atol(torch.float32, ref_lse) if peer_dtype(dtype) == torch.float32 else SOFTMAX_ATOL[dtype]


def random_target(shape, classes, device, ignored_every=0):
    t = torch.randint(0, classes, shape, device=device)
    if ignored_every:
        t.view(-1)[::ignored_every] = IGNORE
    return t


def rows_reference(x, target, label_smoothing, z_loss, ignore_index=IGNORE):
    """Per-row loss and lse of 2-D logits with F.cross_entropy plus the z-loss,
    in x's dtype (differentiable)."""
    loss = F.cross_entropy(x, target, reduction="none", ignore_index=ignore_index, label_smoothing=label_smoothing)
    lse = torch.logsumexp(x, dim=1)
    if z_loss:
        loss = loss + torch.where(target != ignore_index, z_loss * lse * lse, 0)
    return loss, lse


def full_reference(x, target, weight=None, reduction="mean", label_smoothing=0.0, z_loss=0.0):
    """torch_oss.cross_entropy's definition from F.cross_entropy (any input
    form), in x's dtype: the z-loss term z * w_t * lse^2 per counted row, in
    the same reduction."""
    loss = F.cross_entropy(x, target, weight=weight, ignore_index=IGNORE, reduction=reduction,
                           label_smoothing=label_smoothing)
    if not z_loss:
        return loss
    lse = torch.logsumexp(x, dim=1 if x.dim() > 1 else 0)
    counted = target != IGNORE
    w_t = torch.ones_like(lse) if weight is None else weight[torch.where(counted, target, 0)]
    w_t = torch.where(counted, w_t, 0)
    z = z_loss * w_t * lse * lse
    if reduction == "none":
        return loss + z
    if reduction == "sum":
        return loss + z.sum()
    return loss + z.sum() / w_t.sum()


def grad_reference(x64, target, g, label_smoothing, z_loss):
    """The logits' gradient written out in float64 (autograd through
    F.cross_entropy in float64 is itself off by up to ~4e-13 at 128256
    classes with smoothing and z-loss, where the written-out form is within a
    few 1e-15)."""
    C = x64.shape[1]
    lse = torch.logsumexp(x64, dim=1, keepdim=True)
    grad = torch.exp(x64 - lse) * (1 + 2 * z_loss * lse) - label_smoothing / C
    counted = target != IGNORE
    rows = torch.arange(x64.shape[0], device=x64.device)[counted]
    grad[rows, target[counted]] -= 1 - label_smoothing
    return torch.where(counted[:, None], grad * g[:, None], 0)


# ---------------------------------------------------------------------------
# The ops
# ---------------------------------------------------------------------------

# (rows, classes): 1 and 3 classes, warp-per-row rows (up to 2048 classes on
# CUDA) and CTA-per-row ones, LM vocabularies (row 0 of each ignored)
OP_SHAPES = [(1, 1), (7, 3), (33, 1000), (64, 2048), (5, 2049), (3, 4099), (3, 50257), (3, 128256), (3, 151936)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", OP_SHAPES)
@pytest.mark.parametrize("label_smoothing,z_loss", SMOOTHING_Z)
def test_op_forward_and_backward(device, dtype, shape, label_smoothing, z_loss):
    N, C = shape
    x = awkward_randn(shape, dtype, device)
    t = random_target((N,), C, device, ignored_every=3 if N > 2 else 0)
    args = (IGNORE, label_smoothing, z_loss)
    loss, lse = torch.ops.oss.cross_entropy(x, t, *args)
    assert loss.dtype == peer_dtype(dtype) and lse.dtype == torch.float64 and loss.shape == lse.shape == (N,)

    x64 = x.double().requires_grad_()
    ref_loss, ref_lse = rows_reference(x64, t, label_smoothing, z_loss)
    xp = x.to(peer_dtype(dtype))
    peer_loss, peer_lse = rows_reference(xp, t, label_smoothing, z_loss)
    # the loss's atol is that of its own dtype (float32 for 16-bit logits)
    atol = SOFTMAX_ATOL[peer_dtype(dtype)]
    assert_tolerance("loss", loss, ref_loss, peer_loss, atol)
    assert_tolerance("lse", lse, ref_lse, peer_lse, lse_atol(dtype, ref_lse))
    assert torch.all(loss[t == IGNORE] == 0)

    g = torch.rand(N, dtype=torch.float64, device=device) + 0.5
    ref_grad = grad_reference(x.double(), t, g, label_smoothing, z_loss)
    grad = torch.ops.oss.cross_entropy_backward(g.to(loss.dtype), x, t, lse, *args)
    assert grad.dtype == dtype and grad.shape == x.shape
    xq = x.detach().requires_grad_()
    peer_rows, _ = rows_reference(xq, t, label_smoothing, z_loss)
    (peer_grad,) = torch.autograd.grad(peer_rows, xq, g.to(peer_rows.dtype))
    assert_tolerance("grad", grad, ref_grad, peer_grad, SOFTMAX_ATOL[dtype])
    assert torch.all(grad[t == IGNORE] == 0)


FUSED_SHAPES = [(9, 5003), (40, 700), (3, 128256)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_forward_backward_ops(device, dtype, shape):
    """cross_entropy_forward_backward against the float64 references, and its
    in-place form (the gradient written over the logits) bitwise equal to it.
    On the CPU both run the two kernels, so they also equal cross_entropy
    followed by cross_entropy_backward bitwise; on CUDA the fused launch may
    give a row more threads than the forward alone (another reduction tree),
    so there it is held to the tolerance rule only."""
    N, C = shape
    x = awkward_randn((N, C), dtype, device)
    t = random_target((N,), C, device, ignored_every=4)
    for label_smoothing, z_loss in SMOOTHING_Z:
        args = (IGNORE, label_smoothing, z_loss)
        g = (torch.rand(N, dtype=torch.float64, device=device) + 0.5).to(peer_dtype(dtype))
        loss, lse, grad = torch.ops.oss.cross_entropy_forward_backward(g, x, t, *args)
        assert loss.dtype == peer_dtype(dtype) and lse.dtype == torch.float64 and grad.dtype == dtype
        xi = x.clone()
        i_loss, i_lse = torch.ops.oss.cross_entropy_forward_backward_(g, xi, t, *args)
        assert torch.equal(i_loss, loss) and torch.equal(i_lse, lse) and torch.equal(xi, grad)
        if device == "cpu":
            s_loss, s_lse = torch.ops.oss.cross_entropy(x, t, *args)
            s_grad = torch.ops.oss.cross_entropy_backward(g, x, t, s_lse, *args)
            assert torch.equal(s_loss, loss) and torch.equal(s_lse, lse) and torch.equal(s_grad, grad)
        x64 = x.double()
        ref_loss, ref_lse = rows_reference(x64, t, label_smoothing, z_loss)
        peer_loss, peer_lse = rows_reference(x.to(peer_dtype(dtype)), t, label_smoothing, z_loss)
        atol = SOFTMAX_ATOL[peer_dtype(dtype)]
        assert_tolerance("fused loss", loss, ref_loss, peer_loss, atol)
        assert_tolerance("fused lse", lse, ref_lse, peer_lse, lse_atol(dtype, ref_lse))
        ref_grad = grad_reference(x64, t, g.double(), label_smoothing, z_loss)
        xq = x.detach().requires_grad_()
        peer_rows, _ = rows_reference(xq, t, label_smoothing, z_loss)
        (peer_grad,) = torch.autograd.grad(peer_rows, xq, g.to(peer_rows.dtype))
        assert_tolerance("fused grad", grad, ref_grad, peer_grad, SOFTMAX_ATOL[dtype])
        assert torch.all(grad[t == IGNORE] == 0) and torch.all(loss[t == IGNORE] == 0)


# rows held on chip on sm_90 by one CTA or a cluster of 2 to 8 (16-bit: a
# 512-thread CTA, clusters of 4 and 7; float32: clusters of 3, 4 and 7, then
# the L2 path at 262144 classes; float64: clusters of 6 and 8, then the L2
# path from 128256 classes); smaller rows, one CTA of 128 to 256 threads, run
# in the shapes above
ONCHIP_SHAPES = [(6, 40001), (3, 60001), (2, 128256), (2, 262144)]


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", ONCHIP_SHAPES)
@pytest.mark.parametrize("offset", [0, 3])
def test_forward_backward_op_wide_rows(device, dtype, shape, offset):
    """The fused op on rows as wide as the on-chip kernel's clusters hold (and
    wider), on rows starting at 16-byte boundaries and 3 elements past them
    (head and tail elements on the first and last CTA of a row), in place too,
    against the float64 references, with the target placed in the head, the
    middle and the tail."""
    N, C = shape
    base = awkward_randn((N, C + offset), dtype, device)
    x = base[:, offset:]
    t = random_target((N,), C, device)
    t[0] = 1
    if N > 2:
        t[1] = C - 2
        t[2] = IGNORE
    g = (torch.rand(N, dtype=torch.float64, device=device) + 0.5).to(peer_dtype(dtype))
    args = (IGNORE, 0.1, 1e-3)
    loss, lse, grad = torch.ops.oss.cross_entropy_forward_backward(g, x, t, *args)
    xi = base.clone()
    i_loss, i_lse = torch.ops.oss.cross_entropy_forward_backward_(g, xi[:, offset:], t, *args)
    assert torch.equal(i_loss, loss) and torch.equal(i_lse, lse) and torch.equal(xi[:, offset:], grad)
    assert torch.equal(xi[:, :offset], base[:, :offset])
    x64 = x.double()
    ref_loss, ref_lse = rows_reference(x64, t, 0.1, 1e-3)
    peer_loss, peer_lse = rows_reference(x.to(peer_dtype(dtype)), t, 0.1, 1e-3)
    assert_tolerance("wide loss", loss, ref_loss, peer_loss, SOFTMAX_ATOL[peer_dtype(dtype)])
    assert_tolerance("wide lse", lse, ref_lse, peer_lse, lse_atol(dtype, ref_lse))
    ref_grad = grad_reference(x64, t, g.double(), 0.1, 1e-3)
    xq = x.detach().requires_grad_()
    peer_rows, _ = rows_reference(xq, t, 0.1, 1e-3)
    (peer_grad,) = torch.autograd.grad(peer_rows, xq, g.to(peer_rows.dtype))
    assert_tolerance("wide grad", grad, ref_grad, peer_grad, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("classes", [30001, 60001, 128256])
def test_forward_backward_op_targets_across_the_row(device, dtype, classes):
    """The target's gradient wherever the target lies: one row per target
    position, the positions spread evenly over the row (every CTA of a
    cluster, the part of a chunk held in registers and the part in shared
    memory) plus the head and tail elements of rows 3 elements off the
    16-byte boundaries; the fused op and its in-place form against the
    float64 references."""
    positions = torch.cat([torch.linspace(0, classes - 1, 61).long(), torch.tensor([1, 2, 3, classes - 2])])
    N = positions.numel()
    base = awkward_randn((N, classes + 3), dtype, device)
    x = base[:, 3:]
    t = positions.to(device)
    g = (torch.rand(N, dtype=torch.float64, device=device) + 0.5).to(peer_dtype(dtype))
    args = (IGNORE, 0.1, 0.0)
    loss, lse, grad = torch.ops.oss.cross_entropy_forward_backward(g, x, t, *args)
    xi = base.clone()
    i_loss, i_lse = torch.ops.oss.cross_entropy_forward_backward_(g, xi[:, 3:], t, *args)
    assert torch.equal(i_loss, loss) and torch.equal(i_lse, lse) and torch.equal(xi[:, 3:], grad)
    x64 = x.double()
    ref_loss, _ = rows_reference(x64, t, 0.1, 0.0)
    peer_loss, _ = rows_reference(x.to(peer_dtype(dtype)), t, 0.1, 0.0)
    assert_tolerance("targets loss", loss, ref_loss, peer_loss, SOFTMAX_ATOL[peer_dtype(dtype)])
    ref_grad = grad_reference(x64, t, g.double(), 0.1, 0.0)
    xq = x.detach().requires_grad_()
    peer_rows, _ = rows_reference(xq, t, 0.1, 0.0)
    (peer_grad,) = torch.autograd.grad(peer_rows, xq, g.to(peer_rows.dtype))
    assert_tolerance("targets grad", grad, ref_grad, peer_grad, SOFTMAX_ATOL[dtype])
    rows = torch.arange(N, device=device)
    assert torch.all(grad[rows, t] < 0)  # -(1 - eps) g dominates at the target


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("classes", [40001, 128256, 262144])
def test_forward_backward_op_many_rows(device, dtype, classes):
    """More wide rows than the GPU holds at once (several waves of CTAs or
    clusters): each row of the batch equals the same row computed alone, bit
    for bit (its reduction has the same shape), with ignored rows among them,
    rows 3 elements off the 16-byte boundaries, and in place too; some rows
    against the float64 references."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    N = 3 * sms + 5
    base = awkward_randn((N, classes + 3), dtype, device)
    x = base[:, 3:]
    t = random_target((N,), classes, device, ignored_every=7)
    g = (torch.rand(N, dtype=torch.float64, device=device) + 0.5).to(peer_dtype(dtype))
    args = (IGNORE, 0.1, 1e-3)
    loss, lse, grad = torch.ops.oss.cross_entropy_forward_backward(g, x, t, *args)
    xi = base.clone()
    i_loss, i_lse = torch.ops.oss.cross_entropy_forward_backward_(g, xi[:, 3:], t, *args)
    assert torch.equal(i_loss, loss) and torch.equal(i_lse, lse) and torch.equal(xi[:, 3:], grad)
    for i in [0, 1, 7, sms - 1, sms, 2 * sms + 1, N - 2, N - 1]:
        r_loss, r_lse, r_grad = torch.ops.oss.cross_entropy_forward_backward(g[i:i + 1], x[i:i + 1], t[i:i + 1], *args)
        assert torch.equal(r_loss, loss[i:i + 1]) and torch.equal(r_lse, lse[i:i + 1]), f"row {i}"
        assert torch.equal(r_grad, grad[i:i + 1]), f"row {i}"
    rows = torch.tensor([0, 1, sms + 2, N - 1], device=device)
    xr, tr = x[rows], t[rows]
    ref_loss, _ = rows_reference(xr.double(), tr, 0.1, 1e-3)
    peer_loss, _ = rows_reference(xr.to(peer_dtype(dtype)), tr, 0.1, 1e-3)
    assert_tolerance("many-rows loss", loss[rows], ref_loss, peer_loss, SOFTMAX_ATOL[peer_dtype(dtype)])
    ref_grad = grad_reference(xr.double(), tr, g[rows].double(), 0.1, 1e-3)
    xq = xr.detach().requires_grad_()
    peer_rows, _ = rows_reference(xq, tr, 0.1, 1e-3)
    (peer_grad,) = torch.autograd.grad(peer_rows, xq, g[rows].to(peer_rows.dtype))
    assert_tolerance("many-rows grad", grad[rows], ref_grad, peer_grad, SOFTMAX_ATOL[dtype])


def two_ops_loss(x, t, reduction, label_smoothing, z_loss):
    """torch_oss.cross_entropy's sum / mean composed from the forward op (whose
    autograd formula runs the backward op), as a compiled graph runs it."""
    loss, _ = torch.ops.oss.cross_entropy(x, t, IGNORE, label_smoothing, z_loss)
    total = loss.sum(dtype=torch.float64).to(loss.dtype)
    return total if reduction == "sum" else total / (t != IGNORE).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [0, 1, 37, 100003])
def test_row_weights_and_total_ops(device, dtype, rows):
    """The mean loss's glue: the row weights equal [t != ignore_index] (over
    their count for a mean) as ATen forms them, bit for bit, and the count is
    exact; the total is the float64 sum rounded once to the loss's dtype (then
    over the count), within that rounding (and the two float64 sums' own
    error) of ATen's sum; no counted row gives
    NaN weights and a NaN mean, as F.cross_entropy's mean; the same bits from
    call to call."""
    t = random_target((rows,), 1000, device, ignored_every=3)
    counted = t != IGNORE
    for mean in (True, False):
        w, n = torch.ops.oss.cross_entropy_row_weights(t, IGNORE, dtype, mean)
        assert w.dtype == dtype and w.shape == (rows,) and n.dtype == torch.int64 and n.shape == ()
        assert n.item() == counted.sum().item()
        want = counted.to(dtype) / counted.sum() if mean else counted.to(dtype)
        torch.testing.assert_close(w, want, rtol=0, atol=0, equal_nan=True)  # (NaN: no counted row)
    loss = (torch.rand(rows, dtype=torch.float64, device=device) * 10).to(dtype)
    loss[~counted] = 0
    for count in (None, n):
        total = torch.ops.oss.cross_entropy_total(loss, count)
        assert total.dtype == dtype and total.shape == ()
        want = loss.sum(dtype=torch.float64).to(dtype)
        want = want if count is None else want / count
        # (the two float64 sums in different orders, each within rows x eps of the exact one)
        rtol = torch.finfo(dtype).eps + 2 * rows * torch.finfo(torch.float64).eps
        torch.testing.assert_close(total, want, rtol=rtol, atol=0, equal_nan=True)
        torch.testing.assert_close(torch.ops.oss.cross_entropy_total(loss, count), total, rtol=0, atol=0,
                                   equal_nan=True)
    t_none = torch.full((5,), IGNORE, device=device)
    w, n = torch.ops.oss.cross_entropy_row_weights(t_none, IGNORE, dtype, True)
    assert n.item() == 0 and torch.isnan(w).all()
    assert torch.isnan(torch.ops.oss.cross_entropy_total(torch.zeros(5, dtype=dtype, device=device), n))


def test_row_weights_and_total_errors():
    t = torch.tensor([0, 1, IGNORE])
    with pytest.raises(TypeError, match="target has dtype"):
        torch.ops.oss.cross_entropy_row_weights(t.int(), IGNORE, torch.float32, True)
    with pytest.raises(ValueError, match="target has shape"):
        torch.ops.oss.cross_entropy_row_weights(t[None], IGNORE, torch.float32, True)
    with pytest.raises(TypeError, match="dtype"):
        torch.ops.oss.cross_entropy_row_weights(t, IGNORE, torch.float16, True)
    with pytest.raises(TypeError, match="loss has dtype"):
        torch.ops.oss.cross_entropy_total(torch.ones(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="loss has shape"):
        torch.ops.oss.cross_entropy_total(torch.ones(3, 1))
    with pytest.raises(TypeError, match="count"):
        torch.ops.oss.cross_entropy_total(torch.ones(3), torch.tensor(3.0))
    with pytest.raises(TypeError, match="count"):
        torch.ops.oss.cross_entropy_total(torch.ones(3), torch.tensor([3]))
    with pytest.raises(NotImplementedError, match="not differentiable"):
        torch.ops.oss.cross_entropy_total(torch.ones(3, requires_grad=True))


def test_which_losses_form_the_gradient_in_the_forward():
    """Only a differentiated, unweighted mean in eager mode takes the fused
    form; the other cases keep the two ops' graph."""
    x = torch.randn(6, 40, requires_grad=True)
    t = torch.tensor([0, 39, IGNORE, 5, 5, 1])

    def node(**kwargs):
        return type(torch_oss.cross_entropy(x, t, **kwargs).grad_fn).__name__

    assert node() == node(label_smoothing=0.1, z_loss=1e-3) == "_FusedLossBackward"
    assert node(reduction="sum") != "_FusedLossBackward"
    assert node(weight=torch.rand(40)) != "_FusedLossBackward"
    assert node(reduction="none") != "_FusedLossBackward"
    # in place: sums too, nothing else
    keep = x.detach().clone()
    for kwargs in (dict(reduction="none"), dict(weight=torch.rand(40))):
        xc = keep.clone().requires_grad_()
        assert type(torch_oss.cross_entropy(xc, t, inplace_backward=True, **kwargs).grad_fn).__name__ \
            != "_FusedLossBackward"
        assert torch.equal(xc.detach(), keep)  # not overwritten
    xc = keep.clone().requires_grad_()
    assert type(torch_oss.cross_entropy(xc, t, reduction="sum", inplace_backward=True).grad_fn).__name__ \
        == "_FusedLossBackward"
    with torch.no_grad():
        assert torch_oss.cross_entropy(x, t).grad_fn is None
    assert torch_oss.cross_entropy(x.detach(), t).grad_fn is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("upstream", [1.0, 0.37])
@pytest.mark.parametrize("shape", [(37, 5003), (5, 128256)])
def test_loss_gradient_formed_in_the_forward(device, dtype, reduction, upstream, shape):
    """A differentiated mean loss: the forward writes the logits' gradient,
    the backward hands it on (upstream gradient 1) or rewrites it for its
    upstream gradient (a sum, which keeps the two ops, for comparison).
    Against float64 by the rule, and against the two ops' gradient: bitwise
    on the CPU, where both run the same kernels (for the same row
    gradients)."""
    N, C = shape
    x = awkward_randn(shape, dtype, device)
    t = random_target((N,), C, device, ignored_every=4)
    for label_smoothing, z_loss in SMOOTHING_Z[::3]:
        xa = x.detach().requires_grad_()
        loss = torch_oss.cross_entropy(xa, t, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
        up = torch.tensor(upstream, dtype=loss.dtype, device=device)
        (grad,) = torch.autograd.grad(loss, xa, up)
        xb = x.detach().requires_grad_()
        two = two_ops_loss(xb, t, reduction, label_smoothing, z_loss)
        (two_grad,) = torch.autograd.grad(two, xb, up)
        x64 = x.double().requires_grad_()
        ref = full_reference(x64, t, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
        (ref_grad,) = torch.autograd.grad(ref, x64, up.double())
        xq = x.detach().to(peer_dtype(dtype)).requires_grad_()
        peer = full_reference(xq, t, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
        (peer_grad,) = torch.autograd.grad(peer, xq, up.to(peer.dtype))
        assert_tolerance("loss", loss, ref.detach(), peer.detach(), SOFTMAX_ATOL[peer_dtype(dtype)])
        assert_tolerance("grad", grad, ref_grad, peer_grad.to(dtype), SOFTMAX_ATOL[dtype], per_element_eps=True)
        # On the CPU both forms run the same row kernels: the same gradient bit
        # for bit (a mean's two ops scale by upstream / n, this by (1 / n) *
        # upstream), the same total up to the order of its float64 sum
        # (cross_entropy_total's against ATen's), so within one rounding.
        if device == "cpu" and (upstream == 1.0 or reduction == "sum"):
            assert torch.equal(grad, two_grad)
            torch.testing.assert_close(loss, two, rtol=torch.finfo(loss.dtype).eps, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("upstream", [1.0, 0.37])
def test_loss_gradient_written_over_the_input(device, dtype, reduction, upstream):
    """inplace_backward=True: the forward writes the gradient of the loss for
    an upstream gradient of 1 over the input (a non-leaf here, as logits out of
    a model are), the backward scales that buffer and hands it on. Its values
    equal the fused op's out of place (bitwise for an upstream gradient of 1;
    a mean out of place runs that op too, a sum out of place the two ops, whose
    reductions may differ in the last bits on CUDA), the loss too, and the
    gradient that reaches the leaf is the overwritten buffer's, against
    float64 by the rule."""
    N, C = 37, 5003
    x = awkward_randn((N, C), dtype, device)
    t = random_target((N,), C, device, ignored_every=4)
    for label_smoothing, z_loss in SMOOTHING_Z[::3]:
        kw = dict(reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
        counted = t != IGNORE
        row_grad = counted.to(peer_dtype(dtype))
        if reduction == "mean":
            row_grad = row_grad / counted.sum()
        f_loss, _, grad = torch.ops.oss.cross_entropy_forward_backward(row_grad, x, t, IGNORE, label_smoothing, z_loss)
        loss = torch.ops.oss.cross_entropy_total(f_loss, counted.sum() if reduction == "mean" else None)
        if reduction == "mean":
            xa = x.detach().requires_grad_()
            assert torch.equal(torch_oss.cross_entropy(xa, t, **kw), loss)  # the same op out of place
        up = torch.tensor(upstream, dtype=loss.dtype, device=device)
        leaf = x.detach().requires_grad_()
        logits = leaf * 1  # a non-leaf whose buffer the loss may overwrite (MulBackward saves no output)
        i_loss = torch_oss.cross_entropy(logits, t, inplace_backward=True, **kw)
        assert torch.equal(i_loss, loss)
        assert not torch.equal(logits.detach(), x)  # overwritten by the forward
        (i_grad,) = torch.autograd.grad(i_loss, leaf, up)
        assert i_grad.dtype == dtype
        if upstream == 1.0:
            assert torch.equal(i_grad, grad) and torch.equal(logits.detach(), grad)
        x64 = x.detach().double().requires_grad_()  # (not x itself for float64)
        ref = full_reference(x64, t, **kw)
        (ref_grad,) = torch.autograd.grad(ref, x64, up.double())
        xq = x.detach().to(peer_dtype(dtype)).requires_grad_()
        peer = full_reference(xq, t, **kw)
        (peer_grad,) = torch.autograd.grad(peer, xq, up.to(peer.dtype))
        assert_tolerance("in-place grad", i_grad, ref_grad, peer_grad.to(dtype), SOFTMAX_ATOL[dtype],
                         per_element_eps=True)


@pytest.mark.parametrize("device", DEVICES)
def test_loss_gradient_written_over_the_input_layouts_and_limits(device):
    """inplace_backward=True on rows the op cannot overwrite (classes not
    unit-stride: a new buffer instead) and on (N, C, d) input (the rows' copy),
    both equal to the out-of-place form; a second backward and create_graph
    raise; the flag must be a bool; without a gradient to form it leaves the
    input alone."""
    x = awkward_randn((7, 301), torch.float32, device)
    t = random_target((7,), 301, device)
    ref_loss = torch_oss.cross_entropy(x.detach().requires_grad_(), t)
    xa = x.detach().requires_grad_()
    (ref_grad,) = torch.autograd.grad(torch_oss.cross_entropy(xa, t), xa)

    xt = x.t().contiguous().detach().requires_grad_()  # (301, 7): its transpose has class stride 7
    loss = torch_oss.cross_entropy(xt.t(), t, inplace_backward=True)
    loss.backward()
    assert torch.equal(loss, ref_loss) and torch.equal(xt.grad.t(), ref_grad)

    x3 = x.detach().clone().reshape(7, 301, 1).requires_grad_()  # (N, C, 1): its rows are a view of it
    loss = torch_oss.cross_entropy(x3, t.reshape(7, 1), inplace_backward=True)
    loss.backward()
    assert torch.equal(loss, ref_loss) and torch.equal(x3.grad.reshape(7, 301), ref_grad)
    y = awkward_randn((3, 301, 4), torch.float32, device)  # (N, C, d): its rows are a copy
    ty = random_target((3, 4), 301, device)
    ya = y.detach().requires_grad_()
    y_loss = torch_oss.cross_entropy(ya, ty)
    y_loss.backward()
    yb = y.detach().requires_grad_()
    loss = torch_oss.cross_entropy(yb, ty, inplace_backward=True)
    loss.backward()
    assert torch.equal(loss, y_loss) and torch.equal(yb.grad, ya.grad) and torch.equal(yb.detach(), y)

    logits = x.detach().requires_grad_() * 1
    loss = torch_oss.cross_entropy(logits, t, inplace_backward=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    logits = x.detach().requires_grad_() * 1
    loss = torch_oss.cross_entropy(logits, t, inplace_backward=True)
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(loss, logits, create_graph=True)
    with pytest.raises(TypeError, match="inplace_backward must be a bool"):
        torch_oss.cross_entropy(x, t, inplace_backward=1)
    xn = x.clone()
    torch_oss.cross_entropy(xn, t, inplace_backward=True)  # no gradient wanted: the two ops' forward
    assert torch.equal(xn, x)


@pytest.mark.parametrize("device", DEVICES)
def test_loss_gradient_through_a_retained_graph(device):
    """A second backward through the same graph recomputes the gradient (the
    first one handed its tensor on): x.grad doubles."""
    x = awkward_randn((9, 3001), torch.float32, device).requires_grad_()
    t = random_target((9,), 3001, device, ignored_every=4)
    loss = torch_oss.cross_entropy(x, t, label_smoothing=0.1)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * first, rtol=1e-6, atol=1e-9)
    if device == "cpu":
        assert torch.equal(x.grad, 2 * first)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_backward_scaled_op(device, dtype):
    """cross_entropy_backward_scaled_ leaves grad_logits alone for a scale of
    exactly 1, and otherwise writes the backward for grad_loss * scale (the
    backward op's result, bitwise)."""
    N, C = 7, 2500
    x = awkward_randn((N, C), dtype, device)
    t = random_target((N,), C, device, ignored_every=3)
    sd = peer_dtype(dtype)
    g = torch.rand(N, dtype=sd, device=device) + 0.5
    _, lse = torch.ops.oss.cross_entropy(x, t, IGNORE, 0.1, 1e-3)
    buf = torch.full((N, C), 7.0, dtype=dtype, device=device)
    torch.ops.oss.cross_entropy_backward_scaled_(buf, g, torch.ones((), dtype=sd, device=device), x, t, lse,
                                                 IGNORE, 0.1, 1e-3)
    assert torch.all(buf == 7)
    scale = torch.tensor([2.5], dtype=sd, device=device)
    torch.ops.oss.cross_entropy_backward_scaled_(buf, g, scale, x, t, lse, IGNORE, 0.1, 1e-3)
    assert torch.equal(buf, torch.ops.oss.cross_entropy_backward(g * scale, x, t, lse, IGNORE, 0.1, 1e-3))
    with pytest.raises(ValueError, match="grad_scale"):
        torch.ops.oss.cross_entropy_backward_scaled_(buf, g, torch.ones(2, device=device), x, t, lse, IGNORE, 0.0,
                                                     0.0)
    with pytest.raises(ValueError, match="grad_logits"):
        torch.ops.oss.cross_entropy_backward_scaled_(buf[:, 1:], g, scale, x, t, lse, IGNORE, 0.0, 0.0)
    with pytest.raises(NotImplementedError, match="not differentiable"):
        torch.ops.oss.cross_entropy_backward_scaled_(buf, g, scale, x.detach().requires_grad_(), t, lse, IGNORE,
                                                     0.0, 0.0)


def test_forward_backward_ops_are_not_differentiable():
    """They compute a gradient and refuse to be differentiated; the in-place
    one bumps the logits' version, so a graph that saved them notices."""
    t = torch.tensor([0, 8, IGNORE, 3])
    g = torch.ones(4)
    for op in (torch.ops.oss.cross_entropy_forward_backward, torch.ops.oss.cross_entropy_forward_backward_):
        with pytest.raises(NotImplementedError, match="not differentiable"):
            op(g, torch.randn(4, 9, requires_grad=True), t)
        with pytest.raises(NotImplementedError, match="not differentiable"):
            op(torch.ones(4, requires_grad=True), torch.randn(4, 9), t)
    w = torch.randn(9, requires_grad=True)
    y = torch.randn(4, 9)
    out = (y * w).sum()  # saves y for w's gradient
    torch.ops.oss.cross_entropy_forward_backward_(g, y, t)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()
    with torch.no_grad():
        torch.ops.oss.cross_entropy_forward_backward_(g, torch.randn(4, 9, requires_grad=True), t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("classes", [37, 2049, 50257])
def test_inplace_on_strided_rows(device, dtype, classes):
    """The in-place op on rows that are a column slice of a wider buffer (row
    stride above C, rows starting off a 16-byte boundary): the gradient lands
    in the slice, and the columns around it are not touched."""
    N, pad = 6, 5
    base = awkward_randn((N, classes + 2 * pad), dtype, device)
    for start in (1, pad):
        buf = base.clone()
        x = buf[:, start:start + classes]
        t = random_target((N,), classes, device, ignored_every=3)
        g = torch.rand(N, dtype=torch.float64, device=device).to(peer_dtype(dtype)) + 0.5
        loss, lse, grad = torch.ops.oss.cross_entropy_forward_backward(g, x, t, IGNORE, 0.1, 1e-3)
        i_loss, i_lse = torch.ops.oss.cross_entropy_forward_backward_(g, x, t, IGNORE, 0.1, 1e-3)
        assert torch.equal(i_loss, loss) and torch.equal(i_lse, lse) and torch.equal(x, grad)
        assert torch.equal(buf[:, :start], base[:, :start])
        assert torch.equal(buf[:, start + classes:], base[:, start + classes:])
        x0 = base[:, start:start + classes]
        ref_grad = grad_reference(x0.double(), t, g.double(), 0.1, 1e-3)
        xq = x0.detach().requires_grad_()
        peer_rows, _ = rows_reference(xq, t, 0.1, 1e-3)
        (peer_grad,) = torch.autograd.grad(peer_rows, xq, g.to(peer_rows.dtype))
        assert_tolerance("strided in-place grad", x, ref_grad, peer_grad, SOFTMAX_ATOL[dtype])
    rows = base.shape[1]
    with pytest.raises(ValueError, match="unit stride"):
        torch.ops.oss.cross_entropy_forward_backward_(torch.ones(rows, device=device), base.t(),
                                                      torch.zeros(rows, dtype=torch.int64, device=device), IGNORE,
                                                      0.0, 0.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("width", [300, 50300])
def test_op_strided_logits(device, dtype, width):
    """Logits that are a column slice (rows not dense, starting at any element,
    so their 16-byte boundaries fall anywhere: the kernels' head, vector and
    tail paths) and a transposed view (copied to rows by the op)."""
    C = width - 100
    base = awkward_randn((6, width), dtype, device)
    t = random_target((6,), C, device, ignored_every=4)
    views = [base[:, 50:50 + C], base[:, 1:1 + C], base[:, 3:3 + C], base.t().contiguous().t()[:, :C]]
    # one row whose classes are not unit-stride (copied to a row by the op too)
    x1 = base.t().contiguous().t()[:1, :C]
    assert x1.stride(1) != 1
    t1 = torch.tensor([C // 2], device=device)
    loss1, _ = torch.ops.oss.cross_entropy(x1, t1, IGNORE, 0.0, 0.0)
    assert_tolerance("one strided row", loss1, rows_reference(x1.double(), t1, 0.0, 0.0)[0],
                     rows_reference(x1.to(peer_dtype(dtype)), t1, 0.0, 0.0)[0], SOFTMAX_ATOL[peer_dtype(dtype)])
    for x in views:
        loss, lse = torch.ops.oss.cross_entropy(x, t, IGNORE, 0.1, 1e-3)
        xp = x.to(peer_dtype(dtype))
        ref_loss, ref_lse = rows_reference(x.double(), t, 0.1, 1e-3)
        atol = SOFTMAX_ATOL[peer_dtype(dtype)]
        assert_tolerance("loss", loss, ref_loss, rows_reference(xp, t, 0.1, 1e-3)[0], atol)
        assert_tolerance("lse", lse, ref_lse, rows_reference(xp, t, 0.1, 1e-3)[1], lse_atol(dtype, ref_lse))
        g = torch.rand(6, dtype=torch.float64, device=device) + 0.5
        grad = torch.ops.oss.cross_entropy_backward(g.to(loss.dtype), x, t, lse, IGNORE, 0.1, 1e-3)
        assert grad.is_contiguous()
        ref_grad = grad_reference(x.double(), t, g, 0.1, 1e-3)
        xq = x.detach().requires_grad_()
        (peer_grad,) = torch.autograd.grad(rows_reference(xq, t, 0.1, 1e-3)[0], xq, g.to(peer_dtype(dtype)))
        assert_tolerance("grad", grad, ref_grad, peer_grad, SOFTMAX_ATOL[dtype])


# ---------------------------------------------------------------------------
# torch_oss.cross_entropy
# ---------------------------------------------------------------------------


def loss_grid(test):
    """The grid of the whole-loss tests: devices, dtypes, reductions, the 2-D, (N, C, d1, d2)
    and unbatched forms, with and without class weights."""
    for name, values in (("weighted", [False, True]), ("shape", [(37, 129), (4, 11, 3, 5), (300,)]),
                         ("reduction", ["none", "mean", "sum"]), ("dtype", FLOAT_DTYPES), ("device", DEVICES)):
        test = pytest.mark.parametrize(name, values)(test)
    return test


@loss_grid
def test_cross_entropy_matches_float64(device, dtype, reduction, shape, weighted):
    C = shape[1] if len(shape) > 1 else shape[0]
    tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    for label_smoothing, z_loss in SMOOTHING_Z:
        x = awkward_randn(shape, dtype, device)
        t = random_target(tshape, C, device, ignored_every=5 if tshape else 0)
        w = torch.rand(C, dtype=torch.float64, device=device) + 0.25 if weighted else None
        kwargs = dict(reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
        x_ours = x.detach().requires_grad_()
        ours = torch_oss.cross_entropy(x_ours, t, weight=None if w is None else w.to(peer_dtype(dtype)), **kwargs)
        x64 = x.double().requires_grad_()
        ref = full_reference(x64, t, weight=w, **kwargs)
        xp = x.to(peer_dtype(dtype)).requires_grad_()
        peer = full_reference(xp, t, weight=None if w is None else w.to(xp.dtype), **kwargs)
        assert ours.shape == ref.shape and ours.dtype == peer_dtype(dtype)
        assert_tolerance(f"loss ls={label_smoothing} z={z_loss}", ours, ref, peer, SOFTMAX_ATOL[ours.dtype])

        up = torch.rand(ref.shape, dtype=torch.float64, device=device) + 0.5
        (g,) = torch.autograd.grad(ours, x_ours, up.to(ours.dtype))
        (ref_g,) = torch.autograd.grad(ref, x64, up)
        xq = x.detach().requires_grad_()
        peer_out = full_reference(xq, t, weight=None if w is None else w.to(dtype), **kwargs)
        (peer_g,) = torch.autograd.grad(peer_out, xq, up.to(peer_out.dtype))
        assert_tolerance(f"grad ls={label_smoothing} z={z_loss}", g, ref_g, peer_g, SOFTMAX_ATOL[dtype])


def probability_reference(x, target, weight=None, reduction="mean", label_smoothing=0.0, z_loss=0.0):
    """torch_oss.cross_entropy's definition for class probabilities from
    F.cross_entropy, in x's dtype: plus z * lse^2 per row, a mean over the rows."""
    loss = F.cross_entropy(x, target, weight=weight, reduction=reduction, label_smoothing=label_smoothing)
    if not z_loss:
        return loss
    z = z_loss * torch.logsumexp(x, dim=1 if x.dim() > 1 else 0) ** 2
    return loss + (z if reduction == "none" else z.sum() if reduction == "sum" else z.mean())


@loss_grid
def test_probability_targets_match_float64(device, dtype, reduction, shape, weighted):
    """Class probabilities as the target (normalised rows, and rows that do not sum to 1, which
    F.cross_entropy accepts too): loss and the gradients of the input and of the target
    against float64, F.cross_entropy in float32 (the input's dtype for the input's gradient)
    on the same values as the peer."""
    for (label_smoothing, z_loss), normalised in zip(SMOOTHING_Z, (True, False, True, False)):
        x = awkward_randn(shape, dtype, device)
        t = torch.rand(shape, dtype=torch.float64, device=device)
        if normalised:
            t = t / t.sum(1 if len(shape) > 1 else 0, keepdim=True)
        t = t.to(dtype)
        w = torch.rand(shape[1] if len(shape) > 1 else shape[0], dtype=torch.float64, device=device) + 0.25
        w = w if weighted else None
        kwargs = dict(reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
        label = f"{dtype} {shape} {reduction} ls={label_smoothing} z={z_loss} normalised={normalised}"
        pd = peer_dtype(dtype)
        x_ours, t_ours = x.detach().requires_grad_(), t.detach().requires_grad_()
        ours = torch_oss.cross_entropy(x_ours, t_ours, weight=None if w is None else w.to(pd), **kwargs)
        x64, t64 = x.double().requires_grad_(), t.double().requires_grad_()
        ref = probability_reference(x64, t64, weight=w, **kwargs)
        xp, tp = x.to(pd).requires_grad_(), t.to(pd).requires_grad_()
        peer = probability_reference(xp, tp, weight=None if w is None else w.to(pd), **kwargs)
        assert ours.shape == ref.shape and ours.dtype == pd, label
        assert_tolerance(f"loss {label}", ours, ref, peer, SOFTMAX_ATOL[ours.dtype])

        up = torch.rand(ref.shape, dtype=torch.float64, device=device) + 0.5
        g, g_t = torch.autograd.grad(ours, (x_ours, t_ours), up.to(ours.dtype))
        ref_g, ref_g_t = torch.autograd.grad(ref, (x64, t64), up)
        xq, tq = x.detach().requires_grad_(), t.detach().requires_grad_()
        peer_out = probability_reference(xq, tq, weight=None if w is None else w.to(dtype), **kwargs)
        peer_g, peer_g_t = torch.autograd.grad(peer_out, (xq, tq), up.to(peer_out.dtype))
        assert_tolerance(f"grad {label}", g, ref_g, peer_g, SOFTMAX_ATOL[dtype])
        assert_tolerance(f"target grad {label}", g_t, ref_g_t, peer_g_t, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_probability_targets_extremes(device):
    """Logits of -inf and 1e4 with class probabilities: NaN exactly where F.cross_entropy
    gives NaN (a -inf logit whose target is 0: 0 * -inf), finite and equal to it elsewhere."""
    x = torch.randn(4, 6, dtype=torch.float64, device=device)
    x[0, 1] = float("-inf")
    x[1, 2] = 1e4
    x[2, 3] = float("-inf")
    t = torch.rand(4, 6, dtype=torch.float64, device=device).softmax(-1)
    t[0, 1] = 0.0
    ours = torch_oss.cross_entropy(x, t, reduction="none")
    ref = F.cross_entropy(x, t, reduction="none")
    assert torch.equal(torch.isnan(ours), torch.isnan(ref)) and torch.isnan(ours).any()
    assert torch.allclose(ours[~torch.isnan(ref)], ref[~torch.isnan(ref)], rtol=1e-12, atol=1e-9)
    # no rows, or no classes: a mean over no rows is NaN, as PyTorch's
    for shape in ((0, 6), (2, 0, 3)):
        x, t = torch.randn(shape, device=device), torch.rand(shape, device=device)
        for reduction in ("mean", "sum", "none"):
            ours = torch_oss.cross_entropy(x, t, reduction=reduction)
            ref = F.cross_entropy(x, t, reduction=reduction)
            assert ours.shape == ref.shape and torch.equal(torch.isnan(ours), torch.isnan(ref)), (shape, reduction)
            assert torch.equal(ours.nan_to_num(), ref.nan_to_num().abs()), (shape, reduction)


# ---------------------------------------------------------------------------
# Class probabilities: the fused ops (torch.ops.oss.cross_entropy_probs and
# its backward) and the loss through them
# ---------------------------------------------------------------------------


def probs_rows_reference(x, t, weight=None, label_smoothing=0.0, z_loss=0.0):
    """Per-row loss, lse and target_sum of 2-D logits with class probabilities,
    written out (differentiable): sum_j u_j (lse - x_j) + z lse^2, u = w t',
    t' = (1 - eps) t + eps / C; in x's dtype."""
    C = x.shape[1]
    lse = torch.logsumexp(x, dim=1)
    u = (1 - label_smoothing) * t + label_smoothing / C
    if weight is not None:
        u = u * weight
    return (u * (lse[:, None] - x)).sum(1) + z_loss * lse * lse, lse, u.sum(1)


def probability_target(shape, dtype, device, normalised=True):
    t = torch.rand(shape, dtype=torch.float64)
    if normalised:
        t = t / t.sum(-1, keepdim=True)
    return t.to(dtype=dtype, device=device)


# (rows, classes): one class, a few, warp-per-row and CTA-per-row rows on CUDA, LM vocabularies
PROBS_SHAPES = [(3, 1), (6, 7), (33, 1000), (5, 2049), (3, 50257), (2, 128256)]
# (label_smoothing, z_loss, weighted)
PROBS_OPTIONS = [(0.0, 0.0, False), (0.1, 0.0, True), (0.0, 1e-3, False), (0.25, 1e-2, True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", PROBS_SHAPES)
@pytest.mark.parametrize("label_smoothing,z_loss,weighted", PROBS_OPTIONS)
def test_probs_op_forward_and_backward(device, dtype, shape, label_smoothing, z_loss, weighted):
    """The probability ops against the written-out definition in float64: loss,
    lse, target_sum, and both gradients of the backward op (normalised rows,
    and unnormalised ones with smoothing). The loss's peer is F.cross_entropy
    on the values in float32 (float64), the gradients' in the input's dtype."""
    N, C = shape
    x = awkward_randn(shape, dtype, device)
    t = probability_target(shape, dtype, device, normalised=label_smoothing == 0)
    w64 = torch.rand(C, dtype=torch.float64, device=device) + 0.25 if weighted else None
    pd = peer_dtype(dtype)
    w = None if w64 is None else w64.to(pd)
    loss, lse, tsum = torch.ops.oss.cross_entropy_probs(x, t, w, label_smoothing, z_loss)
    assert loss.dtype == pd and lse.dtype == tsum.dtype == torch.float64
    assert loss.shape == lse.shape == tsum.shape == (N,)
    x64, t64 = x.double().requires_grad_(), t.double().requires_grad_()
    ref_loss, ref_lse, ref_tsum = probs_rows_reference(x64, t64, w64, label_smoothing, z_loss)
    kw = dict(reduction="none", label_smoothing=label_smoothing)
    xp, tp = x.to(pd), t.to(pd)
    peer_loss = F.cross_entropy(xp, tp, weight=w, **kw) + z_loss * torch.logsumexp(xp, 1) ** 2
    label = f"{dtype} {shape} ls={label_smoothing} z={z_loss} weighted={weighted}"
    assert_tolerance(f"loss {label}", loss, ref_loss, peer_loss, SOFTMAX_ATOL[pd])
    assert_tolerance(f"lse {label}", lse, ref_lse, torch.logsumexp(xp, 1), lse_atol(dtype, ref_lse))
    peer_u = (1 - label_smoothing) * tp + label_smoothing / C
    peer_tsum = (peer_u if w is None else peer_u * w).sum(1)
    assert_tolerance(f"target_sum {label}", tsum, ref_tsum, peer_tsum, lse_atol(dtype, ref_tsum))

    g = torch.rand(N, dtype=torch.float64, device=device) + 0.5
    gx, gt = torch.ops.oss.cross_entropy_probs_backward(g.to(pd), x, t, w, lse, tsum, label_smoothing, z_loss, True)
    assert gx.dtype == gt.dtype == dtype and gx.shape == gt.shape == x.shape
    ref_gx, ref_gt = torch.autograd.grad(ref_loss, (x64, t64), g)
    xq, tq = x.detach().requires_grad_(), t.detach().requires_grad_()
    peer = F.cross_entropy(xq, tq, weight=None if w is None else w.to(dtype), **kw)
    peer = peer + z_loss * torch.logsumexp(xq, 1) ** 2
    peer_gx, peer_gt = torch.autograd.grad(peer, (xq, tq), g.to(dtype))
    assert_tolerance(f"grad input {label}", gx, ref_gx, peer_gx, SOFTMAX_ATOL[dtype])
    assert_tolerance(f"grad target {label}", gt, ref_gt, peer_gt, SOFTMAX_ATOL[dtype])
    # without the target's gradient: the same logits' gradient, no target gradient
    gx2, gt2 = torch.ops.oss.cross_entropy_probs_backward(g.to(pd), x, t, w, lse, tsum, label_smoothing, z_loss,
                                                          False)
    assert torch.equal(gx2, gx) and gt2.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("C", [7, 3001])
def test_probs_strided_and_misaligned_rows(device, dtype, C):
    """Logits and target as views of wider rows, at offsets that give them
    different 16-byte phases (the CUDA kernels' element-by-element target
    path), and one row (its stride unused); against float64."""
    N = 5
    xb = awkward_randn((N, C + 9), dtype, device)
    tb = probability_target((N, C + 9), dtype, device)
    for xo, to in ((1, 3), (0, 0), (2, 1)):
        x, t = xb[:, xo:xo + C], tb[:, to:to + C]
        for rows in (slice(None), slice(2, 3)):
            xr, tr = x[rows], t[rows]
            loss, lse, tsum = torch.ops.oss.cross_entropy_probs(xr, tr, None, 0.1, 1e-3)
            x64, t64 = xr.double().requires_grad_(), tr.double().requires_grad_()
            ref, _, _ = probs_rows_reference(x64, t64, None, 0.1, 1e-3)
            xp = xr.to(peer_dtype(dtype))
            peer = F.cross_entropy(xp, tr.to(xp.dtype), reduction="none", label_smoothing=0.1)
            peer = peer + 1e-3 * torch.logsumexp(xp, 1) ** 2
            assert_tolerance(f"loss {xo} {to}", loss, ref, peer, SOFTMAX_ATOL[loss.dtype])
            g = torch.ones(ref.shape, dtype=torch.float64, device=device)
            gx, gt = torch.ops.oss.cross_entropy_probs_backward(g.to(loss.dtype), xr, tr, None, lse, tsum, 0.1, 1e-3,
                                                                True)
            ref_gx, ref_gt = torch.autograd.grad(ref, (x64, t64), g)
            xq, tq = xr.detach().requires_grad_(), tr.detach().requires_grad_()
            peer = F.cross_entropy(xq, tq, reduction="none", label_smoothing=0.1)
            peer_gx, peer_gt = torch.autograd.grad(peer + 1e-3 * torch.logsumexp(xq, 1) ** 2, (xq, tq),
                                                   g.to(dtype))
            assert_tolerance(f"grad input {xo} {to}", gx, ref_gx, peer_gx, SOFTMAX_ATOL[dtype])
            assert_tolerance(f"grad target {xo} {to}", gt, ref_gt, peer_gt, SOFTMAX_ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("C", [257, 50257])
def test_probs_extreme_logits(device, dtype, C):
    """±1e4 and -inf logits with class probabilities: where a -inf logit has a
    target of 0 the row is NaN, as F.cross_entropy's (0 * -inf); with label
    smoothing every u_j > 0 and such a row is +inf; elsewhere the loss and the
    gradients are finite and within the rule (a large lse does not cancel)."""
    N = 8
    x = awkward_randn((N, C), torch.float64, "cpu")
    x[0::2, 5] = 1e4
    x[1::2, 7] = -1e4
    x[2::4, 9] = 1e4
    x[3, 100:120] = float("-inf")
    t = probability_target((N, C), torch.float64, "cpu")
    t[0, 5] = 0.7  # most of the weight on the dominant logit
    t[3, 100:120] = 0.0  # a -inf logit with target 0: NaN
    x, t = x.to(dtype=dtype, device=device), t.to(dtype=dtype, device=device)
    pd = peer_dtype(dtype)
    for label_smoothing, z_loss in ((0.0, 0.0), (0.0, 1e-4), (0.1, 0.0)):
        xo, to = x.detach().requires_grad_(), t.detach().requires_grad_()
        ours = torch_oss.cross_entropy(xo, to, reduction="none", label_smoothing=label_smoothing, z_loss=z_loss)
        x64, t64 = x.double().requires_grad_(), t.double().requires_grad_()
        ref = probability_reference(x64, t64, reduction="none", label_smoothing=label_smoothing, z_loss=z_loss)
        peer = probability_reference(x.to(pd), t.to(pd), reduction="none", label_smoothing=label_smoothing,
                                     z_loss=z_loss)
        assert torch.isnan(ref[3]) == (label_smoothing == 0) and torch.isinf(ref[3]) == (label_smoothing != 0)
        assert_tolerance(f"extreme loss ls={label_smoothing}", ours, ref, peer, SOFTMAX_ATOL[pd],
                         per_element_eps=True)
        # the gradients of the finite rows (a row of NaN or inf has NaN gradients in both)
        keep = torch.isfinite(ref)
        g, g_t = torch.autograd.grad(ours[keep].sum(), (xo, to))
        ref_g, ref_g_t = torch.autograd.grad(ref[keep].sum(), (x64, t64))
        xq, tq = x.detach().requires_grad_(), t.detach().requires_grad_()
        peer_out = probability_reference(xq, tq, reduction="none", label_smoothing=label_smoothing, z_loss=z_loss)
        peer_g, peer_g_t = torch.autograd.grad(peer_out[keep].sum(), (xq, tq))
        assert_tolerance("extreme grad", g[keep], ref_g[keep], peer_g[keep], SOFTMAX_ATOL[dtype],
                         per_element_eps=True)
        assert_tolerance("extreme target grad", g_t[keep], ref_g_t[keep], peer_g_t[keep], SOFTMAX_ATOL[dtype],
                         per_element_eps=True)


@pytest.mark.parametrize("device", DEVICES)
def test_probs_all_inf_rows(device):
    """A row of -inf logits, and one holding +inf or NaN: NaN, as F.cross_entropy."""
    x = torch.randn(4, 9, dtype=torch.float64, device=device)
    x[0] = float("-inf")
    x[1, 3] = float("inf")
    x[2, 4] = float("nan")
    t = probability_target((4, 9), torch.float64, device)
    for dtype in FLOAT_DTYPES:
        ours = torch_oss.cross_entropy(x.to(dtype), t.to(dtype), reduction="none", z_loss=1e-3)
        ref = F.cross_entropy(x, t, reduction="none")
        assert torch.equal(torch.isnan(ours.cpu()), torch.isnan(ref.cpu())), dtype
        assert torch.isnan(ours[:3]).all() and torch.isfinite(ours[3])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_probs_vocabularies_through_the_loss(device, dtype):
    """torch_oss.cross_entropy with probabilities at vocabulary sizes that are
    multiples of nothing, every reduction, the input's and the target's
    gradients against F.cross_entropy in float64 (a few rows each)."""
    for C in (1, 7, 50257, 128256):
        N = 3 if C > 1000 else 11
        x = awkward_randn((N, C), dtype, device)
        t = probability_target((N, C), dtype, device)
        for reduction in ("none", "sum", "mean"):
            kwargs = dict(reduction=reduction, label_smoothing=0.05, z_loss=1e-4)
            xo, to = x.detach().requires_grad_(), t.detach().requires_grad_()
            ours = torch_oss.cross_entropy(xo, to, **kwargs)
            x64, t64 = x.double().requires_grad_(), t.double().requires_grad_()
            ref = probability_reference(x64, t64, **kwargs)
            pd = peer_dtype(dtype)
            peer = probability_reference(x.to(pd), t.to(pd), **kwargs)
            assert ours.dtype == pd and ours.shape == ref.shape
            label = f"C={C} {reduction}"
            assert_tolerance(f"loss {label}", ours, ref, peer, SOFTMAX_ATOL[pd])
            up = torch.rand(ref.shape, dtype=torch.float64, device=device) + 0.5
            g, g_t = torch.autograd.grad(ours, (xo, to), up.to(ours.dtype))
            ref_g, ref_g_t = torch.autograd.grad(ref, (x64, t64), up)
            xq, tq = x.detach().requires_grad_(), t.detach().requires_grad_()
            peer_out = probability_reference(xq, tq, **kwargs)
            peer_g, peer_g_t = torch.autograd.grad(peer_out, (xq, tq), up.to(peer_out.dtype))
            assert_tolerance(f"grad {label}", g, ref_g, peer_g, SOFTMAX_ATOL[dtype])
            assert_tolerance(f"target grad {label}", g_t, ref_g_t, peer_g_t, SOFTMAX_ATOL[dtype])


def test_probs_routing():
    """A target of the input's dtype takes the fused ops; another target dtype
    keeps the composed path (PyTorch's promotion: the loss in float64 when
    either is float64), also tested against F.cross_entropy."""
    from torch_oss.cross_entropy import _fuses_probabilities
    x = awkward_randn((6, 11), torch.float32, "cpu")
    t = probability_target((6, 11), torch.float32, "cpu")
    assert _fuses_probabilities(x, t, None) and _fuses_probabilities(x.bfloat16(), t.bfloat16(), torch.ones(11))
    assert not _fuses_probabilities(x, t.double(), None) and not _fuses_probabilities(x.bfloat16(), t, None)
    assert not _fuses_probabilities(x[:0], t[:0], None)
    for xd, td in ((torch.float32, torch.float64), (torch.bfloat16, torch.float32), (torch.float64, torch.float16)):
        xi, ti = x.to(xd).requires_grad_(), t.to(td).requires_grad_()
        ours = torch_oss.cross_entropy(xi, ti, label_smoothing=0.1)
        x64, t64 = xi.detach().double().requires_grad_(), ti.detach().double().requires_grad_()
        ref = F.cross_entropy(x64, t64, label_smoothing=0.1)
        stat = torch.float64 if torch.float64 in (xd, td) else torch.float32
        assert ours.dtype == stat, (xd, td)
        peer = F.cross_entropy(xi.detach().to(stat), ti.detach().to(stat), label_smoothing=0.1)
        assert_tolerance(f"promoted loss {xd} {td}", ours, ref, peer, SOFTMAX_ATOL[stat])
        g, g_t = torch.autograd.grad(ours, (xi, ti))
        assert g.dtype == xd and g_t.dtype == td


def test_probs_no_float32_logits_buffers():
    """The fused path's forward and backward with a bfloat16 input allocate no
    float32 (or float64) tensor of the logits' size: the kernels keep their
    statistics per row; only the bfloat16 gradients are logits-sized. The
    composed path (a float32 target) does make them, so the check can fail."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class WideOutputs(TorchDispatchMode):
        found = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.numel() >= N * C and t.dtype in (torch.float32, torch.float64):
                    WideOutputs.found.append((str(func), t.dtype))
            return out

    N, C = 16, 3001
    x = awkward_randn((N, C), torch.bfloat16, "cpu").requires_grad_()
    t = probability_target((N, C), torch.bfloat16, "cpu").requires_grad_()
    with WideOutputs():
        loss = torch_oss.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-3)
        torch.autograd.grad(loss, (x, t))
    assert WideOutputs.found == []
    with WideOutputs():
        torch_oss.cross_entropy(x, t.float(), label_smoothing=0.1)
    assert WideOutputs.found


def test_probs_gradcheck_float64():
    """gradcheck and gradgradcheck through the fused ops: the input, the
    target and the weight, every reduction, (N, C, d) and unbatched, and the
    ops' own lse and target_sum outputs."""
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    t = torch.rand(4, 6, dtype=torch.float64).softmax(1).requires_grad_()
    w = (torch.rand(6, dtype=torch.float64) + 0.5).requires_grad_()
    for kwargs in (dict(), dict(label_smoothing=0.2, z_loss=0.05), dict(reduction="sum", z_loss=0.1),
                   dict(reduction="none", label_smoothing=0.3)):
        assert torch.autograd.gradcheck(lambda x, t, w: torch_oss.cross_entropy(x, t, weight=w, **kwargs), (x, t, w))
        assert torch.autograd.gradgradcheck(lambda x, t, w: torch_oss.cross_entropy(x, t, weight=w, **kwargs),
                                            (x, t, w))
        assert torch.autograd.gradcheck(lambda x, t: torch_oss.cross_entropy(x, t, **kwargs), (x, t))
    x3 = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    t3 = torch.rand(2, 5, 3, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, t: torch_oss.cross_entropy(x, t, z_loss=0.1, label_smoothing=0.1),
                                    (x3, t3))
    assert torch.autograd.gradcheck(lambda x, t: torch_oss.cross_entropy(x, t, reduction="none"), (x[0], t[0]))
    for i in (1, 2):  # lse and target_sum
        assert torch.autograd.gradcheck(
            lambda x, t, w: torch.ops.oss.cross_entropy_probs(x, t, w, 0.1, 0.2)[i], (x, t, w))
        assert torch.autograd.gradgradcheck(
            lambda x, t, w: torch.ops.oss.cross_entropy_probs(x, t, w, 0.1, 0.2)[i], (x, t, w))


def test_probs_opcheck():
    x = torch.randn(6, 33)
    t = torch.rand(6, 33).softmax(1)
    w = torch.rand(33) + 0.5
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        xd, td = x.to(dtype), t.to(dtype)
        wd = w.to(torch.float64 if dtype == torch.float64 else torch.float32)
        for weight in (None, wd):
            torch.library.opcheck(torch.ops.oss.cross_entropy_probs, (xd, td, weight, 0.1, 0.01))
            torch.library.opcheck(torch.ops.oss.cross_entropy_probs,
                                  (xd.clone().requires_grad_(), td.clone().requires_grad_(), weight, 0.0, 0.0))
            _, lse, tsum = torch.ops.oss.cross_entropy_probs(xd, td, weight, 0.1, 0.01)
            g = torch.rand(6, dtype=wd.dtype)
            for grad_target in (True, False):
                torch.library.opcheck(torch.ops.oss.cross_entropy_probs_backward,
                                      (g, xd, td, weight, lse, tsum, 0.1, 0.01, grad_target))


def test_probs_compile_fullgraph():
    """torch.compile(fullgraph=True) through the fused ops: (N, C) with
    weights and the target's gradient, and unbatched input."""
    x = awkward_randn((8, 50), torch.float32, "cpu")
    t = probability_target((8, 50), torch.float32, "cpu")
    w = torch.rand(50) + 0.5

    def f(x, t, w):
        return torch_oss.cross_entropy(x, t, weight=w, label_smoothing=0.1, z_loss=1e-3, reduction="sum")

    compiled = torch.compile(f, fullgraph=True)
    for shape in (slice(None), 0):
        xa, ta = x[shape].clone().requires_grad_(), t[shape].clone().requires_grad_()
        out = compiled(xa, ta, w)
        ga, gta = torch.autograd.grad(out, (xa, ta))
        x64, t64 = x[shape].double().requires_grad_(), t[shape].double().requires_grad_()
        ref = probability_reference(x64, t64, weight=w.double(), reduction="sum", label_smoothing=0.1, z_loss=1e-3)
        xb, tb = x[shape].clone().requires_grad_(), t[shape].clone().requires_grad_()
        peer = probability_reference(xb, tb, weight=w, reduction="sum", label_smoothing=0.1, z_loss=1e-3)
        assert_tolerance("compiled probs loss", out, ref, peer, None)
        ref_g, ref_gt = torch.autograd.grad(ref, (x64, t64))
        peer_g, peer_gt = torch.autograd.grad(peer, (xb, tb))
        assert_tolerance("compiled probs grad", ga, ref_g, peer_g, None)
        assert_tolerance("compiled probs target grad", gta, ref_gt, peer_gt, None)


def test_probs_results_do_not_depend_on_the_thread_count():
    x = awkward_randn((37, 5000), torch.bfloat16, "cpu")
    t = probability_target((37, 5000), torch.bfloat16, "cpu")
    w = torch.rand(5000) + 0.5
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            loss, lse, tsum = torch.ops.oss.cross_entropy_probs(x, t, w, 0.1, 1e-3)
            g = torch.rand(37, generator=torch.Generator().manual_seed(0))
            grads = torch.ops.oss.cross_entropy_probs_backward(g, x, t, w, lse, tsum, 0.1, 1e-3, True)
            results.append((loss, lse, tsum) + tuple(grads))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_probs_cuda_bitwise_reproducible(device, dtype):
    for N, C in ((300, 1000), (7, 128256)):
        x = awkward_randn((N, C), dtype, device)
        t = probability_target((N, C), dtype, device)
        w = torch.rand(C, device=device) + 0.5
        g = torch.rand(N, device=device)
        runs = []
        for _ in range(3):
            loss, lse, tsum = torch.ops.oss.cross_entropy_probs(x, t, w, 0.1, 1e-3)
            runs.append((loss, lse, tsum) + tuple(torch.ops.oss.cross_entropy_probs_backward(
                g, x, t, w, lse, tsum, 0.1, 1e-3, True)))
        for r in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(r, runs[0]))


@NVCC_SKIP
def test_probs_cuda_kernels_do_not_spill(tmp_path):
    """The probability kernels stream rows like the class-index ones: a spilled
    register costs each thread local loads and stores beside the stream. All
    24 instantiations (4 dtypes; forward x weighted; backward x weighted x
    target gradient) compile for sm_90a with a zero stack frame."""
    import os
    import re
    csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
    report = ptxas_report('#include "cuda/cross_entropy/cross_entropy.cu"\n', tmp_path, csrc)
    frames = re.findall(r"Function properties for (\S*cep_\w+)\s+(\d+) bytes stack frame", report)
    assert len(frames) == 24, f"expected 24 probability kernels in ptxas's report, found {len(frames)}"
    spilled = [f"{name}: {size} bytes" for name, size in frames if int(size) != 0]
    assert not spilled, "stack frames:\n" + "\n".join(spilled)


@pytest.mark.parametrize("device", DEVICES)
def test_probs_errors_name_the_argument(device):
    x = torch.randn(4, 10, device=device)
    t = torch.rand(4, 10, device=device)
    op, bwd = torch.ops.oss.cross_entropy_probs, torch.ops.oss.cross_entropy_probs_backward
    with pytest.raises(TypeError, match="target has dtype"):
        op(x, t.double(), None, 0.0, 0.0)
    with pytest.raises(ValueError, match="target has shape"):
        op(x, t[:, :9], None, 0.0, 0.0)
    with pytest.raises(ValueError, match="logits must be 2-D"):
        op(x[None], t[None], None, 0.0, 0.0)
    with pytest.raises(TypeError, match="logits have dtype"):
        op(x.long(), t.long(), None, 0.0, 0.0)
    with pytest.raises(ValueError, match="weight has shape"):
        op(x, t, torch.ones(9, device=device), 0.0, 0.0)
    with pytest.raises(TypeError, match="weight has dtype"):
        op(x, t, torch.ones(10, dtype=torch.int64, device=device), 0.0, 0.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        op(x, t, None, 1.5, 0.0)
    with pytest.raises(ValueError, match="z_loss"):
        op(x, t, None, 0.0, -1.0)
    _, lse, tsum = op(x, t, None, 0.0, 0.0)
    with pytest.raises(ValueError, match="target_sum"):
        bwd(torch.ones(4, device=device), x, t, None, lse, tsum[:3], 0.0, 0.0, True)
    with pytest.raises(ValueError, match="grad_loss"):
        bwd(torch.ones(5, device=device), x, t, None, lse, tsum, 0.0, 0.0, True)
    # through the loss
    with pytest.raises(ValueError, match="ignore_index=3"):
        torch_oss.cross_entropy(x, t, ignore_index=3)
    with pytest.raises(ValueError, match="target of class probabilities has shape"):
        torch_oss.cross_entropy(x, t[:, :9])
    with pytest.raises(ValueError, match="weight must be"):
        torch_oss.cross_entropy(x, t, weight=torch.ones(9, device=device))
    with pytest.raises(ValueError, match="label_smoothing"):
        torch_oss.cross_entropy(x, t, label_smoothing=-0.1)
    with pytest.raises(ValueError, match="z_loss"):
        torch_oss.cross_entropy(x, t, z_loss=-1.0)
    with pytest.raises(ValueError, match="0-D"):
        torch_oss.cross_entropy(x[0, 0], t[0, 0])


@pytest.mark.parametrize("device", DEVICES)
def test_all_rows_ignored(device):
    x = awkward_randn((5, 7), torch.float32, device).requires_grad_()
    t = torch.full((5,), IGNORE, device=device)
    for reduction in ("none", "mean", "sum"):
        for z_loss in (0.0, 0.1):
            ours = torch_oss.cross_entropy(x, t, reduction=reduction, z_loss=z_loss, label_smoothing=0.1)
            ref = F.cross_entropy(x.double(), t, reduction=reduction, label_smoothing=0.1)
            assert torch.equal(torch.isnan(ours), torch.isnan(ref)), reduction
            if reduction == "mean":
                assert torch.isnan(ours)
            else:
                assert torch.all(ours == 0)
            (g,) = torch.autograd.grad(ours.sum(), x)
            assert torch.all(g == 0) if reduction != "mean" else torch.all(torch.isnan(g) | (g == 0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("C", [257, 50257])
def test_extreme_logits(device, dtype, C):
    """±1e4 logits and -inf in columns that are not the target (float16,
    whose largest value is 65504, takes them too)."""
    N = 12
    x = awkward_randn((N, C), torch.float64, "cpu")
    x[0::3, 5] = 1e4
    x[1::3, 7] = -1e4
    x[2::3, 9] = 1e4
    x[2::3, 10] = -1e4
    x[:, 100:120] = float("-inf")
    x = x.to(dtype=dtype, device=device)
    t = random_target((N,), 100, device)
    t[0] = 5  # the dominant column as target
    for label_smoothing, z_loss in [(0.0, 0.0), (0.0, 1e-4)]:
        xo = x.detach().requires_grad_()
        ours = torch_oss.cross_entropy(xo, t, reduction="none", label_smoothing=label_smoothing, z_loss=z_loss)
        x64 = x.double().requires_grad_()
        ref = full_reference(x64, t, reduction="none", label_smoothing=label_smoothing, z_loss=z_loss)
        xp = x.to(peer_dtype(dtype)).requires_grad_()
        peer = full_reference(xp, t, reduction="none", label_smoothing=label_smoothing, z_loss=z_loss)
        assert torch.isfinite(ours).all()
        assert_tolerance("extreme loss", ours, ref, peer, SOFTMAX_ATOL[ours.dtype], per_element_eps=True)
        (g,) = torch.autograd.grad(ours.sum(), xo)
        (ref_g,) = torch.autograd.grad(ref.sum(), x64)
        xq = x.detach().requires_grad_()
        (peer_g,) = torch.autograd.grad(full_reference(xq, t, reduction="none", z_loss=z_loss).sum(), xq)
        assert torch.all(g[:, 100:120] == 0)
        assert_tolerance("extreme grad", g, ref_g, peer_g, SOFTMAX_ATOL[dtype], per_element_eps=True)
    # label smoothing over a row holding -inf: the loss is +inf, as in PyTorch
    ours = torch_oss.cross_entropy(x, t, reduction="none", label_smoothing=0.1)
    ref = F.cross_entropy(x.double(), t, reduction="none", label_smoothing=0.1)
    assert torch.equal(ours.double(), ref) and torch.isinf(ours).all()


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("C", [40, 5000])
def test_cuda_bad_target_gives_nan_row(device, C):
    """On CUDA the targets are not checked on the host (that would
    synchronise): a target outside [0, C) that is not ignore_index makes its
    row's loss and gradient NaN, reads nothing outside the row, and leaves the
    other rows as they would be."""
    x = awkward_randn((5, C), torch.float32, device)
    good = torch.tensor([0, 1, IGNORE, 3, C - 1], device=device)
    bad = good.clone()
    bad[1], bad[3] = C, -7
    loss, lse = torch.ops.oss.cross_entropy(x, bad, IGNORE, 0.1, 1e-3)
    ref_loss, ref_lse = torch.ops.oss.cross_entropy(x, good, IGNORE, 0.1, 1e-3)
    assert torch.isnan(loss[[1, 3]]).all() and torch.equal(loss[[0, 2, 4]], ref_loss[[0, 2, 4]])
    assert torch.equal(lse, ref_lse)
    g = torch.ones(5, device=device)
    grad = torch.ops.oss.cross_entropy_backward(g, x, bad, lse, IGNORE, 0.1, 1e-3)
    ref = torch.ops.oss.cross_entropy_backward(g, x, good, lse, IGNORE, 0.1, 1e-3)
    assert torch.isnan(grad[[1, 3]]).all() and torch.equal(grad[[0, 2, 4]], ref[[0, 2, 4]])
    assert torch.isnan(torch_oss.cross_entropy(x, bad))


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_bitwise_reproducible(device, dtype):
    """Each row's reduction has a fixed shape: results are bitwise equal from
    call to call, in every launch shape."""
    for N, C in ((300, 1000), (7, 128256)):
        x = awkward_randn((N, C), dtype, device)
        t = random_target((N,), C, device, ignored_every=5)
        g = torch.rand(N, device=device)
        runs = [torch.ops.oss.cross_entropy_forward_backward(g, x, t, IGNORE, 0.1, 1e-3) for _ in range(3)]
        for r in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(r, runs[0]))


def test_gradcheck_float64():
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 6, IGNORE, 3, 3])
    w = torch.rand(7, dtype=torch.float64) + 0.5
    for kwargs in (dict(), dict(label_smoothing=0.2, z_loss=0.05), dict(weight=w, label_smoothing=0.3, z_loss=0.1),
                   dict(reduction="none", z_loss=0.2)):
        assert torch.autograd.gradcheck(lambda x: torch_oss.cross_entropy(x, t, **kwargs), (x,))
    # through lse too (its gradient is the softmax)
    assert torch.autograd.gradcheck(lambda x: torch.ops.oss.cross_entropy(x, t, IGNORE, 0.1, 0.1)[1], (x,))
    h = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    W = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    for reduction in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda h, W, b: torch_oss.linear_cross_entropy(h, W, t, b, reduction=reduction, label_smoothing=0.1,
                                                           z_loss=0.01, chunk_size=2), (h, W, b))


def test_second_derivatives_float64():
    """gradgradcheck through the backward op's own autograd formula (and the
    forward's lse gradient it feeds)."""
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 5, IGNORE, 2])
    w = torch.rand(6, dtype=torch.float64) + 0.5
    for kwargs in (dict(), dict(label_smoothing=0.2, z_loss=0.1), dict(reduction="none", z_loss=0.3),
                   dict(weight=w, z_loss=0.1)):
        assert torch.autograd.gradgradcheck(lambda x: torch_oss.cross_entropy(x, t, **kwargs), (x,))
    g = torch.rand(4, dtype=torch.float64, requires_grad=True)
    _, lse = torch.ops.oss.cross_entropy(x.detach(), t, IGNORE, 0.1, 0.2)
    lse = lse.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda g, x, lse: torch.ops.oss.cross_entropy_backward(g, x, t, lse, IGNORE, 0.1, 0.2), (g, x, lse))


def test_opcheck():
    x = torch.randn(6, 33)
    t = torch.tensor([0, 32, IGNORE, 5, 5, 1])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        xd = x.to(dtype)
        torch.library.opcheck(torch.ops.oss.cross_entropy, (xd, t, IGNORE, 0.1, 0.01))
        torch.library.opcheck(torch.ops.oss.cross_entropy, (xd.requires_grad_(), t, IGNORE, 0.0, 0.0))
        _, lse = torch.ops.oss.cross_entropy(xd.detach(), t, IGNORE, 0.1, 0.01)
        torch.library.opcheck(torch.ops.oss.cross_entropy_backward,
                              (torch.rand(6, dtype=lse.dtype), xd.detach(), t, lse, IGNORE, 0.1, 0.01))
        g = torch.rand(6, dtype=lse.dtype if dtype == torch.float64 else torch.float32)
        torch.library.opcheck(torch.ops.oss.cross_entropy_forward_backward, (g, xd.detach(), t, IGNORE, 0.1, 0.01))
        torch.library.opcheck(torch.ops.oss.cross_entropy_forward_backward_,
                              (g, xd.detach().clone(), t, IGNORE, 0.1, 0.01))
        for scale in (1.0, 0.5):
            torch.library.opcheck(torch.ops.oss.cross_entropy_backward_scaled_,
                                  (torch.zeros_like(xd.detach()), g, torch.tensor(scale, dtype=g.dtype), xd.detach(),
                                   t, lse, IGNORE, 0.1, 0.01))
    for dtype in (torch.float32, torch.float64):
        for mean in (True, False):
            torch.library.opcheck(torch.ops.oss.cross_entropy_row_weights, (t, IGNORE, dtype, mean))
        loss = torch.rand(6, dtype=dtype)
        torch.library.opcheck(torch.ops.oss.cross_entropy_total, (loss, torch.tensor(4)))
        torch.library.opcheck(torch.ops.oss.cross_entropy_total, (loss, None))


def test_compile_fullgraph():
    x = awkward_randn((8, 3, 50), torch.float32, "cpu")
    t = random_target((8, 50), 3, "cpu", ignored_every=7)

    def f(x, t):
        return torch_oss.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-3)

    compiled = torch.compile(f, fullgraph=True)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, eager = compiled(xa, t), f(xb, t)
    (ga,) = torch.autograd.grad(out, xa)
    (gb,) = torch.autograd.grad(eager, xb)
    # inductor may fuse the reduction after the op differently: equal to a rounding
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(ga, gb)
    x64 = x.double().requires_grad_()
    ref = full_reference(x64, t, label_smoothing=0.1, z_loss=1e-3)
    assert_tolerance("compiled loss", out, ref, full_reference(x, t, label_smoothing=0.1, z_loss=1e-3), None)
    # class probabilities
    probs = torch.rand(8, 3, 50).softmax(1)
    out = compiled(xa, probs)
    ref = probability_reference(x64, probs.double(), label_smoothing=0.1, z_loss=1e-3)
    assert_tolerance("compiled loss, probabilities", out, ref,
                     probability_reference(x, probs, label_smoothing=0.1, z_loss=1e-3), None)
    (ga,) = torch.autograd.grad(out, xa)
    (ref_g,) = torch.autograd.grad(ref, x64)
    (peer_g,) = torch.autograd.grad(probability_reference(xb, probs, label_smoothing=0.1, z_loss=1e-3), xb)
    assert_tolerance("compiled gradient, probabilities", ga, ref_g, peer_g, None)


def test_errors_name_the_argument():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match=r"target\[2\] = 10 is out of range"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 10, 2]))
    with pytest.raises(ValueError, match=r"target\[0\] = -1"):
        torch_oss.cross_entropy(x, torch.tensor([-1, 1, 1, 2]))
    with pytest.raises(NotImplementedError, match="target"):
        torch_oss.linear_cross_entropy(torch.randn(3, 4), torch.randn(5, 4), torch.rand(3, 5))
    with pytest.raises(ValueError, match="target of class probabilities has shape"):
        torch_oss.cross_entropy(x, torch.softmax(x, 1)[:, :9])
    with pytest.raises(ValueError, match="ignore_index=3"):
        torch_oss.cross_entropy(x, torch.softmax(x, 1), ignore_index=3)
    with pytest.raises(ValueError, match="weight"):
        torch_oss.cross_entropy(x, torch.softmax(x, 1), weight=torch.ones(9))
    with pytest.raises(ValueError, match="reduction"):
        torch_oss.cross_entropy(x, torch.softmax(x, 1), reduction="avg")
    with pytest.raises(TypeError, match="input has dtype torch.int64"):
        torch_oss.cross_entropy(x.long(), torch.softmax(x, 1))
    with pytest.raises(TypeError, match="target"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="target"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="reduction"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 2, 3]), reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 2, 3]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="z_loss"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 2, 3]), z_loss=-1.0)
    with pytest.raises(ValueError, match="weight"):
        torch_oss.cross_entropy(x, torch.tensor([0, 1, 2, 3]), weight=torch.ones(9))
    with pytest.raises(TypeError, match="logits"):
        torch.ops.oss.cross_entropy(x.long(), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="logits must be 2-D"):
        torch.ops.oss.cross_entropy(x[None], torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="lse"):
        torch.ops.oss.cross_entropy_backward(torch.ones(4), x, torch.tensor([0, 1, 2, 3]), torch.ones(3), IGNORE,
                                             0.0, 0.0)
    with pytest.raises(ValueError, match="weight must be"):
        torch_oss.linear_cross_entropy(torch.randn(3, 4), torch.randn(5, 6), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="chunk_size"):
        torch_oss.linear_cross_entropy(torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2]), chunk_size=0)
    with pytest.raises(ValueError, match=r"target\[1\] = 5"):
        torch_oss.linear_cross_entropy(torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 5, 2]))


# ---------------------------------------------------------------------------
# torch_oss.linear_cross_entropy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_cross_entropy(device, dtype, reduction, with_bias):
    B, T, H, V = 2, 13, 32, 1001
    hidden = (torch.randn(B, T, H, dtype=torch.float64, device=device)).to(dtype)
    weight = (torch.randn(V, H, dtype=torch.float64, device=device) / H**0.5 * 2).to(dtype)
    bias = (torch.randn(V, dtype=torch.float64, device=device)).to(dtype) if with_bias else None
    t = random_target((B, T), V, device, ignored_every=4)
    kwargs = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3)

    def reference(h, w, b):
        logits = F.linear(h, w, b)
        return full_reference(logits.transpose(1, 2), t, **kwargs)

    if dtype == torch.bfloat16:
        # Everyone's logits are the bfloat16 product (torch.matmul, as
        # F.linear), whose rounding (2^-8 relative) is the same for ours and
        # the peer and dominates both errors; the reference takes that product
        # and does everything after it in float64.
        logits64 = F.linear(hidden, weight, bias).double().requires_grad_()
        ref = full_reference(logits64.transpose(1, 2), t, **kwargs)
        up = torch.rand(ref.shape, dtype=torch.float64, device=device) + 0.5
        (g64,) = torch.autograd.grad(ref, logits64, up)
        g64 = g64.reshape(-1, V)
        ref_grads = [(g64 @ weight.double()).reshape(B, T, H), g64.t() @ hidden.reshape(-1, H).double(), g64.sum(0)]
    else:
        leaves64 = [p.double().requires_grad_() for p in (hidden, weight, bias) if p is not None]
        ref = reference(*leaves64, *([None] if bias is None else []))
        up = torch.rand(ref.shape, dtype=torch.float64, device=device) + 0.5
        ref_grads = torch.autograd.grad(ref, leaves64, up)
    peer_leaves = [p.detach().requires_grad_() for p in (hidden, weight, bias) if p is not None]
    peer = reference(*peer_leaves, *([None] if bias is None else []))
    peer_grads = torch.autograd.grad(peer, peer_leaves, up.to(peer.dtype))
    atol = {torch.float64: 1e-10, torch.float32: None, torch.bfloat16: 1e-3}[dtype]
    for chunk_size in (1, 5, 11, None):
        leaves = [p.detach().requires_grad_() for p in (hidden, weight, bias) if p is not None]
        ours = torch_oss.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2] if with_bias else None,
                                              chunk_size=chunk_size, **kwargs)
        assert ours.shape == ref.shape
        assert_tolerance(f"loss chunk={chunk_size}", ours, ref, peer, atol)
        grads = torch.autograd.grad(ours, leaves, up.to(ours.dtype))
        for name, g, r, p in zip(("hidden", "weight", "bias"), grads, ref_grads, peer_grads):
            assert g.dtype == dtype
            # mean/sum: the gradients are computed in the forward and scaled
            # by the (here random, not a power of two) upstream gradient in
            # the backward: one more rounding of each element
            rescaled = reduction != "none"
            assert_tolerance(f"grad {name} chunk={chunk_size}", g, r, p, atol, per_element_eps=rescaled)


def test_linear_cross_entropy_no_grad_and_partial_grads():
    hidden = torch.randn(9, 8)
    weight = torch.randn(20, 8, requires_grad=True)
    t = random_target((9,), 20, "cpu", ignored_every=3)
    ref = F.cross_entropy(F.linear(hidden.double(), weight.double()), t)
    with torch.no_grad():
        out = torch_oss.linear_cross_entropy(hidden, weight, t, chunk_size=4)
    assert not out.requires_grad
    out = torch_oss.linear_cross_entropy(hidden, weight, t, chunk_size=4)
    (gw,) = torch.autograd.grad(out * 3, weight)
    w64 = weight.detach().double().requires_grad_()
    (ref_gw,) = torch.autograd.grad(F.cross_entropy(F.linear(hidden.double(), w64), t) * 3, w64)
    wp = weight.detach().requires_grad_()
    (peer_gw,) = torch.autograd.grad(F.cross_entropy(F.linear(hidden, wp), t) * 3, wp)
    assert_tolerance("loss", out, ref, F.cross_entropy(F.linear(hidden, weight), t), None)
    assert_tolerance("grad weight", gw, ref_gw, peer_gw, None)


def test_linear_cross_entropy_never_makes_whole_logits():
    """Every tensor any op produces in forward and backward (reductions mean
    and none) stays below tokens x V elements: only chunks of logits exist."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestOutput(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    LargestOutput.largest = max(LargestOutput.largest, t.numel())
            return out

    tokens, H, V, chunk = 64, 16, 3001, 10
    hidden = torch.randn(tokens, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    bias = torch.randn(V, requires_grad=True)
    t = random_target((tokens,), V, "cpu", ignored_every=5)
    for reduction in ("mean", "none"):
        LargestOutput.largest = 0
        with LargestOutput():
            loss = torch_oss.linear_cross_entropy(hidden, weight, t, bias, reduction=reduction, chunk_size=chunk)
            torch.autograd.grad(loss.sum(), (hidden, weight, bias))
        assert LargestOutput.largest <= max(chunk * V, V * H), (reduction, LargestOutput.largest)
    # and the check can see whole logits: F.linear + F.cross_entropy makes them
    LargestOutput.largest = 0
    with LargestOutput():
        F.cross_entropy(F.linear(hidden, weight, bias), t)
    assert LargestOutput.largest >= tokens * V


def test_results_do_not_depend_on_the_thread_count():
    x = awkward_randn((37, 5000), torch.bfloat16, "cpu")
    t = random_target((37,), 5000, "cpu", ignored_every=6)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            loss, lse = torch.ops.oss.cross_entropy(x, t, IGNORE, 0.1, 1e-3)
            grad = torch.ops.oss.cross_entropy_backward(torch.rand(37, generator=torch.Generator().manual_seed(0)),
                                                        x, t, lse, IGNORE, 0.1, 1e-3)
            results.append((loss, lse, grad))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_empty_batch():
    x = torch.randn(0, 7, requires_grad=True)
    t = torch.zeros(0, dtype=torch.int64)
    for reduction in ("none", "sum", "mean"):
        ours = torch_oss.cross_entropy(x, t, reduction=reduction)
        ref = F.cross_entropy(x, t, reduction=reduction)
        assert ours.shape == ref.shape and torch.equal(torch.isnan(ours), torch.isnan(ref))
        (g,) = torch.autograd.grad(ours.sum(), x)
        assert g.shape == x.shape


def _peak_bytes(step):
    """Peak CUDA memory allocated by step() beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_OK, reason=CUDA_SKIP_REASON)
def test_linear_cross_entropy_peak_memory_cuda():
    """Forward + backward of linear_cross_entropy holds one chunk of logits and
    weight's float32 gradient accumulator, not the tokens x V logits that
    F.linear + F.cross_entropy make (and their gradient)."""
    torch.manual_seed(0)
    tokens, H, V, chunk = 32768, 256, 32000, 1024
    hidden = (torch.randn(tokens, H, device="cuda") * 0.1).bfloat16().requires_grad_()
    weight = (torch.randn(V, H, device="cuda") * 0.1).bfloat16().requires_grad_()
    t = random_target((tokens,), V, "cuda", ignored_every=7)

    def step(loss_fn):
        def run():
            loss_fn().backward()
            hidden.grad = weight.grad = None  # gradients are part of both peaks; free them after
        return run

    ours = _peak_bytes(step(lambda: torch_oss.linear_cross_entropy(hidden, weight, t, chunk_size=chunk)))
    peer = _peak_bytes(step(lambda: F.cross_entropy(F.linear(hidden, weight), t)))
    grads = (tokens * H + V * H) * 2
    # a chunk's logits (its gradient written over them), weight's float32 accumulator and its scaled
    # copy in the backward, the gradients, 64 MiB for cuBLAS's workspace and small tensors, and a
    # quarter of all that for the allocator's rounding
    bound = 1.25 * (chunk * V * 2 + 2 * V * H * 4 + grads + 2**26)
    assert ours <= bound, (ours, bound)
    assert ours <= 0.25 * peer, (ours, peer)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.2, "z_loss": 1e-2},
                                {"weighted": True, "reduction": "sum", "z_loss": 1e-2},
                                {"weighted": True, "label_smoothing": 0.3}, {"reduction": "none", "z_loss": 0.1}],
                         ids=["mean", "smoothing, z-loss", "weighted sum, z-loss", "weighted smoothing", "none"])
def test_torch_func_and_forward_ad(device, kw):
    """torch.func.grad, hessian and jvp, and forward-mode AD, where the ops'
    registered formulas cannot run: the losses are ATen ops there, against
    the same transforms of the definition (F.cross_entropy plus the z-loss),
    float64; (N, C, d) input with ignored rows."""
    import torch.autograd.forward_ad as fwAD
    kw = dict(kw)
    weight = torch.rand(7, dtype=torch.float64, device=device) + 0.5 if kw.pop("weighted", False) else None
    x = torch.randn(3, 7, 2, dtype=torch.float64, device=device)
    target = torch.tensor([[1, IGNORE], [3, 6], [0, IGNORE]], device=device)
    tangent = torch.randn_like(x)
    results = []
    for fn in (torch_oss.cross_entropy, full_reference):
        loss = lambda x: fn(x, target, weight=weight, **kw).square().sum()
        with fwAD.dual_level():
            forward_ad = fwAD.unpack_dual(fn(fwAD.make_dual(x, tangent), target, weight=weight, **kw)).tangent
        results.append((torch.func.grad(loss)(x), torch.func.hessian(loss)(x),
                        torch.func.jvp(lambda x: fn(x, target, weight=weight, **kw), (x,), (tangent,))[1],
                        forward_ad))
    for name, ours, ref in zip(("grad", "hessian", "jvp", "forward-mode AD"), *results):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")
