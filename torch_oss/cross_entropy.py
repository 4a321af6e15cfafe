"""Cross-entropy on the torch.ops.oss kernels.

- cross_entropy: F.cross_entropy's semantics, plus an optional z-loss
  (z_loss * logsumexp(logits)**2 per counted row). Class-index targets run
  the kernels below; class-probability targets of the input's dtype run
  torch.ops.oss.cross_entropy_probs and its backward (one pass over the
  logits and the target each; oss.h and docs/cross-entropy.md give the
  numerics), other class-probability targets the log_softmax kernel and a
  product with the target.
- linear_cross_entropy: the LM head's matrix product and that loss fused by
  chunks of tokens, so the full (tokens x vocabulary) logits never exist.

torch.ops.oss.cross_entropy(logits, target, ignore_index, label_smoothing,
z_loss) -> (loss, lse) gives the per-row loss (float32, float64 for float64
logits) and log-sum-exp (float64) of 2-D logits;
torch.ops.oss.cross_entropy_backward gives the gradient of the logits, and
torch.ops.oss.cross_entropy_forward_backward both for a per-row upstream
gradient known in advance (cross_entropy_forward_backward_ writes that
gradient over the logits and returns the loss and lse), and
torch.ops.oss.cross_entropy_backward_scaled_ rewrites such a gradient for a
scaled upstream gradient unless the scale is 1. All run kernels that pass
over each row once (C on the CPU, CUDA on the GPU; on the GPU the fused op
holds a row in shared memory on sm_90, else reads it again from L2). On
the CPU a target outside [0, C) that is not ignore_index raises ValueError;
on CUDA (no host synchronisation) it makes its row's loss and gradient NaN.
"""

import torch

__all__ = ["cross_entropy", "linear_cross_entropy"]

REDUCTIONS = ("none", "mean", "sum")

# The default chunk of linear_cross_entropy holds about this many bytes of logits.
DEFAULT_CHUNK_BYTES = 512 * 2**20


def _stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------
# cross_entropy
# ---------------------------------------------------------------------------


def _check_common(name, target, ignore_index, reduction, label_smoothing, z_loss):
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{name}: target must be a tensor, got {type(target).__name__}")
    if target.is_floating_point():
        raise NotImplementedError(
            f"{name}: target has dtype {target.dtype}: class probabilities are not supported, only int64 class "
            "indices"
        )
    if target.dtype != torch.int64:
        raise TypeError(f"{name}: target has dtype {target.dtype} but must be int64 class indices")
    _check_options(name, ignore_index, reduction, label_smoothing, z_loss)


def _check_options(name, ignore_index, reduction, label_smoothing, z_loss):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}: reduction={reduction!r} must be one of {REDUCTIONS}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing={label_smoothing} must be in [0, 1]")
    if not z_loss >= 0.0:
        raise ValueError(f"{name}: z_loss={z_loss} must be >= 0")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{name}: ignore_index must be an int, got {type(ignore_index).__name__}")


def _check_weight(name, weight, classes):
    if weight is not None:
        if not isinstance(weight, torch.Tensor) or weight.shape != (classes,):
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(f"{name}: weight must be a tensor of shape ({classes},), got {got}")
        if not weight.is_floating_point():
            raise TypeError(f"{name}: weight has dtype {weight.dtype} but must be floating point")


def _check_probability_args(input, target, weight, ignore_index, reduction, label_smoothing, z_loss):
    """The checks of a class-probability loss; returns the number of classes."""
    name = "cross_entropy"
    if ignore_index != -100:
        raise ValueError(f"{name}: ignore_index={ignore_index} applies to class-index targets, not to class "
                         "probabilities")
    _check_options(name, ignore_index, reduction, label_smoothing, z_loss)
    if input.dim() == 0:
        raise ValueError(f"{name}: input must have at least 1 dimension (the classes), got a 0-D tensor")
    if target.shape != input.shape:
        raise ValueError(f"{name}: target of class probabilities has shape {tuple(target.shape)} but must have the "
                         f"input's shape {tuple(input.shape)}")
    classes = input.shape[1] if input.dim() > 1 else input.shape[0]
    _check_weight(name, weight, classes)
    return classes


def _fuses_probabilities(input, target, weight):
    """Whether a class-probability loss runs the fused kernels: a target of the
    input's dtype (one of the kernels'), at least one class, outside torch.func
    transforms and forward-mode AD (_needs_aten), and a weight on the input's
    device. Other targets (another dtype, which PyTorch promotes) take
    _probability_loss."""
    return (target.dtype == input.dtype and input.dtype in _KERNEL_DTYPES and input.numel() > 0
            and not any(t is not None and _needs_aten(t) for t in (input, target, weight))
            and (weight is None or weight.device == input.device))


_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fused_probability_loss(input, target, weight, reduction, label_smoothing, z_loss, classes):
    """The class-probability loss by torch.ops.oss.cross_entropy_probs: one
    pass over each row's logits and target for the loss (and a second, in
    the backward, for the gradients), statistics in float32 (float64 for
    float64), the loss in the loss's dtype. The (N, C, d1, ...) form is first
    moved to rows with the classes last (a copy in the input's dtype, as for
    class indices)."""
    if input.dim() == 1:
        x, t, shape = input[None], target[None], ()
    elif input.dim() == 2:
        x, t, shape = input, target, (input.shape[0],)
    else:
        x = torch.movedim(input, 1, -1).reshape(-1, classes)
        t = torch.movedim(target, 1, -1).reshape(-1, classes)
        shape = (input.shape[0],) + tuple(input.shape[2:])
    loss, _, _ = torch.ops.oss.cross_entropy_probs(x, t, weight, float(label_smoothing), float(z_loss))
    if reduction == "none":
        return loss.reshape(shape)
    total = loss.sum(dtype=torch.float64).to(loss.dtype)  # rounded once
    return total if reduction == "sum" else total / loss.numel()


def _probability_loss(input, target, weight, ignore_index, reduction, label_smoothing, z_loss):
    """F.cross_entropy with class probabilities as the target (floating point,
    of the input's shape): row n's loss is -sum_c w_c t'_nc log_softmax(x_n)_c
    with t' = (1 - eps) t + eps / C (w = 1 without weights), plus z_loss *
    logsumexp(x_n)**2; "mean" divides by the number of rows, as PyTorch's
    does (not by weights). A target of the input's dtype runs the fused
    kernels (_fused_probability_loss; oss.h describes their numerics).
    Otherwise the log-probabilities come from the log_softmax
    kernel on the input converted to float32 (float64), and the products
    with the target are summed as F.cross_entropy sums them, in float32
    (float64 for float64 input or target), the loss's dtype. Either way,
    like F.cross_entropy, a logit of -inf with a target of 0 gives NaN
    (0 * -inf). Gradients reach the input and, where they require one, the
    target and the weight."""
    classes = _check_probability_args(input, target, weight, ignore_index, reduction, label_smoothing, z_loss)
    if _fuses_probabilities(input, target, weight):
        return _fused_probability_loss(input, target, weight, reduction, label_smoothing, z_loss, classes)
    stat = torch.float64 if torch.float64 in (input.dtype, target.dtype) else torch.float32
    # the classes last, in the loss's dtype: the log-softmax's and the z-loss's
    # gradients then add up in it and reach a 16-bit input rounded once (added
    # in the input's dtype, two roundings where the terms cancel pass twice
    # F.cross_entropy's error)
    x = (torch.movedim(input, 1, -1) if input.dim() > 2 else input).to(stat)
    t = torch.movedim(target, 1, -1) if target.dim() > 2 else target
    log_p = torch.ops.oss.log_softmax(x, -1)
    t = t.to(stat)
    if label_smoothing:
        t = t * (1 - label_smoothing) + label_smoothing / classes
    if weight is not None:
        t = t * weight.to(stat)
    loss = -(t * log_p).sum(-1)
    if z_loss:
        lse = torch.logsumexp(x, -1)
        loss = loss + z_loss * lse * lse
    if reduction == "none":
        return loss
    total = loss.sum(dtype=torch.float64).to(stat)  # rounded once
    # PyTorch's count of rows, numel / C: none without classes (nan, as there)
    return total if reduction == "sum" else total / (loss.numel() if classes else 0)


def _rows(input, target):
    """(N, C, d1, ...) / (N, C) / (C,) logits as 2-D rows (class dim last) and
    the flat target; returns them and the shape of the unreduced loss."""
    if input.dim() == 0:
        raise ValueError("cross_entropy: input must have at least 1 dimension (the classes), got a 0-D tensor")
    if input.dim() == 1:
        if target.dim() != 0:
            raise ValueError(
                f"cross_entropy: for unbatched input of shape {tuple(input.shape)} target must be 0-D, got shape "
                f"{tuple(target.shape)}"
            )
        return input[None, :], target.reshape(1), ()
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"cross_entropy: target has shape {tuple(target.shape)} but must be {expected} for input of shape "
            f"{tuple(input.shape)}"
        )
    classes = input.shape[1]
    rows = input if input.dim() == 2 else torch.movedim(input, 1, -1).reshape(-1, classes)
    return rows, target.reshape(-1), expected


class _FusedLoss(torch.autograd.Function):
    """The mean (or, in place, the sum) of the rows' losses of 2-D logits, with
    the logits' gradient formed in the forward's own pass over them: the
    forward + backward op runs for the gradient of this loss under an
    upstream gradient of 1 (row_grad: 1 / counted rows for the mean, 1 for the
    sum, 0 on ignored rows) and keeps it.

    Out of place, the backward hands that tensor on, rewritten by
    cross_entropy_backward_scaled_ only when the upstream gradient is not
    exactly 1 (decided on the device), so loss.backward() reads the logits
    once in all. A second backward through a retained graph recomputes the
    gradient from the saved logits, and a backward that builds a graph
    (create_graph) takes the two ops' differentiable path, so second
    derivatives are those of the two-op form.

    In place (inplace=True), the gradient is written over the logits
    (cross_entropy_forward_backward_), so no logits-sized buffer is allocated;
    the backward multiplies it by the upstream gradient (exact for 1 and for
    powers of two, else one more rounding in the logits' dtype) and hands it
    on. The logits are gone then: a second backward and create_graph raise."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, label_smoothing, z_loss, mean, inplace):
        # [t != ignore_index] (/ their count for a mean) per row, one launch on CUDA
        row_grad, denominator = torch.ops.oss.cross_entropy_row_weights(target, ignore_index,
                                                                        _stat_dtype(logits.dtype), mean)
        args = (ignore_index, label_smoothing, z_loss)
        if inplace:
            loss, _ = torch.ops.oss.cross_entropy_forward_backward_(row_grad, logits, target, *args)
            grad = logits  # the backward needs nothing else
        else:
            loss, lse, grad = torch.ops.oss.cross_entropy_forward_backward(row_grad, logits, target, *args)
            ctx.save_for_backward(logits, target, row_grad, lse)
        # the sum in float64 rounded once (then / the count for a mean), one launch on CUDA
        total = torch.ops.oss.cross_entropy_total(loss, denominator if mean else None)
        ctx.args = args
        ctx.inplace = inplace
        ctx.grad = grad  # handed on by the first backward
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad, ctx.grad = ctx.grad, None
        nones = (None,) * 6
        if ctx.inplace:
            if grad is None:
                raise RuntimeError("cross_entropy(inplace_backward=True): the logits were overwritten with their "
                                   "gradient, which the first backward handed on; a second backward through the "
                                   "graph cannot recompute it (use inplace_backward=False)")
            if torch.is_grad_enabled():
                raise RuntimeError("cross_entropy(inplace_backward=True): create_graph=True needs the logits, which "
                                   "were overwritten with their gradient (use inplace_backward=False for second "
                                   "derivatives)")
            return (grad.mul_(grad_total), *nones)
        logits, target, row_grad, lse = ctx.saved_tensors
        if torch.is_grad_enabled() or grad is None:
            if torch.is_grad_enabled():
                # the two ops' graph: lse recomputed by the differentiable forward
                _, lse = torch.ops.oss.cross_entropy(logits, target, *ctx.args)
            grad = torch.ops.oss.cross_entropy_backward(row_grad * grad_total, logits, target, lse, *ctx.args)
        else:
            torch.ops.oss.cross_entropy_backward_scaled_(grad, row_grad, grad_total, logits, target, lse, *ctx.args)
        return (grad, *nones)


def _needs_aten(logits):
    """Whether the losses must be ATen ops: under torch.func transforms (the
    logits wrapped) or forward-mode AD (a tangent), where the ops' registered
    autograd formulas cannot run (a compiled graph traces those formulas)."""
    if torch.compiler.is_compiling():
        return False
    return (torch._C._functorch.is_functorch_wrapped_tensor(logits)
            or torch.autograd.forward_ad.unpack_dual(logits).tangent is not None)


def _row_losses_aten(logits, target, ignore_index, label_smoothing, z_loss):
    """torch.ops.oss.cross_entropy's (loss, lse) of each row as ATen ops: loss
    (1 - eps) (lse - x_t) + eps (lse - mean_j x_j) + z lse^2, 0 on ignored
    rows, in float32 for 16-bit logits (float64 for float64)."""
    x = logits.to(_stat_dtype(logits.dtype))
    lse = torch.logsumexp(x, -1)
    counted = target != ignore_index
    x_t = x.gather(-1, torch.where(counted, target, 0)[:, None])[:, 0]
    loss = (1 - label_smoothing) * (lse - x_t)
    if label_smoothing:
        loss = loss + label_smoothing * (lse - x.mean(-1))
    if z_loss:
        loss = loss + z_loss * lse * lse
    return torch.where(counted, loss, 0), lse


def _fuses_backward(logits, weight, reduction, inplace):
    """Whether the forward writes the gradient too: a loss without class
    weights whose logits autograd will differentiate, in eager mode (a
    compiled graph keeps the two ops, whose formulas it traces); a mean, or a
    sum written in place. Not a sum out of place: sums are most often divided
    afterwards (Hugging Face divides a summed loss by the tokens of the whole
    accumulation step), and an upstream gradient other than 1 costs the
    out-of-place form a second pass over the logits, which makes it slower
    than the two ops."""
    return (weight is None and (reduction == "mean" or (inplace and reduction == "sum")) and logits.requires_grad
            and torch.is_grad_enabled() and not torch.compiler.is_compiling())


def _overwritable(logits):
    """Rows the in-place op can write the gradient over: unit stride along
    the classes (any row stride)."""
    return logits.shape[1] <= 1 or logits.stride(1) == 1


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                  inplace_backward=False):
    """Drop-in for torch.nn.functional.cross_entropy, plus z_loss: each
    counted row adds z_loss * logsumexp(row)**2. Targets are int64 class
    indices, or class probabilities (a floating-point tensor of the input's
    shape; see _probability_loss: no ignore_index, "mean" over the rows, and
    the flags below change nothing for them).

    input: (N, C), (C,) or (N, C, d1, ...); float16/bfloat16/float32/float64.
    The loss is float32 for 16-bit input (float64 for float64), not rounded
    back to the input dtype as F.cross_entropy's is. Rows whose target is
    ignore_index count for nothing; reduction="mean" divides by the number of
    counted rows (by the sum of their class weights when `weight` is given), so
    it is nan when every row is ignored, as in PyTorch. With `weight`, each
    row's terms are scaled as in F.cross_entropy (the smoothing term by the
    weights of all classes); the z-loss term by the weight of the row's target.

    A "mean" loss without weights whose input will be differentiated (in
    eager mode) computes the input's gradient in the forward's pass over it
    and keeps it until the backward (memory the backward would allocate
    anyway); the backward then passes over the logits again only when its
    upstream gradient is not exactly 1 (a loss divided for gradient
    accumulation or scaled by a GradScaler).

    inplace_backward=True lets a "mean" or "sum" loss without weights write
    that gradient over the input itself (2-D or 1-D input with unit stride
    along the classes; other layouts write it into the rows' copy), so no
    buffer of the input's size is allocated for it: the input's values are
    gone after the call, the backward scales the gradient by its upstream
    gradient (one more rounding in the input's dtype unless that is a power of
    two), and a second backward or create_graph=True raises. As for the fused
    form above, it applies in eager mode only; elsewhere the flag changes
    nothing.
    """
    name = "cross_entropy"
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{name}: input must be a tensor, got {type(input).__name__}")
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"{name}: inplace_backward must be a bool, got {type(inplace_backward).__name__}")
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        if not input.is_floating_point():
            raise TypeError(f"{name}: input has dtype {input.dtype} but must be floating point")
        return _probability_loss(input, target, weight, ignore_index, reduction, label_smoothing, z_loss)
    _check_common(name, target, ignore_index, reduction, label_smoothing, z_loss)
    logits, flat_target, shape = _rows(input, target)
    classes = logits.shape[1]
    _check_weight(name, weight, classes)
    inplace = inplace_backward and _overwritable(logits)
    aten = _needs_aten(logits)
    if not aten and _fuses_backward(logits, weight, reduction, inplace):
        return _FusedLoss.apply(logits, flat_target, ignore_index, float(label_smoothing), float(z_loss),
                                reduction == "mean", inplace)
    row_losses = _row_losses_aten if aten else torch.ops.oss.cross_entropy
    counted = flat_target != ignore_index

    if weight is None:
        loss, _ = row_losses(logits, flat_target, ignore_index, float(label_smoothing), float(z_loss))
        denominator = counted.sum()
    else:
        # F.cross_entropy's weighted form: (1 - eps) w_t (lse - x_t)
        # + eps / C * sum_j w_j (lse - x_j), plus z_loss w_t lse^2.
        loss_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        w = weight.to(loss_dtype)
        w_t = torch.where(counted, w[torch.where(counted, flat_target, 0)], 0)
        if label_smoothing == 0:
            # w_t (lse - x_t + z lse^2): the kernel's row loss, scaled
            loss, _ = row_losses(logits, flat_target, ignore_index, 0.0, float(z_loss))
            loss = w_t * loss
        else:
            # Composed from ATen ops (three terms whose logits gradients are
            # summed), on float32 logits so the sum is rounded to a 16-bit
            # dtype only once.
            x = logits.to(loss_dtype)
            nll, lse = row_losses(x, flat_target, ignore_index, 0.0, 0.0)
            lse = lse.to(loss_dtype)
            loss = (1 - label_smoothing) * w_t * nll
            smooth = lse * w.sum() - x @ w
            loss = loss + torch.where(counted, (label_smoothing / classes) * smooth, 0)
            if z_loss != 0:
                loss = loss + z_loss * w_t * lse * lse
        denominator = w_t.sum()

    if reduction == "none":
        return loss.reshape(shape)
    total = loss.sum(dtype=torch.float64).to(loss.dtype)  # rounded once
    if reduction == "sum":
        return total
    return total / denominator


# ---------------------------------------------------------------------------
# linear_cross_entropy
# ---------------------------------------------------------------------------


def _default_chunk(tokens, vocab, dtype):
    itemsize = torch.empty((), dtype=dtype).element_size()
    return max(1, min(tokens, DEFAULT_CHUNK_BYTES // max(1, vocab * itemsize)))


# aten's matrix products with a float32 result from 16-bit inputs (cuBLAS,
# float32 accumulation), where this torch has them
_HAS_OUT_DTYPE = hasattr(torch.ops.aten.addmm, "dtype_out")


def _add_product(acc, a, b):
    """acc += a @ b, acc float32 (float64 for float64), a and b in the inputs'
    dtype. On CUDA with 16-bit inputs one cuBLAS product of the 16-bit values
    accumulated and written in float32: the same products as converting a and
    b to float32 first (16-bit values are exact in float32), without the
    float32 copies and at the tensor cores' rate rather than a float32 GEMM's.
    Elsewhere through float32 copies."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif a.is_cuda and _HAS_OUT_DTYPE:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def _chunk_logits(hidden_c, weight, bias):
    # F.linear: one matrix product with the bias fused (addmm), rounded once
    return torch.nn.functional.linear(hidden_c, weight, bias)


class _LinearCrossEntropy(torch.autograd.Function):
    """Per chunk of tokens: logits = hidden @ weight.T + bias, the loss and its
    logits gradient with the oss ops, and (when gradients are wanted) their
    products with weight and hidden, so no tensor of (tokens x vocabulary) is
    ever whole. mean/sum compute the gradients in the forward (for an upstream
    gradient of 1) and the backward scales them; "none" keeps only the inputs
    and recomputes each chunk's logits in the backward with the per-row
    upstream gradients."""

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss, chunk,
                grad_enabled):
        tokens = hidden.shape[0]
        want = tuple(grad_enabled and t is not None and t.requires_grad for t in (hidden, weight, bias))
        stat = _stat_dtype(hidden.dtype)
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        args = (ignore_index, label_smoothing, z_loss)
        counted = target != ignore_index
        losses = torch.empty(tokens, dtype=stat, device=hidden.device)
        keep_grads = reduction != "none" and any(want)
        if keep_grads:
            # the upstream gradient of every row's loss for an output gradient of 1
            row_grad = (1.0 / counted.sum().to(stat)) if reduction == "mean" else torch.ones((), dtype=stat,
                                                                                                device=hidden.device)
            grad_hidden = torch.empty_like(hidden) if want[0] else None
            grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want[1] else None
            grad_bias = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want[2] else None
        for begin in range(0, tokens, chunk):
            end = min(begin + chunk, tokens)
            h, t = hidden[begin:end], target[begin:end]
            logits = _chunk_logits(h, weight, bias)
            if keep_grads:
                # loss and gradient in one call (one launch on CUDA), the
                # gradient written over the chunk's logits
                loss_c, _ = torch.ops.oss.cross_entropy_forward_backward_(row_grad.expand(end - begin), logits, t,
                                                                          *args)
                g = logits
                del logits
            else:
                loss_c, _ = torch.ops.oss.cross_entropy(logits, t, *args)
            losses[begin:end] = loss_c
            if keep_grads:
                if want[0]:
                    grad_hidden[begin:end] = g @ weight
                if want[1]:
                    _add_product(grad_weight, g.t(), h)
                if want[2]:
                    grad_bias += g.sum(0, dtype=acc)
        ctx.reduction = reduction
        ctx.args = args
        ctx.chunk = chunk
        if reduction == "none":
            ctx.save_for_backward(hidden, weight, target, bias)
            return losses
        if keep_grads:
            # weight's and bias's stay in their float32 accumulators (float64
            # for float64) and are rounded once, after the backward's scaling;
            # hidden's rows are final products in hidden's dtype
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
            ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        total = losses.sum(dtype=torch.float64).to(stat)  # rounded once
        return total / counted.sum() if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_output):
        nones = (None,) * 7
        if ctx.reduction != "none":
            grads = [None if g is None else (g * grad_output.to(g.dtype)).to(dt)
                     for g, dt in zip(ctx.saved_tensors, ctx.dtypes)]
            return (grads[0], grads[1], None, grads[2]) + nones
        hidden, weight, target, bias = ctx.saved_tensors
        want_h, want_w, _, want_b = ctx.needs_input_grad[:4]
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        grad_hidden = torch.empty_like(hidden) if want_h else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        grad_bias = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_b else None
        tokens, chunk = hidden.shape[0], ctx.chunk
        for begin in range(0, tokens, chunk):
            end = min(begin + chunk, tokens)
            h, t = hidden[begin:end], target[begin:end]
            logits = _chunk_logits(h, weight, bias)
            torch.ops.oss.cross_entropy_forward_backward_(grad_output[begin:end], logits, t, *ctx.args)
            g = logits
            del logits
            if want_h:
                grad_hidden[begin:end] = g @ weight
            if want_w:
                _add_product(grad_weight, g.t(), h)
            if want_b:
                grad_bias += g.sum(0, dtype=acc)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None,
                None if grad_bias is None else grad_bias.to(bias.dtype)) + nones


def linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, z_loss=0.0, chunk_size=None):
    """cross_entropy(F.linear(hidden, weight, bias), target, ...) without the
    whole logits tensor: tokens are processed chunk_size at a time.

    hidden: (..., H); weight: (V, H); bias: (V,) or None; target: hidden's
    leading shape, int64 class indices. Each chunk's logits are computed by
    F.linear (in the inputs' dtype, the bias fused, rounded once); the loss
    and the logits' gradient by the oss ops, in float32 (float64 for
    float64). weight's and bias's gradients accumulate over the chunks in
    float32 from float32 products (a 16-bit product per chunk would round
    every chunk's share): for 16-bit inputs on CUDA, cuBLAS products of the
    16-bit values with a float32 result.

    Memory beyond the inputs and their gradients: one chunk's logits (their
    gradient is written over them), plus the float32 accumulator of weight's
    gradient: O(chunk x V + V x H), not O(tokens x V). chunk_size defaults to
    512 MiB / (V * itemsize) tokens (2092 for a 128256 vocabulary in bfloat16).

    For reduction "mean"/"sum" the gradients are computed during the forward
    (when any input requires grad) and scaled by the upstream gradient in the
    backward: weight's and bias's are held in float32 until then and rounded
    once after the scaling; hidden's are held in its dtype, so for 16-bit
    inputs an upstream gradient that is not a power of two (1 and loss scales
    are) costs them one more rounding. For "none" the forward keeps only its
    inputs and the backward recomputes each chunk's logits.
    """
    name = "linear_cross_entropy"
    _check_common(name, target, ignore_index, reduction, label_smoothing, z_loss)
    for arg, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {arg} must be a tensor, got {type(t).__name__}")
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{name}: weight must be (V, H) with H = hidden.size(-1); got weight {tuple(weight.shape)}, hidden "
            f"{tuple(hidden.shape)}"
        )
    if weight.dtype != hidden.dtype or (bias is not None and bias.dtype != hidden.dtype):
        raise TypeError(f"{name}: hidden, weight and bias must share a dtype (got {hidden.dtype}, {weight.dtype}"
                        f"{'' if bias is None else ', ' + str(bias.dtype)})")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{name}: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"{name}: target has shape {tuple(target.shape)} but must be hidden's leading shape "
            f"{tuple(hidden.shape[:-1])}"
        )
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise ValueError(f"{name}: chunk_size={chunk_size!r} must be a positive int or None")
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1)
    chunk = chunk_size or _default_chunk(h.shape[0], weight.shape[0], hidden.dtype)
    out = _LinearCrossEntropy.apply(h, weight, t, bias, ignore_index, reduction, float(label_smoothing),
                                    float(z_loss), chunk, torch.is_grad_enabled())
    return out.reshape(target.shape) if reduction == "none" else out
