"""torch_oss: open softmax and FlashAttention-style attention kernels for PyTorch.

Importing the package registers torch.ops.oss.{softmax, log_softmax, attention,
attention_varlen} and their backward ops, with fake functions and autograd
formulas, so they work in eager mode, under autograd and under torch.compile.
"""

import torch  # noqa: F401  (the extension links against torch's libraries)

from . import _C  # noqa: F401  registers the operator schemas and kernels
from . import _registrations
from .cross_entropy import cross_entropy, linear_cross_entropy  # noqa: F401
from .functional import attention, attention_with_lse, log_softmax, softmax
from .kv_cache import attention_with_kvcache
from .patching import (FallbackError, FallbackWarning, disable, enable, enabled, fallback_stats, is_enabled,
                       reset_fallback_stats)
from .transformers_integration import register_transformers
from .varlen import attention_varlen

__version__ = "0.1.0"
__all__ = ["softmax", "log_softmax", "attention", "attention_with_lse", "attention_with_kvcache", "attention_varlen",
           "build_info", "__version__"]
__all__ += ["enable", "disable", "enabled", "is_enabled", "fallback_stats", "reset_fallback_stats", "FallbackWarning",
            "FallbackError", "register_transformers"]

_registrations.register()


def __getattr__(name):
    # torch_oss.distributed (context parallelism) is imported on first use, so
    # that `import torch_oss` does not import torch.distributed.
    if name == "distributed":
        import importlib

        return importlib.import_module(".distributed", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_info():
    """What this build compiled: version, torch version, whether CUDA kernels
    are present, their archs, the attention head dims with tile kernels and
    those with the Hopper forward."""
    fields = dict(item.split("=", 1) for item in _C.build_config().split())

    def as_list(text, cast=str):
        return [cast(x) for x in text.replace(";", ",").split(",") if x]

    return {
        "version": __version__,
        "torch": torch.__version__,
        "cuda": fields.get("cuda") == "1",
        "cuda_archs": as_list(fields.get("archs", "")),
        "attention_head_dims": as_list(fields.get("attention_head_dims", ""), int),
        # head dims whose forward has the Hopper (wgmma, sm_90a) kernel
        "attention_hopper_head_dims": as_list(fields.get("attention_hopper_head_dims", ""), int),
    }
