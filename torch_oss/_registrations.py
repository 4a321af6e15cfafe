"""Fake (meta) functions of the torch.ops.oss operators.

The operators themselves (schemas, CPU and CUDA kernels, and the autograd
formulas, which run on every call and so cost less in C++) are registered by
torch_oss._C; this module adds what torch.compile and FakeTensor need,
following torch.library's recommended pattern.
"""

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_same_device(op, named):
    """A meta tensor mixed with real ones dispatches here (to the fake kernel),
    so the fake functions must reject device mixes as the real kernels do."""
    (first_name, first), *rest = [(n, t) for n, t in named if t is not None]
    for name, t in rest:
        torch._check_value(
            t.device == first.device,
            lambda: f"{op}: {name} is on {t.device} but {first_name} is on {first.device}",
        )


# ---------------------------------------------------------------------------
# softmax / log_softmax
# ---------------------------------------------------------------------------


def _softmax_fake(name):
    def fake(self, dim, dtype=None):
        out_dtype = self.dtype if dtype is None else dtype
        torch._check_type(
            out_dtype in FLOAT_DTYPES,
            lambda: f"{name}: output dtype {out_dtype} is not float16, bfloat16, float32 or float64",
        )
        rank = max(self.dim(), 1)
        torch._check_index(
            -rank <= dim < rank,
            lambda: f"{name}: dim={dim} is out of range for a tensor with {self.dim()} dimensions",
        )
        return self.new_empty(self.shape, dtype=out_dtype)

    return fake


def _softmax_backward_fake(name):
    def fake(grad_output, output, dim, input_dtype):
        _check_same_device(name, [("output", output), ("grad_output", grad_output)])
        torch._check(
            grad_output.shape == output.shape,
            lambda: f"{name}: grad_output has shape {tuple(grad_output.shape)} but output has "
            f"shape {tuple(output.shape)}",
        )
        return output.new_empty(output.shape, dtype=input_dtype)

    return fake


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------


def _check_dropout(op, dropout_p, dropout_seed):
    torch._check_value(0.0 <= dropout_p <= 1.0, lambda: f"{op}: dropout_p={dropout_p} must be a number in [0, 1]")
    if dropout_p > 0:
        torch._check_value(dropout_seed is not None,
                           lambda: f"{op}: dropout_p > 0 needs dropout_seed (a one-element int64 tensor)")
        torch._check_type(dropout_seed.dtype == torch.int64 and dropout_seed.numel() == 1,
                          lambda: f"{op}: dropout_seed must be a one-element int64 tensor, got dtype "
                          f"{dropout_seed.dtype} and shape {tuple(dropout_seed.shape)}")


def _check_lse_gradient(op, lse, grad_lse):
    """The op's check of grad_lse (lse's gradient, or None): lse's shape, a floating dtype."""
    if grad_lse is None:
        return
    torch._check_value(grad_lse.shape == lse.shape,
                       lambda: f"{op}: grad_lse has shape {tuple(grad_lse.shape)}, expected lse's {tuple(lse.shape)}")
    torch._check_type(grad_lse.dtype.is_floating_point,
                      lambda: f"{op}: grad_lse has dtype {grad_lse.dtype} but must be a floating type")


def _attention_fake(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                    causal_alignment="top_left", window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
                    deterministic=None, dropout_p=0.0, dropout_seed=None):
    _check_same_device("attention", [("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask),
                                     ("alibi_slopes", alibi_slopes), ("sinks", sinks), ("dropout_seed", dropout_seed)])
    _check_dropout("attention", dropout_p, dropout_seed)
    if sinks is not None:
        torch._check_value(sinks.dim() == 1 and sinks.shape[0] == query.shape[1],
                           lambda: f"attention: sinks must have shape (heads_q,) = ({query.shape[1]},), got "
                           f"{tuple(sinks.shape)}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        torch._check_value(t.dim() == 4, lambda: f"attention: {name} must be 4-D, got {t.dim()}-D")
    torch._check_type(
        key.dtype == query.dtype and value.dtype == query.dtype,
        lambda: f"attention: query, key, value dtypes differ ({query.dtype}, {key.dtype}, {value.dtype})",
    )
    torch._check_value(
        key.shape[-1] == query.shape[-1],
        lambda: f"attention: key.size(-1)={key.shape[-1]} must equal query.size(-1)={query.shape[-1]}",
    )
    B, Hq, Lq, _ = query.shape
    # in query's layout where query is (B, L, H, D) memory seen as (B, H, L, D), as the op allocates it
    if query.stride(1) < query.stride(2):
        out = query.new_empty((B, Lq, Hq, value.shape[-1])).transpose(1, 2)
    else:
        out = query.new_empty((B, Hq, Lq, value.shape[-1]))
    lse = query.new_empty((B, Hq, Lq), dtype=_lse_dtype(query.dtype))
    return out, lse


def _residual_like(out, keep):
    """The output residual as the ops return it: int8 codes of out's shape, or
    an empty int8 tensor where none is kept."""
    return torch.empty_like(out, dtype=torch.int8) if keep else out.new_empty((0,), dtype=torch.int8)


def _attention_with_residual_fake(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                                  causal_alignment="top_left", window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                  sinks=None, deterministic=None, dropout_p=0.0, dropout_seed=None):
    out, lse = _attention_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, causal_alignment,
                               window_size, softcap, alibi_slopes, sinks, deterministic, dropout_p, dropout_seed)
    half = query.dtype in (torch.float16, torch.bfloat16)
    return out, lse, _residual_like(out, half)


def _attention_backward_fake(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa,
                             causal_alignment, deterministic, out_residual=None, window_size=(-1, -1), softcap=0.0,
                             alibi_slopes=None, sinks=None, keys_subset=False, dropout_p=0.0, dropout_seed=None,
                             grad_lse=None):
    _check_same_device("attention_backward", [("query", query), ("key", key), ("value", value),
                                              ("attn_mask", attn_mask), ("grad_out", grad_out), ("out", out),
                                              ("lse", lse), ("out_residual", out_residual),
                                              ("alibi_slopes", alibi_slopes), ("sinks", sinks),
                                              ("dropout_seed", dropout_seed), ("grad_lse", grad_lse)])
    _check_dropout("attention_backward", dropout_p, dropout_seed)
    _check_lse_gradient("attention_backward", lse, grad_lse)
    return _grad_like(query), _grad_like(key), _grad_like(value)


def _grad_like(t):
    """A gradient as the backward op allocates it: in its input's layout
    where the input's last dim is contiguous, else contiguous."""
    return torch.empty_like(t) if t.stride(-1) == 1 else t.new_empty(t.shape)


def _attention_backward_with_sinks_fake(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale,
                                        enable_gqa, causal_alignment, deterministic, out_residual, window_size,
                                        softcap, alibi_slopes, sinks, dropout_p=0.0, dropout_seed=None, grad_lse=None):
    dq, dk, dv = _attention_backward_fake(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale,
                                          enable_gqa, causal_alignment, deterministic, out_residual, window_size,
                                          softcap, alibi_slopes, sinks, False, dropout_p, dropout_seed, grad_lse)
    return dq, dk, dv, sinks.new_empty(sinks.shape)


# ---------------------------------------------------------------------------
# attention_varlen (packed variable-length batches)
# ---------------------------------------------------------------------------


def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                           scale=None, causal_alignment="bottom_right", window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, sinks=None, deterministic=None, dropout_p=0.0, dropout_seed=None,
                           return_residual=False):
    op = "attention_varlen"
    _check_same_device(op, [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                            ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes), ("sinks", sinks),
                            ("dropout_seed", dropout_seed)])
    _check_dropout(op, dropout_p, dropout_seed)
    for name, t in (("q", q), ("k", k), ("v", v)):
        torch._check_value(t.dim() == 3, lambda: f"{op}: {name} must be 3-D, got {t.dim()}-D")
    torch._check_type(k.dtype == q.dtype and v.dtype == q.dtype,
                      lambda: f"{op}: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    torch._check_value(k.shape[2] == q.shape[2],
                       lambda: f"{op}: k.size(2)={k.shape[2]} must equal q.size(2)={q.shape[2]}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        torch._check_type(t.dtype == torch.int32, lambda: f"{op}: {name}.dtype={t.dtype} must be torch.int32")
        torch._check_value(t.dim() == 1, lambda: f"{op}: {name} must be 1-D (batch + 1,), got {t.dim()}-D")
    torch._check_value(cu_seqlens_q.shape[0] == cu_seqlens_k.shape[0],
                       lambda: f"{op}: cu_seqlens_q and cu_seqlens_k must have the same batch + 1 entries")
    if sinks is not None:
        torch._check_value(sinks.dim() == 1 and sinks.shape[0] == q.shape[1],
                           lambda: f"{op}: sinks must have shape (heads_q,) = ({q.shape[1]},), got "
                           f"{tuple(sinks.shape)}")
    total_q, heads_q = q.shape[0], q.shape[1]
    out = q.new_empty((total_q, heads_q, v.shape[2]))
    lse = q.new_empty((heads_q, total_q), dtype=_lse_dtype(q.dtype))
    return out, lse, _residual_like(out, return_residual and q.dtype in (torch.float16, torch.bfloat16))


def _attention_varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, is_causal, scale, causal_alignment, deterministic, out_residual=None,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                                    dropout_seed=None, grad_lse=None):
    op = "attention_varlen_backward"
    _check_same_device(op, [("q", q), ("k", k), ("v", v), ("grad_out", grad_out), ("out", out), ("lse", lse),
                            ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                            ("out_residual", out_residual), ("alibi_slopes", alibi_slopes), ("sinks", sinks),
                            ("dropout_seed", dropout_seed), ("grad_lse", grad_lse)])
    _check_dropout(op, dropout_p, dropout_seed)
    _check_lse_gradient(op, lse, grad_lse)
    torch._check_value(grad_out.shape == out.shape,
                       lambda: f"{op}: grad_out has shape {tuple(grad_out.shape)} but out has {tuple(out.shape)}")
    grad_sinks = sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty((0,))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), grad_sinks


# The forward's inputs, in schema order: q, k, v, cu_seqlens_q, cu_seqlens_k,
# max_seqlen_q, max_seqlen_k, is_causal, scale, causal_alignment, window_size,
# softcap, alibi_slopes, sinks, deterministic, dropout_p, dropout_seed,
# return_residual.
_VARLEN_INPUTS, _VARLEN_SINKS = 18, 13


def _attention_varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, alignment, window_size, softcap, alibi_slopes, sinks,
     deterministic, dropout_p, dropout_seed, return_residual) = inputs
    out, lse, residual = output
    ctx.mark_non_differentiable(residual)
    ctx.set_materialize_grads(False)  # no zero tensors for the gradients of outputs the loss does not use
    half = q.dtype in (torch.float16, torch.bfloat16)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, residual if return_residual and half else None,
                          alibi_slopes, sinks, dropout_seed if dropout_p > 0 else None)
    if deterministic is None:  # the setting when the forward ran, as for attention
        deterministic = torch.are_deterministic_algorithms_enabled()
    # the scalar arguments of the backward op, in its order around deterministic
    ctx.varlen_args = (max_q, max_k, is_causal, scale, alignment, bool(deterministic))
    ctx.variant_args = (list(window_size), softcap)
    ctx.dropout_p = dropout_p


def _attention_varlen_backward(ctx, grad_out, grad_lse, grad_residual):
    """dq, dk, dv and d sinks by oss::attention_varlen_backward, out's and
    lse's gradients both (the residual carries none)."""
    q, k, v, out, lse, cu_q, cu_k, residual, alibi_slopes, sinks, dropout_seed = ctx.saved_tensors
    needs = ctx.needs_input_grad  # the trailing defaulted inputs may be absent
    want = [needs[0], needs[1], needs[2], sinks is not None and len(needs) > _VARLEN_SINKS and needs[_VARLEN_SINKS]]
    grads = [None] * _VARLEN_INPUTS
    if (grad_out is None and grad_lse is None) or not any(want):  # both zero: so are the inputs'
        return tuple(grads)
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (grad_out, grad_lse, q, k, v, out, lse, sinks)):
        dq, dk, dv, dsinks = _attention_varlen_gradients_with_graph(ctx, grad_out, grad_lse, q, k, v, cu_q, cu_k,
                                                                    alibi_slopes, sinks)
        for index, grad, wanted in zip((0, 1, 2, _VARLEN_SINKS), (dq, dk, dv, dsinks), want):
            grads[index] = grad if wanted else None
        return tuple(grads)
    dq, dk, dv, dsinks = torch.ops.oss.attention_varlen_backward(
        grad_out, q, k, v, out, lse, cu_q, cu_k, *ctx.varlen_args, residual, *ctx.variant_args, alibi_slopes, sinks,
        ctx.dropout_p, dropout_seed, grad_lse)
    for index, grad, wanted in zip((0, 1, 2, _VARLEN_SINKS), (dq, dk, dv, dsinks), want):
        grads[index] = grad if wanted else None
    return tuple(grads)


def _attention_varlen_gradients_with_graph(ctx, grad_out, grad_lse, q, k, v, cu_q, cu_k, alibi_slopes, sinks):
    """dq, dk, dv and d sinks as a graph that autograd differentiates again
    (create_graph=True): each sequence's gradients from the dense op on its
    rows, whose backward builds that graph from ATen ops (design-attention.md,
    second derivatives), summed over the sequences. Reads cu_seqlens on the
    host (a synchronisation, on this path only); refused with dropout, whose
    mask lives in the kernels' random streams."""
    if ctx.dropout_p > 0:
        raise NotImplementedError(_VARLEN_DOUBLE_BACKWARD.replace("is not supported", "is not supported with "
                                                                  "dropout_p > 0"))
    _, _, is_causal, scale, alignment, _ = ctx.varlen_args
    window_size, softcap = ctx.variant_args
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    inputs = [t if t.requires_grad else t.detach().requires_grad_(True) for t in (q, k, v)]
    if sinks is not None:
        inputs.append(sinks if sinks.requires_grad else sinks.detach().requires_grad_(True))
    outputs, seeds = [], []
    for b in range(len(starts_q) - 1):
        rows_q, rows_k = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        dense = [t[rows].transpose(0, 1).unsqueeze(0) for t, rows in zip(inputs[:3], (rows_q, rows_k, rows_k))]
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        out_b, lse_b = torch.ops.oss.attention(*dense, None, is_causal, scale, True, alignment, list(window_size),
                                               softcap, slopes, inputs[3] if sinks is not None else None)
        outputs.append(out_b)
        seeds.append(grad_out[rows_q].transpose(0, 1).unsqueeze(0))
        if grad_lse is not None:
            outputs.append(lse_b)
            seeds.append(grad_lse[:, rows_q].unsqueeze(0))
    grads = torch.autograd.grad(outputs, inputs, seeds, create_graph=True, allow_unused=True,
                                materialize_grads=True) if outputs else [torch.zeros_like(t) for t in inputs]
    return (*grads[:3], grads[3] if sinks is not None else q.new_empty((0,)))


_VARLEN_DOUBLE_BACKWARD = (
    "torch_oss.attention_varlen: double backward is not supported: the gradient of attention_varlen's backward (a "
    "second derivative, as autograd.grad(..., create_graph=True) or backward(create_graph=True) would build) is "
    "not implemented. Compute the first gradient without create_graph=True")


def _attention_varlen_backward_setup_context(ctx, inputs, output):
    """Runs when the backward op is called with inputs that require grad and
    grad mode on, i.e. when a graph would be built through it: refused there,
    as for attention, rather than when that graph is used."""
    raise NotImplementedError(_VARLEN_DOUBLE_BACKWARD)


def _attention_varlen_double_backward(ctx, *grads):
    raise NotImplementedError(_VARLEN_DOUBLE_BACKWARD)


# ---------------------------------------------------------------------------
# cross_entropy
# ---------------------------------------------------------------------------


def _attention_with_kvcache_fake(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                                 softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0,
                                 alibi_slopes=None, sinks=None):
    _check_same_device("attention_with_kvcache", [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k),
                                                  ("v", v), ("cache_seqlens", cache_seqlens),
                                                  ("block_table", block_table), ("alibi_slopes", alibi_slopes),
                                                  ("sinks", sinks)])
    torch._check_value(q.dim() == 4 and k_cache.dim() == 4 and v_cache.dim() == 4,
                       lambda: "attention_with_kvcache: q, k_cache and v_cache must be 4-D")
    batch, len_q, heads_q, _ = q.shape
    out = q.new_empty((batch, len_q, heads_q, v_cache.shape[-1]))
    return out, q.new_empty((batch, heads_q, len_q), dtype=_lse_dtype(q.dtype))


def _cross_entropy_fake(logits, target, ignore_index=-100, label_smoothing=0.0, z_loss=0.0):
    _check_same_device("cross_entropy", [("logits", logits), ("target", target)])
    torch._check_value(logits.dim() == 2, lambda: f"cross_entropy: logits must be 2-D (N, C), got {logits.dim()}-D")
    torch._check_type(logits.dtype in FLOAT_DTYPES,
                      lambda: f"cross_entropy: logits have dtype {logits.dtype}, expected a floating type")
    torch._check_type(target.dtype == torch.int64,
                      lambda: f"cross_entropy: target has dtype {target.dtype} but must be int64 class indices")
    torch._check_value(target.dim() == 1 and target.shape[0] == logits.shape[0],
                       lambda: f"cross_entropy: target has shape {tuple(target.shape)} but must be "
                       f"({logits.shape[0]},)")
    n = logits.shape[0]
    return logits.new_empty((n,), dtype=_lse_dtype(logits.dtype)), logits.new_empty((n,), dtype=torch.float64)


def _cross_entropy_backward_fake(grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss):
    _check_same_device("cross_entropy_backward", [("logits", logits), ("target", target), ("grad_loss", grad_loss),
                                                  ("lse", lse)])
    torch._check_value(logits.dim() == 2,
                       lambda: f"cross_entropy_backward: logits must be 2-D (N, C), got {logits.dim()}-D")
    return logits.new_empty(logits.shape)


def _cross_entropy_forward_backward_fake(grad_loss, logits, target, ignore_index=-100, label_smoothing=0.0,
                                        z_loss=0.0):
    _check_same_device("cross_entropy_forward_backward", [("logits", logits), ("target", target),
                                                          ("grad_loss", grad_loss)])
    loss, lse = _cross_entropy_fake(logits, target, ignore_index, label_smoothing, z_loss)
    return loss, lse, logits.new_empty(logits.shape)


def _cross_entropy_forward_backward_inplace_fake(grad_loss, logits, target, ignore_index=-100, label_smoothing=0.0,
                                                z_loss=0.0):
    loss, lse, _ = _cross_entropy_forward_backward_fake(grad_loss, logits, target, ignore_index, label_smoothing,
                                                        z_loss)
    return loss, lse


def _cross_entropy_backward_scaled_fake(grad_logits, grad_loss, grad_scale, logits, target, lse, ignore_index,
                                        label_smoothing, z_loss):
    _check_same_device("cross_entropy_backward_scaled_", [("grad_logits", grad_logits), ("grad_loss", grad_loss),
                                                          ("grad_scale", grad_scale), ("logits", logits),
                                                          ("target", target), ("lse", lse)])
    torch._check_value(grad_logits.shape == logits.shape,
                       lambda: f"cross_entropy_backward_scaled_: grad_logits has shape {tuple(grad_logits.shape)} "
                       f"but must have the logits' {tuple(logits.shape)}")
    return None


def _cross_entropy_row_weights_fake(target, ignore_index, dtype, mean):
    torch._check(target.dtype == torch.int64,
                 lambda: f"cross_entropy_row_weights: target has dtype {target.dtype} but must be int64 class indices")
    torch._check_value(target.dim() == 1,
                       lambda: f"cross_entropy_row_weights: target has shape {tuple(target.shape)} but must be 1-D")
    torch._check(dtype in (torch.float32, torch.float64),
                 lambda: f"cross_entropy_row_weights: dtype is {dtype} but must be float32 or float64")
    return target.new_empty(target.shape, dtype=dtype), target.new_empty(())


def _cross_entropy_total_fake(loss, count=None):
    if count is not None:
        _check_same_device("cross_entropy_total", [("loss", loss), ("count", count)])
    torch._check(loss.dtype in (torch.float32, torch.float64),
                 lambda: f"cross_entropy_total: loss has dtype {loss.dtype} but must be float32 or float64")
    torch._check_value(loss.dim() == 1, lambda: f"cross_entropy_total: loss has shape {tuple(loss.shape)} but must "
                       "be 1-D")
    return loss.new_empty(())


def _cross_entropy_setup_context(ctx, inputs, output):
    logits, target, ignore_index, label_smoothing, z_loss = inputs
    _, lse = output
    ctx.save_for_backward(logits, target, lse)
    ctx.args = (ignore_index, label_smoothing, z_loss)
    ctx.set_materialize_grads(False)


def _cross_entropy_backward(ctx, grad_loss, grad_lse):
    """d loss / d logits by the backward kernel; a gradient reaching lse (whose
    derivative is the softmax) is added with ATen ops."""
    logits, target, lse = ctx.saved_tensors
    grad = None
    if grad_loss is not None:
        grad = torch.ops.oss.cross_entropy_backward(grad_loss, logits, target, lse, *ctx.args)
    if grad_lse is not None:
        extra = (torch.exp(logits.to(lse.dtype) - lse[:, None]) * grad_lse.to(lse.dtype)[:, None]).to(logits.dtype)
        grad = extra if grad is None else grad + extra
    return grad, None, None, None, None


def _cross_entropy_backward_setup_context(ctx, inputs, output):
    grad_loss, logits, target, lse, ignore_index, label_smoothing, z_loss = inputs
    ctx.save_for_backward(grad_loss, logits, target, lse)
    ctx.args = (ignore_index, label_smoothing, z_loss)


def _cross_entropy_double_backward(ctx, grad_grad):
    """Derivatives of grad_j = g (p_j s - (1 - eps) [j == t] - eps / C), with
    p_j = exp(x_j - lse) and s = 1 + 2 z lse, taking g, x and lse as its
    inputs (lse's own dependence on x flows on through the forward's node);
    G is the gradient of grad. ATen ops, in float32 (float64 for float64):
      d/dg   = s sum_j G_j p_j - (1 - eps) G_t - eps / C sum_j G_j
      d/dx_j = g s p_j G_j
      d/dlse = g (2 z - s) sum_j G_j p_j
    all 0 on ignored rows."""
    grad_loss, logits, target, lse = ctx.saved_tensors
    ignore_index, label_smoothing, z_loss = ctx.args
    want_g, want_x, _, want_lse = ctx.needs_input_grad[:4]
    dt = _lse_dtype(logits.dtype)
    x, lse_, G = logits.to(dt), lse.to(dt), grad_grad.to(dt)
    counted = target != ignore_index
    g = torch.where(counted, grad_loss.to(dt), 0)
    p = torch.exp(x - lse_[:, None])
    s = 1 + 2 * z_loss * lse_
    gp = (G * p).sum(dim=1)
    grad_g = grad_x = grad_lse = None
    if want_g:
        t = torch.where(counted, target, 0)
        grad_g = s * gp - (1 - label_smoothing) * G.gather(1, t[:, None])[:, 0]
        grad_g = grad_g - (label_smoothing / logits.shape[1]) * G.sum(dim=1)
        grad_g = torch.where(counted, grad_g, 0).to(grad_loss.dtype)
    if want_x:
        grad_x = ((g * s)[:, None] * p * G).to(logits.dtype)
    if want_lse:
        grad_lse = (g * (2 * z_loss - s) * gp).to(lse.dtype)
    return grad_g, grad_x, None, grad_lse, None, None, None


def _cross_entropy_probs_fake(logits, target, weight=None, label_smoothing=0.0, z_loss=0.0):
    op = "cross_entropy_probs"
    _check_same_device(op, [("logits", logits), ("target", target), ("weight", weight)])
    torch._check_value(logits.dim() == 2, lambda: f"{op}: logits must be 2-D (N, C), got {logits.dim()}-D")
    torch._check_type(logits.dtype in FLOAT_DTYPES,
                      lambda: f"{op}: logits have dtype {logits.dtype}, expected a floating type")
    torch._check_type(target.dtype == logits.dtype,
                      lambda: f"{op}: target has dtype {target.dtype} but must have the logits' dtype {logits.dtype}")
    torch._check_value(target.shape == logits.shape,
                       lambda: f"{op}: target has shape {tuple(target.shape)} but must have the logits' shape "
                       f"{tuple(logits.shape)}")
    torch._check_value(weight is None or tuple(weight.shape) == (logits.shape[1],),
                       lambda: f"{op}: weight has shape {tuple(weight.shape)} but must be ({logits.shape[1]},)")
    n = logits.shape[0]
    return (logits.new_empty((n,), dtype=_lse_dtype(logits.dtype)), logits.new_empty((n,), dtype=torch.float64),
            logits.new_empty((n,), dtype=torch.float64))


def _cross_entropy_probs_backward_fake(grad_loss, logits, target, weight, lse, target_sum, label_smoothing, z_loss,
                                       grad_target):
    op = "cross_entropy_probs_backward"
    _check_same_device(op, [("logits", logits), ("target", target), ("weight", weight), ("grad_loss", grad_loss),
                            ("lse", lse), ("target_sum", target_sum)])
    torch._check_value(logits.dim() == 2, lambda: f"{op}: logits must be 2-D (N, C), got {logits.dim()}-D")
    return logits.new_empty(logits.shape), logits.new_empty(logits.shape if grad_target else (0,))


def _cross_entropy_probs_setup_context(ctx, inputs, output):
    logits, target, weight, label_smoothing, z_loss = inputs
    _, lse, target_sum = output
    ctx.save_for_backward(logits, target, weight, lse, target_sum)
    ctx.args = (label_smoothing, z_loss)
    ctx.set_materialize_grads(False)


def _probs_weights(weight, classes, dtype, device):
    return torch.ones(classes, dtype=dtype, device=device) if weight is None else weight.to(dtype)


def _probs_smoothed(target, eps, dtype):
    """t' = (1 - eps) t + eps / C, in dtype."""
    return (1 - eps) * target.to(dtype) + eps / target.shape[1]


def _cross_entropy_probs_backward(ctx, grad_loss, grad_lse, grad_target_sum):
    """The gradients of the loss by the backward kernel (logits and, where it
    requires one, target); gradients reaching lse (its derivative is the
    softmax), target_sum (d/dt_j = (1 - eps) w_j) and the weight
    (d loss / d w_j = t'_j (lse - x_j), d target_sum / d w_j = t'_j) with
    ATen ops, in the loss's dtype."""
    logits, target, weight, lse, target_sum = ctx.saved_tensors
    eps, z = ctx.args
    # (the dispatcher drops trailing arguments equal to their defaults: weight=None among them)
    want_x, want_t, want_w = (tuple(ctx.needs_input_grad) + (False,) * 3)[:3]
    grad_x = grad_t = grad_w = None
    if grad_loss is not None and (want_x or want_t):
        gx, gt = torch.ops.oss.cross_entropy_probs_backward(grad_loss, logits, target, weight, lse, target_sum, eps, z,
                                                            want_t)
        grad_x = gx if want_x else None
        grad_t = gt if want_t else None
    dt = lse.dtype
    if grad_lse is not None and want_x:
        extra = (torch.exp(logits.to(dt) - lse[:, None]) * grad_lse.to(dt)[:, None]).to(logits.dtype)
        grad_x = extra if grad_x is None else grad_x + extra
    if grad_target_sum is not None and want_t:
        w = _probs_weights(weight, logits.shape[1], dt, logits.device)
        extra = (grad_target_sum.to(dt)[:, None] * ((1 - eps) * w)).to(target.dtype)
        grad_t = extra if grad_t is None else grad_t + extra
    if want_w:
        smoothed = _probs_smoothed(target, eps, dt)
        grad_w = torch.zeros(logits.shape[1], dtype=dt, device=logits.device)
        if grad_loss is not None:
            grad_w = grad_w + (grad_loss.to(dt)[:, None] * smoothed * (lse[:, None] - logits.to(dt))).sum(0)
        if grad_target_sum is not None:
            grad_w = grad_w + (grad_target_sum.to(dt)[:, None] * smoothed).sum(0)
        grad_w = grad_w.to(weight.dtype)
    return grad_x, grad_t, grad_w, None, None


def _cross_entropy_probs_backward_setup_context(ctx, inputs, output):
    grad_loss, logits, target, weight, lse, target_sum, label_smoothing, z_loss, grad_target = inputs
    ctx.save_for_backward(grad_loss, logits, target, weight, lse, target_sum)
    ctx.args = (label_smoothing, z_loss)
    ctx.set_materialize_grads(False)


def _cross_entropy_probs_double_backward(ctx, grad_grad_x, grad_grad_t):
    """Derivatives of gx_j = g (p_j (S + 2 z lse) - u_j) and gt_j = g (1 - eps)
    w_j (lse - x_j), u_j = w_j t'_j, t'_j = (1 - eps) t_j + eps / C, p_j =
    exp(x_j - lse), taking g, x, t, w, lse and S (target_sum) as inputs (the
    dependence of lse and S on x and t flows on through the forward's node);
    Gx and Gt are the gradients of gx and gt. ATen ops, in the loss's dtype:
      d/dg   = sum_j Gx_j (p_j (S + 2 z lse) - u_j) + (1 - eps) sum_j Gt_j w_j (lse - x_j)
      d/dx_j = g (S + 2 z lse) p_j Gx_j - g (1 - eps) w_j Gt_j
      d/dt_j = -g (1 - eps) w_j Gx_j
      d/dw_j = sum_rows g (-t'_j Gx_j + (1 - eps) (lse - x_j) Gt_j)
      d/dlse = g (2 z - S - 2 z lse) sum_j Gx_j p_j + g (1 - eps) sum_j Gt_j w_j
      d/dS   = g sum_j Gx_j p_j"""
    grad_loss, logits, target, weight, lse, target_sum = ctx.saved_tensors
    eps, z = ctx.args
    want_g, want_x, want_t, want_w, want_lse, want_s = ctx.needs_input_grad[:6]
    dt = lse.dtype
    C = logits.shape[1]
    x, g, lse_, S = logits.to(dt), grad_loss.to(dt)[:, None], lse[:, None], target_sum.to(dt)[:, None]
    w = _probs_weights(weight, C, dt, logits.device)
    smoothed = _probs_smoothed(target, eps, dt)
    p = torch.exp(x - lse_)
    scale = S + 2 * z * lse_
    Gx = torch.zeros_like(x) if grad_grad_x is None else grad_grad_x.to(dt)
    Gt = torch.zeros_like(x) if grad_grad_t is None or grad_grad_t.numel() == 0 else grad_grad_t.to(dt)
    gp = (Gx * p).sum(1, keepdim=True)
    out = [None] * 9
    if want_g:
        out[0] = ((Gx * (p * scale - w * smoothed)).sum(1) + (1 - eps) * (Gt * w * (lse_ - x)).sum(1))
        out[0] = out[0].to(grad_loss.dtype)
    if want_x:
        out[1] = (g * scale * p * Gx - g * (1 - eps) * w * Gt).to(logits.dtype)
    if want_t:
        out[2] = (-g * (1 - eps) * w * Gx).to(target.dtype)
    if want_w:
        out[3] = (g * (-smoothed * Gx + (1 - eps) * (lse_ - x) * Gt)).sum(0).to(weight.dtype)
    if want_lse:
        out[4] = (g * (2 * z - scale) * gp + g * (1 - eps) * (Gt * w).sum(1, keepdim=True))[:, 0].to(lse.dtype)
    if want_s:
        out[5] = (g * gp)[:, 0].to(target_sum.dtype)
    return tuple(out)


def register():
    lib = "oss"
    for name in ("softmax", "log_softmax"):
        torch.library.register_fake(f"{lib}::{name}", _softmax_fake(name))
        torch.library.register_fake(f"{lib}::{name}_backward", _softmax_backward_fake(f"{name}_backward"))
    # the autograd formulas of all four differentiable ops are in C++ (csrc/torch_ops.cpp):
    # a Python formula here would run on every call and cost ~14 us of host time
    torch.library.register_fake(f"{lib}::attention", _attention_fake)
    torch.library.register_fake(f"{lib}::attention_with_residual", _attention_with_residual_fake)
    torch.library.register_fake(f"{lib}::attention_backward", _attention_backward_fake)
    torch.library.register_fake(f"{lib}::attention_backward_with_sinks", _attention_backward_with_sinks_fake)
    torch.library.register_fake(f"{lib}::attention_with_kvcache", _attention_with_kvcache_fake)
    torch.library.register_fake(f"{lib}::attention_varlen", _attention_varlen_fake)
    torch.library.register_fake(f"{lib}::attention_varlen_backward", _attention_varlen_backward_fake)
    # attention_varlen's formula is here, the op's schema taking no deterministic flag (varlen.py passes it)
    torch.library.register_autograd(f"{lib}::attention_varlen", _attention_varlen_backward,
                                    setup_context=_attention_varlen_setup_context)
    torch.library.register_autograd(f"{lib}::attention_varlen_backward", _attention_varlen_double_backward,
                                    setup_context=_attention_varlen_backward_setup_context)
    torch.library.register_fake(f"{lib}::cross_entropy", _cross_entropy_fake)
    torch.library.register_fake(f"{lib}::cross_entropy_backward", _cross_entropy_backward_fake)
    # (their Autograd kernels, in C++, refuse differentiation: they compute a
    # gradient, e.g. in linear_cross_entropy's forward, and are not differentiated)
    torch.library.register_fake(f"{lib}::cross_entropy_forward_backward", _cross_entropy_forward_backward_fake)
    torch.library.register_fake(f"{lib}::cross_entropy_forward_backward_",
                                _cross_entropy_forward_backward_inplace_fake)
    torch.library.register_fake(f"{lib}::cross_entropy_backward_scaled_", _cross_entropy_backward_scaled_fake)
    torch.library.register_fake(f"{lib}::cross_entropy_row_weights", _cross_entropy_row_weights_fake)
    torch.library.register_fake(f"{lib}::cross_entropy_total", _cross_entropy_total_fake)
    # cross_entropy's formulas are here: the op is called once per loss, not per layer
    torch.library.register_autograd(f"{lib}::cross_entropy", _cross_entropy_backward,
                                    setup_context=_cross_entropy_setup_context)
    torch.library.register_autograd(f"{lib}::cross_entropy_backward", _cross_entropy_double_backward,
                                    setup_context=_cross_entropy_backward_setup_context)
    torch.library.register_fake(f"{lib}::cross_entropy_probs", _cross_entropy_probs_fake)
    torch.library.register_fake(f"{lib}::cross_entropy_probs_backward", _cross_entropy_probs_backward_fake)
    torch.library.register_autograd(f"{lib}::cross_entropy_probs", _cross_entropy_probs_backward,
                                    setup_context=_cross_entropy_probs_setup_context)
    torch.library.register_autograd(f"{lib}::cross_entropy_probs_backward", _cross_entropy_probs_double_backward,
                                    setup_context=_cross_entropy_probs_backward_setup_context)
    _tag_compile_caches()


def cache_tag():
    """This build's tag in torch.compile's cache keys: a hash of this file,
    where the fake functions live."""
    import hashlib

    with open(__file__, "rb") as f:
        return "torch_oss-" + hashlib.sha256(f.read()).hexdigest()[:16]


def _tag_compile_caches():
    """torch.compile's on-disk caches key a graph by its ops and inputs, not by
    the fake functions that gave the ops' outputs their shapes and strides: a
    graph compiled against another version of these fakes would be reused and
    fail its stride checks at run time (an output layout that changed, say).
    cache_tag() joins torch.compiler.config.cache_key_tag, PyTorch's means to
    separate caches, so graphs are compiled again when the fakes change and
    reused while they do not."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return
    tag = cache_tag()
    if tag not in config.cache_key_tag.split():
        config.cache_key_tag = " ".join(t for t in (config.cache_key_tag, tag) if t)

