"""Hugging Face transformers integration: ``attn_implementation="oss"``.

    import torch_oss
    torch_oss.register_transformers()          # or torch_oss.enable(), which calls it
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="oss")
    model.set_attn_implementation("oss")       # on a model that exists already

Two functions are registered under the name "oss" through transformers' public
extension points:

* ``AttentionInterface.register("oss", attention_forward)``: the attention of
  every layer of models built on the attention interface (Llama, Mistral, Qwen,
  GPT-2, BERT, ... in transformers 5). It calls torch_oss.attention on the
  module's (B, H, L, D) tensors: grouped-query attention runs on the K/V heads
  as they are (enable_gqa, no repeat_kv), the module's ``scaling`` is the
  softmax scale, padding and other masks are passed as the boolean mask.
* ``AttentionMaskInterface.register("oss", mask)``: the mask builder. Without
  it, transformers builds *no* mask at all for an unknown implementation (it
  returns None, leaving causality to the attention function), so it must be
  registered. It returns the same boolean masks as the "sdpa" builder, except
  that it returns None where the mask is exactly causal with the queries at
  the end of the keys (no padding; a fresh sequence, a decoding step with a
  DynamicCache, or a chunk of several new tokens after a cache). The attention
  function then runs ``is_causal=True, causal_alignment="bottom_right"`` (the
  FlashAttention convention), so no mask is materialised. Where sdpa would
  rely on a top-left ``is_causal`` over keys that are not all real (a
  StaticCache prefill), a mask is built instead.

Falls back to PyTorch's SDPA (same inputs, the mask made explicit) for what
torch_oss does not serve: unsupported dtypes or devices, tensor subclasses, head dims over the limit, a ``position_bias``
or mask that requires grad. Fallbacks are counted in torch_oss.fallback_stats()
under ``"transformers attn_implementation='oss'"`` and warned once per reason;
``torch_oss.enable(strict=True)`` / ``register_transformers(strict=True)``
raise instead.

The score variants models pass as keyword arguments are served by
torch_oss.attention's: ``softcap`` (Gemma 2) as ``softcap``, ``s_aux`` (the
learnable attention sinks of gpt-oss; also accepted as ``sinks``) as
``sinks``, with their gradient, and ``sliding_window`` as
``window_size=(sliding_window - 1, sliding_window - 1)`` (FlashAttention's
rule) where no mask is passed; where a mask is passed, the mask builder has
already put the window into it.

Importing this module does not import transformers; register_transformers()
does.
"""

import warnings

import torch

from . import functional as _oss
from . import patching as _patching

__all__ = ["register_transformers", "attention_forward", "mask", "NAME"]

NAME = "oss"
_FUNCTION = "transformers attn_implementation='oss'"
_SDPA = "torch.nn.functional.scaled_dot_product_attention"


def register_transformers(strict=None):
    """Registers ``attn_implementation="oss"`` with transformers (attention
    function and mask builder). Idempotent; returns the name, "oss".

    strict: if given, sets torch_oss's strict mode (raise instead of falling
    back), the same switch as ``torch_oss.enable(strict=...)``.
    """
    try:
        from transformers import AttentionInterface
    except ImportError as exc:
        raise ImportError(
            "torch_oss.register_transformers() needs transformers with AttentionInterface (transformers >= 4.48); "
            f"import failed: {exc}"
        ) from exc
    if _warn_no_attention_weights not in _patching._TRACE_TIME_HELPERS:
        _patching._TRACE_TIME_HELPERS.append(_warn_no_attention_weights)
    _patching.mark_trace_time_helpers()
    AttentionInterface.register(NAME, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        # Older transformers build the mask in each model and hand it to any
        # custom attention function as an explicit 4-D mask: nothing to add.
        pass
    else:
        AttentionMaskInterface.register(NAME, mask)
    if strict is not None:
        _patching._STRICT = bool(strict)
    return NAME


# ---------------------------------------------------------------------------
# Mask builder
# ---------------------------------------------------------------------------


def _is_tracing(t):
    try:
        from transformers.utils.import_utils import is_tracing
    except ImportError:  # pragma: no cover - older transformers
        return torch.compiler.is_compiling() or torch.jit.is_tracing()
    return is_tracing(t)


def _bottom_right_causal_is_exact(attention_mask, q_length, kv_length, q_offset, kv_offset, local_size):
    """True when the mask transformers asks for is exactly a causal mask whose
    last query sits on the last key: then is_causal with bottom-right
    alignment computes it without a mask tensor."""
    # Tensor offsets (StaticCache) and symbolic sizes: decide nothing, build the mask.
    if not all(type(v) is int for v in (q_length, kv_length, q_offset, kv_offset)):
        return False
    if q_offset - kv_offset != kv_length - q_length:
        return False  # the keys are not exactly the positions up to the last query (e.g. a StaticCache)
    if local_size is not None and kv_offset + kv_length > local_size:
        return False  # a sliding window or chunk boundary could cut into the keys
    if attention_mask is not None:
        if attention_mask.dim() != 2 or _is_tracing(attention_mask):
            return False
        if attention_mask.shape[-1] < kv_offset + kv_length:
            return False  # transformers pads a short 2-D mask with False
        padding = attention_mask[:, kv_offset:kv_offset + kv_length]
        if not bool(padding.all()):
            return False
    return True


def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
         local_size=None, allow_is_causal_skip=True, allow_is_bidirectional_skip=False, **kwargs):
    """The "oss" entry of transformers' AttentionMaskInterface: the "sdpa"
    boolean mask, or None where :func:`attention_forward` can use
    bottom-right-aligned ``is_causal`` instead (see the module docstring)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if mask_function is None:
        mask_function = causal_mask_function
    if allow_is_causal_skip and _bottom_right_causal_is_exact(attention_mask, q_length, kv_length, q_offset,
                                                               kv_offset, local_size):
        return None
    kwargs.pop("allow_torch_fix", None)  # deprecated in transformers 5.17, gone later
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False,
                     allow_is_bidirectional_skip=allow_is_bidirectional_skip, **kwargs)


# ---------------------------------------------------------------------------
# Attention function
# ---------------------------------------------------------------------------


def _unsupported_reason(query, key, value, attention_mask, dropout, position_bias, variants=()):
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
        return f"dropout={dropout!r} (not a number in [0, 1])"
    for name, t in (("query", query), ("key", key), ("value", value)):
        reason = _patching._tensor_reason(t, name)
        if reason is not None:
            return reason
    if query.dtype not in _patching._FLOAT_DTYPES:
        return f"query dtype {query.dtype}"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return "query, key and value dtypes differ"
    limit = _patching._CUDA_MAX_HEAD_DIM if query.device.type == "cuda" else _patching._MAX_HEAD_DIM
    if query.shape[-1] > limit or value.shape[-1] > limit:
        return f"head dim {max(query.shape[-1], value.shape[-1])} > {limit}"
    if query.shape[1] % key.shape[1] != 0:
        return f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key/value heads"
    for name, t in (("attention mask", attention_mask), ("position_bias", position_bias)):
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            return f"{name} requires grad (torch_oss gives no mask gradient)"
    return None


def _additive_bias(position_bias, attention_mask, dtype):
    # position_bias (T5-style, (B|1, H, Lq, Lk)) folded with the mask into one
    # additive mask, masked entries at the dtype's minimum as transformers does.
    bias = position_bias.to(dtype)
    if attention_mask is None:
        return bias
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, bias, torch.finfo(dtype).min)
    return bias + attention_mask.to(dtype)


def _torch_sdpa_fallback(query, key, value, attention_mask, dropout, scaling, is_causal, position_bias):
    """PyTorch's SDPA on the same problem, with the conventions of
    :func:`attention_forward` (bottom-right causal when no mask) made explicit."""
    Lq, Lk = query.shape[2], key.shape[2]
    if is_causal and attention_mask is None and Lq != Lk:
        i = torch.arange(Lq, device=query.device)[:, None]
        j = torch.arange(Lk, device=query.device)[None, :]
        attention_mask, is_causal = j <= i + (Lk - Lq), False
    if position_bias is not None:
        if is_causal:
            attention_mask = torch.ones(Lq, Lk, dtype=torch.bool, device=query.device).tril()
            is_causal = False
        attention_mask = _additive_bias(position_bias, attention_mask, query.dtype)
    elif attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.to(query.dtype)
    kwargs = {}
    if query.shape[1] != key.shape[1]:
        if attention_mask is None:
            kwargs["enable_gqa"] = True
        else:  # PyTorch's fused kernels take GQA only without a mask
            groups = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
    sdpa = _patching.original(_SDPA)
    return sdpa(query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
                **kwargs)


def _torch_eager_fallback(query, key, value, attention_mask, dropout, scaling, is_causal, position_bias,
                          window_size, softcap, sinks):
    """The score variants in PyTorch ops (float32 for 16-bit inputs), with the
    conventions of :func:`attention_forward` (bottom-right causal and window
    when no mask): the fallback for what SDPA cannot express (softcap, sinks)."""
    Lq, Lk = query.shape[2], key.shape[2]
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    s = (query.to(compute) @ key.to(compute).transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if position_bias is not None:
        attention_mask = _additive_bias(position_bias, attention_mask, compute)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            s = s.masked_fill(~attention_mask, float("-inf"))
        else:
            s = s + attention_mask.to(compute)
    i = torch.arange(Lq, device=query.device)[:, None]
    j = torch.arange(Lk, device=query.device)[None, :]
    d = i + (Lk - Lq) - j
    hidden = torch.zeros(Lq, Lk, dtype=torch.bool, device=query.device)
    if window_size[0] >= 0:
        hidden |= d > window_size[0]
    if window_size[1] >= 0:
        hidden |= -d > window_size[1]
    if is_causal:
        hidden |= d < 0
    s = s.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.to(compute).reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)[..., :Lk]  # a row that sees nothing: 0
    if dropout:
        p = torch.nn.functional.dropout(p, dropout)
    return (p @ value.to(compute)).to(query.dtype)


def _warn_no_attention_weights():  # marked for dynamo by register_transformers (see patching)
    global _WARNED_WEIGHTS
    if not _WARNED_WEIGHTS:
        _WARNED_WEIGHTS = True
        warnings.warn("attn_implementation='oss' returns no attention weights (output_attentions=True); use "
                      "attn_implementation='eager' for them", UserWarning, stacklevel=4)
    return True


_WARNED_WEIGHTS = False


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      position_bias=None, **kwargs):
    """The "oss" entry of transformers' AttentionInterface.

    query (B, Hq, Lq, D), key/value (B, Hkv, Lk, D); attention_mask None, a
    boolean mask (True = attend) or an additive float mask broadcastable to
    (B, Hq, Lq, Lk). Returns (output (B, Lq, Hq, Dv), None).
    """
    softcap = kwargs.get("softcap") or 0.0
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    sliding_window = kwargs.get("sliding_window")
    if kwargs.get("output_attentions", False):
        _warn_no_attention_weights()
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # No mask + causal module: the mask builder guarantees the queries are the
    # last keys, which is FlashAttention's bottom-right alignment.
    is_causal = bool(is_causal) and attention_mask is None
    # FlashAttention's window for HF's sliding_window (keys i - sliding_window < j),
    # needed only without a mask: a mask from the mask builder holds the window already
    window_size = (-1, -1)
    if sliding_window is not None and attention_mask is None:
        window_size = (int(sliding_window) - 1, int(sliding_window) - 1)
    variants = [name for name, used in (("sliding_window", window_size != (-1, -1)), ("softcap", softcap != 0),
                                        ("s_aux", sinks is not None)) if used]

    reason = _unsupported_reason(query, key, value, attention_mask, dropout, position_bias, variants)
    if reason is not None:
        _patching._note_fallback(_FUNCTION, reason, stacklevel=3)
        if variants:
            out = _torch_eager_fallback(query, key, value, attention_mask, dropout, scaling, is_causal,
                                        position_bias, window_size, softcap, sinks)
        else:
            out = _torch_sdpa_fallback(query, key, value, attention_mask, dropout, scaling, is_causal, position_bias)
        return out.transpose(1, 2).contiguous(), None

    if position_bias is not None:
        attention_mask = _additive_bias(position_bias, attention_mask, query.dtype)
    elif attention_mask is not None and attention_mask.dtype not in (torch.bool, query.dtype, torch.float32):
        attention_mask = attention_mask.to(query.dtype)
    query, key, value, attention_mask = _patching.autocast_attention_inputs(query, key, value, attention_mask)
    out = _oss.attention(query, key, value, attn_mask=attention_mask, dropout_p=float(dropout), is_causal=is_causal,
                         scale=scaling, enable_gqa=query.shape[1] != key.shape[1], causal_alignment="bottom_right",
                         window_size=window_size, softcap=float(softcap), sinks=sinks)
    return out.transpose(1, 2).contiguous(), None
