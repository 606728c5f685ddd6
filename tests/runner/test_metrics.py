"""Metrics against scikit-learn on fixed inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from graphattn.runner.metrics import accuracy, lrgb_ap, mae


def test_lrgb_ap_equals_sklearn_macro_over_labels_with_positives():
    rng = np.random.default_rng(0)
    y = (rng.random((50, 4)) < 0.3).astype(float)
    y[:, 2] = 0.0  # no positive: ignored, as the official evaluator does
    y[5, 1] = np.nan  # an unlabelled entry: ignored
    s = rng.standard_normal((50, 4))
    cols = [0, 1, 3]
    expected = np.mean([
        average_precision_score(y[~np.isnan(y[:, c]), c], s[~np.isnan(y[:, c]), c]) for c in cols
    ])
    assert lrgb_ap(torch.tensor(y), torch.tensor(s)) == pytest.approx(expected, abs=1e-12)
    # fixed hand-checked case: one label, ranking [1, 0, 1] -> AP = (1 + 2/3) / 2
    assert lrgb_ap(np.array([[1.0], [0.0], [1.0]]), np.array([[0.9], [0.8], [0.1]])) == \
        pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="undefined"):
        lrgb_ap(np.zeros((3, 2)), np.zeros((3, 2)))


def test_accuracy_and_mae():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    assert accuracy(logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    assert mae(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 4.0]])) == pytest.approx(1.5)
