"""Attention over variable-length (packed) batches, in FlashAttention's
``flash_attn_varlen_func`` conventions: the sequences of a batch are stored
one after another along the first dim, and ``cu_seqlens`` says where each
begins, so no padding is stored or computed."""

import math

import torch

from .functional import CAUSAL_ALIGNMENTS, _check_kv_like_q, _check_variants, _dropout_seed, _is_int

__all__ = ["attention_varlen"]

_OP = "torch_oss.attention_varlen"
_HALF = (torch.float16, torch.bfloat16)
_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _is_length(x):
    return (_is_int(x) or isinstance(x, torch.SymInt)) and x >= 0


def _check_cu_seqlens(name, cu, q):
    """cu_seqlens as a contiguous int32 tensor on q's device; TypeError /
    ValueError naming `name` otherwise."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{_OP}: {name} must be a Tensor, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{_OP}: {name}.dtype={cu.dtype} must be torch.int32 or torch.int64")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{_OP}: {name} must have shape (batch + 1,), got {tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{_OP}: {name} is on {cu.device} but q is on {q.device}")
    return cu


def _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                  causal_alignment, dropout_p):
    """The types, shapes, dtypes and devices of the arguments (no values of
    device tensors); raises naming the argument."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_OP}: {name} must be a Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{_OP}: {name} must be 3-D (total_rows, heads, head_dim), got shape {tuple(t.shape)}")
    if q.dtype not in _FLOAT:
        raise TypeError(f"{_OP}: q.dtype={q.dtype} must be float16, bfloat16, float32 or float64")
    _check_kv_like_q(_OP, q, k, v)
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{_OP}: k.size(2)={k.shape[2]} (head_dim) must equal q.size(2)={q.shape[2]}")
    if v.shape[0] != k.shape[0] or v.shape[1] != k.shape[1]:
        raise ValueError(f"{_OP}: v has shape {tuple(v.shape)} but k has {tuple(k.shape)}: they must have the same "
                         "rows (total_k) and heads (heads_kv)")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"{_OP}: q has {q.shape[1]} heads, not a multiple of the {k.shape[1]} heads of k and v")
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q)
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"{_OP}: cu_seqlens_q has {cu_seqlens_q.shape[0]} entries but cu_seqlens_k has "
                         f"{cu_seqlens_k.shape[0]}: both must be (batch + 1,) for the same batch")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not _is_length(n):
            raise ValueError(f"{_OP}: {name}={n!r} must be an int >= 0")
    if not isinstance(causal, bool):
        raise TypeError(f"{_OP}: causal={causal!r} must be True or False")
    if softmax_scale is not None and (not isinstance(softmax_scale, (int, float)) or isinstance(softmax_scale, bool)
                                      or not math.isfinite(softmax_scale)):
        raise ValueError(f"{_OP}: softmax_scale={softmax_scale!r} must be a finite number or None")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"{_OP}: causal_alignment={causal_alignment!r} must be one of {CAUSAL_ALIGNMENTS}")
    if (not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or math.isnan(dropout_p)
            or not 0.0 <= dropout_p <= 1.0):
        raise ValueError(f"{_OP}: dropout_p={dropout_p!r} must be a number in [0, 1]")


def _check_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    """The checks that read cu_seqlens' values, with one host synchronisation:
    each starts at 0, never decreases, ends at the packed tensor's rows, and
    no sequence is longer than its max_seqlen. Raises ValueError naming the
    argument and the sequence."""
    stats = []
    for cu in (cu_seqlens_q, cu_seqlens_k):
        c = cu.long()
        lengths = c[1:] - c[:-1]
        if lengths.numel() == 0:  # batch 0: nothing to take a min or max of
            lengths = c.new_zeros(1)
        low, high = lengths.argmin(), lengths.argmax()
        stats += [c[0], c[-1], low, lengths[low], high, lengths[high]]
    values = torch.stack(stats).tolist()
    for i, (name, total, bound, rows) in enumerate((("cu_seqlens_q", total_q, max_seqlen_q, "q"),
                                                    ("cu_seqlens_k", total_k, max_seqlen_k, "k"))):
        first, last, low, shortest, high, longest = values[6 * i:6 * i + 6]
        if first != 0:
            raise ValueError(f"{_OP}: {name}[0]={first} must be 0")
        if shortest < 0:
            raise ValueError(f"{_OP}: {name} must be nondecreasing, but {name}[{low + 1}] < {name}[{low}] "
                             f"(sequence {low} has length {shortest})")
        if last != total:
            raise ValueError(f"{_OP}: {name}[-1]={last} must equal the rows of {rows} ({total})")
        if longest > bound:
            raise ValueError(f"{_OP}: sequence {high} has {longest} rows of {rows} (from {name}), more than "
                             f"max_seqlen_{rows}={bound}")


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                     softmax_scale=None, return_lse=False, *, causal_alignment="bottom_right", window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, deterministic=None, validate=True):
    """Attention over a batch of sequences of different lengths packed without
    padding, FlashAttention's ``flash_attn_varlen_func`` layout and rules.

    q: ``(total_q, heads_q, head_dim)``; k: ``(total_k, heads_kv, head_dim)``;
    v: ``(total_k, heads_kv, head_dim_v)``; the last dim unit-stride, other
    strides free (views into a packed QKV tensor need no copy); heads_q a
    multiple of heads_kv (GQA/MQA). cu_seqlens_q / cu_seqlens_k:
    ``(batch + 1,)`` int32 or int64 on the inputs' device, the cumulative
    lengths: sequence b is query rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1``
    and key rows ``cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1``; each sequence
    attends only to its own keys. max_seqlen_q / max_seqlen_k (ints): bounds
    on every sequence's lengths.

    causal: each sequence's causal mask, aligned as ``causal_alignment``
    says: ``"bottom_right"`` (FlashAttention's varlen convention: query i
    sees key j iff j <= i + len_k - len_q) or ``"top_left"`` (j <= i).
    softmax_scale: default ``head_dim ** -0.5``. The score variants
    (``window_size``, ``softcap``, ``alibi_slopes`` ``(heads_q,)`` or
    ``(batch, heads_q)``, ``sinks``), ``dropout_p`` and ``deterministic``
    mean what they mean for :func:`torch_oss.attention`, with distances
    measured within each sequence (and dropout's batch index the sequence's).

    Returns out ``(total_q, heads_q, head_dim_v)`` in q's dtype, and with
    ``return_lse`` also lse ``(heads_q, total_q)``, float32 (float64 for
    float64 inputs), natural log, -inf for a row that sees no key (its output
    is 0). Differentiable in q, k, v and sinks, through out and lse (lse's gradient
    as for :func:`torch_oss.attention_with_lse`).

    validate: check cu_seqlens' values (start at 0, nondecreasing, last entry
    the rows of q / k, no length above max_seqlen) and raise ValueError
    otherwise. That costs one host synchronisation, so it is skipped during
    CUDA-graph capture and under torch.compile; pass False where the values
    are known good. Unchecked bad values cannot make the kernels read or write
    outside the packed tensors, but give undefined outputs (on the CPU the
    kernels check them and raise ValueError anyway).
    """
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                  causal_alignment, dropout_p)
    window_size = _check_variants(q, window_size, softcap, alibi_slopes, sinks, deterministic, op=_OP)
    if validate and not torch.compiler.is_compiling() and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        _check_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    cu_q = cu_seqlens_q.to(torch.int32).contiguous()
    cu_k = cu_seqlens_k.to(torch.int32).contiguous()
    seed = _dropout_seed(q.device) if dropout_p > 0 else None
    differentiate = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    # with a backward to follow, 16-bit calls keep out's rounding residual for it
    return_residual = differentiate and q.dtype in _HALF
    scale = None if softmax_scale is None else float(softmax_scale)
    out, lse, _ = torch.ops.oss.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                                 causal_alignment, list(window_size), float(softcap), alibi_slopes,
                                                 sinks, deterministic, float(dropout_p), seed, return_residual)
    return (out, lse) if return_lse else out
