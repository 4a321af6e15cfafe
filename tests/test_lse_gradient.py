"""The gradient of attention's lse.

d lse_i / d s_ij = P_ij (and d lse_i / d sink = p_sink), so a loss that uses
lse as well as out (partial attentions merged by their lse, a penalty on lse)
gets lse's share in dq, dk and d sinks: the backward takes D - dlse for D
(oss.h dlse). The CPU kernels compute it; the CUDA kernels refuse it with
NotImplementedError (they would otherwise have to drop it).
"""

import pytest
import torch
from _util import ATTENTION_ATOL, assert_tolerance, cuda_param
from test_variants import make_qkv, variant_reference

import torch_oss

VARIANTS = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "bottom_right_window_softcap": dict(is_causal=True, causal_alignment="bottom_right", window_size=(3, 0),
                                        softcap=2.0),
    "alibi_sinks": dict(alibi=True, sinks=True),
    "all": dict(window_size=(2, 1), softcap=1.5, alibi=True, sinks=True),
}


def call_kwargs(spec, Hq, device, dtype=torch.float64):
    """torch_oss.attention_with_lse's keyword arguments for a VARIANTS entry
    (the sinks, if any, as a leaf that requires grad)."""
    kw = {k: v for k, v in spec.items() if k not in ("alibi", "sinks")}
    if spec.get("alibi"):
        kw["alibi_slopes"] = torch.linspace(0.25, 1.0, Hq, device=device)
    if spec.get("sinks"):
        kw["sinks"] = torch.linspace(-0.5, 0.75, Hq, device=device, dtype=dtype).requires_grad_()
    return kw


def reference_kwargs(kw):
    """variant_reference's keyword arguments for the same call."""
    ref = dict(kw)
    ref["alignment"] = ref.pop("causal_alignment", "top_left")
    return ref


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradcheck_through_out_and_lse(variant):
    """Numerical gradients of q, k, v (and the sinks) of a function of both
    outputs. The sinks are float32 values and the step 2^-12 keeps sink +-
    step exact in float32 (the kernels hold sinks in float32)."""
    torch.manual_seed(3)
    q, k, v = (t.requires_grad_() for t in make_qkv((2, 2, 1, 5, 7, 4, 4), torch.float64, "cpu"))
    kw = call_kwargs(VARIANTS[variant], 2, "cpu")
    sinks = kw.pop("sinks", None)

    def f(q, k, v, *maybe_sinks):
        return torch_oss.attention_with_lse(q, k, v, enable_gqa=True, sinks=maybe_sinks[0] if maybe_sinks else None,
                                            **kw)

    inputs = (q, k, v) + ((sinks,) if sinks is not None else ())
    assert torch.autograd.gradcheck(f, inputs, eps=2 ** -12, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradients_match_float64(dtype, variant):
    """loss = <out, w> + <lse, u>: dq, dk, dv and d sinks against the float64
    reference's autograd, by the tolerance rule. The peer for bfloat16 is the
    same autograd in float32, rounded to bfloat16 (PyTorch has no kernel with
    lse's gradient); float32's bound derives from the reference."""
    torch.manual_seed(5)
    shape = (2, 4, 2, 37, 53, 16, 16)
    q, k, v = make_qkv(shape, dtype, "cpu")
    kw = call_kwargs(VARIANTS[variant], 4, "cpu", torch.float32)
    # the weights exact in the dtypes the backward takes out's and lse's gradients in
    out_w = torch.randn(2, 4, 37, 16, dtype=dtype).double()
    lse_w = torch.randn(2, 4, 37, dtype=torch.float32).double()

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    sinks = kw.pop("sinks", None)
    out, lse = torch_oss.attention_with_lse(*leaves, enable_gqa=True, sinks=sinks, **kw)
    ((out.double() * out_w).sum() + (lse.double() * lse_w).sum()).backward()

    def reference_grads(compute_dtype):
        ref_leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v)]
        ref_sinks = None if sinks is None else sinks.detach().to(compute_dtype).requires_grad_()
        ref_out, ref_lse = variant_reference(*ref_leaves, sinks=ref_sinks, compute_dtype=compute_dtype,
                                             **reference_kwargs(kw))
        ((ref_out * out_w.to(compute_dtype)).sum() + (ref_lse * lse_w.to(compute_dtype)).sum()).backward()
        return [t.grad for t in ref_leaves] + ([ref_sinks.grad] if sinks is not None else [])

    ref = reference_grads(torch.float64)
    peer = [g.to(dtype) for g in reference_grads(torch.float32)] if dtype != torch.float32 else [None] * len(ref)
    ours = [t.grad for t in leaves] + ([sinks.grad] if sinks is not None else [])
    for name, got, want, other in zip(("dq", "dk", "dv", "dsinks"), ours, ref, peer):
        atol = None if name == "dsinks" else ATTENTION_ATOL[dtype]
        assert_tolerance(f"{variant} {dtype} {name}", got, want, other if name != "dsinks" else None, atol)


def test_lse_alone_feeds_the_loss():
    """A loss of lse only: out's gradient is absent and lse's still reaches
    q and k (v gets none: lse does not depend on it)."""
    torch.manual_seed(7)
    q, k, v = (t.requires_grad_() for t in make_qkv((1, 2, 2, 6, 9, 8, 8), torch.float64, "cpu"))
    _, lse = torch_oss.attention_with_lse(q, k, v, is_causal=True, causal_alignment="bottom_right")
    lse.sum().backward()
    rq, rk, rv = (t.detach().requires_grad_() for t in (q, k, v))
    _, ref_lse = variant_reference(rq, rk, rv, is_causal=True, alignment="bottom_right")
    ref_lse.sum().backward()
    torch.testing.assert_close(q.grad, rq.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(k.grad, rk.grad, rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(v.grad) == 0


def test_partials_merged_by_lse_give_the_whole_gradient():
    """Attention over two halves of the keys, merged by their lse (the rule a
    split or ring computation uses), differentiates to the gradient of
    attention over all the keys: the merge weights depend on lse."""
    torch.manual_seed(9)
    q, k, v = make_qkv((2, 4, 2, 20, 30, 8, 8), torch.float64, "cpu")
    dout = torch.randn(2, 4, 20, 8, dtype=torch.float64)

    def whole(q, k, v):
        return torch_oss.attention(q, k, v, enable_gqa=True)

    def merged(q, k, v):
        o1, l1 = torch_oss.attention_with_lse(q, k[:, :, :13], v[:, :, :13], enable_gqa=True)
        o2, l2 = torch_oss.attention_with_lse(q, k[:, :, 13:], v[:, :, 13:], enable_gqa=True)
        lse = torch.logaddexp(l1, l2)
        return torch.exp(l1 - lse).unsqueeze(-1) * o1 + torch.exp(l2 - lse).unsqueeze(-1) * o2

    grads = []
    for fn in (whole, merged):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        (fn(*leaves) * dout).sum().backward()
        grads.append([t.grad for t in leaves])
    for name, a, b in zip(("dq", "dk", "dv"), *grads):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-11, msg=name)


def test_varlen_lse_gradient():
    """attention_varlen's lse: each sequence's gradient as the dense call on
    that sequence alone gives it."""
    torch.manual_seed(13)
    lens = [5, 0, 9, 1]
    H, D = 2, 8
    total = sum(lens)
    q, k, v = (torch.randn(total, H, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    out_w = torch.randn(total, H, D, dtype=torch.float64)
    lse_w = torch.randn(H, total, dtype=torch.float64)
    out, lse = torch_oss.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    ((out * out_w).sum() + (lse.masked_fill(lse == float("-inf"), 0) * lse_w).sum()).backward()
    start = 0
    for n in lens:
        if n:
            rows = slice(start, start + n)
            leaves = [t.detach()[rows].transpose(0, 1).unsqueeze(0).requires_grad_() for t in (q, k, v)]
            o, l = torch_oss.attention_with_lse(*leaves, is_causal=True, causal_alignment="bottom_right")
            ((o[0].transpose(0, 1) * out_w[rows]).sum() + (l[0] * lse_w[:, rows]).sum()).backward()
            for leaf, packed in zip(leaves, (q, k, v)):
                torch.testing.assert_close(packed.grad[rows], leaf.grad[0].transpose(0, 1), rtol=1e-10, atol=1e-12)
        start += n


def test_compile_with_lse_in_the_loss():
    torch.manual_seed(17)
    q, k, v = make_qkv((1, 4, 2, 24, 40, 16, 16), torch.float32, "cpu")
    sinks = torch.randn(4)

    def f(q, k, v, sinks):
        out, lse = torch_oss.attention_with_lse(q, k, v, is_causal=True, enable_gqa=True, softcap=5.0, sinks=sinks)
        return out.square().sum() + lse.sum()

    compiled = torch.compile(f, fullgraph=True)
    grads = []
    for fn in (f, compiled):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_backward_op_checks_grad_lse():
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    out, lse = torch.ops.oss.attention(q, k, v)
    args = (torch.ones_like(out), q, k, v, out, lse, None, False, None, False, "top_left", False)
    with pytest.raises(ValueError, match="grad_lse has shape"):
        torch.ops.oss.attention_backward(*args, grad_lse=torch.ones(1, 2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="grad_lse has dtype"):
        torch.ops.oss.attention_backward(*args, grad_lse=torch.ones(1, 2, 5, dtype=torch.int32))


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_refuses_lse_gradient(device, dtype):
    """The CUDA kernels do not take lse's gradient: a loss that uses lse
    raises rather than getting out's share alone; one that uses out alone
    (lse detached or unused) runs as before."""
    q, k, v = (t.requires_grad_() for t in make_qkv((1, 2, 2, 16, 16, 64, 64), dtype, device))
    out, lse = torch_oss.attention_with_lse(q, k, v)
    with pytest.raises(NotImplementedError, match="gradient of lse"):
        (out.float().sum() + lse.sum()).backward(retain_graph=True)
    (out.float().sum() + lse.detach().sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
