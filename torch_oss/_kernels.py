"""Which CUDA attention kernels run: for tests and benchmarks that compare the
kernel families on one GPU. Not part of the public API."""

import contextlib

from . import _C


@contextlib.contextmanager
def attention_kernels(forward=None, backward=None, dq_centring=None):
    """Inside the block, forward="mma" / backward="mma" run the mma.sync
    kernels also where Hopper (wgmma) ones exist ("best" the default choice),
    and dq_centring=False turns off the 16-bit backward's dQ centring. None
    keeps a choice as it is. The choices are process-wide: not for use while
    another thread runs attention."""

    def family(value, name):
        if value is None:
            return -1
        if value not in ("mma", "best"):
            raise ValueError(f"attention_kernels: {name}={value!r} must be 'mma', 'best' or None")
        return int(value == "mma")

    previous = _C.attention_kernels(family(forward, "forward"), family(backward, "backward"),
                                    -1 if dq_centring is None else int(bool(dq_centring)))
    try:
        yield
    finally:
        _C.attention_kernels(*previous)
