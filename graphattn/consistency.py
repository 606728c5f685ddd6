r"""Consistency regularisation across stochastic forward passes (GRAND's idea, Feng et al., 2020),
for any model whose passes differ: dropout, DropNode, or a stochastic producer that samples a new
edge set per pass.

Given the predictions of :math:`S` passes, with probabilities :math:`p^{(s)}_i` (softmax for
``kind="ce"``, per-label sigmoid for ``kind="bce"``), their mean :math:`\bar p_i` is sharpened with
temperature :math:`T`,

.. math::

    q_{ic} = \frac{\bar p_{ic}^{1/T}}{\sum_{c'} \bar p_{ic'}^{1/T}} \;(\text{ce}), \qquad
    q_{ic} = \frac{\bar p_{ic}^{1/T}}{\bar p_{ic}^{1/T} + (1 - \bar p_{ic})^{1/T}} \;(\text{bce}),

held constant (no gradient), and the loss is

.. math::

    \mathcal{L}_{\mathrm{con}} = \frac{1}{S} \sum_{s=1}^{S} \frac{1}{N} \sum_{i=1}^{N}
    \sum_c \big(p^{(s)}_{ic} - q_{ic}\big)^2 ,

over every row :math:`i` given (for a node task: every node, labelled or not — the
semi-supervised signal). The runner adds :math:`\lambda\, \mathcal{L}_{\mathrm{con}}` to the mean of
the passes' task losses (``--consistency-samples S --consistency-weight λ
--consistency-temperature T``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["consistency_loss", "sharpen"]


def sharpen(p: Tensor, temperature: float, kind: str = "ce") -> Tensor:
    r"""The sharpened distribution :math:`q` of the module docstring (rows of ``p`` are
    probabilities; ``kind`` ``"ce"``: over the last dimension, ``"bce"``: each entry a Bernoulli)."""
    _check(temperature, kind)
    t = 1.0 / temperature
    if kind == "ce":
        # in log space: p^(1/T) underflows for small p and small T
        return torch.softmax(torch.log(p.clamp_min(1e-30)) * t, dim=-1)
    pos = torch.log(p.clamp_min(1e-30)) * t
    neg = torch.log((1 - p).clamp_min(1e-30)) * t
    return torch.sigmoid(pos - neg)


def consistency_loss(logits: Sequence[Tensor], temperature: float = 0.5,
                     kind: str = "ce") -> Tensor:
    r""":math:`\mathcal{L}_{\mathrm{con}}` of the module docstring for ``logits``, a sequence of
    :math:`S \ge 2` tensors ``[N, C]`` (the passes' pre-activation outputs, same shape)."""
    if not isinstance(logits, (list, tuple)) or len(logits) < 2:
        got = f"{len(logits)} item(s)" if isinstance(logits, (list, tuple)) else type(logits).__name__
        raise ValueError(f"'logits' must be a list of at least 2 tensors (one per pass), got {got}")
    shape = logits[0].shape
    if logits[0].dim() != 2 or any(t.shape != shape for t in logits):
        raise ValueError(f"'logits' must all have the same shape [N, C], got "
                         f"{[tuple(t.shape) for t in logits]}")
    _check(temperature, kind)
    probs = torch.stack([torch.softmax(t, -1) if kind == "ce" else torch.sigmoid(t) for t in logits])
    target = sharpen(probs.mean(0).detach(), temperature, kind)
    if shape[0] == 0:
        return probs.sum() * 0.0
    return (probs - target).pow(2).sum(-1).mean()


def _check(temperature: float, kind: str) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"'temperature' must be a positive number, got {temperature!r}")
    if kind not in ("ce", "bce"):
        raise ValueError(f"'kind' must be 'ce' (softmax classes) or 'bce' (independent labels), "
                         f"got {kind!r}")
