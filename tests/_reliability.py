"""Helpers shared by the reliability tests (test_extremes, test_fuzz,
test_determinism, test_concurrency, test_large): full forward + backward
checks of softmax and attention against the float64 references of _util.py by
the tolerance rule (tests/_util.py), bitwise comparison and small utilities.

Every check takes the *leaf* tensors and a view function, so that strided,
sliced, transposed and broadcast (stride-0) inputs are checked the same way as
contiguous ones. Gradients are compared on the views, i.e. the gradients the op
returns, not on the leaves: for a broadcast view the leaf's gradient is
PyTorch's own sum of the op's gradient rows, rounded once more to the dtype,
and the 2x rule applied after that sum fails at random between equally accurate
kernels: for a float16 (169, 230) query broadcast from one row, two roundings of
equal accuracy fail it against each other in 41 of 4000 comparisons on the
leaf's gradient and in none on the rows (in a float64 emulation of both roundings; the
long fuzz profile hit such a case on the H100).
"""

import torch
import torch.nn.functional as F
from _util import ATTENTION_ATOL, SOFTMAX_ATOL, assert_tolerance, attention_reference, lse_peer, sdpa_peer

import torch_oss

SOFTMAX_OPS = {
    "softmax": (torch_oss.softmax, F.softmax),
    "log_softmax": (torch_oss.log_softmax, F.log_softmax),
}


def dtype_id(dtype):
    """Readable test ids: float16 rather than dtype1."""
    return str(dtype).replace("torch.", "")


def identity(t):
    return t


def looser_atol(table, *dtypes):
    """The atol of the coarsest of `dtypes` (None: float32's, derived from the reference)."""
    return table[max(dtypes, key=lambda d: torch.finfo(d).eps)]


def view_with_grad(view_fn, leaf):
    """view_fn(leaf), keeping its gradient (the op's own) when it is not the leaf."""
    t = view_fn(leaf)
    if t.requires_grad and not t.is_leaf:
        t.retain_grad()
    return t


def representable(ref64, dtype):
    """The float64 reference as the output dtype can hold it: where rounding
    the exact result to `dtype` overflows (a log-probability of -131008 in
    float16, say) the correct stored answer is that infinity; elsewhere the
    reference stays exact."""
    if dtype == torch.float64:
        return ref64
    rounded = ref64.to(dtype)
    overflow = torch.isinf(rounded) & torch.isfinite(ref64)
    return torch.where(overflow, rounded.to(torch.float64), ref64)


def bits(t):
    """An integer view of t's bits, so equality is bitwise (NaN == NaN, -0 != +0)."""
    t = t.detach().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def assert_bitwise_equal(name, a, b):
    assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    if not torch.equal(bits(a), bits(b)):
        diff = (bits(a) != bits(b)).sum().item()
        raise AssertionError(f"{name}: {diff} of {a.numel()} elements differ bitwise")


# ---------------------------------------------------------------------------
# softmax
# ---------------------------------------------------------------------------


def _randn(shape, dtype, device, seed):
    g = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=torch.float64, generator=g).to(dtype=dtype, device=device)


def check_softmax(op_name, base, view_fn, dim, dtype=None, grad=True, label="", seed=None, check_values=True,
                  grad_output=None, per_element_eps=False):
    """torch_oss.{op_name}(view_fn(base), dim, dtype=dtype) and its gradient
    with respect to `base` against float64 (tolerance rule, PyTorch's same-dtype
    kernel as the peer). The upstream gradient is drawn from `seed` (from
    torch's global generator when None). per_element_eps: the gradient may also
    carry one rounding of each element's own magnitude (assert_tolerance).
    Returns ours (forward)."""
    ours_fn, torch_fn = SOFTMAX_OPS[op_name]
    out_dtype = base.dtype if dtype is None else dtype
    leaves = {name: base.detach().clone().requires_grad_(grad) for name in ("ours", "peer")}
    # the reference sees the input exactly as the kernel computes on it: cast to
    # out_dtype first (dtype= means "cast, then compute"), then widened. For
    # float64 on CUDA the peer would be the very computation of the reference
    # (an error of 0, and a bound of atol alone, tighter than float64 sums of
    # 1000 terms in another order): that reference runs on the CPU, as in
    # check_attention, so the peer's error is its real float64 rounding.
    ref_device = "cpu" if out_dtype == torch.float64 and base.is_cuda else base.device
    leaves["ref"] = base.detach().to(out_dtype).to(device=ref_device, dtype=torch.float64).requires_grad_(grad)
    views = {name: view_with_grad(view_fn, leaf) for name, leaf in leaves.items()}
    ours = ours_fn(views["ours"], dim, dtype=dtype)
    peer = torch_fn(views["peer"], dim, dtype=dtype)
    ref = torch_fn(views["ref"], dim)
    assert ours.dtype == out_dtype and ours.shape == peer.shape and ours.device == base.device, (
        f"{label}: got {ours.dtype} {tuple(ours.shape)} on {ours.device}")
    atol = SOFTMAX_ATOL[out_dtype]
    if check_values:
        assert_tolerance(f"{op_name} fwd {label}", ours, representable(ref.detach(), out_dtype), peer, atol)
    if grad and ours.numel() > 0:
        g = _randn(ours.shape, out_dtype, base.device, seed) if grad_output is None else grad_output.to(out_dtype)
        ours.backward(g)
        peer.backward(g)
        ref.backward(g.to(device=ref_device, dtype=torch.float64))
        got = views["ours"].grad
        assert got.dtype == base.dtype, f"{label}: gradient dtype {got.dtype} != input dtype {base.dtype}"
        # with a dtype= cast the gradient carries the precision of the coarser of
        # the two dtypes (the saved output is rounded to out_dtype): judge it there.
        # Rounding a finer gradient to that dtype for the comparison is the test's
        # own rounding, not the kernel's: then each element may also be off by one
        # rounding of its magnitude
        coarse = max((base.dtype, out_dtype), key=lambda d: torch.finfo(d).eps)
        assert_tolerance(f"{op_name} grad {label}", got.to(coarse), representable(views["ref"].grad, coarse),
                         views["peer"].grad.to(coarse), looser_atol(SOFTMAX_ATOL, out_dtype, base.dtype),
                         per_element_eps=per_element_eps or coarse != base.dtype)
    return ours.detach()


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def check_attention(bases, views=(identity, identity, identity), mask=None, is_causal=False, alignment="top_left",
                    scale=None, grad=True, label="", lse_rows=None, seed=None, check_values=True,
                    per_element_eps=False):
    """torch_oss.attention_with_lse on views[i](bases[i]) against the float64
    reference: out and lse, then dq, dk, dv of the views (the op's own
    gradients; see the module docstring). Returns (out, lse). lse_rows (a
    boolean (.., Lq) selection) limits the lse check to those rows. The
    upstream gradient is drawn from `seed` (torch's global generator when
    None); check_values=False checks the gradients only; per_element_eps: the
    gradients may also carry one rounding of each element's own magnitude."""
    q0, k0, v0 = views[0](bases[0]), views[1](bases[1]), views[2](bases[2])
    gqa = q0.dim() == 4 and q0.shape[-3] != k0.shape[-3]
    dtype, device = bases[0].dtype, bases[0].device
    kw = dict(attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=gqa, causal_alignment=alignment)
    leaves = {}
    for name in ("ours", "peer", "ref"):
        ldtype = torch.float64 if name == "ref" else dtype
        leaves[name] = [b.detach().to(ldtype).requires_grad_(grad) for b in bases]
    if dtype == torch.float64 and device.type == "cuda":
        # For float64 on CUDA the peer (SDPA's math backend) is the very
        # computation of attention_reference, so their difference would be 0
        # and the rule would degenerate to atol alone; the reference runs on the
        # CPU instead, so the peer's error is its real float64 rounding.
        leaves["ref"] = [b.detach().cpu().requires_grad_(grad) for b in bases]
    qkv = {name: [view_with_grad(f, t) for f, t in zip(views, leaves[name])] for name in leaves}
    out, lse = torch_oss.attention_with_lse(*qkv["ours"], **kw)
    ref_mask = mask.cpu() if (mask is not None and qkv["ref"][0].device != device) else mask
    ref_out, ref_lse = attention_reference(*qkv["ref"], ref_mask, is_causal, scale, gqa, alignment)
    peer_lse = lse_peer(*(t.detach() for t in qkv["peer"]), mask, is_causal, scale, gqa, alignment)
    # SDPA takes masks of at least 2 dims; torch_oss also takes 0-D and 1-D ones (broadcast)
    peer_mask = mask if mask is None or mask.dim() >= 2 else mask.expand(q0.shape[-2], k0.shape[-2])
    peer_out = sdpa_peer(*qkv["peer"], peer_mask, is_causal, scale, gqa, alignment)
    atol = ATTENTION_ATOL[dtype]
    assert out.dtype == dtype and out.device == device, f"{label}: out is {out.dtype} on {out.device}"
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), f"{label}: lse {lse.dtype}"
    assert lse.shape == ref_lse.shape, f"{label}: lse shape {tuple(lse.shape)} != {tuple(ref_lse.shape)}"
    if check_values:
        assert_tolerance(f"out {label}", out, representable(ref_out.detach(), dtype), peer_out, atol)
        if lse_rows is None:
            assert_tolerance(f"lse {label}", lse, ref_lse.detach(), peer_lse, atol)
        else:
            assert_tolerance(f"lse {label}", lse[lse_rows], ref_lse.detach()[lse_rows.to(ref_lse.device)],
                             peer_lse[lse_rows], atol)
    if grad:
        dout = _randn(out.shape, dtype, device, seed)
        out.backward(dout)
        if peer_out.requires_grad:
            peer_out.backward(dout)
        if ref_out.requires_grad:
            ref_out.backward(dout.to(device=ref_out.device, dtype=torch.float64))
        for i, name in enumerate(("dq", "dk", "dv")):
            got = qkv["ours"][i].grad
            ref_grad = qkv["ref"][i].grad
            peer_grad = qkv["peer"][i].grad
            if out.numel() == 0:  # empty problem: no path from the output, no gradient
                ref_grad = torch.zeros_like(qkv["ref"][i]) if ref_grad is None else ref_grad
                got = torch.zeros_like(qkv["ours"][i]) if got is None else got
            assert got is not None and ref_grad is not None, f"{name} {label}: no gradient reached the view"
            assert got.dtype == dtype and got.shape == qkv["ours"][i].shape, f"{name} {label}: {got.dtype} {got.shape}"
            assert_tolerance(f"{name} {label}", got, representable(ref_grad, dtype), peer_grad, atol,
                             per_element_eps=per_element_eps)
    return out.detach(), lse.detach()


def free_cuda():
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
