"""Benchmark metrics, computed as the benchmarks' official evaluators do, and a task's training
loss and metric."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score
from torch import Tensor

if TYPE_CHECKING:
    from graphattn.runner.tasks import Task


def accuracy(logits: Tensor, y: Tensor) -> float:
    """Fraction of rows whose arg-max equals the integer label."""
    if y.numel() == 0:
        raise ValueError("accuracy of an empty set")
    return float((logits.argmax(-1) == y.view(-1)).float().mean())


def lrgb_ap(y_true: Tensor | np.ndarray, y_score: Tensor | np.ndarray) -> float:
    """LRGB Peptides-func average precision: for each of the ``T`` labels that has at least one
    positive and one negative among its non-NaN entries, scikit-learn's
    ``average_precision_score`` on those entries; the mean over such labels (the official LRGB /
    OGB evaluator; labels without positives are ignored)."""
    yt = y_true.detach().cpu().numpy() if isinstance(y_true, Tensor) else np.asarray(y_true)
    ys = y_score.detach().cpu().numpy() if isinstance(y_score, Tensor) else np.asarray(y_score)
    if yt.shape != ys.shape or yt.ndim != 2:
        raise ValueError(f"y_true and y_score must both be [n, T], got {yt.shape} and {ys.shape}")
    aps = []
    for t in range(yt.shape[1]):
        labelled = yt[:, t] == yt[:, t]
        col = yt[labelled, t]
        if (col == 1).sum() > 0 and (col == 0).sum() > 0:
            aps.append(average_precision_score(col, ys[labelled, t]))
    if not aps:
        raise ValueError("no label has both a positive and a negative: AP is undefined")
    return float(np.mean(aps))


def mae(pred: Tensor, target: Tensor) -> float:
    """Mean absolute error over every entry (LRGB Peptides-struct)."""
    return float((pred - target).abs().mean())


METRICS = {"accuracy": (accuracy, True), "ap": (lrgb_ap, True), "mae": (mae, False)}


def task_loss(task: Task, out: Tensor, y: Tensor) -> Tensor:
    """The training loss of ``task``: cross-entropy, binary cross-entropy over the labelled
    (non-NaN) entries, or the mean absolute error."""
    if task.loss == "ce":
        return F.cross_entropy(out, y.view(-1))
    if task.loss == "bce":
        ok = y == y
        loss = F.binary_cross_entropy_with_logits(out, torch.where(ok, y, torch.zeros_like(y)),
                                                  reduction="none")
        return (loss * ok).sum() / ok.sum().clamp_min(1)
    return (out - y).abs().mean()


def task_metric(task: Task, out: Tensor, y: Tensor) -> float:
    """The metric of ``task`` (:data:`METRICS`) of the predictions ``out`` for the targets ``y``."""
    fn, _ = METRICS[task.metric]
    if task.metric == "accuracy":
        return fn(out, y)
    if task.metric == "ap":
        return fn(y, out)
    return fn(out, y)
