"""The shared argument checks (:mod:`graphattn.core.checks`): each names the argument and what was
expected."""

from __future__ import annotations

import math

import pytest
import torch

from graphattn.core.checks import all_finite, check_number, check_sized_channels


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_equals_isfinite_all(dtype):
    """One ``aminmax`` reduction flags exactly what ``torch.isfinite(t).all()`` flags: NaN (also
    next to ±inf, whose extremes it would otherwise hide), +inf, -inf, in any position."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(37, 5, generator=g).to(dtype)
    assert bool(all_finite(base))
    for bad in ([math.nan], [math.inf], [-math.inf], [math.nan, math.inf], [-math.inf, math.nan]):
        for pos in (0, 100, 184):
            t = base.clone().view(-1)
            for i, v in enumerate(bad):
                t[(pos + i) % t.numel()] = v
            assert not bool(all_finite(t.view(37, 5))), (bad, pos)
            assert bool(all_finite(t.view(37, 5))) == bool(torch.isfinite(t).all())


def test_all_finite_other_tensors():
    assert bool(all_finite(torch.empty(0, 3)))
    assert bool(all_finite(torch.arange(5)))  # integers are always finite
    assert not bool(all_finite(torch.tensor([1 + 1j, complex(math.inf, 0)])))
    assert bool(all_finite(torch.tensor(2.0)))
    x = torch.randn(4, requires_grad=True)
    out = all_finite(x)
    assert out.dtype == torch.bool and out.shape == () and not out.requires_grad


def test_check_sized_channels_refuses_lazy_and_names_the_remedy():
    assert check_sized_channels("P", 8) == 8
    with pytest.raises(ValueError, match=r"P sizes its parameters by the input width: 'channels' = "
                                         r"-1 \(lazy\) is not supported; give the model in_channels="):
        check_sized_channels("P", -1)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="'channels' must be a positive int"):
            check_sized_channels("P", bad)


@pytest.mark.parametrize("name", ["samsa", "converter"])
def test_producers_sized_by_the_input_refuse_lazy_channels(name):
    from graphattn.producers.registry import PRODUCERS, build_producer

    assert PRODUCERS[name].lazy_channels is False
    with pytest.raises(ValueError, match="'channels' = -1 \\(lazy\\) is not supported"):
        build_producer(name, channels=-1, heads=2, num_heads=2)
