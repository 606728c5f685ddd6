"""The shared argument checks (:mod:`graphattn.checks`): each names the argument and what was
expected."""

from __future__ import annotations

import math

import pytest

from graphattn.checks import check_number


@pytest.mark.parametrize("value", [0, -2, 1.5, 3])
def test_check_number_accepts_finite_reals(value):
    out = check_number("w", value)
    assert isinstance(out, float) and out == value


@pytest.mark.parametrize("value", [True, "1", None, math.nan, math.inf, -math.inf, [1.0]])
def test_check_number_refuses_non_numbers(value):
    with pytest.raises(ValueError, match=r"'w' must be a finite number, got"):
        check_number("w", value)


def test_check_number_bounds():
    assert check_number("w", 0, minimum=0) == 0.0
    with pytest.raises(ValueError, match=r"'w' must be a finite number >= 0, got -0.5"):
        check_number("w", -0.5, minimum=0)
    with pytest.raises(ValueError, match=r"'tau' must be a finite number > 0, got 0"):
        check_number("tau", 0, minimum=0, strict=True)
    assert check_number("tau", 1e-9, minimum=0, strict=True) == 1e-9
    with pytest.raises(ValueError, match=r"> 0, got inf"):
        check_number("tau", math.inf, minimum=0, strict=True)
