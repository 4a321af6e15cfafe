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
  softmax scale, masks are passed as the boolean mask (but for packed and
  padded batches, below).
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
torch_oss does not serve: unsupported dtypes or devices, tensor subclasses,
head dims over the limit, a ``position_bias`` or mask that requires grad. Fallbacks are counted in torch_oss.fallback_stats()
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

Packed sequences (several documents in one row, as ``DataCollatorWithFlattening``
makes them) and padded batches (a 2-D ``attention_mask`` without a cache) run
torch_oss.attention_varlen on the real tokens, with no dense mask: see
:func:`attention_forward` for when, and for the rule that keeps other masks on
the dense path.

Importing this module does not import transformers; register_transformers()
does.
"""

import warnings
import weakref

import torch

from . import functional as _oss
from . import patching as _patching
from . import varlen as _varlen

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
    out = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                    kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                    local_size=local_size, allow_is_causal_skip=False,
                    allow_is_bidirectional_skip=allow_is_bidirectional_skip, **kwargs)
    if out is not None and not kwargs.get("use_vmap", False) and _is_zero(q_offset) and _is_zero(kv_offset) \
            and q_length == kv_length:
        if attention_mask is None:
            # See _MASK_KIND: a mask without a padding mask, without a custom
            # (vmap) mask function and without cache offsets; "packed" where
            # transformers refused the causal skip, as it does for packed
            # position_ids.
            setattr(out, _MASK_KIND, "unpadded" if allow_is_causal_skip else "packed")
        elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 \
                and attention_mask.shape[-1] >= kv_length and not _is_tracing(attention_mask):
            # a padding mask over the queries' own keys (no cache): the
            # attention may run the real tokens alone (_padded_from_mask)
            setattr(out, _MASK_KIND, "padded")
            setattr(out, _PADDING, attention_mask)
    return out


def _is_zero(v):
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool) and v == 0


# ---------------------------------------------------------------------------
# Packed sequences
# ---------------------------------------------------------------------------

# The attribute the mask builder sets on a mask it built without a 2-D padding
# mask (attention_mask=None), without a custom mask function (use_vmap) and
# without cache offsets: "unpadded", or "packed" where transformers also
# refused the is_causal skip, which is what create_causal_mask does for packed
# position_ids (find_packed_sequence_indices found a restart). A mask without
# it (a 4-D mask of the user's, a slice of a mask, the masks of older
# transformers) never leaves the dense path. "padded": a mask built from a
# 2-D padding mask (kept under _PADDING), without a custom mask function and
# without cache offsets (see _padded_from_mask).
_MASK_KIND = "_torch_oss_mask_kind"
_PADDING = "_torch_oss_padding_mask"

# Rows of the mask compared per step when checking a packed mask (bounds the
# temporaries at this many elements).
_CHECK_CHUNK = 1 << 24


class _TensorKeyedCache:
    """A few results keyed by a tensor object, held weakly (a dead or another
    object never matches), and its version counter (an in-place change never
    matches; inference tensors have none)."""

    def __init__(self, size=4):
        self._size = size
        self._entries = []

    @staticmethod
    def _version(t):
        try:
            return t._version
        except RuntimeError:  # an inference tensor
            return None

    def get(self, tensor, extra):
        for ref, version, ext, value in self._entries:
            if ref() is tensor and ext == extra and self._version(tensor) == version:
                return True, value
        return False, None

    def put(self, tensor, extra, value):
        entry = (weakref.ref(tensor), self._version(tensor), extra, value)
        self._entries = [entry] + self._entries[:self._size - 1]

    def clear(self):
        self._entries = []


_PACKED_CACHE = _TensorKeyedCache()
_PADDED_CACHE = _TensorKeyedCache()
_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _packed_from_position_ids(query, key, attention_mask, position_ids, sliding_window):
    """(cu_seqlens, max_seqlen) for a packed batch recognised from
    position_ids, or None.

    Taken only where the mask is the one the mask builder made for packed
    position_ids (_MASK_KIND "packed": no padding mask, no cache, no custom
    mask function) and, checked on the device, equals exactly what
    attention_varlen computes: within each row, the documents are the runs of
    position_ids that rise by 1 (transformers' find_packed_sequence_indices),
    and the mask is causal within a document and empty across documents
    (with the layer's sliding window). So a padding mask, a cache (transformers
    then builds no packed mask), an overlay such as bidirectional image
    blocks, or any other mask keeps the dense path, and where this is taken
    the result is the dense mask's. One host synchronisation per forward (the
    result is cached for the mask object, which transformers builds once per
    forward and hands to every layer of its kind); not while tracing
    (torch.compile, torch.export, jit, CUDA-graph capture), where the dense path runs.
    """
    if not isinstance(position_ids, torch.Tensor) or not isinstance(attention_mask, torch.Tensor):
        return None
    if getattr(attention_mask, _MASK_KIND, None) != "packed" or attention_mask.dtype != torch.bool:
        return None
    if _is_tracing(query) or _is_tracing(attention_mask) or _is_tracing(position_ids):
        return None
    B, _, L, _ = query.shape
    if L < 2 or key.shape[2] != L or attention_mask.dim() != 4 or attention_mask.shape[-2:] != (L, L) \
            or attention_mask.shape[0] not in (1, B) or attention_mask.device != query.device:
        return None
    if position_ids.dim() != 2 or position_ids.shape[-1] != L or position_ids.shape[0] not in (1, B) \
            or position_ids.dtype not in _INDEX_DTYPES:
        return None
    window = None if sliding_window is None else int(sliding_window)
    # Keyed by the mask alone: once checked, the documents are a function of
    # the mask's content, whatever position_ids a later layer passes.
    extra = (B, window, query.device)
    hit, value = _PACKED_CACHE.get(attention_mask, extra)
    if hit:
        return value
    value = _derive_packed(attention_mask, position_ids, B, L, window, query.device)
    _PACKED_CACHE.put(attention_mask, extra, value)
    return value


def _derive_packed(attention_mask, position_ids, B, L, window, device):
    pos = position_ids.to(device)
    if pos.shape[0] != B:
        pos = pos.expand(B, L)
    starts = torch.ones(B, L, dtype=torch.bool, device=device)
    starts[:, 1:] = (pos[:, 1:] - pos[:, :-1]) != 1
    doc = starts.cumsum(-1)
    idx = torch.arange(L, device=device)
    ok = torch.ones((), dtype=torch.bool, device=device)
    rows = max(1, _CHECK_CHUNK // (B * L))
    for r0 in range(0, L, rows):
        i = idx[r0:r0 + rows, None]
        want = (idx[None, :] <= i) & (doc[:, r0:r0 + rows, None] == doc[:, None, :])
        if window is not None:
            want &= idx[None, :] > i - window
        ok &= (attention_mask[..., r0:r0 + rows, :] == want[:, None]).all()
    host = torch.cat([ok.view(1), starts.view(-1)]).cpu()  # the one synchronisation
    if not bool(host[0]):
        return None
    begins = host[1:].nonzero().view(-1)
    cu = torch.cat([begins, begins.new_tensor([B * L])])
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    return cu.to(device=device, dtype=torch.int32, non_blocking=True), max_seqlen


def _padded_from_mask(query, key, attention_mask, causal, sliding_window):
    """(indices, cu_seqlens, max_seqlen) of the real tokens of a padded
    batch, or None.

    Taken only where the mask is one the mask builder made from a 2-D padding
    mask (_MASK_KIND "padded": no cache, no custom mask function) and,
    checked on the device, every real query's row of it equals exactly what
    attention_varlen computes over the row's real tokens taken in order: the
    real keys, causal or not as the module is, within the layer's sliding
    window (counted over real tokens; a window on a non-causal module keeps
    the dense path). A padding query's row is not compared: attention_varlen
    gives those positions output 0 (FlashAttention's convention), where the
    dense mask lets a padding query after the real tokens (right padding, or
    any padding of a bidirectional model) attend to them; a padding query
    before them (left padding, causal) sees no key and gets 0 either way.
    One host synchronisation per forward (the result is cached for the mask
    object, which transformers builds once per forward and hands to every
    layer); not while tracing, where the dense path runs.
    """
    padding = getattr(attention_mask, _PADDING, None)
    if getattr(attention_mask, _MASK_KIND, None) != "padded" or not isinstance(padding, torch.Tensor) \
            or attention_mask.dtype != torch.bool:
        return None
    if _is_tracing(query) or _is_tracing(attention_mask):
        return None
    B, _, L, _ = query.shape
    if L < 1 or key.shape[2] != L or attention_mask.dim() != 4 or attention_mask.shape[1] != 1 \
            or attention_mask.shape[-2:] != (L, L) or attention_mask.shape[0] not in (1, B) \
            or attention_mask.device != query.device:
        return None
    if padding.dim() != 2 or padding.shape[0] != B or padding.shape[1] < L:
        return None
    window = None if sliding_window is None else int(sliding_window)
    if window is not None and not causal:
        return None
    extra = (B, L, bool(causal), window, query.device)
    hit, value = _PADDED_CACHE.get(attention_mask, extra)
    if hit:
        return value
    value = _derive_padded(attention_mask, padding[:, :L].to(device=query.device, dtype=torch.bool), causal, window)
    _PADDED_CACHE.put(attention_mask, extra, value)
    return value


def _derive_padded(attention_mask, real, causal, window):
    B, L = real.shape
    pos = real.to(torch.int64).cumsum(-1)  # a real token's place among its row's real tokens, plus 1
    ok = torch.ones((), dtype=torch.bool, device=real.device)
    rows = max(1, _CHECK_CHUNK // (B * L))
    for r0 in range(0, L, rows):
        pi, pj = pos[:, r0:r0 + rows, None], pos[:, None, :]
        want = real[:, None, :] & ((pj <= pi) if causal else True)
        if window is not None:
            want = want & (pj > pi - window)
        got = attention_mask[:, 0, r0:r0 + rows, :]
        ok &= ((got == want) | ~real[:, r0:r0 + rows, None]).all()
    host = torch.cat([ok.view(1), real.reshape(-1)]).cpu()  # the one synchronisation
    if not bool(host[0]):
        return None
    real_h = host[1:].view(B, L)
    lengths = real_h.sum(-1)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    indices = real_h.reshape(-1).nonzero().view(-1)
    return (indices.to(real.device, non_blocking=True), cu.to(real.device, non_blocking=True),
            int(lengths.max()) if B else 0)


def _varlen_kwargs(query, key, attention_mask, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) from
    the FlashAttention kwargs (cu_seq_lens_q, cu_seq_lens_k, max_length_q,
    max_length_k: all four, as transformers' flash-attention path requires),
    or None.

    Used as given, without a host synchronisation, for one row (query batch
    1) whose mask is None (transformers saw a plain causal batch) or one the
    mask builder made without a padding mask (_MASK_KIND). A padding mask or
    a mask of the user's keeps the dense path: it is what the "sdpa" and
    "eager" implementations, which ignore these kwargs, compute.

    Their values are checked only where that needs no device synchronisation:
    cu_seq_lens on the CPU are checked here (and copied to a CUDA query's
    device); on the device they are not (attention_varlen's contract: bad
    values cannot make it read or write outside the tensors, but give
    undefined outputs). A max_length given as a device tensor is replaced by
    the row's length, a valid bound."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    cu_q, cu_k, max_q, max_k = (kwargs.get(n) for n in names)
    if not (isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor)) or max_q is None or max_k is None:
        return None
    # one row, self-attention over the same tokens (no cached keys; a
    # cross-attention call, whose keys are another sequence, gets the same
    # kwargs in an encoder-decoder)
    if query.shape[0] != 1 or query.shape[2] != key.shape[2] or cu_q.shape != cu_k.shape:
        return None
    if attention_mask is not None and getattr(attention_mask, _MASK_KIND, None) not in ("unpadded", "packed"):
        return None
    total_q, total_k = query.shape[2], key.shape[2]
    max_q, max_k = _max_length(max_q, total_q), _max_length(max_k, total_k)
    out = []
    for name, cu, total, bound in (("cu_seq_lens_q", cu_q, total_q, max_q), ("cu_seq_lens_k", cu_k, total_k, max_k)):
        if cu.device.type == "cpu" and cu.dim() == 1 and cu.numel() >= 1 and cu.dtype in (torch.int32, torch.int64) \
                and not _is_tracing(cu) and not _is_tracing(query):
            _check_cu_values(name, cu, total, bound)
        if cu.device != query.device:
            cu = cu.to(query.device, non_blocking=True)
        out.append(cu)
    return out[0], out[1], max_q, max_k


def _max_length(n, total):
    if isinstance(n, torch.Tensor):
        if n.numel() != 1 or n.device.type != "cpu" or _is_tracing(n):
            return total
        n = n.item()
    return n if isinstance(n, torch.SymInt) else int(n)


def _check_cu_values(name, cu, total, bound):
    values = cu.tolist()
    lengths = [b - a for a, b in zip(values, values[1:])]
    if values[0] != 0 or values[-1] != total or any(n < 0 for n in lengths) \
            or (lengths and not isinstance(bound, torch.SymInt) and max(lengths) > bound):
        raise ValueError(f"attn_implementation='oss': {name}={values} must start at 0, never decrease, end at the "
                         f"sequence length ({total}) and hold no sequence longer than its max_length ({bound})")


def _varlen_dense_mask(cu_q, cu_k, total_q, total_k, causal, window_size, device):
    """The boolean (1, 1, total_q, total_k) mask of what attention_varlen
    computes with these cu_seqlens (bottom-right causal within each
    sequence), for the fallback of a packed call."""
    cu_q, cu_k = cu_q.to(device=device, dtype=torch.long), cu_k.to(device=device, dtype=torch.long)
    last = cu_q.shape[0] - 2
    i, j = torch.arange(total_q, device=device), torch.arange(total_k, device=device)
    sq = torch.searchsorted(cu_q[1:], i, right=True).clamp(max=max(last, 0))
    sk = torch.searchsorted(cu_k[1:], j, right=True)
    # distance of key j behind query i in the query's sequence (bottom-right aligned)
    d = (i - cu_q[sq] + (cu_k[sq + 1] - cu_k[sq]) - (cu_q[sq + 1] - cu_q[sq]))[:, None] - (j - cu_k[sk.clamp(
        max=max(last, 0))])[None, :]
    vis = sq[:, None] == sk[None, :]
    if causal:
        vis &= d >= 0
    if window_size[0] >= 0:
        vis &= d <= window_size[0]
    if window_size[1] >= 0:
        vis &= -d <= window_size[1]
    return vis[None, None]


def _packed_attention(query, key, value, cu_q, cu_k, max_q, max_k, causal, dropout, scaling, window_size, softcap,
                      sinks, validate, indices=None):
    """attention_varlen on the (B, H, L, D) tensors flattened to one packed
    row of B * L tokens, or, with indices, on those of the B * L positions
    alone (a padded batch's real tokens, gathered, their outputs scattered
    back); returns (B, L, Hq, Dv) like attention_forward, 0 at the positions
    indices leaves out."""
    B, Hq, Lq, D = query.shape
    q, k, v = (t.transpose(1, 2).reshape(B * t.shape[2], t.shape[1], t.shape[3]) for t in (query, key, value))
    if indices is not None:
        q, k, v = (t.index_select(0, indices) for t in (q, k, v))
    q, k, v, _ = _patching.autocast_attention_inputs(q, k, v, None)
    out = _varlen.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, softmax_scale=scaling,
                                   causal_alignment="bottom_right", window_size=window_size, softcap=float(softcap),
                                   sinks=sinks, dropout_p=float(dropout), validate=validate)
    if indices is not None:
        out = out.new_zeros(B * Lq, Hq, out.shape[-1]).index_copy(0, indices, out)
    return out.view(B, Lq, Hq, out.shape[-1])


def _no_cross_attention(module):
    """True where the module's model has no cross-attention (its config says
    neither encoder-decoder nor add_cross_attention). A bidirectional padded
    mask of a cross-attention call whose two sequences have one length looks
    like a self-attention's, but its padding is the keys' alone; causal
    modules are never cross-attention."""
    cfg = getattr(module, "config", None)
    return cfg is not None and getattr(cfg, "is_encoder_decoder", True) is False \
        and not getattr(cfg, "add_cross_attention", False)


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
    limit = _patching._CUDA_MAX_HEAD_DIM if query.is_cuda else _patching._MAX_HEAD_DIM
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

    Packed sequences run torch_oss.attention_varlen instead, in two cases:

    * the FlashAttention kwargs ``cu_seq_lens_q``, ``cu_seq_lens_k``,
      ``max_length_q``, ``max_length_k`` (``DataCollatorWithFlattening(
      return_flash_attn_kwargs=True)``) on a query batch of 1, with no mask or
      a mask the mask builder made without a padding mask: used as given, no
      host synchronisation (see _varlen_kwargs);
    * ``position_ids`` whose documents transformers found (it then builds a
      block-diagonal causal mask; only without a padding mask and without a
      cache): the documents are read from position_ids with one host
      synchronisation per forward, after checking that the mask is exactly
      that block-diagonal mask (see _packed_from_position_ids).

    Either way the dense mask is not read by the kernel, the module's
    scaling, dropout, softcap, sinks and sliding window apply within each
    document, and grouped-query attention runs on the K/V heads as they are.

    A padded batch (the mask builder's mask from a 2-D padding mask, no
    cache) runs attention_varlen on its real tokens, gathered from the
    (B, H, L, D) tensors and scattered back, after checking on the device
    that the mask is exactly the causal (or, for a bidirectional module of a
    model without cross-attention, full) mask over each row's real tokens,
    with the sliding window if any; one host synchronisation per forward
    (see _padded_from_mask). Padding positions get output 0 there, as with
    FlashAttention.

    A cache or a custom mask keeps the dense path.
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
    module_causal = bool(is_causal)
    packed_window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, int(sliding_window) - 1)

    packed = _varlen_kwargs(query, key, attention_mask, kwargs) if position_bias is None else None
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        reason = _unsupported_reason(query, key, value, None, dropout, None)
        if reason is None:
            out = _packed_attention(query, key, value, cu_q, cu_k, max_q, max_k, module_causal, dropout, scaling,
                                    packed_window, softcap, sinks, validate=False)
            return out, None
        # the dense fallback of the same problem: one row, the documents as its mask
        _patching._note_fallback(_FUNCTION, reason, stacklevel=3)
        B, Hq, Lq, D = query.shape
        dense = _varlen_dense_mask(cu_q, cu_k, B * Lq, B * key.shape[2], module_causal, packed_window, query.device)
        if softcap or sinks is not None:
            out = _torch_eager_fallback(query, key, value, dense, dropout, scaling, False, None, (-1, -1), softcap,
                                        sinks)
        else:
            out = _torch_sdpa_fallback(query, key, value, dense, dropout, scaling, False, None)
        return out.transpose(1, 2).contiguous(), None

    # No mask + causal module: the mask builder guarantees the queries are the
    # last keys, which is FlashAttention's bottom-right alignment.
    is_causal = module_causal and attention_mask is None
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

    if module_causal and attention_mask is not None and position_bias is None:
        packed = _packed_from_position_ids(query, key, attention_mask, kwargs.get("position_ids"), sliding_window)
        if packed is not None:
            cu, max_seqlen = packed
            out = _packed_attention(query, key, value, cu, cu, max_seqlen, max_seqlen, True, dropout, scaling,
                                    packed_window, softcap, sinks, validate=False)
            return out, None

    if attention_mask is not None and position_bias is None and (module_causal or _no_cross_attention(module)):
        padded = _padded_from_mask(query, key, attention_mask, module_causal, sliding_window)
        if padded is not None:
            indices, cu, max_seqlen = padded
            out = _packed_attention(query, key, value, cu, cu, max_seqlen, max_seqlen, module_causal, dropout,
                                    scaling, packed_window, softcap, sinks, validate=False, indices=indices)
            return out, None

    if position_bias is not None:
        attention_mask = _additive_bias(position_bias, attention_mask, query.dtype)
    elif attention_mask is not None and attention_mask.dtype not in (torch.bool, query.dtype, torch.float32):
        attention_mask = attention_mask.to(query.dtype)
    query, key, value, attention_mask = _patching.autocast_attention_inputs(query, key, value, attention_mask)
    out = _oss.attention(query, key, value, attn_mask=attention_mask, dropout_p=float(dropout), is_causal=is_causal,
                         scale=scaling, enable_gqa=query.shape[1] != key.shape[1], causal_alignment="bottom_right",
                         window_size=window_size, softcap=float(softcap), sinks=sinks)
    return out.transpose(1, 2).contiguous(), None
