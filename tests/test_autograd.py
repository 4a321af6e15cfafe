"""Autograd beyond the first derivative: softmax and log_softmax are twice
(and more) differentiable, as F.softmax is, checked with gradgradcheck and
against F.softmax's own double backward by the tolerance rule; attention
refuses a second derivative with a clear NotImplementedError instead of a
silently wrong one; and every operator of the package has an autograd kernel
of its own (none falls through PyTorch's "autograd kernel was not registered"
path, which warns and returns gradients that lack the op's share)."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from _util import DEVICES, FLOAT_DTYPES, SOFTMAX_ATOL, assert_tolerance, awkward_randn, derived_atol

import torch_oss

OPS = {
    "softmax": (torch_oss.softmax, F.softmax),
    "log_softmax": (torch_oss.log_softmax, F.log_softmax),
}


def oss_op_names():
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("oss::"))


# ---------------------------------------------------------------------------
# softmax / log_softmax: second derivatives
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim,layout", [
    ((3, 7), -1, "contiguous"),
    ((4, 5, 6), 1, "contiguous"),
    ((2, 3, 4), 0, "contiguous"),
    ((1, 1), 0, "contiguous"),
    ((6,), 0, "contiguous"),
    ((5, 4), -1, "transposed"),
    ((4, 6, 3), 1, "sliced"),
    ((3, 5), 0, "expanded"),
])
def test_gradgradcheck_float64(device, op_name, shape, dim, layout):
    ours_fn, _ = OPS[op_name]
    x = torch.randn(shape, dtype=torch.float64, device=device, requires_grad=True)

    def view(t):
        if layout == "transposed":
            return t.t().contiguous().t()  # same values, column-major strides
        if layout == "sliced":
            return torch.cat([t, t], -1)[..., ::2]  # a stride of 2 along the last dim
        if layout == "expanded":
            return t[:1].expand(shape)  # stride 0 along dim 0
        return t

    assert torch.autograd.gradcheck(lambda t: ours_fn(view(t), dim), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ours_fn(view(t), dim), (x,))


@pytest.mark.parametrize("op_name", list(OPS))
def test_backward_ops_gradgradcheck_in_both_arguments(op_name):
    """oss.{op}_backward differentiated directly in grad_output and output
    (treated as independent inputs), first and second order."""
    backward = getattr(torch.ops.oss, f"{op_name}_backward")
    x = torch.randn(4, 9, dtype=torch.float64)
    y = OPS[op_name][1](x, -1).requires_grad_()
    dy = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g, o: backward(g, o, -1, torch.float64), (dy, y))
    assert torch.autograd.gradgradcheck(lambda g, o: backward(g, o, -1, torch.float64), (dy, y))


def hessian_vector_products(fn, x, dim, w, v, dtype=None):
    """d/dx of <grad_x <fn(x), w>, v>: the snippet a gradient penalty runs,
    and the same with a gradient of the squared first gradient."""
    x = x.detach().clone().requires_grad_()
    y = fn(x, dim) if dtype is None else fn(x, dim, dtype=dtype)
    (g,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * v).sum(), x, retain_graph=True)
    (h2,) = torch.autograd.grad(g.pow(2).sum(), x)
    return g.detach(), hv, h2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("shape,dim", [((4, 7), -1), ((33, 300), -1), ((5, 130, 3), 1), ((2, 2049), -1)])
def test_double_backward_matches_float64(device, dtype, op_name, shape, dim):
    """Hessian-vector products through our op against the same through F.softmax
    in float64 (reference) and in the same dtype (peer), by the tolerance rule."""
    ours_fn, torch_fn = OPS[op_name]
    x = awkward_randn(shape, dtype, device, scale=2.0)
    w = torch.randn(shape, dtype=dtype, device=device)
    v = torch.randn(shape, dtype=dtype, device=device)
    ours = hessian_vector_products(ours_fn, x, dim, w, v)
    peer = hessian_vector_products(torch_fn, x, dim, w, v)
    ref = hessian_vector_products(torch_fn, x.cpu().double(), dim, w.cpu().double(), v.cpu().double())
    log = op_name == "log_softmax"
    for name, a, p, r in zip(("grad", "hvp", "grad of |grad|^2"), ours, peer, ref):
        assert a.dtype == dtype and a.device == x.device
        if name == "grad":
            atol = first_order_atol(dtype, r, w, dim, log)
        else:
            atol = second_order_atol(dtype, r, w, v if name == "hvp" else 2 * ours[0], dim, log)
        assert_tolerance(f"{op_name} {name} {dtype} {shape} dim={dim}", a, r, p, atol)


def first_order_atol(dtype, ref64, w, dim, log):
    """The atol of the first gradient here, which is built from the rounded
    forward output y (softmax: y * (w - sum(w y)); log_softmax: w - exp(y)
    sum(w)), so its error holds y's rounding, the row sum's and its own, and
    two kernels whose y differ by an ulp differ there by more than 2x at
    random on rows of a few elements (about 1 draw in 100 failed the bare
    rule). float16/bfloat16 (sums in float32): one rounding of the largest
    result beyond the rule's atol. float32/float64: the rule's atol plus one
    rounding of the largest term |w| (times 1 + the largest |sum(w)| for
    log_softmax) per level of a pairwise row sum (ceil(log2 n) levels)."""
    eps = torch.finfo(dtype).eps
    if dtype in (torch.float16, torch.bfloat16):
        return SOFTMAX_ATOL[dtype] + eps * ref64.abs().max().item()
    base = SOFTMAX_ATOL[dtype] if SOFTMAX_ATOL[dtype] is not None else derived_atol(dtype, ref64)
    w_wide = w.double().cpu()
    terms = w_wide.abs().max().item()
    if log:
        terms *= 1 + w_wide.sum(dim).abs().max().item()
    levels = max(1, math.ceil(math.log2(w.shape[dim])))
    return base + eps * terms * levels


def second_order_atol(dtype, ref64, w, v, dim, log):
    """The atol of a Hessian-vector product. It is a chain of results rounded
    in `dtype` (y, the first gradient, the gradient reaching y) whose terms
    cancel, in ours and in the peer alike, so the two chains' largest errors
    differ by more than 2x at random. The size of the terms is max|w| max|v|,
    times 1 + the largest |sum(w)| over dim for log_softmax, whose gradient
    carries that sum. float32 and float64: four roundings of the terms per
    level of a pairwise sum over dim (ceil(log2 n) levels: the row sums inside
    the chain round at each); in float64 the peer is the reference's own
    computation, so there the atol is the whole allowance. float16 and
    bfloat16 (sums in float32): two roundings of the largest result plus half
    a 16-bit ulp (eps / 2) of the terms, by which rounding y or the first
    gradient to 16 bits moves the result (where y is nearly one-hot the
    result is far smaller than its terms)."""
    eps = torch.finfo(dtype).eps
    w_wide, v_wide = w.double().cpu(), v.double().cpu()
    terms = w_wide.abs().max().item() * v_wide.abs().max().item()
    if log:
        terms *= 1 + w_wide.sum(dim).abs().max().item()
    if dtype in (torch.float16, torch.bfloat16):
        return 2 * eps * ref64.abs().max().item() + eps / 2 * terms
    levels = max(1, math.ceil(math.log2(w.shape[dim])))
    return 4 * eps * terms * levels


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_issue_snippet_gives_f_softmax_answer(device, op_name):
    """The second derivative a gradient penalty computes, float64."""
    ours_fn, torch_fn = OPS[op_name]
    x = torch.randn(4, 7, dtype=torch.float64, device=device)
    w = torch.randn(4, 7, dtype=torch.float64, device=device)
    results = []
    for fn in (ours_fn, torch_fn):
        xr = x.clone().requires_grad_()
        (g,) = torch.autograd.grad((fn(xr, -1) * w).sum(), xr, create_graph=True)
        (h,) = torch.autograd.grad(g.pow(2).sum(), xr)
        results.append(h)
    torch.testing.assert_close(results[0], results[1], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.float16, torch.float32), (torch.float32, torch.float64),
                                                (torch.float64, torch.float32)])
def test_double_backward_with_dtype_cast(device, op_name, in_dtype, out_dtype):
    """dtype= casts: the second derivative has the input's dtype and matches
    F.softmax(..., dtype=) by the tolerance rule against float64."""
    ours_fn, torch_fn = OPS[op_name]
    x = awkward_randn((6, 50), in_dtype, device, scale=2.0)
    w = torch.randn(6, 50, dtype=out_dtype, device=device)
    v = torch.randn(6, 50, dtype=in_dtype, device=device)
    ours = hessian_vector_products(ours_fn, x, -1, w, v, dtype=out_dtype)
    peer = hessian_vector_products(torch_fn, x, -1, w, v, dtype=out_dtype)
    ref = hessian_vector_products(torch_fn, x.cpu().double(), -1, w.cpu().double(), v.cpu().double())
    coarse = max((in_dtype, out_dtype), key=lambda d: torch.finfo(d).eps)
    log = op_name == "log_softmax"
    for name, a, p, r in zip(("grad", "hvp", "grad of |grad|^2"), ours, peer, ref):
        assert a.dtype == in_dtype
        atol = SOFTMAX_ATOL[coarse] if name == "grad" else second_order_atol(coarse, r, w, v if name == "hvp" else
                                                                             2 * ours[0], -1, log)
        assert_tolerance(f"{op_name} {name} {in_dtype}->{out_dtype}", a.to(coarse), r, p.to(coarse), atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op_name", list(OPS))
def test_third_derivative(device, op_name):
    ours_fn, _ = OPS[op_name]
    x = torch.randn(3, 5, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda t: torch.autograd.grad(ours_fn(t, -1).pow(3).sum(), t, create_graph=True)[0], (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_of_composed_ops(device):
    """log_softmax over dim 0 of a scaled softmax over dim -1: the second
    derivative flows through both ops' backward nodes and both forward nodes."""
    x = torch.randn(6, 11, dtype=torch.float64, device=device, requires_grad=True)
    (g,) = torch.autograd.grad(torch_oss.log_softmax(torch_oss.softmax(x, -1) * 3, 0).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.square().sum(), x)
    xr = x.detach().clone().requires_grad_()
    (gr,) = torch.autograd.grad(F.log_softmax(F.softmax(xr, -1) * 3, 0).sum(), xr, create_graph=True)
    (hr,) = torch.autograd.grad(gr.square().sum(), xr)
    torch.testing.assert_close(h, hr, atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------------------
# attention: a second derivative is refused, loudly
# ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("wrt", ["q", "k", "v", "qkv"])
def test_attention_double_backward_raises(device, dtype, wrt):
    """A graph built through attention's backward (create_graph=True) raises
    NotImplementedError naming double backward, for every input (16-bit
    inputs go through attention_with_residual); it never returns zeros."""
    q, k, v = (torch.randn(1, 4, 9, 16, dtype=dtype, device=device) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    leaves = {"q": q, "k": k, "v": v}
    for name in leaves:
        leaves[name] = leaves[name].clone().requires_grad_(name in wrt)
    out = torch_oss.attention(leaves["q"], leaves["k"], leaves["v"], is_causal=True, enable_gqa=True)
    wanted = [leaves[n] for n in "qkv" if n in wrt]
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(out.square().sum(), wanted, create_graph=True)
    out = torch_oss.attention(leaves["q"], leaves["k"], leaves["v"], is_causal=True, enable_gqa=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        out.square().sum().backward(create_graph=True)
    # without create_graph the first derivative works as before
    out = torch_oss.attention(leaves["q"], leaves["k"], leaves["v"], is_causal=True, enable_gqa=True)
    grads = torch.autograd.grad(out.square().sum(), wanted)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_backward_op_refuses_a_graph(device):
    """The backward op called directly with inputs that require grad (grad
    mode on): a gradient of it is not implemented, so building one raises."""
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, device=device) for _ in range(3))
    out, lse = torch.ops.oss.attention(q, k, v)
    dout = torch.randn_like(out, requires_grad=True)
    args = (q, k, v, out, lse, None, False, None, False, "top_left", False)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.ops.oss.attention_backward(dout, *args)
    with torch.no_grad():
        dq, dk, dv = torch.ops.oss.attention_backward(dout, *args)
    assert dq.shape == q.shape and not dq.requires_grad


# ---------------------------------------------------------------------------
# every op has an autograd kernel
# ---------------------------------------------------------------------------


def test_every_op_has_an_autograd_kernel():
    names = oss_op_names()
    expected = {"oss::softmax", "oss::softmax_backward", "oss::log_softmax", "oss::log_softmax_backward",
                "oss::attention", "oss::attention_with_residual", "oss::attention_backward"}
    assert expected <= set(names), names
    missing = [n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(n, "Autograd")]
    assert not missing, f"ops without an autograd kernel: {missing}"


@pytest.mark.parametrize("device", DEVICES)
def test_no_op_falls_through_the_autograd_warning(device):
    """Each op, and the backward of each, with create_graph=True and warnings
    as errors: either a right answer or a NotImplementedError (attention),
    never PyTorch's "autograd kernel was not registered" warning."""
    x = torch.randn(3, 6, dtype=torch.float64, device=device, requires_grad=True)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, device=device, requires_grad=True)
    q16 = torch.randn(1, 2, 4, 8, dtype=torch.bfloat16, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (torch.ops.oss.softmax, torch.ops.oss.log_softmax):
            y = fn(x, -1)
            (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
            (h,) = torch.autograd.grad(g.sum(), x)
            assert torch.isfinite(h).all()
            dy = torch.randn_like(y, requires_grad=True)
            backward = torch.ops.oss.softmax_backward if fn is torch.ops.oss.softmax else \
                torch.ops.oss.log_softmax_backward
            dx = backward(dy, y, -1, torch.float64)
            (gdy, gy) = torch.autograd.grad(dx.square().sum(), (dy, y), create_graph=True)
            assert torch.isfinite(gdy).all() and torch.isfinite(gy).all()
        for t, op in ((q, torch.ops.oss.attention), (q16, torch.ops.oss.attention_with_residual)):
            out = op(t, t, t)[0]
            with pytest.raises(NotImplementedError, match="double backward"):
                torch.autograd.grad(out.sum(), t, create_graph=True)
            (g,) = torch.autograd.grad(op(t, t, t)[0].sum(), t)
            assert torch.isfinite(g).all()
