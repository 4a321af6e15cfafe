"""Public functions with the semantics of F.softmax, F.log_softmax and
F.scaled_dot_product_attention, running on the torch.ops.oss kernels."""

import math
import warnings

import torch

__all__ = ["softmax", "log_softmax", "attention", "attention_with_lse"]

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def _legacy_softmax_dim(name, ndim, stacklevel):
    # F.softmax's rule for dim=None, kept for drop-in compatibility.
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an "
        "argument.",
        stacklevel=stacklevel,
    )
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Drop-in for torch.nn.functional.softmax (same arguments and results)."""
    if dim is None:
        dim = _legacy_softmax_dim("softmax", input.dim(), _stacklevel)
    return torch.ops.oss.softmax(input, dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """Drop-in for torch.nn.functional.log_softmax (same arguments and results)."""
    if dim is None:
        dim = _legacy_softmax_dim("log_softmax", input.dim(), _stacklevel)
    return torch.ops.oss.log_softmax(input, dim, dtype)


def _causal_bias_variant(attn_mask):
    """Maps torch.nn.attention.bias.CausalBias (PyTorch's own way of asking
    for top-left or bottom-right causal masks) to our alignment names."""
    if attn_mask is None:  # the common case, without the import below (~0.6 us per call)
        return None
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # pragma: no cover - very old torch
        return None
    if not isinstance(attn_mask, CausalBias):
        return None
    return "top_left" if attn_mask.variant == CausalVariant.UPPER_LEFT else "bottom_right"


def _check_kv_like_q(op, q, k, v):
    """k and v of q's dtype and on q's device; raises naming the argument
    (op: the messages' prefix)."""
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: {name}.dtype={t.dtype} must equal q.dtype={q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{op}: {name} is on {t.device} but q is on {q.device}")


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _check_window(window_size, op):
    """window_size as a tuple (left, right) of ints >= -1, or a ValueError naming it."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(_is_int(w) and w >= -1 for w in window_size)):
        raise ValueError(f"{op}: window_size={window_size!r} must be a pair (left, right) of ints "
                         ">= -1 (-1: unbounded on that side)")
    return tuple(window_size)


_NO_WINDOW = (-1, -1)


def _check_variants(query, window_size, softcap, alibi_slopes, sinks, deterministic, op="torch_oss.attention"):
    """Checks the score variants' arguments (types, values, dtypes, devices;
    the op checks their shapes against the heads) and returns window_size as
    a tuple. Raises naming the argument."""
    window_size = _check_window(window_size, op)
    if (not isinstance(softcap, (int, float)) or isinstance(softcap, bool) or not math.isfinite(softcap)
            or softcap < 0):
        raise ValueError(f"{op}: softcap={softcap!r} must be a finite number >= 0 (0: off)")
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor or None, got {type(t).__name__}")
        if t.device != query.device:
            raise ValueError(f"{op}: {name} is on {t.device} but query is on {query.device}")
    if alibi_slopes is not None:
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"{op}: alibi_slopes.dtype={alibi_slopes.dtype} must be torch.float32")
        if alibi_slopes.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"{op}: alibi_slopes requires grad, but gradients with respect "
                                      "to the ALiBi slopes are not supported; pass alibi_slopes.detach()")
    if sinks is not None:
        if sinks.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"{op}: sinks.dtype={sinks.dtype} must be a floating type")
        if sinks.dim() != 1:
            raise ValueError(f"{op}: sinks must have shape (heads_q,), got {tuple(sinks.shape)}")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"{op}: deterministic={deterministic!r} must be True, False or None")
    # (the op checks the shapes; a KV cache takes every variant, dropout aside)
    return window_size


def attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, *, causal_alignment="top_left", window_size=(-1, -1), softcap=0.0,
                       alibi_slopes=None, sinks=None, deterministic=None):
    """Like :func:`attention` but returns ``(out, lse)``; ``lse`` is the
    natural-log log-sum-exp of each query row's scaled, masked scores (and of
    the sink, with ``sinks``), shape ``(..., Hq, Lq)``, float32 (float64 for
    float64 inputs), ``-inf`` for a row that sees no key and has no sink.
    ``lse`` is differentiable: a loss that uses it (partial attentions merged
    by their lse, a penalty on it) gets its share of the gradients (use
    ``lse.detach()`` where lse should count as a constant)."""
    # Each check has a fast form for the common argument types (a call's host
    # time is its latency for small inputs); anything else takes the full check.
    if not (type(dropout_p) is float and 0.0 <= dropout_p <= 1.0) and (
            not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or math.isnan(dropout_p)
            or not 0.0 <= dropout_p <= 1.0):
        raise ValueError(f"torch_oss.attention: dropout_p={dropout_p!r} must be a number in [0, 1]")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(
            f"torch_oss.attention: causal_alignment={causal_alignment!r} must be one of {CAUSAL_ALIGNMENTS}"
        )
    variant = _causal_bias_variant(attn_mask)
    if variant is not None:
        attn_mask, is_causal, causal_alignment = None, True, variant
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale)):
        raise ValueError(f"torch_oss.attention: scale={scale} must be a finite number or None")

    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"torch_oss.attention: {name} must be a Tensor, got {type(t).__name__}")
    if not (type(window_size) is tuple and window_size == _NO_WINDOW and type(softcap) is float and softcap == 0.0
            and alibi_slopes is None and sinks is None and deterministic is None):
        window_size = _check_variants(query, window_size, softcap, alibi_slopes, sinks, deterministic)
    variants = (window_size, softcap, alibi_slopes, sinks, deterministic, float(dropout_p),
                _dropout_seed(query.device) if dropout_p > 0 else None)
    ranks = (query.dim(), key.dim(), value.dim())
    if ranks == (3, 3, 3) and query.shape[0] == key.shape[0] == value.shape[0]:
        # (N, L, E): one head. A 3-D mask (N, L, S) gets the head dim too.
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)
        out, lse = _attention_op(
            query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1), attn_mask, is_causal, scale, enable_gqa,
            causal_alignment, *variants,
        )
        return out.squeeze(1), lse.squeeze(1)
    heads = {query.shape[1], key.shape[1], value.shape[1]} if ranks == (4, 4, 4) else set()
    head_broadcast = not enable_gqa and len(heads) > 1 and 1 in heads  # SDPA stretches a single head
    if ranks == (4, 4, 4) and query.shape[0] == key.shape[0] == value.shape[0] and not head_broadcast:
        return _attention_op(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment, *variants)
    return _attention_broadcast(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                                *variants)


def _dropout_seed(device):
    """A fresh dropout seed drawn from torch's generator of `device`, so dropout
    follows torch.manual_seed and, on CUDA, stays on the device (no
    synchronisation; a CUDA graph replays with a new seed each time). The op
    reads its 64 bits; the backward reuses it, so the same weights drop."""
    return torch.randint(-2**63, 2**63 - 1, (1,), dtype=torch.int64, device=device)


def _broadcast_plan(query, key, value, enable_gqa):
    """The shapes SDPA's broadcasting gives (query, key, value): the common rank
    (at least 3), the broadcast leading dims before the head dim, and the query
    and key/value head counts. Raises ValueError naming what does not fit."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() < 2:
            raise ValueError(f"torch_oss.attention: {name} must have at least 2 dims (seq_len, head_dim), "
                             f"got {t.dim()}-D")
    rank = max(query.dim(), key.dim(), value.dim(), 3)
    shapes = [(1,) * (rank - t.dim()) + tuple(t.shape) for t in (query, key, value)]
    try:
        batch = torch.broadcast_shapes(*(sh[:-3] for sh in shapes))
        if enable_gqa:
            q_heads = shapes[0][-3]
            kv_heads = torch.broadcast_shapes(shapes[1][-3:-2], shapes[2][-3:-2])[0]
        else:
            q_heads = kv_heads = torch.broadcast_shapes(*(sh[-3:-2] for sh in shapes))[0]
    except RuntimeError:
        raise ValueError(
            f"torch_oss.attention: the leading dims of query {tuple(query.shape)}, key {tuple(key.shape)} and "
            f"value {tuple(value.shape)} do not broadcast"
        ) from None
    if q_heads % kv_heads != 0:
        raise ValueError(f"torch_oss.attention: query has {q_heads} heads, not a multiple of the {kv_heads} of "
                         "key and value (enable_gqa=True)")
    return rank, batch, q_heads, kv_heads


def _attention_broadcast(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, deterministic=None,
                         dropout_p=0.0, dropout_seed=None):
    """SDPA's general shape contract: (..., L, E) with any number of leading
    dims, broadcast between query and key/value as SDPA's math does (leading
    dims aligned from the right, size-1 dims stretched). With enable_gqa the
    head dim (-3) is not broadcast: key and value have the query's heads or a
    divisor of them. The leading dims are expanded (no copy) and folded into
    one batch dim of the 4-D op; gradients of broadcast dims are summed by
    autograd through the expand. The score variants pass through: sinks
    (heads,), alibi_slopes (heads,) or (*leading dims, heads), folded like the
    batch."""
    rank, batch, q_heads, kv_heads = _broadcast_plan(query, key, value, enable_gqa)

    def lift(t):  # prepend size-1 dims up to `rank`
        return t.reshape((1,) * (rank - t.dim()) + tuple(t.shape))

    q, k, v = lift(query), lift(key), lift(value)
    q = q.expand(*batch, q_heads, *q.shape[-2:])
    k = k.expand(*batch, kv_heads, *k.shape[-2:])
    v = v.expand(*batch, kv_heads, *v.shape[-2:])
    n = math.prod(batch)
    q4, k4, v4 = (t.reshape(n, *t.shape[-3:]) for t in (q, k, v))
    mask = attn_mask
    if isinstance(mask, torch.Tensor) and mask.dim() > 2:
        mask = lift(mask) if mask.dim() < rank else mask
        if mask.dim() > rank:
            raise ValueError(f"torch_oss.attention: attn_mask is {attn_mask.dim()}-D but the inputs broadcast "
                             f"to {rank}-D")
        try:
            mask = mask.expand(*batch, *mask.shape[-3:]).reshape(n, *mask.shape[-3:])
        except RuntimeError:
            raise ValueError(f"torch_oss.attention: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
                             f"to the inputs' leading dims {tuple(batch)}") from None
    if alibi_slopes is not None and alibi_slopes.dim() > 1:
        try:
            alibi_slopes = alibi_slopes.expand(*batch, q_heads).reshape(n, q_heads)
        except RuntimeError:
            raise ValueError(f"torch_oss.attention: alibi_slopes of shape {tuple(alibi_slopes.shape)} must be "
                             f"(heads_q,) or (*leading dims, heads_q) = {(*batch, q_heads)}") from None
    out, lse = _attention_op(q4, k4, v4, mask, is_causal, scale, enable_gqa and q_heads != kv_heads,
                             causal_alignment, window_size, softcap, alibi_slopes, sinks, deterministic, dropout_p,
                             dropout_seed)
    out, lse = out.reshape(*batch, *out.shape[1:]), lse.reshape(*batch, *lse.shape[1:])
    drop = rank - max(query.dim(), key.dim(), value.dim())  # the head dim added to 2-D inputs
    return (out.squeeze(0), lse.squeeze(0)) if drop else (out, lse)


def _attention_op(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, deterministic=None,
                  dropout_p=0.0, dropout_seed=None):
    """torch.ops.oss.attention, or, when a float16/bfloat16 backward will
    follow, torch.ops.oss.attention_with_residual: it also keeps the output's
    rounding residual, so the backward's D = rowsum(dO * O) is that of the
    unrounded output and the gradients do not carry the output's rounding
    (int8 codes of out's shape saved for the backward: torch_oss._residual)."""
    if (window_size == (-1, -1) and softcap == 0 and alibi_slopes is None and sinks is None and deterministic is None
            and dropout_p == 0):
        variants = ()  # the common call, with the schema's defaults
    else:
        variants = (list(window_size), float(softcap), alibi_slopes, sinks, deterministic, float(dropout_p),
                    dropout_seed)
    if (query.dtype in (torch.float16, torch.bfloat16) and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (query, key, value, sinks))):
        out, lse, _ = torch.ops.oss.attention_with_residual(query, key, value, attn_mask, is_causal, scale,
                                                            enable_gqa, causal_alignment, *variants)
        return out, lse
    return torch.ops.oss.attention(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                                   *variants)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              *, causal_alignment="top_left", window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
              deterministic=None):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention.

    Same arguments and result. Extras: ``is_causal`` may be combined with
    ``attn_mask``; ``causal_alignment="bottom_right"`` aligns the causal mask
    to the bottom-right corner (FlashAttention's convention, for a KV cache
    with ``Lq < Lk``), as does passing
    ``torch.nn.attention.bias.causal_lower_right(Lq, Lk)`` as ``attn_mask``.

    ``dropout_p`` > 0 drops each attention weight with that probability
    (to within 2**-17: 16 random bits per weight) and scales the kept ones
    by 1 / (1 - dropout_p), as SDPA does (pass
    ``dropout_p=p if self.training else 0.0``). The mask comes from a
    counter-based generator (Philox) seeded by one draw from torch's
    generator of the inputs' device, so it follows ``torch.manual_seed`` and
    CUDA-graph capture; it is never stored: the backward regenerates it. The
    lse is that of the weights before dropout.

    Score variants (keyword-only; CPU and CUDA, every dtype), applied to each
    score s = scale * q.k of query i and key j in this order, with d = i + off - j the distance from the diagonal that
    ``causal_alignment`` chooses (off = 0 top-left, Lk - Lq bottom-right):

    - ``softcap`` > 0: s = softcap * tanh(s / softcap) (0: off).
    - ``alibi_slopes``: float32 (Hq,) or (B, Hq); s -= slope * |d|. No gradient.
    - ``attn_mask``, then ``window_size=(left, right)``: key j is hidden when
      d > left or -d > right; -1 leaves a side unbounded (FlashAttention's
      convention; ``is_causal`` is the window's right = 0). Key tiles wholly
      outside the window are skipped.
    - then ``is_causal``.
    - ``sinks``: (Hq,), any floating dtype (the kernels hold it in float32):
      one extra logit per query head in every row's softmax denominator and
      lse, with no value. Differentiable (its gradient is returned in its
      dtype). A row that sees no key then outputs 0 with lse = the sink.

    ``deterministic``: None follows ``torch.are_deterministic_algorithms_enabled()``
    at the call; True / False overrides it for this call's backward (the CPU
    backward is always deterministic).
    """
    return attention_with_lse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                              causal_alignment=causal_alignment, window_size=window_size, softcap=softcap,
                              alibi_slopes=alibi_slopes, sinks=sinks, deterministic=deterministic)[0]
