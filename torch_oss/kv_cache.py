"""Attention over a KV cache, in FlashAttention's conventions, for serving:
new keys and values are written into a contiguous or paged cache in place,
then the queries attend to each sequence's cached keys."""

import torch

__all__ = ["attention_with_kvcache"]


def _cache_value_checks(k_cache, k, cache_seqlens, block_table):
    """The checks that read device values (one host synchronisation): each
    length plus the new tokens fits the cache, and every page a sequence uses
    exists. Raises ValueError naming the argument."""
    paged = block_table is not None
    new = 0 if k is None else k.shape[1]
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    checks = []
    if cache_seqlens is not None:
        lengths = cache_seqlens.long() + new
        checks += [cache_seqlens.min().long(), lengths.max()]
    if paged:
        page_size, pages = k_cache.shape[1], k_cache.shape[0]
        if cache_seqlens is None:
            used = torch.ones_like(block_table, dtype=torch.bool)
        else:
            needed = (lengths.clamp(0, capacity) + page_size - 1) // page_size
            used = torch.arange(block_table.shape[1], device=block_table.device) < needed[:, None]
        bad = used & ((block_table < 0) | (block_table >= pages))
        checks.append(bad.any().long())
    if not checks:
        return
    values = torch.stack(checks).tolist()
    if cache_seqlens is not None:
        low, high = values[0], values[1]
        if low < 0:
            raise ValueError(f"attention_with_kvcache: cache_seqlens has a negative entry ({low})")
        if high > capacity:
            raise ValueError(
                f"attention_with_kvcache: cache_seqlens + {new} new tokens reaches {high}, but the cache holds "
                f"{capacity} tokens per sequence"
                + (f" (block_table.shape[1]={block_table.shape[1]} pages of {k_cache.shape[1]})" if paged else ""))
    if paged and values[-1]:
        raise ValueError(
            f"attention_with_kvcache: block_table has an entry outside [0, {k_cache.shape[0]}) (the pages of "
            "k_cache) among the pages the sequences use")


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                           softmax_scale=None, causal=True, return_lse=False, *, validate=True, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, sinks=None):
    """Attention of ``q`` over a KV cache, FlashAttention's
    ``flash_attn_with_kvcache`` layout and rules.

    q: ``(batch, len_q, heads_q, head_dim)``. k_cache / v_cache: a contiguous
    cache ``(batch, max_len, heads_kv, head_dim)`` or, with ``block_table``
    ``(batch, pages_per_sequence)`` int32, a paged cache
    ``(num_pages, page_size, heads_kv, head_dim)`` (any page size); heads_q a
    multiple of heads_kv (GQA/MQA). cache_seqlens ``(batch,)`` int32/int64:
    the tokens already in each sequence's cache (None: the whole cache).
    k / v ``(batch, len_new, heads_kv, head_dim)``: written into the caches
    in place at positions ``cache_seqlens[b] ..`` before attending (needs
    cache_seqlens). The queries then attend to keys
    ``0 .. cache_seqlens[b] + len_new - 1``; ``causal`` aligns the diagonal
    bottom-right (query i of len_q sees keys up to ``i + length - len_q``).

    Returns out ``(batch, len_q, heads_q, head_dim_v)``, and with
    ``return_lse`` also lse ``(batch, heads_q, len_q)`` float32. Inference
    only: no backward. On CUDA it needs float16 or bfloat16; cache_seqlens
    and block_table stay on the device, so a decode step can be captured in
    a CUDA graph.

    validate: check the values of cache_seqlens and block_table (lengths
    within the cache, pages that exist) and raise ValueError otherwise. That
    costs one host synchronisation, so it is skipped during CUDA-graph
    capture and under torch.compile; pass False in a hot loop whose inputs are
    known good (a length past the capacity is then clamped to it, a page index
    out of range reads as zeros, and an append past the end is undefined).

    window_size, softcap, alibi_slopes, sinks: the score variants of
    :func:`torch_oss.attention` (alibi_slopes ``(heads_q,)`` or
    ``(batch, heads_q)``), their distances measured from the bottom-right
    diagonal that follows each sequence's length, on CPU and CUDA. A sink
    joins each row's softmax once; a row that sees no key (an empty
    sequence, or a window past its keys) then gets output 0 and lse = the
    sink. There is no dropout here (inference only).
    """
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, k, v)):
        raise RuntimeError("attention_with_kvcache is for inference and has no backward; call it under "
                           "torch.no_grad() or use torch_oss.attention for training")
    if validate and not torch.compiler.is_compiling() and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        _cache_value_checks(k_cache, k, cache_seqlens, block_table)
    from .functional import _check_variants

    window_size = _check_variants(q, window_size, softcap, alibi_slopes, sinks, None, op="attention_with_kvcache")
    variants = () if (window_size == (-1, -1) and softcap == 0 and alibi_slopes is None and sinks is None) else (
        list(window_size), float(softcap), alibi_slopes, sinks)
    out, lse = torch.ops.oss.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                                    softmax_scale, causal, *variants)
    return (out, lse) if return_lse else out
