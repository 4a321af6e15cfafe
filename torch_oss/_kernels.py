"""Which CUDA attention kernels run: for tests and benchmarks that compare
the kernel families on one GPU. Not part of the public API."""

import contextlib

from . import _C

_KEEP = -1000  # the extension's "leave this choice as it is"


@contextlib.contextmanager
def attention_kernels(forward=None, backward=None, dq_centring=None, decode_splits=None, forward_ctas_per_sm=None,
                      forward_block_rows=None):
    """Inside the block, forward="mma" / backward="mma" run the mma.sync
    kernels also where Hopper (wgmma) ones exist ("best" the default choice),
    dq_centring=False turns off the 16-bit backward's dQ centring,
    decode_splits=n forces the split-KV decode forward to n key splits (0: its
    own rule, -1: never run it where the other kernels can serve the call), and
    forward_ctas_per_sm=n runs the Hopper forward as a persistent grid of n
    CTAs per SM (-1: one CTA per block of query rows; 0: the launcher's rule,
    the default), and forward_block_rows=128 or 192 picks the Hopper forward's
    query rows per block where kernels of both sizes serve a call (0: the
    launcher's rule). None keeps a choice as it is. The choices are process-wide:
    not for use while another thread runs attention."""

    def family(value, name):
        if value is None:
            return _KEEP
        if value not in ("mma", "best"):
            raise ValueError(f"attention_kernels: {name}={value!r} must be 'mma', 'best' or None")
        return int(value == "mma")

    if decode_splits is not None and (not isinstance(decode_splits, int) or decode_splits < -1):
        raise ValueError(f"attention_kernels: decode_splits={decode_splits!r} must be an int >= -1 or None")
    if forward_ctas_per_sm is not None and (not isinstance(forward_ctas_per_sm, int) or forward_ctas_per_sm < -1):
        raise ValueError(f"attention_kernels: forward_ctas_per_sm={forward_ctas_per_sm!r} must be an int >= -1 or None")
    if forward_block_rows is not None and (type(forward_block_rows) is not int or forward_block_rows not in (0, 128, 192)):
        raise ValueError(f"attention_kernels: forward_block_rows={forward_block_rows!r} must be 0, 128, 192 or None")
    previous = _C.attention_kernels(family(forward, "forward"), family(backward, "backward"),
                                    _KEEP if dq_centring is None else int(bool(dq_centring)),
                                    _KEEP if decode_splits is None else decode_splits,
                                    _KEEP if forward_ctas_per_sm is None else forward_ctas_per_sm,
                                    _KEEP if forward_block_rows is None else forward_block_rows)
    try:
        yield
    finally:
        _C.attention_kernels(*previous)
