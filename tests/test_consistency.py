"""The consistency loss across stochastic passes (GRAND's regulariser), against a float64
reference written from the formula."""

from __future__ import annotations

import pytest
import torch

from graphattn.consistency import consistency_loss, sharpen


def _reference(logits, t, kind):
    probs = [torch.softmax(z, -1) if kind == "ce" else torch.sigmoid(z) for z in logits]
    mean = sum(probs) / len(probs)
    if kind == "ce":
        q = mean ** (1 / t)
        q = q / q.sum(-1, keepdim=True)
    else:
        q = mean ** (1 / t) / (mean ** (1 / t) + (1 - mean) ** (1 / t))
    return sum(((p - q) ** 2).sum(-1).mean() for p in probs) / len(probs)


@pytest.mark.parametrize("kind", ["ce", "bce"])
@pytest.mark.parametrize("t", [0.2, 0.5, 1.0])
@pytest.mark.parametrize("s", [2, 4])
def test_matches_the_formula(kind, t, s):
    g = torch.Generator().manual_seed(s)
    logits = [torch.randn(7, 4, generator=g, dtype=torch.float64) for _ in range(s)]
    torch.testing.assert_close(consistency_loss(logits, t, kind), _reference(logits, t, kind),
                               rtol=1e-12, atol=1e-12)


def test_target_carries_no_gradient():
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
              for _ in range(3)]
    consistency_loss(logits, 0.5).backward()
    q = sharpen(torch.stack([torch.softmax(z, -1) for z in logits]).mean(0).detach(), 0.5)
    for z in logits:
        p = torch.softmax(z.detach(), -1)
        dp = 2 * (p - q) / (5 * 3)  # d/dp of (1/S)(1/N) sum (p - q)^2
        expected = p * (dp - (dp * p).sum(-1, keepdim=True))  # softmax Jacobian
        torch.testing.assert_close(z.grad, expected, rtol=1e-12, atol=1e-12)


def test_sharpen_properties():
    p = torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64)
    torch.testing.assert_close(sharpen(p, 1.0), p)
    q = sharpen(p, 0.5)
    assert q[0, 0] > p[0, 0] and abs(q.sum().item() - 1) < 1e-12
    tiny = torch.tensor([[1e-30, 1.0]], dtype=torch.float64)
    assert torch.isfinite(sharpen(tiny, 0.1)).all()
    torch.testing.assert_close(sharpen(torch.tensor([0.5]), 0.3, "bce"), torch.tensor([0.5]))


def test_identical_confident_passes_give_zero_and_empty_rows():
    z = torch.tensor([[50.0, -50.0]], dtype=torch.float64)
    assert consistency_loss([z, z.clone()], 0.5).item() < 1e-20
    e = torch.zeros(0, 3, requires_grad=True)
    out = consistency_loss([e, e], 0.5)
    out.backward()
    assert out.item() == 0.0


def test_bad_input_is_refused():
    z = torch.randn(3, 2)
    with pytest.raises(ValueError, match="at least 2"):
        consistency_loss([z], 0.5)
    with pytest.raises(ValueError, match="same shape"):
        consistency_loss([z, torch.randn(3, 3)], 0.5)
    with pytest.raises(ValueError, match="'temperature'"):
        consistency_loss([z, z], 0.0)
    with pytest.raises(ValueError, match="'kind'"):
        consistency_loss([z, z], 0.5, "l1")
