"""The counter-based CPU dropout (``kernels/csrc/dropout.cpp``) against its definition."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from graphattn.kernels import cpu_extension
from graphattn.kernels import dropout as dropout_mod
from graphattn.kernels.dropout import draw_seed, dropout

from graphattn.nn.dropout import Dropout

needs_kernel = pytest.mark.skipif(cpu_extension.cpu_ops(warn=False) is None,
                                  reason="the compiled CPU extension is unavailable")


@needs_kernel
@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9])
def test_each_element_is_kept_with_probability_one_minus_p(p: float) -> None:
    torch.manual_seed(0)
    n = 1_000_003  # odd, not a multiple of any vector width
    y = dropout(torch.ones(n, dtype=torch.float64), p)
    kept = y != 0
    # binomial: the kept count lies within 6 standard deviations of n (1 - p)
    assert abs(kept.sum().item() - n * (1 - p)) < 6 * math.sqrt(n * p * (1 - p))
    # kept elements are scaled by 1 / (1 - p): unbiased
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    # no correlation between neighbouring elements (the mask is not a pattern)
    k = kept.double()
    corr = torch.corrcoef(torch.stack([k[:-1], k[1:]]))[0, 1].item()
    assert abs(corr) < 6 / math.sqrt(n)


@needs_kernel
def test_the_mask_is_reproducible_under_a_seed_and_changes_between_calls() -> None:
    x = torch.randn(301, 17)
    torch.manual_seed(5)
    a, b = dropout(x, 0.3), dropout(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(dropout(x, 0.3), a)
    assert not torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(dropout(x, 0.3, generator=g1), dropout(x, 0.3, generator=g2))


@needs_kernel
def test_the_mask_does_not_depend_on_the_number_of_threads() -> None:
    x = torch.randn(70_001, 9)
    seed = draw_seed(torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(dropout(x, 0.25, seed=seed))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_output_is_the_input_times_the_scaled_mask(dtype: torch.dtype) -> None:
    x = torch.randn(1000, 13, dtype=dtype) + 3.0  # no zeros in x: the zeros of y are the mask
    seed = draw_seed(torch.Generator().manual_seed(2))
    y = dropout(x, 0.4, seed=seed)
    mask = (y != 0).to(dtype)
    torch.testing.assert_close(y, x * mask / 0.6)
    # a non-contiguous input gives the mask of its contiguous copy
    xt = x.t().contiguous().t()
    assert torch.equal(dropout(xt, 0.4, seed=seed), dropout(xt.contiguous(), 0.4, seed=seed))


@needs_kernel
def test_backward_applies_the_same_mask() -> None:
    x = (torch.randn(200, 7, dtype=torch.float64) + 3.0).requires_grad_()
    seed = draw_seed(torch.Generator().manual_seed(3))
    y = dropout(x, 0.5, seed=seed)
    g = torch.randn_like(y)
    (grad,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(grad, g * (y != 0).double() / 0.5)
    small = x[:20, :5].detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: dropout(t, 0.3, seed=seed), (small,))
    assert torch.autograd.gradgradcheck(lambda t: dropout(t, 0.3, seed=seed), (small,))


def test_edge_cases_and_the_fallback() -> None:
    x = torch.randn(50, 4)
    assert dropout(x, 0.0) is x
    assert dropout(x, 0.7, training=False) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert dropout(torch.empty(0, 3), 0.5).shape == (0, 3)
    for bad in (-0.1, 1.5, "0.5", True, float("nan")):
        with pytest.raises(ValueError, match="'p'"):
            dropout(x, bad)  # type: ignore[arg-type]
    old = dropout_mod.NATIVE_DROPOUT
    dropout_mod.NATIVE_DROPOUT = False
    try:  # F.dropout's path: same distribution, and a seed cannot be honoured
        torch.manual_seed(0)
        y = dropout(torch.ones(10_000), 0.5)
        assert set(y.unique().tolist()) <= {0.0, 2.0}
        with pytest.raises(ValueError, match="'seed'"):
            dropout(x, 0.5, seed=torch.tensor(1))
    finally:
        dropout_mod.NATIVE_DROPOUT = old
    # integer and half tensors go to F.dropout's checks unchanged
    h = torch.ones(100, dtype=torch.float16)
    assert dropout(h, 0.5).dtype == torch.float16


def test_the_module_is_torch_dropout_with_the_fast_path() -> None:
    m = Dropout(0.2)
    assert isinstance(m, torch.nn.Dropout) and repr(m) == repr(torch.nn.Dropout(0.2))
    x = torch.randn(64, 8)
    m.eval()
    assert m(x) is x
    m.train()
    y = m(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.8)
    inplace = Dropout(0.2, inplace=True)  # in place: torch's own
    z = x.clone()
    assert inplace(z) is z
    assert F.dropout(x, 0.0).equal(x)
