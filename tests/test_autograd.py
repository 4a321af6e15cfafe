"""Autograd beyond the first derivative: softmax and log_softmax are twice
(and more) differentiable, as F.softmax is, checked with gradgradcheck and
against F.softmax's own double backward by the tolerance rule, and work under
forward-mode AD and torch.func transforms; attention is differentiable to any
order too, through ATen ops that recompute its first gradient (gradgradcheck,
against SDPA's math backend, under torch.func), and refuses with dropout; and
every operator of the package has an autograd kernel of its own (none falls
through PyTorch's "autograd kernel was not registered" path, which warns and
returns gradients that lack the op's share)."""

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
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_torch_func_and_forward_ad(device, op_name, dtype):
    """torch.func.grad, jvp, hessian and vmap of grad, and forward-mode AD,
    against the same through F.softmax / F.log_softmax (the ops run PyTorch's
    own kernel there, after their argument checks)."""
    import torch.autograd.forward_ad as fwAD
    ours_fn, torch_fn = OPS[op_name]
    x = awkward_randn((3, 9), dtype, device, scale=2.0)
    t = torch.randn_like(x)
    w = torch.randn_like(x)
    results = []
    for fn in (ours_fn, torch_fn):
        loss = lambda x: (fn(x, -1) * w[..., :x.shape[-1]]).sum()
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(fn(fwAD.make_dual(x, t), -1)).tangent
        per_sample = torch.func.vmap(torch.func.grad(loss))(x[:, None].expand(3, 3, 9))
        results.append((torch.func.grad(loss)(x), torch.func.jvp(lambda x: fn(x, -1), (x,), (t,))[1],
                        torch.func.hessian(loss)(x[:1, :4]), per_sample, tangent))
    for name, a, b in zip(("grad", "jvp", "hessian", "vmap of grad", "forward-mode AD"), *results):
        torch.testing.assert_close(a, b, msg=lambda m: f"{op_name} {name}: {m}")
    with pytest.raises(IndexError, match="dim=5 is out of range"):  # the op's checks still run
        torch.func.grad(lambda x: ours_fn(x, 5).sum())(x)


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


# Attention's configurations for its second derivatives: (name, keyword
# arguments of torch_oss.attention_with_lse, Hq, Hkv, Lq, Lk, D, Dv); masks
# and sinks are built per case (make_attention_case).
ATTENTION_CASES = [
    ("plain", {}, 2, 2, 5, 6, 4, 4),
    ("causal top-left", {"is_causal": True}, 2, 2, 6, 6, 4, 3),
    ("causal bottom-right", {"is_causal": True, "causal_alignment": "bottom_right"}, 2, 2, 3, 7, 4, 4),
    ("gqa", {"enable_gqa": True, "scale": 0.7}, 4, 2, 5, 5, 4, 4),
    ("bool mask, a row sees no key", {"attn_mask": "bool"}, 2, 2, 4, 5, 4, 4),
    ("float mask", {"attn_mask": "float"}, 2, 2, 4, 5, 4, 4),
    ("window and causal", {"window_size": (2, 1), "is_causal": True}, 2, 2, 6, 6, 4, 4),
    ("softcap", {"softcap": 1.5}, 2, 2, 4, 5, 4, 4),
    ("alibi (B, H)", {"alibi_slopes": "bh", "causal_alignment": "bottom_right"}, 2, 2, 3, 5, 4, 4),
    ("sinks", {"sinks": True, "is_causal": True}, 2, 2, 4, 4, 4, 4),
]


# the cases SDPA expresses (its is_causal is top-left; no score variants)
SDPA_CASES = [c for c in ATTENTION_CASES[:6] if c[1].get("causal_alignment") != "bottom_right"]


def make_attention_case(case, dtype, device, B=2):
    """q, k, v (and sinks when the case has them) as leaves that require grad,
    and the keyword arguments with the case's masks and slopes built."""
    name, kwargs, Hq, Hkv, Lq, Lk, D, Dv = case
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    rand = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    q, k, v = rand(B, Hq, Lq, D), rand(B, Hkv, Lk, D), rand(B, Hkv, Lk, Dv)
    kwargs = dict(kwargs)
    if kwargs.get("attn_mask") == "bool":
        mask = torch.rand(B, 1, Lq, Lk, generator=g) > 0.4
        mask[:, :, 1] = False  # row 1 sees no key: out 0, lse -inf, zero gradients
        kwargs["attn_mask"] = mask.to(device)
    elif kwargs.get("attn_mask") == "float":
        kwargs["attn_mask"] = torch.randn(1, Hq, Lq, Lk, generator=g, dtype=torch.float64).to(dtype=dtype,
                                                                                             device=device)
    if kwargs.get("alibi_slopes") == "bh":
        kwargs["alibi_slopes"] = torch.rand(B, Hq, generator=g).to(device)
    leaves = [q, k, v]
    if kwargs.pop("sinks", False):
        # multiples of 2^-8: the kernels hold sinks in float32, and these stay
        # exact there, also when gradgradcheck moves them by its step 2^-12
        leaves.append((rand(Hq) * 256).round() / 256)
    return [t.requires_grad_(True) for t in leaves], kwargs


def attention_fn(kwargs):
    """(q, k, v[, sinks]) -> (out, lse) of torch_oss.attention_with_lse."""
    def fn(q, k, v, sinks=None):
        return torch_oss.attention_with_lse(q, k, v, sinks=sinks, **kwargs)
    return fn


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_gradgradcheck_float64(device, case):
    """Second derivatives of out and lse in every input (q, k, v, sinks) and in
    the incoming gradients, against finite differences of the first, float64."""
    leaves, kwargs = make_attention_case(case, torch.float64, device)
    eps = 2**-12 if len(leaves) == 4 else 1e-6  # sinks: a step float32 holds exactly
    assert torch.autograd.gradgradcheck(attention_fn(kwargs), leaves, eps=eps, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_graph_gradient_matches_kernel(device, dtype, case):
    """The first gradient computed for a graph (create_graph=True: ATen ops)
    against the variants' float64 definition, by the tolerance rule with the
    kernel's gradient (create_graph=False) as the peer: building a graph does
    not change the gradient it starts from."""
    from test_variants import variant_reference
    leaves, kwargs = make_attention_case(case, dtype, device)
    ref_leaves, ref_kwargs = make_attention_case(case, torch.float64, "cpu")
    ref_kwargs["alignment"] = ref_kwargs.pop("causal_alignment", "top_left")
    ref_kwargs.pop("enable_gqa", None)
    w = torch.randn(leaves[0].shape[:-1] + (case[7],), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    wl = torch.randn(leaves[0].shape[:-1], generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def loss(fn_leaves, kw, fn=None):
        out, lse = (fn or attention_fn(kw))(*fn_leaves)
        lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        return (out.double() * w.to(out.device)).sum() + (lse.double() * wl.to(out.device)).sum()

    graph = torch.autograd.grad(loss(leaves, kwargs), leaves, create_graph=True)
    kernel = torch.autograd.grad(loss(leaves, kwargs), leaves)
    ref = torch.autograd.grad(loss(ref_leaves, ref_kwargs,
                                   lambda q, k, v, sinks=None: variant_reference(q, k, v, sinks=sinks, **ref_kwargs)),
                              ref_leaves)
    for name, a, p, r in zip("qkvs", graph, kernel, ref):
        assert a.dtype == dtype and a.requires_grad
        assert_tolerance(f"{case[0]} d{name} {dtype}", a, r, p, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_attention_hessian_vector_products_match_sdpa(device, dtype, case):
    """Hessian-vector products of <w, out> through torch_oss.attention against
    the same through F.scaled_dot_product_attention's math backend, in float64
    (reference) and in the same dtype (peer), by the tolerance rule."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    leaves, kwargs = make_attention_case(case, dtype, device)
    dirs = [torch.randn(t.shape, generator=torch.Generator().manual_seed(3 + i), dtype=torch.float64)
            for i, t in enumerate(leaves)]
    w = torch.randn(leaves[0].shape[:-1] + (case[7],), generator=torch.Generator().manual_seed(7),
                    dtype=torch.float64)

    def hvp(fn, xs):
        xs = [x.detach().clone().requires_grad_(True) for x in xs]
        out = fn(*xs)
        grads = torch.autograd.grad((out.double() * w.to(out.device)).sum(), xs, create_graph=True)
        dot = sum((g.double() * d.to(g.device)).sum() for g, d in zip(grads, dirs))
        return torch.autograd.grad(dot, xs)

    def sdpa(q, k, v):
        mask = kwargs.get("attn_mask")
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kwargs.get("is_causal", False),
                                                  scale=kwargs.get("scale"), enable_gqa=kwargs.get("enable_gqa",
                                                                                                 False))

    ours = hvp(lambda q, k, v: torch_oss.attention(q, k, v, **kwargs), leaves)
    peer = hvp(sdpa, leaves)
    ref_leaves = [t.detach().cpu().double() for t in leaves]
    if isinstance(kwargs.get("attn_mask"), torch.Tensor):
        kwargs["attn_mask"] = kwargs["attn_mask"].cpu()
        if kwargs["attn_mask"].is_floating_point():
            kwargs["attn_mask"] = kwargs["attn_mask"].double()
    ref = hvp(sdpa, ref_leaves)
    for name, a, p, r in zip("qkv", ours, peer, ref):
        # a row that sees no key: SDPA's math backend gives NaN there, ours 0
        keep = torch.isfinite(r)
        r = torch.where(keep, r, 0)
        # float64: the peer is the reference's own computation, so the atol is
        # the whole allowance, for a chain of three products of rounded results
        # (scores, P, the first gradient): four times the rule's
        atol = 4 * derived_atol(dtype, r) if dtype == torch.float64 else None
        assert_tolerance(f"{case[0]} hvp d{name} {dtype}", torch.where(keep.to(a.device), a, 0), r,
                         torch.where(keep.to(p.device), p, 0), atol)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("device", DEVICES)
def test_attention_third_derivative(device):
    """Derivatives of any order: the second derivative's graph is ATen ops too."""
    leaves, kwargs = make_attention_case(ATTENTION_CASES[3], torch.float64, device)
    assert torch.autograd.gradgradcheck(
        lambda q, k, v: torch.autograd.grad(attention_fn(kwargs)(q, k, v)[0].square().sum(), (q, k, v),
                                            create_graph=True),
        leaves, atol=1e-6, rtol=1e-5)


def reference_fn(kwargs):
    """(q, k, v[, sinks]) -> (out, lse) of the variants' float64 definition,
    for a case's keyword arguments."""
    from test_variants import variant_reference
    kw = dict(kwargs)
    kw["alignment"] = kw.pop("causal_alignment", "top_left")
    kw.pop("enable_gqa", None)

    def fn(q, k, v, sinks=None):
        return variant_reference(q, k, v, sinks=sinks, **kw)
    return fn


TORCH_FUNC_CASES = [c for c in ATTENTION_CASES if c[0] in ("causal bottom-right", "gqa", "bool mask, a row sees no key",
                                                           "softcap", "alibi (B, H)", "sinks")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", TORCH_FUNC_CASES, ids=[c[0] for c in TORCH_FUNC_CASES])
def test_attention_under_torch_func_and_forward_ad(device, case):
    """torch.func.grad, jvp and hessian, per-sample gradients (vmap of grad) and
    forward-mode AD run attention as ATen ops: each against the same transform
    of the variants' float64 definition."""
    import torch.autograd.forward_ad as fwAD
    leaves, kwargs = make_attention_case(case, torch.float64, device)
    leaves = [t.detach() for t in leaves]
    ours_fn, ref_fn = attention_fn(kwargs), reference_fn(kwargs)
    w = torch.randn(leaves[0].shape[:-1] + (case[7],), generator=torch.Generator().manual_seed(5),
                    dtype=torch.float64).to(device)
    tangents = [torch.randn(t.shape, generator=torch.Generator().manual_seed(11 + i), dtype=torch.float64).to(device)
                for i, t in enumerate(leaves)]

    def loss(fn, w=w):
        def f(*xs):
            out, lse = fn(*xs)
            return (out * w).sum() + torch.where(torch.isfinite(lse), lse, 0).square().sum()
        return f

    def close(name, a, b):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"{case[0]} {name}: {m}")

    argnums = tuple(range(len(leaves)))
    for i, (a, b) in enumerate(zip(torch.func.grad(loss(ours_fn), argnums)(*leaves),
                                   torch.func.grad(loss(ref_fn), argnums)(*leaves))):
        close(f"func.grad {i}", a, b)
    (_, ours_t), (_, ref_t) = (torch.func.jvp(lambda *xs: fn(*xs)[0], tuple(leaves), tuple(tangents))
                               for fn in (ours_fn, ref_fn))
    close("func.jvp", ours_t, ref_t)
    with fwAD.dual_level():
        out, lse = ours_fn(*(fwAD.make_dual(x, t) for x, t in zip(leaves, tangents)))
        close("forward-mode AD", fwAD.unpack_dual(out).tangent, ref_t)
    small = [x[:1, :, :3] if i < 3 else x for i, x in enumerate(leaves)]
    if "attn_mask" not in kwargs and "alibi_slopes" not in kwargs:  # those are shaped for the full batch
        ours_h = torch.func.hessian(loss(ours_fn, w[:1, :, :3]))(*small)
        ref_h = torch.func.hessian(loss(ref_fn, w[:1, :, :3]))(*small)
        close("func.hessian", ours_h, ref_h)
        # per-sample gradients: vmap over the batch of q of grad in q
        per_sample = torch.func.vmap(
            torch.func.grad(lambda q1, k, v, *rest: loss(ours_fn, w[:1])(q1[None], k, v, *rest)),
            in_dims=(0,) + (None,) * (len(leaves) - 1))
        k1 = [x[:1] if i in (1, 2) else x for i, x in enumerate(leaves)]
        ours_ps = per_sample(leaves[0], *k1[1:])
        ref_ps = torch.stack([torch.func.grad(loss(ref_fn, w[:1]))(leaves[0][b:b + 1], *k1[1:])[0]
                              for b in range(leaves[0].shape[0])])
        close("vmap of grad", ours_ps, ref_ps)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_under_torch_func_refuses_dropout(device):
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64, device=device)
    with pytest.raises(NotImplementedError, match="dropout_p > 0 is not supported under forward-mode AD or torch.func"):
        torch.func.grad(lambda q: torch_oss.attention(q, q, q, dropout_p=0.2).sum())(q)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("Lq,Lk", [(3, 0), (0, 4)])
def test_attention_double_backward_empty(device, Lq, Lk):
    """No keys (out 0) or no queries: second derivatives of the right shapes, zero."""
    q = torch.randn(1, 2, Lq, 4, dtype=torch.float64, device=device, requires_grad=True)
    k, v = (torch.randn(1, 2, Lk, 4, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    out = torch_oss.attention(q, k, v)
    grads = torch.autograd.grad(out.square().sum() + out.sum(), (q, k, v), create_graph=True)
    hess = torch.autograd.grad(sum(g.square().sum() for g in grads), (q, k, v), allow_unused=True,
                               materialize_grads=True)
    for t, g, h in zip((q, k, v), grads, hess):
        assert g.shape == t.shape and h.shape == t.shape
        assert not g.abs().sum().item() and not h.abs().sum().item()


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("device", DEVICES)
def test_attention_double_backward_refused_with_dropout(device):
    """Dropout's mask is not recomputed by the ATen ops: a graph through the
    backward of a call with dropout raises NotImplementedError; the first
    derivative works."""
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64, device=device, requires_grad=True)
    out = torch_oss.attention(q, q, q, dropout_p=0.3)
    with pytest.raises(NotImplementedError, match="double backward is not supported with dropout_p"):
        torch.autograd.grad(out.square().sum(), q, create_graph=True)
    (g,) = torch.autograd.grad(torch_oss.attention(q, q, q, dropout_p=0.3).square().sum(), q)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("device", DEVICES)
def test_attention_backward_op_is_differentiable(device):
    """The backward op called directly with a grad_out that requires grad: its
    result is linear in grad_out, so the gradient of <dq, u> in grad_out is
    the first gradient of <out, .> in the direction u, computed independently."""
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64, device=device) for _ in range(3))
    out, lse = torch.ops.oss.attention(q, k, v)
    dout = torch.randn_like(out, requires_grad=True)
    args = (q, k, v, out, lse, None, False, None, False, "top_left", False)
    dq, dk, dv = torch.ops.oss.attention_backward(dout, *args)
    assert dq.requires_grad
    with torch.no_grad():
        dq0, dk0, dv0 = torch.ops.oss.attention_backward(dout, *args)
    torch.testing.assert_close(dq, dq0, rtol=1e-12, atol=1e-12)
    u = torch.randn_like(v)
    (g,) = torch.autograd.grad((dv * u).sum(), dout)
    # dv = P^T dout, so d<dv, u>/d dout = P u
    p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1)
    torch.testing.assert_close(g, p @ u, rtol=1e-10, atol=1e-12)


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
    as errors: a second derivative, never PyTorch's "autograd kernel was not
    registered" warning."""
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
            (g,) = torch.autograd.grad(out.square().sum(), t, create_graph=True)
            (h,) = torch.autograd.grad(g.sum(), t)
            assert torch.isfinite(h).all()
