"""The tolerance rule's handling of overflow (tests/_util.py assert_tolerance):
a 16-bit output must be inf exactly where the float64 reference rounds to inf,
except where the reference lies within the allowed error of the overflow
threshold (65520 in float16), where either side is a correct rounding."""

import pytest
import torch
from _util import assert_tolerance

F16 = torch.float16


def check(ours, ref, atol=1.0):
    assert_tolerance("t", torch.tensor(ours, dtype=F16), torch.tensor(ref, dtype=torch.float64), None, atol,
                     per_element_eps=True)


def test_either_side_of_the_threshold_within_the_error():
    check([65504.0, 1.0], [65530.0, 1.0])  # reference rounds to inf, ours to the largest finite
    check([float("inf"), 1.0], [65510.0, 1.0])  # reference rounds to 65504, ours to inf
    check([-float("inf"), 1.0], [-65510.0, 1.0])


def test_infinities_far_from_the_threshold_must_match():
    with pytest.raises(AssertionError, match="infinities differ"):
        check([float("inf"), 1.0], [60000.0, 1.0])
    with pytest.raises(AssertionError, match="infinities differ"):
        check([65504.0, 1.0], [1e6, 1.0])
    check([float("inf"), 1.0], [1e6, 1.0])


def test_an_infinity_of_the_wrong_sign_fails():
    with pytest.raises(AssertionError, match="wrong sign"):
        check([-float("inf"), 1.0], [65530.0, 1.0])


def test_a_finite_value_at_the_threshold_is_still_compared():
    with pytest.raises(AssertionError, match="max error"):
        check([60000.0, 1.0], [65530.0, 1.0], atol=1.0)
