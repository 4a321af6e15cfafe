"""Route PyTorch's softmax, log_softmax, scaled_dot_product_attention and cross_entropy to torch_oss.

    torch_oss.enable()              # from now on F.softmax & co. run on torch.ops.oss.*
    torch_oss.disable()             # PyTorch's own functions again (the exact objects)
    with torch_oss.enabled(): ...   # only inside the block

While enabled, these functions are replaced by wrappers that call the torch_oss
ops when they can serve the call and PyTorch's implementation otherwise:

    torch.nn.functional.softmax        torch.nn.functional.log_softmax
    torch.softmax                      torch.log_softmax
    torch.Tensor.softmax               torch.Tensor.log_softmax
    torch.special.softmax              torch.special.log_softmax
    torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.cross_entropy  (class indices, or probabilities of the input's dtype; torch_oss.cross_entropy)

Hugging Face models compute their language-modelling loss with
``nn.functional.cross_entropy``, looked up at each call, so their losses take
torch_oss's kernels while it is enabled.

The wrappers are plain Python, so torch.compile (dynamo) inlines them: the
compiled graph holds torch.ops.oss.* nodes, with no graph break, and dynamo's
guards on the patched attributes recompile a function after disable() (or
after enable(), for code compiled before it).

Tensor methods (checked on torch 2.11 and 2.15): on a tensor that enters the
compiled region (an input, parameter or buffer) dynamo inlines the wrapper
like the functions above, with the same guards. On a tensor computed inside
the region dynamo records an opaque ``.softmax(...)`` method call; AOTAutograd
(the "inductor" and "aot_eager" backends, torch.export) runs that call through
the wrapper while it traces, so the final graph holds torch.ops.oss as well,
but dynamo installs no guard for it: code compiled before enable() keeps
PyTorch's kernel for such calls (and code compiled while enabled keeps
torch_oss after disable()) until it is recompiled, e.g. after
``torch.compiler.reset()``. Their fallbacks are counted once per compilation
(when AOTAutograd traces them) rather than per call. Enable torch_oss before
compiling and none of this matters.

What the wrappers see is what they route: ``from torch.nn.functional import
softmax`` executed *before* enable() keeps PyTorch's function, and C++ code
(e.g. nn.MultiheadAttention's fused fast path, torch._native_multi_head_attention)
never calls Python.

A call torch_oss cannot serve (a dtype, device or layout the
kernels lack, a tensor subclass, arguments the op does not have such as
``out=`` or named dims, 5-D attention inputs, head dims above the build's limit)
runs PyTorch's original function instead. Each such call is counted per
(function, reason) in :func:`fallback_stats` and the first one of each reason
emits a :class:`FallbackWarning`. Under torch.compile the decision is taken
while tracing: the count still grows on every call of the compiled code (dynamo
replays the update), the warning appears once, at compile time. With
``enable(strict=True)`` such a call raises :class:`FallbackError` instead (under
``torch.compile(fullgraph=True)`` dynamo reports it as an error while compiling).

Autocast is honoured as PyTorch's own kernels do it: under CUDA autocast,
softmax and log_softmax without ``dtype=`` return float32; under autocast on
either device, attention inputs are cast to the autocast dtype and
cross_entropy returns float32 (computed from the 16-bit logits directly, which
autocast would first copy to float32; the gradient keeps the logits' dtype).
Without autocast cross_entropy returns the logits' dtype, as PyTorch does.
"""

import contextlib
import importlib.util
import threading
import warnings

import torch
import torch.nn.functional as F

from . import _C
from . import functional as _oss
from .cross_entropy import cross_entropy as _oss_cross_entropy

__all__ = ["enable", "disable", "enabled", "is_enabled", "fallback_stats", "reset_fallback_stats", "FallbackWarning",
           "FallbackError"]


class FallbackWarning(UserWarning):
    """A call routed to torch_oss ran PyTorch's own implementation instead."""


class FallbackError(NotImplementedError):
    """Raised in strict mode where torch_oss cannot serve a call."""


# ---------------------------------------------------------------------------
# Build facts (read once; plain values so that dynamo treats them as constants)
# ---------------------------------------------------------------------------


def _build_fields():
    return dict(item.split("=", 1) for item in _C.build_config().split())


_FIELDS = _build_fields()
_CUDA_BUILT = _FIELDS.get("cuda") == "1"
_CUDA_HEAD_DIMS = [int(x) for x in _FIELDS.get("attention_head_dims", "").replace(";", ",").split(",") if x]
_CUDA_MAX_HEAD_DIM = max(_CUDA_HEAD_DIMS) if _CUDA_HEAD_DIMS else 256
_MAX_HEAD_DIM = 256
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SERVED_DEVICES = ("cpu", "cuda", "meta") if _CUDA_BUILT else ("cpu", "meta")


def _tracing_tensor_types():
    # Tensor types under which eager-mode tracers (non-strict torch.export,
    # make_fx, AOTAutograd) run Python code; they stand for plain tensors.
    types = []
    try:
        from torch._subclasses.fake_tensor import FakeTensor

        types.append(FakeTensor)
    except ImportError:  # pragma: no cover
        pass
    try:
        from torch._subclasses.functional_tensor import FunctionalTensor

        types.append(FunctionalTensor)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


_TRACING_TYPES = _tracing_tensor_types()

# ---------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------

_LOCK = threading.RLock()
_ACTIVE = False
_STRICT = False
_ORIGINALS = {}  # qualified name -> the object that enable() replaced
_OWN_ATTR = {}  # qualified name -> whether the owner held the attribute in its own __dict__
_STATS = {}  # (function, reason) -> count; never rebound (compiled code holds it)
_WARNED = set()


def fallback_stats():
    """Calls that fell back to PyTorch since the last reset, as
    ``{function: {reason: count}}`` (a copy). Functions are named by their
    public path (``"torch.nn.functional.scaled_dot_product_attention"``), and
    ``"transformers attn_implementation='oss'"`` for the Hugging Face
    attention function."""
    out = {}
    for (function, reason), count in list(_STATS.items()):
        out.setdefault(function, {})[reason] = count
    return out


def reset_fallback_stats():
    """Clears the counts and re-arms the one-time warnings (compiled code that
    is already traced does not warn again: its warning was emitted while
    tracing)."""
    _STATS.clear()
    _WARNED.clear()


def _warn_once(function, reason, stacklevel):
    # Runs in eager mode for eager calls and once, while tracing, for compiled
    # code (marked by mark_trace_time_helpers: dynamo calls it instead of
    # tracing it, and warnings.warn would be a graph break).
    key = (function, reason)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(
            f"torch_oss: {function} ran PyTorch's implementation instead of torch_oss: {reason}. "
            "(Warned once per reason; counts in torch_oss.fallback_stats(); torch_oss.enable(strict=True) raises "
            "instead.)",
            FallbackWarning,
            stacklevel=stacklevel + 1,
        )
    return True


_TRACE_TIME_HELPERS = [_warn_once]


def mark_trace_time_helpers():
    """Marks the warning helpers with torch.compiler.assume_constant_result
    (which returns the function itself, marked). Done by enable() and
    register_transformers() rather than at import, because it imports
    torch._dynamo (a second and a half) and only code routed by those two
    ever reaches the helpers."""
    for fn in _TRACE_TIME_HELPERS:
        torch.compiler.assume_constant_result(fn)


def _note_fallback(function, reason, stacklevel=2):
    """Called where a call cannot be served: raises in strict mode, else
    counts it and warns once per reason. stacklevel: 1 names the caller of
    this function, 2 its caller, ... (the warning points at the user's code)."""
    if not torch._C._is_torch_function_enabled():
        # A tensor subclass's __torch_function__ calling the function again
        # (PyTorch hands it torch.Tensor.softmax, i.e. the wrapper): the outer
        # call was counted already.
        return
    if _STRICT:
        raise FallbackError(f"torch_oss (strict mode): {function} cannot run on torch_oss: {reason}")
    key = (function, reason)
    _STATS[key] = _STATS.get(key, 0) + 1
    _warn_once(function, reason, stacklevel + 1)


def original(name):
    """PyTorch's function behind a patched name (e.g.
    ``"torch.nn.functional.scaled_dot_product_attention"``), whether or not
    torch_oss is enabled."""
    if name in _ORIGINALS:
        return _ORIGINALS[name]
    owner, attr = _TARGETS[name]
    return getattr(owner(), attr)


# ---------------------------------------------------------------------------
# Checks: each returns None when torch_oss can serve the call, else a reason
# ---------------------------------------------------------------------------


def _tensor_reason(t, name):
    cls = type(t)
    if not (cls is torch.Tensor or cls is torch.nn.Parameter or cls in _TRACING_TYPES):
        return f"{name} is a tensor subclass ({cls.__name__})"
    if t.is_nested:
        return f"{name} is a nested tensor"
    if t.layout != torch.strided:
        return f"{name} has layout {t.layout}"
    # is_cpu / is_cuda first: cheaper than building the device object (every call pays this)
    if not (t.is_cpu or (_CUDA_BUILT and t.is_cuda)) and t.device.type not in _SERVED_DEVICES:
        return f"{name} is on device type '{t.device.type}' (this build serves {', '.join(_SERVED_DEVICES)})"
    return None


def _softmax_reason(input, dim, dtype):
    if not isinstance(input, torch.Tensor):
        return "input is not a Tensor"
    reason = _tensor_reason(input, "input")
    if reason is not None:
        return reason
    if type(dim) is not int:
        return f"dim of type {type(dim).__name__} (named or symbolic dims are not supported)"
    rank = max(input.dim(), 1)
    if not -rank <= dim < rank:
        return "dim out of range"
    if dtype is not None:
        if dtype not in _FLOAT_DTYPES:
            return f"dtype={dtype} (torch_oss computes in float16, bfloat16, float32 or float64)"
        if input.dtype.is_complex:
            return f"input dtype {input.dtype}"
    elif input.dtype not in _FLOAT_DTYPES:
        return f"input dtype {input.dtype} (torch_oss computes in float16, bfloat16, float32 or float64)"
    return None


def _attention_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            return f"{name} is not a Tensor"
        reason = _tensor_reason(t, name)
        if reason is not None:
            return reason
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or not 0 <= dropout_p <= 1:
        return f"dropout_p={dropout_p!r} (not a number in [0, 1])"
    if query.dtype not in _FLOAT_DTYPES:
        return f"query dtype {query.dtype}"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return "query, key and value dtypes differ"
    if key.device != query.device or value.device != query.device:
        return "query, key and value are on different devices"
    try:
        rank = _oss._broadcast_plan(query, key, value, enable_gqa)[0]
    except ValueError as e:
        return str(e).replace("torch_oss.attention: ", "")
    limit = _CUDA_MAX_HEAD_DIM if query.device.type == "cuda" else _MAX_HEAD_DIM
    if query.shape[-1] > limit or value.shape[-1] > limit:
        return f"head dim {max(query.shape[-1], value.shape[-1])} > {limit}"
    if query.shape[-1] < 1 or value.shape[-1] < 1 or key.shape[-1] != query.shape[-1]:
        return "head dims of query and key differ or are 0"
    if key.dim() >= 3 and value.dim() >= 3 and key.shape[-3] != value.shape[-3]:
        return "key and value have different numbers of heads"
    if scale is not None and not isinstance(scale, (int, float)):
        return f"scale of type {type(scale).__name__}"
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            return "attn_mask is not a Tensor"
        if _oss._causal_bias_variant(attn_mask) is not None:
            return None  # torch.nn.attention.bias.CausalBias: torch_oss reads its variant
        if is_causal:
            return "attn_mask together with is_causal=True (PyTorch rejects this combination)"
        reason = _tensor_reason(attn_mask, "attn_mask")
        if reason is not None:
            return reason
        if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype and attn_mask.dtype != torch.float32:
            return f"attn_mask dtype {attn_mask.dtype} with query dtype {query.dtype}"
        if attn_mask.device != query.device:
            return "attn_mask is on another device"
        if attn_mask.dim() > rank:
            return f"{attn_mask.dim()}-D attn_mask for {rank}-D inputs"
        if attn_mask.requires_grad and torch.is_grad_enabled():
            return "attn_mask requires grad (torch_oss gives no mask gradient)"
    return None


def _cross_entropy_reason(input, target, weight, size_average, reduce, reduction, ignore_index):
    for name, t in (("input", input), ("target", target), ("weight", weight)):
        if t is None and name == "weight":
            continue
        if not isinstance(t, torch.Tensor):
            return f"{name} is not a Tensor"
        reason = _tensor_reason(t, name)
        if reason is not None:
            return reason
    if size_average is not None or reduce is not None:
        return "the deprecated size_average / reduce arguments"
    if input.dtype not in _FLOAT_DTYPES:
        return f"input dtype {input.dtype}"
    if target.dtype.is_floating_point:
        # class probabilities: as PyTorch's where the target has the input's
        # dtype and shape and ignore_index its default (PyTorch promotes mixed
        # dtypes and raises on the others)
        if target.dtype != input.dtype:
            return f"probability targets of dtype {target.dtype} for input of dtype {input.dtype}"
        if target.shape != input.shape or ignore_index != -100:
            return "probability targets of another shape than the input's, or with ignore_index"
    elif target.dtype != torch.int64:
        return f"target dtype {target.dtype}"
    if input.dim() < 1 or reduction not in ("none", "mean", "sum"):
        return "input shape or reduction outside F.cross_entropy's forms"
    if target.device != input.device or (weight is not None and weight.device != input.device):
        return "input, target and weight are on different devices"
    return None


# ---------------------------------------------------------------------------
# Autocast, as PyTorch's own kernels apply it
# ---------------------------------------------------------------------------


def _autocast_softmax_dtype(input, dtype):
    # CUDA autocast runs softmax/log_softmax with policy fp32_set_opt_dtype: an
    # unset dtype becomes float32 for floating inputs other than float64. CPU
    # autocast leaves softmax alone.
    if dtype is None and input.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        if input.dtype.is_floating_point and input.dtype != torch.float64:
            return torch.float32
    return dtype


def autocast_attention_inputs(query, key, value, attn_mask):
    """Casts like autocast does for scaled_dot_product_attention (lower
    precision list on CPU and CUDA): floating tensors other than float64 go to
    the autocast dtype."""
    device = "cuda" if query.is_cuda else "cpu" if query.is_cpu else None  # cheaper than query.device.type
    if device is None or not torch.is_autocast_enabled(device):
        return query, key, value, attn_mask
    target = torch.get_autocast_dtype(device)

    def cast(t):
        if t is not None and t.dtype.is_floating_point and t.dtype != torch.float64 and t.dtype != target:
            return t.to(target)
        return t

    mask = attn_mask if _oss._causal_bias_variant(attn_mask) is not None else cast(attn_mask)
    return cast(query), cast(key), cast(value), mask


# ---------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------


def _softmax_dispatch(function, log, input, dim, dtype, fallback):
    reason = _softmax_reason(input, dim, dtype)
    if reason is None:
        dtype = _autocast_softmax_dtype(input, dtype)
        op = torch.ops.oss.log_softmax if log else torch.ops.oss.softmax
        return op(input, dim, dtype)
    _note_fallback(function, reason, stacklevel=3)
    if torch.compiler.is_compiling() and type(dim) is int and isinstance(input, torch.Tensor):
        # An aten overload: a graph node that never calls back into a wrapper.
        op = torch.ops.aten.log_softmax.int if log else torch.ops.aten.softmax.int
        return op(input, dim, dtype)
    return fallback()


def _make_functional(name, log):
    qualname = f"torch.nn.functional.{name}"

    def wrapper(input, dim=None, _stacklevel=3, dtype=None):
        if dim is None and isinstance(input, torch.Tensor):
            # F.softmax's legacy implicit-dim rule (warning included, in eager).
            if torch.compiler.is_compiling():
                dim = 0 if input.dim() in (0, 1, 3) else 1
            else:
                dim = _oss._legacy_softmax_dim(name, input.dim(), _stacklevel)

        def fallback():
            cls = type(input)
            if cls is torch.Tensor or cls is torch.nn.Parameter:
                # What F.softmax does for a plain tensor, without going through
                # the patched Tensor method (which would count the call twice).
                method = _ORIGINALS[method_name]
                return method(input, dim) if dtype is None else method(input, dim, dtype=dtype)
            return _ORIGINALS[qualname](input, dim, _stacklevel, dtype)

        return _softmax_dispatch(qualname, log, input, dim, dtype, fallback)

    method_name = f"torch.Tensor.{name}"
    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"torch_oss-routed {qualname} (see torch_oss.enable)."
    return wrapper


def _make_torch(name, log, qualname):
    def wrapper(input, dim, dtype=None, *, out=None):
        if out is not None:
            _note_fallback(qualname, "out= is not supported", stacklevel=2)
            return _ORIGINALS[qualname](input, dim, dtype, out=out)
        return _softmax_dispatch(qualname, log, input, dim, dtype, lambda: _ORIGINALS[qualname](input, dim, dtype))

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"torch_oss-routed {qualname} (see torch_oss.enable)."
    return wrapper


def _make_special(name, log, qualname):
    def wrapper(input, dim, dtype=None):
        return _softmax_dispatch(qualname, log, input, dim, dtype, lambda: _ORIGINALS[qualname](input, dim, dtype))

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = f"torch_oss-routed {qualname} (see torch_oss.enable)."
    return wrapper


def _make_method(name, log):
    qualname = f"torch.Tensor.{name}"

    def wrapper(self, dim, dtype=None):
        return _softmax_dispatch(qualname, log, self, dim, dtype,
                                 lambda: _ORIGINALS[qualname](self, dim, dtype=dtype))

    # Not named "softmax": dynamo treats a bound method whose __name__ is a
    # Tensor attribute as PyTorch's builtin method and would not inline it.
    wrapper.__name__ = f"torch_oss_{name}"
    wrapper.__qualname__ = f"Tensor.torch_oss_{name}"
    wrapper.__doc__ = f"torch_oss-routed {qualname} (see torch_oss.enable)."
    return wrapper


_SDPA = "torch.nn.functional.scaled_dot_product_attention"


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch_oss-routed torch.nn.functional.scaled_dot_product_attention (see torch_oss.enable)."""
    reason = _attention_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is None:
        query, key, value, attn_mask = autocast_attention_inputs(query, key, value, attn_mask)
        return _oss.attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                              scale=scale, enable_gqa=enable_gqa)
    _note_fallback(_SDPA, reason, stacklevel=2)
    if torch.compiler.is_compiling() and all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        return torch.ops.aten.scaled_dot_product_attention.default(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return _ORIGINALS[_SDPA](query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                             scale=scale, enable_gqa=enable_gqa)


_CROSS_ENTROPY = "torch.nn.functional.cross_entropy"


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """torch_oss-routed torch.nn.functional.cross_entropy (see torch_oss.enable)."""
    reason = _cross_entropy_reason(input, target, weight, size_average, reduce, reduction, ignore_index)
    if reason is None:
        loss = _oss_cross_entropy(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                                  label_smoothing=label_smoothing)
        device = input.device.type
        autocast = device in ("cpu", "cuda") and torch.is_autocast_enabled(device)
        return loss if autocast or loss.dtype == input.dtype else loss.to(input.dtype)
    _note_fallback(_CROSS_ENTROPY, reason, stacklevel=2)
    return _ORIGINALS[_CROSS_ENTROPY](input, target, weight=weight, size_average=size_average,
                                      ignore_index=ignore_index, reduce=reduce, reduction=reduction,
                                      label_smoothing=label_smoothing)


# name -> (owner getter, attribute); owners are looked up when patching so
# that torch.special and friends are imported modules, not stale copies.
_TARGETS = {
    "torch.nn.functional.softmax": (lambda: F, "softmax"),
    "torch.nn.functional.log_softmax": (lambda: F, "log_softmax"),
    "torch.softmax": (lambda: torch, "softmax"),
    "torch.log_softmax": (lambda: torch, "log_softmax"),
    "torch.special.softmax": (lambda: torch.special, "softmax"),
    "torch.special.log_softmax": (lambda: torch.special, "log_softmax"),
    "torch.Tensor.softmax": (lambda: torch.Tensor, "softmax"),
    "torch.Tensor.log_softmax": (lambda: torch.Tensor, "log_softmax"),
    _SDPA: (lambda: F, "scaled_dot_product_attention"),
    _CROSS_ENTROPY: (lambda: F, "cross_entropy"),
}

_WRAPPERS = {
    "torch.nn.functional.softmax": _make_functional("softmax", log=False),
    "torch.nn.functional.log_softmax": _make_functional("log_softmax", log=True),
    "torch.softmax": _make_torch("softmax", False, "torch.softmax"),
    "torch.log_softmax": _make_torch("log_softmax", True, "torch.log_softmax"),
    "torch.special.softmax": _make_special("softmax", False, "torch.special.softmax"),
    "torch.special.log_softmax": _make_special("log_softmax", True, "torch.special.log_softmax"),
    "torch.Tensor.softmax": _make_method("softmax", log=False),
    "torch.Tensor.log_softmax": _make_method("log_softmax", log=True),
    _SDPA: scaled_dot_product_attention,
    _CROSS_ENTROPY: cross_entropy,
}

PATCHED_FUNCTIONS = tuple(_TARGETS)

# ---------------------------------------------------------------------------
# enable / disable
# ---------------------------------------------------------------------------


def is_enabled():
    """Whether torch_oss currently routes PyTorch's functions."""
    return _ACTIVE


def _register_transformers_if_available():
    if importlib.util.find_spec("transformers") is None:
        return
    try:
        from .transformers_integration import register_transformers

        register_transformers()
    except Exception as exc:  # a broken or too old transformers must not break enable()
        warnings.warn(f"torch_oss.enable(): could not register attn_implementation='oss' with transformers: {exc}",
                      RuntimeWarning, stacklevel=3)


def enable(*, strict=False, transformers=True):
    """Routes F.softmax, F.log_softmax, F.scaled_dot_product_attention,
    F.cross_entropy and the aliases (see the module docstring) to torch_oss, in
    eager mode and under torch.compile.

    strict: raise :class:`FallbackError` instead of falling back to PyTorch.
    transformers: when the transformers package is installed, also register
        ``attn_implementation="oss"`` (see torch_oss.register_transformers);
        this imports transformers.

    Idempotent: a second call only updates ``strict``.
    """
    global _ACTIVE, _STRICT
    mark_trace_time_helpers()
    with _LOCK:
        _STRICT = bool(strict)
        if not _ACTIVE:
            for name, (owner_of, attr) in _TARGETS.items():
                owner = owner_of()
                _OWN_ATTR[name] = attr in vars(owner)
                _ORIGINALS[name] = getattr(owner, attr)
            for name, (owner_of, attr) in _TARGETS.items():
                setattr(owner_of(), attr, _WRAPPERS[name])
            _ACTIVE = True
    if transformers:
        _register_transformers_if_available()


def disable():
    """Restores the exact functions that enable() replaced. An attribute that
    someone else replaced after enable() is left as it is (with a warning)."""
    global _ACTIVE, _STRICT
    with _LOCK:
        if not _ACTIVE:
            _STRICT = False
            return
        for name, (owner_of, attr) in _TARGETS.items():
            owner = owner_of()
            current = vars(owner).get(attr)
            if current is not _WRAPPERS[name]:
                warnings.warn(f"torch_oss.disable(): {name} was replaced by someone else after enable(); left as it is",
                              RuntimeWarning, stacklevel=2)
                continue
            if _OWN_ATTR[name]:
                setattr(owner, attr, _ORIGINALS[name])
            else:
                delattr(owner, attr)  # e.g. torch.Tensor.softmax lives on torch._C.TensorBase
        _ACTIVE = False
        _STRICT = False


@contextlib.contextmanager
def enabled(*, strict=False, transformers=True):
    """Context manager form of :func:`enable`; restores the previous state
    (enabled or not, strict or not) on exit. The patching is process-wide:
    other threads see it too while the block runs."""
    global _STRICT
    with _LOCK:
        was_active, was_strict = _ACTIVE, _STRICT
    enable(strict=strict, transformers=transformers)
    try:
        yield
    finally:
        with _LOCK:
            if was_active:
                _STRICT = was_strict
            else:
                disable()
