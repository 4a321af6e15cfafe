"""The gradient of attention's lse.

d lse_i / d s_ij = P_ij (and d lse_i / d sink = p_sink), so a loss that uses
lse as well as out (partial attentions merged by their lse, a penalty on lse)
gets lse's share in dq, dk and d sinks: the backward takes D - dlse for D
(oss.h dlse), in every kernel's row statistics pass; dQ's centring is off
with it (dS's rows no longer sum to 0).
"""

import pytest
import torch
from _util import ATTENTION_ATOL, DEVICES, assert_tolerance
from test_variants import fa_style_peer, make_qkv, variant_reference

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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradcheck_through_out_and_lse(device, variant):
    """Numerical gradients of q, k, v (and the sinks) of a function of both
    outputs. The sinks are float32 values and the step 2^-12 keeps sink +-
    step exact in float32 (the kernels hold sinks in float32)."""
    torch.manual_seed(3)
    q, k, v = (t.requires_grad_() for t in make_qkv((2, 2, 1, 5, 7, 4, 4), torch.float64, device))
    kw = call_kwargs(VARIANTS[variant], 2, device)
    sinks = kw.pop("sinks", None)

    def f(q, k, v, *maybe_sinks):
        return torch_oss.attention_with_lse(q, k, v, enable_gqa=True, sinks=maybe_sinks[0] if maybe_sinks else None,
                                            **kw)

    inputs = (q, k, v) + ((sinks,) if sinks is not None else ())
    assert torch.autograd.gradcheck(f, inputs, eps=2 ** -12, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gradients_match_float64(device, dtype, variant):
    """loss = <out, w> + <lse, u>: dq, dk, dv and d sinks against the float64
    reference's autograd, by the tolerance rule. PyTorch has no kernel with
    lse's gradient, so the peer for bfloat16 is built here: on the CPU the
    same autograd in float32, rounded to bfloat16; on CUDA the FA-style
    computation, whose roundings the CUDA kernels share. float32's bound
    derives from the reference."""
    torch.manual_seed(5)
    shape = (2, 4, 2, 37, 53, 16, 16)
    q, k, v = make_qkv(shape, dtype, device)
    kw = call_kwargs(VARIANTS[variant], 4, device, torch.float32)
    # the weights exact in the dtypes the backward takes out's and lse's gradients in
    out_w = torch.randn(2, 4, 37, 16, dtype=dtype, device=device).double()
    lse_w = torch.randn(2, 4, 37, dtype=torch.float32, device=device).double()

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
    ours = [t.grad for t in leaves] + ([sinks.grad] if sinks is not None else [])
    if dtype == torch.float32:
        for name, got, want in zip(("dq", "dk", "dv", "dsinks"), ours, ref):
            assert_tolerance(f"{variant} {dtype} {name}", got, want, None, None if name == "dsinks" else
                             ATTENTION_ATOL[dtype])
        return
    if device == "cpu":  # the CPU kernels' 16-bit path computes in float32 throughout
        peer = [g.to(dtype) for g in reference_grads(torch.float32)]
    else:  # the CUDA kernels round P, out and dS to 16 bits, D comes from the rounded out
        peer_sinks = None if sinks is None else sinks.detach()
        peer = list(fa_style_peer(q, k, v, out_w.to(dtype), sinks=peer_sinks, dlse=lse_w.float(),
                                  **reference_kwargs(kw))[2:])
    for name, got, want, other in zip(("dq", "dk", "dv"), ours, ref, peer):
        assert_tolerance(f"{variant} {dtype} {name}", got, want, other, ATTENTION_ATOL[dtype])
    if sinks is not None:
        # d sinks sums p_sink (D - dlse) over the rows, each D carrying the 16-bit output's
        # rounding: judged in the inputs' dtype, one rounding of each element's magnitude
        # allowed (docs/testing.md), as for the sinks without lse's gradient.
        assert_tolerance(f"{variant} {dtype} dsinks", ours[3].to(dtype), ref[3], peer[3].to(dtype),
                         ATTENTION_ATOL[dtype], per_element_eps=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_tensor_core_shapes(device, head_dim, is_causal, deterministic):
    """bfloat16 at head dims the tensor-core backward kernels serve, with
    several query and key blocks and GQA (dQ's centring is off with lse's
    gradient), in both backward modes."""
    torch.manual_seed(head_dim + is_causal)
    q, k, v = make_qkv((1, 4, 2, 200, 333, head_dim, head_dim), torch.bfloat16, device)
    out_w = torch.randn(1, 4, 200, head_dim, dtype=torch.bfloat16, device=device).double()
    lse_w = torch.randn(1, 4, 200, dtype=torch.float32, device=device).double()
    kw = dict(is_causal=is_causal, causal_alignment="bottom_right")

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = torch_oss.attention_with_lse(*leaves, enable_gqa=True, deterministic=deterministic, **kw)
    ((out.double() * out_w).sum() + (lse.double() * lse_w).sum()).backward()

    def reference_grads(compute_dtype):
        ref_leaves = [t.detach().to(compute_dtype).requires_grad_() for t in (q, k, v)]
        ref_out, ref_lse = variant_reference(*ref_leaves, compute_dtype=compute_dtype, **reference_kwargs(kw))
        ((ref_out * out_w.to(compute_dtype)).sum() + (ref_lse * lse_w.to(compute_dtype)).sum()).backward()
        return [t.grad for t in ref_leaves]

    ref, peer = reference_grads(torch.float64), [g.to(torch.bfloat16) for g in reference_grads(torch.float32)]
    for name, got, want, other in zip(("dq", "dk", "dv"), [t.grad for t in leaves], ref, peer):
        assert_tolerance(f"hd {head_dim} causal {is_causal} {name}", got, want, other, ATTENTION_ATOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
def test_lse_alone_feeds_the_loss(device):
    """A loss of lse only: out's gradient is absent and lse's still reaches
    q and k (v gets none: lse does not depend on it)."""
    torch.manual_seed(7)
    q, k, v = (t.requires_grad_() for t in make_qkv((1, 2, 2, 6, 9, 8, 8), torch.float64, device))
    _, lse = torch_oss.attention_with_lse(q, k, v, is_causal=True, causal_alignment="bottom_right")
    lse.sum().backward()
    rq, rk, rv = (t.detach().requires_grad_() for t in (q, k, v))
    _, ref_lse = variant_reference(rq, rk, rv, is_causal=True, alignment="bottom_right")
    ref_lse.sum().backward()
    torch.testing.assert_close(q.grad, rq.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(k.grad, rk.grad, rtol=1e-10, atol=1e-12)
    assert torch.count_nonzero(v.grad) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_partials_merged_by_lse_give_the_whole_gradient(device):
    """Attention over two halves of the keys, merged by their lse (the rule a
    split or ring computation uses), differentiates to the gradient of
    attention over all the keys: the merge weights depend on lse."""
    torch.manual_seed(9)
    q, k, v = make_qkv((2, 4, 2, 20, 30, 8, 8), torch.float64, device)
    dout = torch.randn(2, 4, 20, 8, dtype=torch.float64, device=device)

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


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_lse_gradient_bfloat16(device):
    """attention_varlen's lse gradient in bfloat16 with GQA, sequences of
    several query and key blocks and empty ones (the packed row passes):
    against the float64 reference per sequence, the float32 one as the peer."""
    torch.manual_seed(19)
    lens_q, lens_k = [5, 0, 130, 1, 77], [9, 4, 200, 0, 77]
    Hq, Hkv, D = 4, 2, 64
    cu_q, cu_k = (torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=torch.int32, device=device)
                  for n in (lens_q, lens_k))
    q = torch.randn(sum(lens_q), Hq, D, dtype=torch.bfloat16, device=device)
    k, v = (torch.randn(sum(lens_k), Hkv, D, dtype=torch.bfloat16, device=device) for _ in range(2))
    out_w = torch.randn(sum(lens_q), Hq, D, dtype=torch.bfloat16, device=device).double()
    lse_w = torch.randn(Hq, sum(lens_q), dtype=torch.float32, device=device).double()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = torch_oss.attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                          return_lse=True)
    ((out.double() * out_w).sum() + (lse.double().nan_to_num(neginf=0.0) * lse_w).sum()).backward()

    def reference_grads(compute_dtype):
        grads = [torch.zeros(t.shape, dtype=compute_dtype, device=device) for t in (q, k, v)]
        sq = sk = 0
        for nq, nk in zip(lens_q, lens_k):
            rq, rk = slice(sq, sq + nq), slice(sk, sk + nk)
            if nq and nk:
                seq = [t[r].transpose(0, 1).unsqueeze(0).to(compute_dtype).requires_grad_() for t, r in
                       ((q, rq), (k, rk), (v, rk))]
                o, l = variant_reference(*seq, is_causal=True, alignment="bottom_right", compute_dtype=compute_dtype)
                ((o[0].transpose(0, 1) * out_w[rq].to(compute_dtype)).sum() +
                 (l[0] * lse_w[:, rq].to(compute_dtype)).sum()).backward()
                for g, leaf, r in zip(grads, seq, (rq, rk, rk)):
                    g[r] = leaf.grad[0].transpose(0, 1)
            sq, sk = sq + nq, sk + nk
        return grads

    ref, peer = reference_grads(torch.float64), [g.to(torch.bfloat16) for g in reference_grads(torch.float32)]
    for name, got, want, other in zip(("dq", "dk", "dv"), [t.grad for t in leaves], ref, peer):
        assert_tolerance(f"varlen {name}", got, want, other, ATTENTION_ATOL[torch.bfloat16])


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
