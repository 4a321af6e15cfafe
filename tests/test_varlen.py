"""torch_oss.attention_varlen (packed variable-length batches, FlashAttention's
flash_attn_varlen_func layout): out, lse, dq, dk, dv and d sinks against a
float64 reference computed sequence by sequence, by the tolerance rule
(docs/testing.md) twice: with PyTorch's peer (SDPA per sequence, or for the
score variants their definition in float32 as in test_variants.py), and with
a per-sequence loop of torch_oss.attention as the peer (the packed call is as
accurate as the padded-free loop of ordinary calls). Over dtypes, head dims
(64, 128, an awkward one, Dv != D), GQA 4/2 and 4/4, mixed lengths (empty
sequences, length 1, across tiles), q lengths != k lengths, both causal
alignments and none, strided views (a packed QKV tensor); each score variant;
dropout against the float64 reference given the mask the kernels draw (the
rule of test_dropout.py, batch index = sequence index), the mask recovered
exactly from the outputs; the lse layout; the argument and value checks;
second derivatives against a loop over the sequences (dropout refused); opcheck,
torch.compile and CUDA-graph capture."""

import itertools
import zlib

import pytest
import torch
from _util import (ATTENTION_ATOL, DEVICES, FLOAT_DTYPES, assert_tolerance, capture_cuda_graph, cuda_param,
                   lse_peer, sdpa_peer)
from test_dropout import dropout_factor, seeded_call
from test_variants import draw_variants, fa_style_peer, variant_reference
from torch.utils._python_dispatch import TorchDispatchMode

import torch_oss
from torch_oss._kernels import attention_kernels

HALF = (torch.float16, torch.bfloat16)
CAUSAL = [(False, "bottom_right"), (True, "top_left"), (True, "bottom_right")]
CAUSAL_IDS = ["none", "causal-tl", "causal-br"]


# ---------------------------------------------------------------------------
# Packed inputs and the per-sequence computations
# ---------------------------------------------------------------------------


def cumulative(lengths, device, dtype=torch.int32):
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=dtype, device=device)


def make_packed(lens_q, lens_k, Hq, Hkv, D, Dv, dtype, device, layout="contiguous"):
    """q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), the
    cumulative lengths (int32) and the max lengths. layout "strided": rows
    longer than the head dim (views of wider tensors); "qkvpacked": q, k and v
    are views of one (total, Hq + 2 Hkv, D) tensor (needs lens_q == lens_k
    and D == Dv)."""
    tq, tk = sum(lens_q), sum(lens_k)

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype=dtype, device=device)

    if layout == "qkvpacked":
        assert list(lens_q) == list(lens_k) and D == Dv
        qkv = randn(tq, Hq + 2 * Hkv, D)
        q, k, v = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv], qkv[:, Hq + Hkv:]
        q.mul_(1.5)
        k.mul_(1.5)
    elif layout == "strided":
        q = randn(tq, Hq, D + 8, scale=1.5)[..., 3:D + 3]
        k = randn(tk, Hkv, D + 8, scale=1.5)[..., :D]
        v = randn(tk, 2 * Hkv, Dv)[:, ::2]
    else:
        q, k, v = randn(tq, Hq, D, scale=1.5), randn(tk, Hkv, D, scale=1.5), randn(tk, Hkv, Dv)
    return (q, k, v, cumulative(lens_q, device), cumulative(lens_k, device), max(lens_q, default=0),
            max(lens_k, default=0))


def sequences(cu_q, cu_k):
    a, b = cu_q.tolist(), cu_k.tolist()
    return [(slice(a[i], a[i + 1]), slice(b[i], b[i + 1])) for i in range(len(a) - 1)]


def sdpa_layout(t):
    """(L, H, D) -> (1, H, L, D), the layout of torch_oss.attention."""
    return t.transpose(0, 1).unsqueeze(0)


def packed_layout(t):
    return t[0].transpose(0, 1)


def autograd_run(fn, cdtype=None):
    """A per-sequence run from a differentiable fn(b, q4, k4, v4, sinks) ->
    (out4, lse3) computed on copies in cdtype (None: the inputs' dtype):
    (out, lse, dq, dk, dv, d sinks) for the upstream gradient dout4."""

    def run(b, q4, k4, v4, dout4, sinks):
        leaves = [t.detach().to(cdtype or t.dtype).requires_grad_() for t in (q4, k4, v4)]
        s = None if sinks is None else sinks.detach().to(cdtype or sinks.dtype).requires_grad_()
        out, lse = fn(b, *leaves, s)
        if out.numel():
            out.backward(dout4.to(out.dtype))
        grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]
        ds = None if s is None else (torch.zeros_like(s) if s.grad is None else s.grad)
        return out.detach(), lse.detach(), *grads, ds

    return run


def per_sequence(run, q, k, v, cu_q, cu_k, dout, sinks=None):
    """run(b, q4, k4, v4, dout4, sinks) on every sequence, its results packed
    like attention_varlen's: out (total_q, Hq, Dv), lse (Hq, total_q), dq, dk,
    dv, and d sinks summed over the sequences in float64 (or None)."""
    results = None
    for b, (sq, sk) in enumerate(sequences(cu_q, cu_k)):
        o, l, dq, dk, dv, ds = run(b, sdpa_layout(q[sq]), sdpa_layout(k[sk]), sdpa_layout(v[sk]),
                                   sdpa_layout(dout[sq]), sinks)
        if results is None:
            results = [o.new_zeros(dout.shape), l.new_zeros((q.shape[1], q.shape[0])), dq.new_zeros(q.shape),
                       dk.new_zeros(k.shape), dv.new_zeros(v.shape),
                       None if ds is None else torch.zeros(ds.shape, dtype=torch.float64, device=ds.device)]
        results[0][sq] = packed_layout(o)
        results[1][:, sq] = l[0]
        results[2][sq] = packed_layout(dq)
        results[3][sk] = packed_layout(dk)
        results[4][sk] = packed_layout(dv)
        if ds is not None:
            results[5] += ds.double()
    return results


def _variant_args(kw, b):
    """The score-variant keywords of sequence b (its row of batch-wise ALiBi slopes)."""
    args = {key: val for key, val in kw.items() if key not in ("sinks", "alibi_slopes")}
    slopes = kw.get("alibi_slopes")
    if slopes is not None:
        args["alibi_slopes"] = slopes[b] if slopes.dim() == 2 else slopes
    return args


def _factor(F, b, q4, k4):
    return None if F is None else F[b:b + 1, :, :q4.shape[2], :k4.shape[2]]


def reference_run(causal, alignment, scale, kw, cdtype, F=None):
    """The definition (test_variants.variant_reference) per sequence in
    cdtype, with the dropout factors F (batch, Hq, max_q, max_k) if given."""
    return autograd_run(lambda b, q4, k4, v4, s: variant_reference(
        q4, k4, v4, is_causal=causal, scale=scale, alignment=alignment, sinks=s, compute_dtype=cdtype,
        dropout_factor=_factor(F, b, q4, k4), **_variant_args(kw, b)), cdtype)


def loop_run(causal, alignment, scale, kw):
    """torch_oss.attention on each sequence (same device and dtype)."""
    return autograd_run(lambda b, q4, k4, v4, s: torch_oss.attention_with_lse(
        q4, k4, v4, is_causal=causal, scale=scale, enable_gqa=True, causal_alignment=alignment, sinks=s,
        **_variant_args(kw, b)))


def peer_run(causal, alignment, scale, kw, dtype, device, F=None):
    """PyTorch's peer per sequence: SDPA (and its lse peer) without variants
    or dropout; else the definition in float32 (float64 for float64), or for
    CUDA float16/bfloat16 the FlashAttention-style emulation
    (test_variants.fa_style_peer). Empty sequences take the float32
    definition (PyTorch's kernels refuse some of them; the result is 0)."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    definition = reference_run(causal, alignment, scale, kw, wide, F)

    def sdpa(b, q4, k4, v4, s):
        return (sdpa_peer(q4, k4, v4, None, causal, scale, True, alignment),
                lse_peer(q4, k4, v4, None, causal, scale, True, alignment))

    plain = autograd_run(sdpa)

    def run(b, q4, k4, v4, dout4, sinks):
        empty = q4.shape[2] == 0 or k4.shape[2] == 0
        if not kw and F is None and not empty:
            return plain(b, q4, k4, v4, dout4, sinks)
        if device == "cuda" and dtype in HALF and not empty:
            return fa_style_peer(q4, k4, v4, dout4, sinks=sinks, is_causal=causal, scale=scale, alignment=alignment,
                                 dropout_factor=_factor(F, b, q4, k4), **_variant_args(kw, b))
        o, l, dq, dk, dv, ds = definition(b, q4, k4, v4, dout4, sinks)
        return o.to(dtype), l, dq.to(dtype), dk.to(dtype), dv.to(dtype), ds

    return run


def check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, alignment="bottom_right", scale=None, kw=None,
                 dropout_p=0.0, salt=0, label=""):
    """attention_varlen's out, lse and gradients against the float64
    reference by the tolerance rule, with PyTorch's peer and (without
    dropout) with the loop of torch_oss.attention as the peer. Returns
    (out, lse) and the dropout factors the call drew (or None)."""
    kw = dict(kw or {})
    dtype, device = q.dtype, q.device
    sinks = kw.pop("sinks", None)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]  # the inputs' own strides
    s = None if sinks is None else sinks.detach().clone().requires_grad_()

    def call():
        return torch_oss.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, causal, scale, return_lse=True,
                                          causal_alignment=alignment, sinks=s, dropout_p=dropout_p, **kw)

    F = None
    if dropout_p > 0:
        (out, lse), seed = seeded_call(call, device, salt)
        F = dropout_factor(seed.cpu(), cu_q.shape[0] - 1, q.shape[1], max_q, max_k, dropout_p).to(device)
    else:
        out, lse = call()
    assert out.shape == (q.shape[0], q.shape[1], v.shape[2]) and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.is_contiguous()
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert lse.requires_grad == any(t.requires_grad for t in leaves)
    dout = torch.randn_like(out)
    out.backward(dout)
    ours = [out, lse, *(t.grad for t in leaves), None if s is None else s.grad]
    full_kw = dict(kw, sinks=sinks) if sinks is not None else kw
    ref = per_sequence(reference_run(causal, alignment, scale, full_kw, torch.float64, F), q, k, v, cu_q, cu_k, dout,
                       sinks)
    peers = {"PyTorch": per_sequence(peer_run(causal, alignment, scale, full_kw, dtype, device, F), q, k, v, cu_q,
                                     cu_k, dout, sinks)}
    if F is None:
        peers["torch_oss.attention per sequence"] = per_sequence(loop_run(causal, alignment, scale, full_kw), q, k,
                                                                 v, cu_q, cu_k, dout, sinks)
    atol = ATTENTION_ATOL[dtype]
    # 16-bit gradients: each element may also be one rounding of its own magnitude
    # off. FlashAttention's own tests add two roundings at the gradient's magnitude to
    # the bound; without that allowance the bound is a draw here, as the peer's own
    # maximum error over these few short sequences is decided by one or two rounding
    # flips (on identical inputs it changed 2x from one process to another).
    half = dtype in (torch.float16, torch.bfloat16)
    for peer_name, peer in peers.items():
        for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
            assert ours[i].dtype == (lse.dtype if name == "lse" else dtype), f"{name} {label}: {ours[i].dtype}"
            assert_tolerance(f"{name} {label} (peer: {peer_name})", ours[i], ref[i], peer[i], atol,
                             per_element_eps=half and i >= 2)
        if sinks is not None and (peer_name != "PyTorch" or len(peers) == 1):
            # the kernels' float64 sums written as float32 (oss.h dsinks), then cast to the
            # sinks' dtype; the peers' sums of per-sequence values: judged in float32 at
            # best, one rounding of each element's magnitude allowed (as test_variants.py).
            # A handful of sums over every sequence's rows: each sequence adds the error of
            # its float32 out and lse, the same in the loop of torch_oss.attention, while
            # PyTorch's peer (its dsinks judged in test_variants.py) draws other errors that
            # may add up smaller; so the loop is the peer wherever there is one.
            assert ours[5].dtype == sinks.dtype
            sdt = torch.float32 if dtype == torch.float64 else dtype
            assert_tolerance(f"dsinks {label} (peer: {peer_name})", ours[5].to(sdt), ref[5], peer[5].to(sdt),
                             ATTENTION_ATOL[sdt], per_element_eps=True)
    return (out.detach(), lse), F


# ---------------------------------------------------------------------------
# Values and gradients: dtypes, head dims, GQA, lengths, alignments, layouts
# ---------------------------------------------------------------------------

# name -> (lens_q, lens_k (None: lens_q), heads_q, heads_kv, {device: (head_dim, head_dim_v)}, layout)
CASES = {
    "mixed_hd64_gqa2_qkvpacked": ([1, 17, 0, 130, 64], None, 4, 2, {"cpu": (64, 64), "cuda": (64, 64)},
                                  "qkvpacked"),
    "q_ne_k_hd128_strided": ([5, 0, 33, 1, 20, 9], [40, 7, 33, 0, 9, 20], 4, 4,
                             {"cpu": (128, 128), "cuda": (128, 128)}, "strided"),
    "awkward_hd_dv": ([3, 64, 1, 0, 2], [70, 64, 2, 5, 0], 4, 2, {"cpu": (40, 24), "cuda": (72, 56)}, "contiguous"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward(device, dtype, causal, alignment, case):
    lens_q, lens_k, Hq, Hkv, dims, layout = CASES[case]
    torch.manual_seed(zlib.crc32(f"{case} {dtype} {causal} {alignment}".encode()))
    D, Dv = dims[device]
    inputs = make_packed(lens_q, lens_k or lens_q, Hq, Hkv, D, Dv, dtype, device, layout)
    check_varlen(*inputs, causal=causal, alignment=alignment, label=f"{case} {dtype} causal={causal}/{alignment}")


# Lengths across several tiles of the CUDA kernels (64 / 128 rows, 64 / 128 keys), with
# max_seqlen above the longest sequence (it only bounds them)
@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_long_sequences_cuda(device, dtype, causal, alignment, head_dim):
    torch.manual_seed(zlib.crc32(f"long {dtype} {causal} {alignment} {head_dim}".encode()))
    q, k, v, cu_q, cu_k, _, _ = make_packed([300, 1, 513, 0, 129, 64], [257, 700, 513, 3, 129, 0], 8, 2, head_dim,
                                            head_dim, dtype, device)
    check_varlen(q, k, v, cu_q, cu_k, 520, 1000, causal=causal, alignment=alignment,
                 label=f"long {dtype} hd={head_dim} causal={causal}/{alignment}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_non_finite_neighbour_leaves_a_sequence_alone(device, dtype, head_dim, causal):
    """The CUDA kernels load whole tiles, so a sequence's last tile of queries
    and of keys holds the first rows of the next sequence. With non-finite
    q, k, v and dout there, the first sequence's output and gradients are
    finite and those of the sequence run alone (to a rounding: the order of
    the dQ accumulator's additions may differ)."""
    torch.manual_seed(head_dim + causal)
    n = 100
    q, k, v, cu_q, cu_k, mq, mk = make_packed([n, 60], [n, 60], 4, 2, head_dim, head_dim, dtype, device)
    dout = torch.randn_like(q)
    q[n:], k[n:], v[n:], dout[n:] = float("inf"), float("nan"), float("inf"), float("nan")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=causal)
    out.backward(dout)
    alone = [t[:n].detach().clone().requires_grad_() for t in (q, k, v)]
    out_alone = torch_oss.attention_varlen(*alone, cu_q[:2], cu_k[:2], n, n, causal=causal)
    out_alone.backward(dout[:n])
    for name, got, want in [("out", out[:n], out_alone)] + [
            (f"d{x}", t.grad[:n], a.grad) for x, t, a in zip("qkv", leaves, alone)]:
        assert torch.isfinite(got).all(), f"{name}: non-finite values from the neighbour"
        torch.testing.assert_close(got, want, rtol=0, atol=4 * torch.finfo(dtype).eps * want.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("family", ["best", "mma"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_dq_is_zero_for_equal_keys_per_sequence(device, dtype, head_dim, family, causal):
    """Each sequence's keys all equal (its own row): its dq is 0, since dS's
    rows sum to 0. The 16-bit kernels compute dq as rounded dS (K - kbar),
    kbar the (sequence, kv head)'s mean K row, which must then be exactly that
    row, for sequences of several key chunks, of one partial chunk and of
    fewer keys than queries; without the centring the error is at least 100x
    larger (test_attention.py's test for one batch)."""
    torch.manual_seed(head_dim + causal)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([200, 37, 90], [300, 20, 130], 4, 2, head_dim, head_dim, dtype, device)
    for _, keys in sequences(cu_q, cu_k):
        k[keys] = k[keys][:1].clone()
    dout = torch.randn_like(q)
    errors = {}
    for centring in (True, False):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with attention_kernels(backward=family, dq_centring=centring):
            torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=causal).backward(dout)
        errors[centring] = leaves[0].grad.double().abs().max().item()
    label = f"dq {dtype} hd {head_dim} {family} causal={causal}: max error with/without centring {errors}"
    assert errors[False] > 0, label  # the case must have roundings to remove
    assert errors[True] <= 0.01 * errors[False], label


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_workspace_follows_the_tokens(device):
    """511 one-token sequences beside one of 16k: the backward's workspace
    grows with the tokens (~90 MB here), not with batch x the longest
    sequence (~9 GB), and the gradients are right: a one-token sequence's
    out is its v, its dq and dk 0 (up to the float32 difference of two sums
    of D) and its dv its dout; the long one's match torch_oss.attention on it
    alone."""
    torch.manual_seed(31)
    lens = [1] * 255 + [16384] + [1] * 256
    dtype = torch.float16
    q, k, v, cu_q, cu_k, mq, mk = make_packed(lens, lens, 4, 4, 64, 64, dtype, device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True)
    dout = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(dout)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < 512 * 2**20, f"the backward allocated {extra / 2**20:.0f} MiB"
    long = slice(255, 255 + 16384)
    short = torch.ones(q.shape[0], dtype=torch.bool, device=device)
    short[long] = False
    assert torch.equal(out[short], v[short])
    assert leaves[0].grad[short].abs().max() < 1e-5 and leaves[1].grad[short].abs().max() < 1e-5
    assert torch.equal(leaves[2].grad[short], dout[short])
    ql, kl, vl = (t[long].detach().transpose(0, 1)[None].requires_grad_() for t in (q, k, v))
    out_l = torch_oss.attention(ql, kl, vl, is_causal=True)
    out_l.backward(dout[long].transpose(0, 1)[None])
    for name, ours, want in (("out", out[long], out_l), ("dq", leaves[0].grad[long], ql.grad),
                             ("dk", leaves[1].grad[long], kl.grad), ("dv", leaves[2].grad[long], vl.grad)):
        torch.testing.assert_close(ours, want[0].transpose(0, 1), rtol=2e-3, atol=2e-3, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_custom_scale_and_int64_cu_seqlens(device):
    """softmax_scale passes through; int64 cu_seqlens give the int32 results bit for bit."""
    torch.manual_seed(2)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([7, 0, 30], [9, 4, 31], 4, 2, 32, 32, torch.float32, device)
    check_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, scale=0.3, label="scale=0.3")
    check_varlen(q, k, v, cu_q, cu_k, mq, mk, scale=-0.7, label="scale=-0.7")
    a = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, True, 0.3, True)
    b = torch_oss.attention_varlen(q, k, v, cu_q.long(), cu_k.long(), mq, mk, True, 0.3, True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_lse_layout_and_rows_that_see_no_key(device):
    """lse is (heads_q, total_q): column r is query row r of the packed q.
    Rows that see no key (a sequence without keys; bottom-right causal rows
    above the diagonal when len_q > len_k) give output 0 and lse -inf, and
    zero gradients."""
    torch.manual_seed(3)
    lens_q, lens_k = [4, 6, 3], [0, 2, 3]
    q, k, v, cu_q, cu_k, mq, mk = make_packed(lens_q, lens_k, 2, 1, 16, 16, torch.float64, device)
    q.requires_grad_()
    out, lse = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_lse=True)
    assert lse.shape == (2, 13)
    dead = torch.zeros(13, dtype=torch.bool)
    dead[0:4] = True        # sequence 0 has no keys
    dead[4:8] = True        # sequence 1: 6 queries, 2 keys, bottom-right: rows 0-3 see nothing
    assert torch.isneginf(lse[:, dead]).all() and torch.isfinite(lse[:, ~dead]).all()
    assert (out[dead] == 0).all()
    for b, (sq, sk) in enumerate(sequences(cu_q, cu_k)):
        _, want = torch_oss.attention_with_lse(sdpa_layout(q[sq]), sdpa_layout(k[sk]), sdpa_layout(v[sk]),
                                               is_causal=True, enable_gqa=True, causal_alignment="bottom_right")
        torch.testing.assert_close(lse[:, sq], want[0], rtol=1e-12, atol=0)
    out.sum().backward()
    assert (q.grad[dead] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_empty_batches(device, dtype):
    """No sequences at all; sequences with no rows; no keys anywhere."""
    for lens_q, lens_k in (([], []), ([0, 0], [0, 0]), ([3, 0, 2], [0, 0, 0]), ([0, 0], [5, 1])):
        q, k, v, cu_q, cu_k, mq, mk = make_packed(lens_q, lens_k, 4, 2, 16, 8, dtype, device)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        sinks = torch.zeros(4, device=device, requires_grad=True)
        out, lse = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, True, return_lse=True)
        assert out.shape == (sum(lens_q), 4, 8) and lse.shape == (4, sum(lens_q))
        assert (out == 0).all() and torch.isneginf(lse).all()
        out = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, sinks=sinks)
        out.sum().backward()
        for t in (q, k, v, sinks):
            assert t.grad is not None and (t.grad == 0).all()


# ---------------------------------------------------------------------------
# Score variants, each against the per-sequence loop with the same variant
# ---------------------------------------------------------------------------

VARIANTS = {
    "window": dict(window_size=(7, 3)),
    "window_left": dict(window_size=(5, -1)),
    "softcap": dict(softcap=2.0),
    "alibi_batch": dict(alibi="batch"),
    "sinks": dict(sinks=True),
    "all": dict(window_size=(9, 2), softcap=3.0, alibi="heads", sinks=True),
}
# Awkward short sequences and two of a few hundred rows, so the maximum errors the
# tolerance rule compares are taken over tens of thousands of gradient elements.
VARIANT_LENS = ([1, 17, 0, 145, 9, 300], [12, 17, 4, 130, 1, 290])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("causal,alignment", CAUSAL, ids=CAUSAL_IDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants(device, dtype, causal, alignment, variant):
    torch.manual_seed(zlib.crc32(f"{variant} {dtype} {causal} {alignment}".encode()))
    lens_q, lens_k = VARIANT_LENS
    inputs = make_packed(lens_q, lens_k, 4, 2, 32, 32, dtype, device)
    kw = draw_variants(VARIANTS[variant], len(lens_q), 4, device)
    check_varlen(*inputs, causal=causal, alignment=alignment, kw=kw,
                 label=f"{variant} {dtype} causal={causal}/{alignment}")


@pytest.mark.parametrize("device", DEVICES)
def test_sinks_any_dtype(device):
    torch.manual_seed(4)
    inputs = make_packed(*VARIANT_LENS, 4, 4, 16, 16, torch.float32, device)
    for sinks_dtype in (torch.bfloat16, torch.float64):
        kw = draw_variants({"sinks": True}, len(VARIANT_LENS[0]), 4, device, sinks_dtype=sinks_dtype)
        check_varlen(*inputs, causal=True, kw=kw, label=f"sinks {sinks_dtype}")


# ---------------------------------------------------------------------------
# Dropout: the mask is the rule's with batch index = sequence index
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal-br"])
@pytest.mark.parametrize("variant", ["plain", "window_sinks"])
def test_dropout_against_reference_with_the_mask(device, dtype, causal, variant):
    """out, lse and every gradient against the float64 reference given the
    mask the call drew (test_dropout.dropout_factor, sequence b's weights
    (i, j) taking batch index b and the rows and keys counted within the
    sequence), PyTorch's peer the same computation in float32 (the
    FlashAttention-style emulation for CUDA 16-bit)."""
    salt = zlib.crc32(f"dropout {variant} {dtype} {causal}".encode())
    torch.manual_seed(salt)
    inputs = make_packed([1, 17, 0, 70, 9], [12, 17, 4, 66, 1], 4, 2, 32, 32, dtype, device)
    kw = {} if variant == "plain" else dict(window_size=(20, 5), **draw_variants({"sinks": True}, 5, 4, device))
    _, F = check_varlen(*inputs, causal=causal, kw=kw, dropout_p=0.3, salt=salt,
                        label=f"dropout {variant} {dtype} causal={causal}")
    assert 0 < (F == 0).double().mean() < 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dropout_mask_recovered_from_outputs(device, dtype):
    """q = 0 makes every weight of sequence b 1 / len_k(b), and v holding the
    identity within each sequence makes out[row, h, j] that weight after
    dropout: the mask, recovered exactly, is the rule's for batch index b
    with rows and keys counted within each sequence."""
    p = 0.5
    lens_q, lens_k = [300, 1, 0, 77, 130], [128, 5, 9, 0, 200]
    Hq, Hkv, B = 4, 2, len(lens_q)
    cu_q, cu_k = cumulative(lens_q, device), cumulative(lens_k, device)
    q = torch.zeros(sum(lens_q), Hq, 32, dtype=dtype, device=device)
    k = torch.randn(sum(lens_k), Hkv, 32, dtype=dtype, device=device)
    v = torch.zeros(sum(lens_k), Hkv, max(lens_k), dtype=dtype, device=device)
    for (_, sk) in sequences(cu_q, cu_k):
        n = sk.stop - sk.start
        v[sk, :, :n] = torch.eye(n, dtype=dtype, device=device)[:, None, :]
    out, seed = seeded_call(lambda: torch_oss.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                               dropout_p=p), device, 5)
    F = dropout_factor(seed.cpu(), B, Hq, max(lens_q), max(lens_k), p)
    for b, (sq, sk) in enumerate(sequences(cu_q, cu_k)):
        n = sk.stop - sk.start
        got = out[sq].float().cpu()  # (len_q, Hq, max_k)
        assert (got[:, :, n:] == 0).all()
        kept = (got[:, :, :n] > 0).transpose(0, 1)
        want = F[b, :, :sq.stop - sq.start, :n] > 0
        assert torch.equal(kept, want), f"sequence {b}: {int((kept != want).sum())} of {kept.numel()} weights differ"
        if n:
            values = got[:, :, :n].transpose(0, 1)[kept].double()
            torch.testing.assert_close(values, torch.full_like(values, 1 / (n * (1 - p))),
                                       rtol=2 * torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_seeds_and_limits(device):
    """The same seed gives the same bits (deterministic backward), another
    seed other bits; dropout_p = 0 is the call without dropout; dropout_p = 1
    gives output 0, the lse without dropout and zero gradients."""
    torch.manual_seed(6)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([40, 3, 77], [50, 3, 60], 4, 2, 32, 32, torch.bfloat16, device)
    runs = []
    for salt in (7, 7, 8):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(salt)
        out = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True, dropout_p=0.3, deterministic=True)
        out.backward(torch.ones_like(out))
        runs.append([out.detach()] + [t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not any(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))
    plain, lse0 = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, return_lse=True)
    assert torch.equal(torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, dropout_p=0.0), plain)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, dropout_p=1.0, return_lse=True)
    assert (out == 0).all() and torch.equal(lse, lse0)
    out.backward(torch.randn_like(out))
    assert all((t.grad == 0).all() for t in leaves)


# ---------------------------------------------------------------------------
# What reaches the backward op: the residual, the deterministic flag
# ---------------------------------------------------------------------------


class RecordBackwardCalls(TorchDispatchMode):
    """Records the arguments of every oss::attention_varlen_backward call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.oss.attention_varlen_backward.default:
            self.calls.append(args)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_gets_the_residual_and_the_deterministic_flag(device):
    """16-bit calls to be differentiated keep out's rounding residual for the
    backward (float32 ones have none); deterministic= (None: the global
    setting) reaches the backward op."""
    q, k, v, cu_q, cu_k, mq, mk = make_packed([5, 9], [7, 9], 2, 2, 16, 16, torch.bfloat16, device)
    prior = torch.are_deterministic_algorithms_enabled()
    for dtype, det, global_det, want in ((torch.bfloat16, None, False, False), (torch.float32, True, False, True),
                                         (torch.bfloat16, False, True, False), (torch.float32, None, True, True)):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        try:
            torch.use_deterministic_algorithms(global_det)
            out = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, deterministic=det)
        finally:
            torch.use_deterministic_algorithms(prior)
        with RecordBackwardCalls() as rec:
            out.sum().backward()
        (args,) = rec.calls
        assert args[13] is want, (dtype, det, global_det)
        residual = args[14] if len(args) > 14 else None
        if dtype in HALF:
            assert residual is not None and residual.shape == out.shape and residual.dtype == torch.int8
        else:
            assert residual is None or residual.numel() == 0
    assert torch.are_deterministic_algorithms_enabled() == prior


def test_deterministic_flag_under_compile():
    """deterministic=True under torch.compile(fullgraph=True) with the global
    setting off: the traced backward calls the op with deterministic=True, and
    the global setting is left as it was."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([5, 9], [7, 9], 2, 2, 16, 16, torch.float32, "cpu")
    prior = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        torch._dynamo.reset()
        f = torch.compile(lambda q, k, v: torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, deterministic=True),
                          backend=backend, fullgraph=True)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        f(*leaves).sum().backward()
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(prior)
    calls = [n for gm in graphs for n in gm.graph.nodes if n.target is torch.ops.oss.attention_varlen_backward.default]
    assert len(calls) == 1 and calls[0].args[13] is True


# ---------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------


def bad_cases(device):
    q, k, v, cu_q, cu_k, mq, mk = make_packed([3, 5], [4, 6], 4, 2, 16, 16, torch.float32, device)

    def call(**over):
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
        args.update(over)
        return lambda: torch_oss.attention_varlen(**args)

    def cu(values, dtype=torch.int32):
        return torch.tensor(values, dtype=dtype, device=device)

    return [
        ("cu_seqlens_q float", call(cu_seqlens_q=cu_q.float()), TypeError, "cu_seqlens_q.dtype"),
        ("cu_seqlens_k int16", call(cu_seqlens_k=cu_k.short()), TypeError, "cu_seqlens_k.dtype"),
        ("cu_seqlens_q a list", call(cu_seqlens_q=[0, 3, 8]), TypeError, "cu_seqlens_q must be a Tensor"),
        ("cu_seqlens_k 2-D", call(cu_seqlens_k=cu_k[None]), ValueError, "cu_seqlens_k must have shape"),
        ("cu_seqlens_q empty", call(cu_seqlens_q=cu([])), ValueError, "cu_seqlens_q must have shape"),
        ("cu_seqlens batch mismatch", call(cu_seqlens_k=cu([0, 4, 6, 10])), ValueError, "cu_seqlens_k has 4"),
        ("cu_seqlens_q decreasing", call(cu_seqlens_q=cu([0, 9, 8])), ValueError, "cu_seqlens_q must be nondecreasing"),
        ("cu_seqlens_k not starting at 0", call(cu_seqlens_k=cu([1, 4, 10])), ValueError, r"cu_seqlens_k\[0\]=1"),
        ("cu_seqlens_q last != total", call(cu_seqlens_q=cu([0, 3, 7])), ValueError, r"cu_seqlens_q\[-1\]=7"),
        ("cu_seqlens_k last != total", call(cu_seqlens_k=cu([0, 4, 11])), ValueError, r"cu_seqlens_k\[-1\]=11"),
        ("cu_seqlens_k int64 beyond int32", call(cu_seqlens_k=cu([0, 4, 10 + 2**32], torch.int64)), ValueError,
         r"cu_seqlens_k\[-1\]"),
        ("length above max_seqlen_q", call(max_seqlen_q=4), ValueError, "max_seqlen_q=4"),
        ("length above max_seqlen_k", call(max_seqlen_k=5), ValueError, "max_seqlen_k=5"),
        ("negative max_seqlen_q", call(max_seqlen_q=-1), ValueError, "max_seqlen_q"),
        ("float max_seqlen_k", call(max_seqlen_k=6.0), ValueError, "max_seqlen_k"),
        ("heads not divisible", call(q=q[:, :3]), ValueError, "heads"),
        ("k dtype differs", call(k=k.double()), TypeError, "k.dtype"),
        ("v dtype differs", call(v=v.half()), TypeError, "v.dtype"),
        ("integer q", call(q=q.int()), TypeError, "q.dtype"),
        ("q 4-D", call(q=q[None]), ValueError, "q must be 3-D"),
        ("v 2-D", call(v=v[:, 0]), ValueError, "v must be 3-D"),
        ("head_dim differs", call(k=k[..., :8]), ValueError, r"k.size\(2\)"),
        ("v rows differ", call(v=v[1:]), ValueError, "v has shape"),
        ("causal not a bool", lambda: torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal="yes"),
         TypeError, "causal"),
        ("bad softmax_scale", lambda: torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk,
                                                                 softmax_scale=float("nan")), ValueError,
         "softmax_scale"),
        ("bad causal_alignment", call(causal_alignment="center"), ValueError, "causal_alignment"),
        ("bad dropout_p", call(dropout_p=1.5), ValueError, "dropout_p"),
        ("bad window_size", call(window_size=(-2, 0)), ValueError, "window_size"),
        ("negative softcap", call(softcap=-1.0), ValueError, "softcap"),
        ("sinks wrong heads", call(sinks=torch.zeros(3, device=device)), ValueError, "sinks"),
        ("alibi_slopes wrong shape", call(alibi_slopes=torch.zeros(3, 4, device=device)), ValueError,
         "alibi_slopes"),
        ("alibi_slopes float64", call(alibi_slopes=torch.zeros(4, dtype=torch.float64, device=device)), TypeError,
         "alibi_slopes"),
        ("op: int64 cu_seqlens", lambda: torch.ops.oss.attention_varlen(q, k, v, cu_q.long(), cu_k, mq, mk), TypeError,
         "cu_seqlens_q"),
        ("op: batch mismatch", lambda: torch.ops.oss.attention_varlen(q, k, v, cu_q, cu([0, 10]), mq, mk), ValueError,
         "cu_seqlens_k"),
    ]


CASE_NAMES = [c[0] for c in bad_cases("cpu")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_raises_naming_the_argument(device, name):
    (case,) = [c for c in bad_cases(device) if c[0] == name]
    _, call, exc_type, pattern = case
    with pytest.raises(exc_type, match=pattern):
        call()


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_cu_seqlens_on_another_device(device):
    q, k, v, cu_q, cu_k, mq, mk = make_packed([3, 5], [4, 6], 4, 2, 16, 16, torch.float16, device)
    with pytest.raises(ValueError, match="cu_seqlens_q is on cpu"):
        torch_oss.attention_varlen(q, k, v, cu_q.cpu(), cu_k, mq, mk)
    with pytest.raises(ValueError, match="cu_seqlens_k is on cpu"):
        torch_oss.attention_varlen(q, k, v, cu_q, cu_k.cpu(), mq, mk, validate=False)
    with pytest.raises(ValueError, match="k is on cpu"):
        torch_oss.attention_varlen(q, k.cpu(), v, cu_q, cu_k, mq, mk)


def test_cpu_kernel_checks_the_values_without_validate():
    """On the CPU the kernel checks cu_seqlens itself: validate=False (and
    the op called directly) still raise ValueError naming it."""
    q, k, v, cu_q, cu_k, mq, mk = make_packed([3, 5], [4, 6], 4, 2, 16, 16, torch.float32, "cpu")
    bad_q = torch.tensor([0, 5, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        torch_oss.attention_varlen(q, k, v, bad_q, cu_k, mq, mk, validate=False)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        torch.ops.oss.attention_varlen(q, k, v, cu_q, torch.tensor([0, 4, 12], dtype=torch.int32), mq, mk)
    with pytest.raises(ValueError, match="max_seqlen_q|cu_seqlens_q"):
        torch.ops.oss.attention_varlen(q, k, v, cu_q, cu_k, 4, mk)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
def test_cuda_bad_values_without_validate_stay_in_bounds(device):
    """With validate=False the CUDA kernels take any values: offsets past
    the packed tensors, decreasing ones and lengths above max_seqlen run
    without a fault (their outputs are undefined), forward and backward, and
    the process stays usable."""
    q, k, v, cu_q, cu_k, mq, mk = make_packed([30, 50], [40, 60], 4, 2, 64, 64, torch.float16, device)
    bad = [torch.tensor(x, dtype=torch.int32, device=device) for x in ([0, 70, 200], [5, 3, 1000], [0, -50, 80])]
    for cu_bad in bad:
        for args in ((cu_bad, cu_k, mq, mk), (cu_q, cu_bad, mq, mk), (cu_q, cu_k, 8, 8)):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = torch_oss.attention_varlen(*leaves, *args, causal=True, validate=False)
            out.float().sum().backward()
            torch.cuda.synchronize()
    good = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk)
    torch.cuda.synchronize()
    assert torch.isfinite(good).all()


# ---------------------------------------------------------------------------
# Autograd, the op contract, torch.compile, CUDA graphs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["causal", "alibi and sinks"])
def test_double_backward_matches_per_sequence_loop(device, variant):
    """Second derivatives (the gradient of |grad|^2 in q, k, v and the sinks,
    with out's and lse's gradients) against a loop of torch_oss.attention over
    the sequences, float64; empty and length-1 sequences included."""
    q, k, v, cu_q, cu_k, mq, mk = make_packed([5, 0, 1, 7], [7, 3, 1, 9], 4, 2, 8, 8, torch.float64, device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    kw = {"causal_alignment": "bottom_right"}
    if variant == "alibi and sinks":
        kw.update(alibi_slopes=torch.rand(4, 4, dtype=torch.float32, device=device), window_size=(4, 1))
        leaves.append(torch.tensor([0.5, -1.0, 0.25, 2.0], dtype=torch.float64, device=device, requires_grad=True))
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()

    def varlen(q, k, v, sinks=None):
        return torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_lse=True, sinks=sinks,
                                          **kw)

    def loop(q, k, v, sinks=None):
        outs, lses = [], []
        for b in range(len(starts_q) - 1):
            rq, rk = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
            dense = [t[r].transpose(0, 1).unsqueeze(0) for t, r in zip((q, k, v), (rq, rk, rk))]
            extra = dict(kw, alibi_slopes=kw["alibi_slopes"][b]) if "alibi_slopes" in kw else kw
            out, lse = torch_oss.attention_with_lse(*dense, is_causal=True, enable_gqa=True, sinks=sinks, **extra)
            outs.append(out[0].transpose(0, 1))
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, -1)

    w = torch.randn(q.shape[0], 4, 8, dtype=torch.float64, device=device)
    results = []
    for fn in (varlen, loop):
        out, lse = fn(*leaves)
        loss = (out * w).sum() + torch.where(torch.isfinite(lse), lse, 0).square().sum()
        grads = torch.autograd.grad(loss, leaves, create_graph=True)
        results.append(torch.autograd.grad(sum(g.square().sum() for g in grads), leaves))
    # d sinks holds a term through the forward kernels' own backward, whose d
    # sinks is summed in float32 (oss.h), in another order by each of the two
    for name, ours, ref, rtol in zip("qkvs", *results, (1e-9, 1e-9, 1e-9, 2**-21)):
        torch.testing.assert_close(ours, ref, rtol=rtol, atol=1e-10, msg=lambda m: f"d{name}: {m}")


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_refused_with_dropout_and_by_the_backward_op(device):
    """Dropout's mask is not recomputed by the ATen ops: a graph through its
    backward raises; the backward op called on inputs that require grad too."""
    q, k, v, cu_q, cu_k, mq, mk = make_packed([5, 9], [7, 9], 4, 2, 16, 16, torch.float64, device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True, dropout_p=0.2)
    with pytest.raises(NotImplementedError, match="double backward is not supported with dropout_p"):
        torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
    out = torch_oss.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True, dropout_p=0.2)
    grads = torch.autograd.grad(out.square().sum(), leaves)
    assert all(torch.isfinite(g).all() for g in grads)
    # the backward op itself: refused when a graph would be built through it, else it runs
    o, lse, _ = torch.ops.oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk)
    dout = torch.randn_like(o, requires_grad=True)
    args = (q, k, v, o, lse, cu_q, cu_k, mq, mk, False, None, "bottom_right", False)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.ops.oss.attention_varlen_backward(dout, *args)
    with torch.no_grad():
        dq, dk, dv, dsinks = torch.ops.oss.attention_varlen_backward(dout, *args)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dsinks.shape == (0,)


def test_gradcheck_float64():
    torch.manual_seed(8)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([3, 0, 4], [5, 2, 3], 2, 1, 4, 4, torch.float64, "cpu")
    sinks = torch.tensor([0.75, -0.5], dtype=torch.float64, requires_grad=True)
    alibi = torch.tensor([[0.25, 0.5], [0.1, 0.2], [0.3, 0.05]])

    def f(q, k, v, sinks):
        return torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, window_size=(2, 1), softcap=1.5,
                                          alibi_slopes=alibi, sinks=sinks)

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(f, (*leaves, sinks), eps=2 ** -12, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    torch.manual_seed(9)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([3, 0, 9], [5, 2, 11], 4, 2, 16, 16, torch.float32, device)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    sinks = torch.randn(4, device=device, requires_grad=True)
    alibi = torch.rand(3, 4, device=device)
    seed = torch.tensor([123456789], dtype=torch.int64, device=device)
    fwd = (q, k, v, cu_q, cu_k, mq, mk, True, None, "bottom_right", [4, 1], 2.5, alibi, sinks, None, 0.25, seed,
           False)
    torch.library.opcheck(torch.ops.oss.attention_varlen.default, fwd)
    torch.library.opcheck(torch.ops.oss.attention_varlen.default, (q, k, v, cu_q, cu_k, mq, mk))
    half = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    torch.library.opcheck(torch.ops.oss.attention_varlen.default,
                          (*half, cu_q, cu_k, mq, mk, False, 0.5, "top_left", [-1, -1], 0.0, None, None, True, 0.0,
                           None, True))
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in fwd]
    out, lse, _ = torch.ops.oss.attention_varlen(*detached)
    bwd = (torch.randn_like(out), *detached[:3], out, lse, cu_q, cu_k, mq, mk, True, None, "bottom_right", False,
           None, [4, 1], 2.5, alibi, sinks.detach(), 0.25, seed)
    torch.library.opcheck(torch.ops.oss.attention_varlen_backward.default, bwd)
    out, lse, res = torch.ops.oss.attention_varlen(*[t.detach() for t in half], cu_q, cu_k, mq, mk,
                                                   return_residual=True)
    bwd16 = (torch.randn_like(out), *[t.detach() for t in half], out, lse, cu_q, cu_k, mq, mk, False, None,
             "bottom_right", True, res)
    torch.library.opcheck(torch.ops.oss.attention_varlen_backward.default, bwd16)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_matches_eager(device):
    """torch.compile(fullgraph=True) of a call with variants and int64
    cu_seqlens (validate is skipped while tracing): eager's values and
    gradients."""
    torch.manual_seed(10)
    q, k, v, cu_q, cu_k, mq, mk = make_packed([9, 0, 24, 1], [14, 3, 24, 6], 4, 2, 16, 16, torch.float32, device)
    cu_q, cu_k = cu_q.long(), cu_k.long()
    sinks = torch.randn(4, device=device)
    alibi = torch.rand(4, device=device)

    def f(q, k, v, sinks):
        return torch_oss.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, window_size=(6, 0), softcap=5.0,
                                          alibi_slopes=alibi, sinks=sinks)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    results = []
    for fn in (f, compiled):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        out = fn(*leaves)
        out.square().sum().backward()
        results.append([out] + [t.grad for t in leaves])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", [cuda_param("cuda")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cuda_graph_capture(device, dtype):
    """A forward captured in a CUDA graph (validate=True is skipped during the
    capture) equals eager, and replays follow new values written into the
    inputs, cu_seqlens included (same totals, lengths within max_seqlen)."""
    torch.manual_seed(11)
    lens_q, lens_k = [100, 1, 0, 250], [130, 64, 7, 250]
    q, k, v, cu_q, cu_k, _, _ = make_packed(lens_q, lens_k, 8, 2, 128, 128, dtype, device)
    with torch.no_grad():
        graph, out = capture_cuda_graph(lambda: torch_oss.attention_varlen(q, k, v, cu_q, cu_k, 300, 300,
                                                                           causal=True))
        for step, (new_q, new_k) in enumerate((([100, 1, 0, 250], [130, 64, 7, 250]),
                                               ([1, 250, 100, 0], [250, 64, 130, 7]))):
            q.copy_(torch.randn_like(q))
            k.copy_(torch.randn_like(k))
            cu_q.copy_(cumulative(new_q, device))
            cu_k.copy_(cumulative(new_k, device))
            want = torch_oss.attention_varlen(q, k, v, cu_q, cu_k, 300, 300, causal=True)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"replay {step}"
