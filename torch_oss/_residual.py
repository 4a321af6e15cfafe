"""The 16-bit attention output's rounding residual as the ops keep it.

`torch.ops.oss.attention_with_residual` (and `attention_varlen` with
`return_residual=True`) return, beside a float16/bfloat16 `out`, the output
before its rounding minus `out`, rounded to a step of 2^-5 of out's unit in the
last place (that of the smallest normal below it; 0 where out is not finite),
as int8 counts of that step (-16 .. 16). The backward ops take those codes as
`out_residual`. These functions are the same rule as the kernels'
(csrc/oss_internal.h), bit for bit, written with tensor operations for code
that merges outputs itself (ring attention).
"""

import torch

_RESIDUAL_BITS = 5


def _step_exponent(rounded):
    """The biased float32 exponent of c = 1.5 * 2^(step + 23), whose last place
    is the residual's step, for each element of the 16-bit `rounded`."""
    bf16 = rounded.dtype == torch.bfloat16
    smallest = 2.0 ** -126 if bf16 else 2.0 ** -14
    a = rounded.float().abs()
    a = torch.where(torch.isnan(a) | (a < smallest), torch.full_like(a, smallest), a)
    return (a.view(torch.int32) >> 23) + (23 - (7 if bf16 else 10) - _RESIDUAL_BITS)


def _c_bits(e):
    # c's exponent field reduced by 64 where it would pass the largest (the
    # scaled case: d and c both times 2^-64, exactly)
    return (torch.where(e > 254, e - 64, e) << 23) | 0x400000


def output_residual_code(x, rounded):
    """int8 codes of x (float32) minus `rounded` (x rounded to float16 or
    bfloat16), in steps of 2^-5 of rounded's last place, to nearest with ties
    to even; 0 where rounded is not finite."""
    e = _step_exponent(rounded)
    cb = _c_bits(e)
    big = e > 254
    d = (x.float() - rounded.float()) * torch.where(big, 2.0 ** -64, 1.0)
    k = (d + cb.view(torch.float32)).view(torch.int32) - cb
    return torch.where(torch.isfinite(rounded), k, torch.zeros_like(k)).to(torch.int8)


def output_residual_value(code, rounded):
    """The float32 residual that int8 `code` stands for next to `rounded`:
    code steps of 2^-5 of rounded's last place (exact; +0 for a code of 0)."""
    e = _step_exponent(rounded)
    cb = _c_bits(e)
    s = (cb + code.to(torch.int32)).view(torch.float32) - cb.view(torch.float32)
    return s * torch.where(e > 254, 2.0 ** 64, 1.0)
