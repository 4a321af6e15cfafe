"""Shared helpers for the torch_oss tests: devices, float64 references and the
tolerance rule.

Tolerance rule (FlashAttention's): max|ours - ref64| <= 2 * max|peer - ref64| + atol,
where ref64 is the computation in float64 and peer is PyTorch's own kernel on the
same-dtype inputs (its error measured against the same reference). NaN passes only
where the reference has NaN too; infinities must match exactly.

atol is per dtype (SOFTMAX_ATOL, ATTENTION_ATOL). For float32 it is derived from
the rule's own scale rather than fixed: FLOAT32_ATOL_ROUNDINGS roundings of the
largest reference value (a few float32 ulps of the output), far below
PyTorch's own error at any tested shape, so a float32 kernel must be about as
accurate as PyTorch's. For float16 and bfloat16 the rule is complemented by
assert_rounded_to_nearest: 16-bit outputs within one unit in the last place of
the float64 reference rounded to nearest, with no systematic bias.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_oss

BUILD = torch_oss.build_info()
CUDA_OK = torch.cuda.is_available() and BUILD["cuda"]
CUDA_SKIP_REASON = (
    "no CUDA GPU visible" if not torch.cuda.is_available() else "torch_oss was built without CUDA kernels"
)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason=CUDA_SKIP_REASON)]),
]
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

# None: derived from the reference's scale (float32; see the module docstring)
SOFTMAX_ATOL = {torch.float64: 1e-12, torch.float32: None, torch.float16: 1e-5, torch.bfloat16: 1e-4}
ATTENTION_ATOL = {torch.float64: 1e-10, torch.float32: None, torch.float16: 1e-4, torch.bfloat16: 1e-3}
FLOAT32_ATOL_ROUNDINGS = 4


def cuda_param(value, *extra_marks):
    return pytest.param(
        value, marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA_OK, reason=CUDA_SKIP_REASON), *extra_marks]
    )


def capture_cuda_graph(fn):
    """fn() captured in a CUDA graph after one warm-up call on a side stream
    (outside the capture, as CUDA graphs require): (graph, fn's outputs, which
    each replay rewrites)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def seeded(seed):
    torch.manual_seed(seed)


def awkward_randn(shape, dtype, device, scale=3.0, outliers=True):
    """randn * scale with a few large outliers, so softmax is far from flat.
    Never zeros; drawn fresh on every call."""
    x = torch.randn(shape, dtype=torch.float64) * scale
    if outliers and x.numel() > 4:
        idx = torch.randint(0, x.numel(), (max(1, x.numel() // 1000),))
        x.view(-1)[idx] += torch.randn(idx.shape, dtype=torch.float64).sign() * 20
    return x.to(dtype=dtype, device=device)


def derived_atol(dtype, ref64):
    """The float32 atol of the rule: FLOAT32_ATOL_ROUNDINGS roundings (eps) of
    the largest finite |ref64| (at least of 1e-30, so an all-zero reference
    still allows float32's underflow)."""
    ref = ref64.detach().to(torch.float64)
    finite = ref[torch.isfinite(ref)]
    scale = max(finite.abs().max().item() if finite.numel() else 0.0, 1e-30)
    return FLOAT32_ATOL_ROUNDINGS * torch.finfo(dtype).eps * scale


def assert_tolerance(name, ours, ref64, peer, atol, per_element_eps=False):
    """The tolerance rule; `peer` may be None when PyTorch has no same-dtype
    kernel to compare with (then the bound is atol alone). atol=None derives
    it from the reference (derived_atol). per_element_eps=True also allows each
    element one rounding of its own magnitude (eps * |ref64|), for checks whose
    peer has no error of its own to scale the bound with."""
    assert ours.shape == ref64.shape, f"{name}: shape {tuple(ours.shape)} != reference {tuple(ref64.shape)}"
    ours64 = ours.detach().to(torch.float64).cpu()
    ref = ref64.detach().to(torch.float64).cpu()
    ref_nan = torch.isnan(ref)
    ours_nan = torch.isnan(ours64)
    assert torch.equal(ours_nan, ref_nan), (
        f"{name}: NaN pattern differs from the reference ({int(ours_nan.sum())} NaN in ours, "
        f"{int(ref_nan.sum())} in the reference)"
    )
    # A finite reference beyond the dtype's range correctly rounds to inf.
    ref_rounded = ref.to(ours.dtype).to(torch.float64) if ours.dtype.is_floating_point else ref
    ref_inf = torch.isinf(ref_rounded)
    finite = ~(ref_nan | ref_inf)
    bound, atol, eps = _tolerance_bound(ours.dtype, ref, finite, peer, atol, per_element_eps)
    # A reference within its allowed error of the dtype's overflow threshold
    # (max + half an ulp, where rounding turns to inf) may come out on either
    # side of it, with the reference's sign; everywhere else infinities match.
    edge = torch.zeros_like(ref_inf)
    if ours.dtype.is_floating_point and ours.dtype != torch.float64 and bound is not None:
        fi = torch.finfo(ours.dtype)
        limit = fi.max + ulp(torch.tensor(fi.max, dtype=torch.float64), ours.dtype).item() / 2 \
            if ours.dtype in MANTISSA_BITS else fi.max
        edge = ~ref_nan & torch.isfinite(ref) & ((ref.abs() - limit).abs() <= bound + eps * ref.abs())
        edge_inf = edge & torch.isinf(ours64)
        assert torch.equal(torch.sign(ours64[edge_inf]), torch.sign(ref[edge_inf])), \
            f"{name}: an infinity of the wrong sign at the overflow threshold"
    assert torch.equal((torch.isinf(ours64) & ~ref_nan) & ~edge, ref_inf & ~edge) and torch.equal(
        ours64[ref_inf & ~edge], ref_rounded[ref_inf & ~edge]
    ), f"{name}: infinities differ from the reference"
    compared = ~ref_nan & torch.isfinite(ours64) & (finite | edge)
    if bound is None or not compared.any():
        return
    err = ((ours64[compared] - ref[compared]).abs() - eps * ref[compared].abs()).max().item()
    assert err <= bound, f"{name}: max error {err:.3e} exceeds bound {bound:.3e} (2 x PyTorch's error + {atol:.3g})"


def _tolerance_bound(dtype, ref, finite, peer, atol, per_element_eps):
    """(bound, atol, eps) of the tolerance rule over the elements `finite`
    (float64 ref, the peer's output or None): bound = atol + 2 x the peer's
    largest error; eps the per-element rounding allowed (0 unless
    per_element_eps). bound is None where no element is finite."""
    eps = torch.finfo(dtype).eps if (per_element_eps and dtype.is_floating_point) else 0.0
    if not finite.any():
        return None, atol, eps
    if atol is None:
        atol = derived_atol(dtype, ref[finite])
    elif dtype == torch.float64:
        # float64's fixed atol, but never below the roundings float32's is made of
        atol = max(atol, derived_atol(torch.float64, ref[finite]))
    bound = atol
    if peer is not None:
        peer64 = peer.detach().to(torch.float64).cpu()
        peer_finite = finite & torch.isfinite(peer64)
        if peer_finite.any():
            bound += 2 * (peer64[peer_finite] - ref[peer_finite]).abs().max().item()
    return bound, atol, eps


MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}


def ulp(values, dtype):
    """The unit in the last place of `dtype` (float16/bfloat16) at each of
    `values` (float64): the spacing of the binade holding |value|, and the
    subnormal spacing below the smallest normal."""
    fi = torch.finfo(dtype)
    v = values.abs().clamp(min=fi.smallest_normal)
    return torch.exp2(torch.floor(torch.log2(v)) - MANTISSA_BITS[dtype])


def assert_rounded_to_nearest(name, ours, ref64, own_error=None, min_count=2000, max_bias=0.05):
    """A float16/bfloat16 output must be the float64 reference rounded to
    nearest, up to the kernel's own float32 arithmetic: every element within
    one unit in the last place of ref64.to(dtype), and no systematic bias: the
    mean signed error in ulps is near zero, and so is the mean error towards
    zero (a kernel that truncates is off by about -0.5 ulp towards zero on
    average, one that rounds up by +0.5). `own_error` (float64, like ref64)
    bounds the error of the kernel's float32 arithmetic before the final
    rounding (where an element is a sum that cancels, it is far above that
    element's rounding): elements where it reaches a quarter of their 16-bit
    ulp are left out of both checks. The bias is judged over at least
    `min_count` elements."""
    dtype = ours.dtype
    assert dtype in MANTISSA_BITS, f"{name}: {dtype} is not a 16-bit float"
    got = ours.detach().cpu().to(torch.float64).reshape(-1)
    ref = ref64.detach().cpu().to(torch.float64).reshape(-1)
    rounded = ref.to(dtype).to(torch.float64)
    keep = torch.isfinite(ref) & torch.isfinite(rounded)
    unit = ulp(rounded, dtype)
    if own_error is not None:
        keep &= own_error.detach().cpu().to(torch.float64).reshape(-1) < unit / 4
    n = int(keep.sum())
    assert n >= min_count, f"{name}: only {n} elements to judge the rounding by (need {min_count})"
    off = ((got - rounded).abs() / unit)[keep]
    worst = off.max().item()
    assert worst <= 1, f"{name}: an element is {worst:.2f} ulp from the float64 reference rounded to nearest"
    signed = ((got - ref) / unit)[keep]
    bias = signed.mean().item()
    towards_zero = (signed * -torch.sign(ref[keep])).mean().item()
    assert abs(bias) <= max_bias and abs(towards_zero) <= max_bias, (
        f"{name}: rounding is biased: mean signed error {bias:+.3f} ulp, mean error towards zero "
        f"{towards_zero:+.3f} ulp over {n} elements (round to nearest gives ~0)")


def poison_(t):
    """Fill with NaN so unwritten output elements cannot pass a check."""
    return t.fill_(float("nan"))


# ---------------------------------------------------------------------------
# Attention reference
# ---------------------------------------------------------------------------


def visible_mask(Lq, Lk, is_causal, alignment, attn_mask, device):
    """Boolean (.., Lq, Lk) mask of the keys each query may see from the causal
    rule and a boolean mask (None when everything is visible)."""
    vis = None
    if is_causal:
        offset = 0 if alignment == "top_left" else Lk - Lq
        i = torch.arange(Lq, device=device)[:, None]
        j = torch.arange(Lk, device=device)[None, :]
        vis = j <= i + offset
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        vis = attn_mask if vis is None else (vis & attn_mask)
    return vis


def attention_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                        alignment="top_left", compute_dtype=torch.float64):
    """Attention in `compute_dtype` with torch_oss's semantics (masks combine
    with the causal rule; a row that sees no key gives 0 output and -inf lse).
    Differentiable; returns (out, lse) in compute_dtype."""
    q, k, v = (t.to(compute_dtype) for t in (q, k, v))
    Hq, Hkv = q.shape[-3], k.shape[-3]
    if Hq != Hkv:
        k = k.repeat_interleave(Hq // Hkv, dim=-3)
        v = v.repeat_interleave(Hq // Hkv, dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        s = s + attn_mask.to(compute_dtype)
    vis = visible_mask(q.shape[-2], k.shape[-2], is_causal, alignment, attn_mask, q.device)
    if vis is not None:
        s = s.masked_fill(~vis, float("-inf"))
    empty = (s == float("-inf")).all(-1, keepdim=True)
    s = s.masked_fill(empty, 0.0)
    p = torch.softmax(s, -1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, -1).masked_fill(empty.squeeze(-1), float("-inf"))
    return p @ v, lse


def _causal_and_mask(q, k, attn_mask, is_causal, alignment):
    """The causal rule folded into an explicit SDPA mask (bool, or additive in q's dtype)."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    mask = attn_mask
    vis = visible_mask(Lq, Lk, is_causal, alignment, attn_mask if (mask is not None and mask.dtype == torch.bool)
                       else None, q.device)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
        if vis is not None:
            mask = mask.masked_fill(~vis, float("-inf"))
    elif vis is not None:
        mask = vis
    return mask


def _pad_last(t, multiple):
    pad = -t.shape[-1] % multiple
    return F.pad(t, (0, pad)) if pad else t


def _fused_half_inputs(q, k, v):
    """True for CUDA float16/bfloat16 inputs: PyTorch's fused SDPA kernels are
    the same-dtype peer there. Its math backend computes half inputs in
    float32, which no fused kernel (FlashAttention, cuDNN, torch_oss) matches,
    so the peer is a fused kernel on inputs whose head dims are zero-padded to
    a multiple of 8 (the padding changes no score and no output column)."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.numel() > 0 and k.numel() > 0


def _fused_peer_inputs(q, k, v, scale):
    """Fresh contiguous copies of q, k, v with the kv heads repeated and the
    head dims zero-padded to a multiple of 8 (all differentiable), and the scale
    made explicit and non-negative (a negative one moves onto q, exactly:
    PyTorch's FlashAttention and cuDNN backends return NaN for scale=-0.3 in
    float16 on the H100, torch 2.11, where the memory-efficient one is right; a
    long-profile fuzz case's peer dq was all NaN; docs/reliability.md). The
    fused kernels refuse stride-0 and other unusual layouts,
    most refuse GQA and odd head dims, and none of that changes the math.
    3-D inputs (heads, L, D) get a leading batch dim of 1: the fused kernels
    take 4-D inputs only, and without it SDPA fell back to its math backend,
    a float32 computation, contrary to the rule above (a long-profile fuzz
    case with 3-D bf16 inputs failed against it; docs/reliability.md).
    Copies, not .contiguous(): a contiguous view at a misaligned storage offset
    stays misaligned, and aten._scaled_dot_product_efficient_attention (called
    directly by lse_peer, past SDPA's checks) then reads it with 16-byte loads
    and faults (found by compute-sanitizer on the fuzz tests)."""
    if q.dim() == 3:
        q, k, v = (t.unsqueeze(0) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if scale < 0:
        q, scale = -q, -scale
    group = q.shape[-3] // k.shape[-3]
    kr, vr = (t.repeat_interleave(group, dim=-3) if group > 1 else t for t in (k, v))
    qp, kp, vp = (_pad_last(t.clone(memory_format=torch.contiguous_format), 8) for t in (q, kr, vr))
    return qp, kp, vp, scale


def _fused_peer_mask(mask, shape):
    """The mask materialised at its full shape (same dtype and values), each
    row 16-element aligned (padded, then sliced). PyTorch's memory-efficient
    kernel reads the mask with 16-byte loads and, given some broadcast or
    transposed masks, picks its aligned variant anyway and faults with a
    misaligned read (found with compute-sanitizer on the attention fuzz tests);
    the math is unchanged by the copy."""
    Lk = shape[-1]
    out = torch.zeros((*shape[:-1], Lk + (-Lk % 16)), dtype=mask.dtype, device=mask.device)[..., :Lk]
    out.copy_(mask.expand(shape))
    return out


def sdpa_peer(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, alignment="top_left"):
    """PyTorch's SDPA on the same-dtype inputs, the causal rule folded into an
    explicit mask so every alignment and mask combination is expressible.
    Rows that see no key are set to 0 (as torch_oss defines them)."""
    mask = _causal_and_mask(q, k, attn_mask, is_causal, alignment)
    kw = {"enable_gqa": True} if q.shape[-3] != k.shape[-3] else {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if q.shape[0] == 0 and q.is_cuda:
        # SDPA's flash and cuDNN backends reject an empty batch
        # (pytorch/pytorch#133780); the math backend returns the empty result
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **kw)
    if _fused_half_inputs(q, k, v):
        qp, kp, vp, scale_ = _fused_peer_inputs(q, k, v, scale)
        mp = None if mask is None else _fused_peer_mask(mask, (*qp.shape[:-1], k.shape[-2]))
        # With a mask: the memory-efficient kernel first (flash takes no mask, and
        # cuDNN, which SDPA prefers on Hopper, builds a graph per shape: seconds
        # per test case); without one, whichever fused kernel SDPA picks.
        # A kernel that returns NaN or inf for finite inputs is no peer (with
        # scale=0 PyTorch's FlashAttention returns NaN in float16 on the H100,
        # torch 2.11: its masked padding keys become -inf * 0): the next one is
        # tried, so the bound never silently shrinks to atol alone.
        choices = ([[SDPBackend.EFFICIENT_ATTENTION], [SDPBackend.CUDNN_ATTENTION]] if mp is not None else
                   [[SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION],
                    [SDPBackend.EFFICIENT_ATTENTION]])
        finite_inputs = all(bool(torch.isfinite(t).all()) for t in (q, k, v)) and (
            mask is None or mask.dtype == torch.bool or not bool(torch.isnan(mask).any()))
        for backends in choices:
            try:
                with sdpa_kernel(backends):
                    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mp, scale=scale_)[..., :v.shape[-1]]
                out = out.reshape(*q.shape[:-1], v.shape[-1])  # drops the batch dim added to 3-D inputs
                out = _zero_dead_rows(out, mask, k.shape[-2])
                if not finite_inputs or bool(torch.isfinite(out).all()):
                    return out
            except RuntimeError:
                pass  # not taken by these backends: the next, then the default choice below
    if q.is_cuda:
        # fresh copies here too: PyTorch's float32 memory-efficient kernel reads
        # views at a misaligned storage offset with 16-byte loads and faults
        # ("misaligned address", found by the long fuzz profile on the H100)
        # The mask at its full shape: one broadcast over the key dim (stride 0)
        # makes the memory-efficient kernel refuse it ("(*bias): last dimension
        # must be contiguous", found by the long fuzz profile with a (2, 1, 1)
        # float32 mask on the H100).
        q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
        if mask is not None:
            mask = _fused_peer_mask(mask, (*q.shape[:-1], k.shape[-2]))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **kw)
    return _zero_dead_rows(out, mask, k.shape[-2])


def _zero_dead_rows(out, mask, Lk):
    """out with the rows that see no key set to 0, as torch_oss defines them
    (SDPA gives NaN there). Only those rows: a NaN elsewhere is the peer's own
    failure and stays, so that the tolerance rule drops it from the bound
    rather than counting the peer as off by the whole output (replacing every
    NaN by 0 once hid a broken peer; docs/reliability.md)."""
    if Lk == 0:
        return torch.zeros_like(out)
    if mask is None:
        return out
    dead = ~mask.any(-1) if mask.dtype == torch.bool else (mask == float("-inf")).all(-1)
    return torch.where(dead.unsqueeze(-1), torch.zeros((), dtype=out.dtype, device=out.device), out)


def lse_peer(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, alignment="top_left"):
    """The same-dtype peer of the log-sum-exp. SDPA does not return it; for CUDA
    half inputs PyTorch's memory-efficient kernel computes it
    (aten._scaled_dot_product_efficient_attention); elsewhere, and where that
    kernel does not take the inputs, a float32 computation."""
    if _fused_half_inputs(q, k, v):
        with torch.no_grad():
            try:
                Lq, Lk = q.shape[-2], k.shape[-2]
                qp, kp, vp, scale_ = _fused_peer_inputs(q, k, v, scale)
                mask = _causal_and_mask(q, k, attn_mask, is_causal, alignment)
                bias = None
                if mask is not None:
                    if mask.dtype == torch.bool:
                        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
                    bias = _fused_peer_mask(mask, (*qp.shape[:-1], Lk))
                lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                    qp, kp, vp, bias, True, 0.0, False, scale=scale_)[1][..., :Lq]
                if q.dim() == 3:
                    lse = lse.squeeze(0)
                if lse.shape == q.shape[:-1]:
                    return lse.float()
            except RuntimeError:
                pass
    return attention_reference(q.detach(), k.detach(), v.detach(), attn_mask, is_causal, scale, enable_gqa, alignment,
                               compute_dtype=torch.float32)[1]


def nvcc_path():
    """nvcc of the CUDA toolkit torch builds extensions with
    (torch.utils.cpp_extension.CUDA_HOME/bin/nvcc), or None without one. The
    ptxas tests use it rather than whatever nvcc is first on PATH: the build
    and the tests must see the same toolkit."""
    import os

    from torch.utils.cpp_extension import CUDA_HOME

    if not CUDA_HOME:
        return None
    path = os.path.join(CUDA_HOME, "bin", "nvcc")
    return path if os.access(path, os.X_OK) else None


NVCC_SKIP = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc (torch.utils.cpp_extension.CUDA_HOME/bin/nvcc)")


def ptxas_report(source, tmp_path, *include_dirs):
    """ptxas -v's messages for `source` (CUDA text) compiled for sm_90a with
    setup.py's flags (needs nvcc, not a GPU): the register and stack report
    of every kernel it instantiates, and ptxas's performance warnings."""
    import subprocess

    src = tmp_path / "ptxas_probe.cu"
    src.write_text(source)
    cmd = [nvcc_path(), "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-DOSS_WITH_CUDA",
           "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
           "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "-lineinfo", "-Xptxas", "-v",
           *(f"-I{d}" for d in include_dirs), "-cubin", str(src), "-o", str(tmp_path / "ptxas_probe.cubin")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr
