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


def attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, *, causal_alignment="top_left"):
    """Like :func:`attention` but returns ``(out, lse)``; ``lse`` is the
    natural-log log-sum-exp of each query row's scaled, masked scores, shape
    ``(..., Hq, Lq)``, float32 (float64 for float64 inputs), ``-inf`` for a row
    that sees no key. ``lse`` carries no gradient."""
    if not isinstance(dropout_p, (int, float)) or math.isnan(dropout_p) or not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"torch_oss.attention: dropout_p={dropout_p} must be a number in [0, 1]")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"torch_oss.attention: dropout_p={dropout_p} is not supported yet; pass dropout_p=0.0 "
            "(e.g. dropout_p=p if self.training else 0.0 in eval) or use F.scaled_dot_product_attention"
        )
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
    ranks = (query.dim(), key.dim(), value.dim())
    if ranks == (3, 3, 3):
        # (N, L, E): one head. A 3-D mask (N, L, S) gets the head dim too.
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)
        out, lse = _attention_op(
            query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1), attn_mask, is_causal, scale, enable_gqa,
            causal_alignment,
        )
        return out.squeeze(1), lse.squeeze(1)
    if ranks != (4, 4, 4):
        raise ValueError(
            f"torch_oss.attention: query, key and value must all be 4-D (batch, heads, seq_len, head_dim) or "
            f"all 3-D (batch, seq_len, head_dim); got {query.dim()}-D, {key.dim()}-D and {value.dim()}-D"
        )
    return _attention_op(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment)


def _attention_op(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment):
    """torch.ops.oss.attention, or, when a float16/bfloat16 backward will
    follow, torch.ops.oss.attention_with_residual: it also keeps the output's
    rounding residual, so the backward's D = rowsum(dO * O) is that of the
    unrounded output and the gradients do not carry the output's rounding
    (one more output-sized tensor saved for the backward)."""
    if (query.dtype in (torch.float16, torch.bfloat16) and torch.is_grad_enabled()
            and any(t.requires_grad for t in (query, key, value))):
        out, lse, _ = torch.ops.oss.attention_with_residual(query, key, value, attn_mask, is_causal, scale,
                                                            enable_gqa, causal_alignment)
        return out, lse
    return torch.ops.oss.attention(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              *, causal_alignment="top_left"):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention.

    Same arguments and result. Extras: ``is_causal`` may be combined with
    ``attn_mask``; ``causal_alignment="bottom_right"`` aligns the causal mask
    to the bottom-right corner (FlashAttention's convention, for a KV cache
    with ``Lq < Lk``), as does passing
    ``torch.nn.attention.bias.causal_lower_right(Lq, Lk)`` as ``attn_mask``.
    ``dropout_p`` must be 0.
    """
    return attention_with_lse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                              causal_alignment=causal_alignment)[0]
