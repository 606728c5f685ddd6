r"""Training signals of one forward pass: what the producers return beside the edges.

A producer's edge set may carry a differentiable ``aux_loss`` (SBM's density regulariser,
Converter's kernel-polynomial loss, SAC's entropy bonus) and, for sampled edges, ``log_prob`` /
``log_prob_graph`` (the policy-gradient terms of SAC). The model passes one
:class:`TrainingSignals` to every attention layer of a forward pass; each layer adds the edge set it
attended over, and the model returns the collection with its prediction::

    out, signals = model(batch, return_signals=True)
    loss = criterion(out, batch.y)
    if signals.aux_loss is not None:
        loss = loss + aux_weight * signals.aux_loss
    loss = loss + reinforce_loss(signals.policy_terms, reward)   # graphattn.core.policy
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.core.edgeset import BaseEdgeSet


class TrainingSignals:
    """The edge sets of one forward pass (one per attention layer, in layer order) and the training
    signals they carry."""

    def __init__(self) -> None:
        self.edge_sets: list[BaseEdgeSet] = []

    def add(self, es: BaseEdgeSet) -> None:
        """Records the edge set a layer attended over."""
        if not isinstance(es, BaseEdgeSet):
            raise TypeError(f"TrainingSignals.add() takes an edge set, got {type(es).__name__}")
        self.edge_sets.append(es)

    @property
    def aux_loss(self) -> Tensor | None:
        """The sum of the edge sets' ``aux_loss`` (a scalar), ``None`` if none has one."""
        losses = [es.aux_loss for es in self.edge_sets if es.aux_loss is not None]
        return torch.stack([loss.reshape(()) for loss in losses]).sum() if losses else None

    @property
    def policy_terms(self) -> list[tuple[Tensor, Tensor]]:
        """``(log_prob [A], log_prob_graph [A])`` of every edge set with sampled edges."""
        return [(es.log_prob, es.log_prob_graph) for es in self.edge_sets
                if es.log_prob is not None and es.log_prob_graph is not None]

    def __len__(self) -> int:
        return len(self.edge_sets)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(edge_sets={len(self.edge_sets)})"
