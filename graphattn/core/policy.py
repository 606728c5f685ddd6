r"""Policy-gradient training signal for sampling producers (REINFORCE with a baseline).

A producer that samples edges stores ``log_prob [A]`` and ``log_prob_graph [A]`` in its EdgeSet
(the attention layer never reads them). Given a per-graph reward :math:`R_g` (e.g. the
log-likelihood of the correct output), the surrogate loss

.. math::
    L_{PG} = -\frac{1}{B} \sum_a \big(R_{g(a)} - b\big)\, \log \pi(a)

has the REINFORCE gradient :math:`-\mathbb{E}[(R - b)\nabla \log \pi]`; :math:`b` is a moving
average of the mean reward, updated after the loss is formed, so it never depends on the current
sample. The runner calls :meth:`ReinforceBaseline.loss` with the ``policy_terms`` of the
:class:`~graphattn.core.signals.TrainingSignals` its model returns (``model(batch, return_signals=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def reinforce_loss(terms: Sequence[tuple[Tensor, Tensor]], rewards: Tensor, baseline: float = 0.0
                   ) -> Tensor:
    """The REINFORCE surrogate over every sampling producer's ``(log_prob, log_prob_graph)``."""
    if rewards.dim() != 1:
        raise ValueError(f"'rewards' must be [B] (one per graph), got {list(rewards.shape)}")
    B = rewards.numel()
    adv = (rewards - baseline).detach()
    total = rewards.new_zeros(())
    for log_prob, graph in terms:
        if log_prob.numel() and int(graph.max()) >= B:
            raise ValueError(f"log_prob_graph refers to graph {int(graph.max())} but only {B} "
                             f"rewards were given")
        total = total - (adv[graph] * log_prob).sum()
    return total / max(B, 1)


class ReinforceBaseline:
    """Moving-average baseline :math:`b \\leftarrow m\\,b + (1 - m)\\,\\bar R`
    (the first call sets :math:`b = \\bar R` before its advantage is taken: a baseline of 0 would
    give the first step an advantage of the whole reward, e.g. a log-likelihood of -3.4 on a
    7-class task against later advantages of about ±0.4)."""

    def __init__(self, momentum: float = 0.9) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"'momentum' must lie in [0, 1), got {momentum}")
        self.momentum = momentum
        self.value: float | None = None

    def loss(self, terms: Sequence[tuple[Tensor, Tensor]], rewards: Tensor) -> Tensor:
        if self.value is None and rewards.numel():
            self.value = float(rewards.detach().mean())
        b = 0.0 if self.value is None else self.value
        out = reinforce_loss(terms, rewards, b)
        mean = float(rewards.detach().mean()) if rewards.numel() else 0.0
        self.value = mean if self.value is None else self.momentum * self.value + (1 - self.momentum) * mean
        return out

    def state_dict(self) -> dict:
        return {"momentum": self.momentum, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.momentum = float(state["momentum"])
        self.value = state["value"]


def per_graph_log_likelihood(loss_kind: str, out: Tensor, y: Tensor, graph: Tensor, num_graphs: int,
                             mask: Tensor | None = None) -> Tensor:
    """Reward per graph: the mean log-likelihood of the correct output over the (masked) rows of
    each graph — ``-CE`` (classes), ``-BCE`` (multi-label) or ``-|error|`` (regression)."""
    if mask is not None:
        out, y, graph = out[mask], y[mask], graph[mask]
    if loss_kind == "ce":
        ll = -torch.nn.functional.cross_entropy(out, y.view(-1), reduction="none")
    elif loss_kind == "bce":
        ok = y == y
        per = -torch.nn.functional.binary_cross_entropy_with_logits(
            out, torch.where(ok, y, torch.zeros_like(y)), reduction="none")
        ll = (per * ok).sum(-1) / ok.sum(-1).clamp_min(1)
    else:
        ll = -(out - y).abs().mean(-1)
    total = torch.zeros(num_graphs, dtype=ll.dtype, device=ll.device).index_add_(0, graph, ll)
    count = torch.bincount(graph, minlength=num_graphs).clamp_min(1)
    return total / count
