"""Recording what every attention layer attended to, for the viewer and for statistics.

Usage::

    with graphattn.trace(model) as t:
        model(data)
    for rec in t.records:        # one per EdgeAttention call, in call order
        rec.layer, rec.edges.edge_index, rec.alpha, rec.edges.origin

While a trace is active every :class:`~graphattn.EdgeAttention` call records the edges it really
used (``to_explicit()``, detached, on the CPU) and the coefficients ``alpha [E, H]`` of each source's
value in its target's output. Tracing forces the explicit path, so use it on small samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from graphattn.edgeset import EdgeSet

_ACTIVE: list[AttentionTrace] = []


@dataclass
class TraceRecord:
    """One attention call: ``layer`` name, the edges used, ``alpha [E, H]`` and the node ``batch``."""

    layer: str
    index: int
    edges: EdgeSet
    alpha: Tensor
    batch: Tensor

    @property
    def num_heads(self) -> int:
        return int(self.alpha.size(1))


@dataclass
class AttentionTrace:
    names: dict[int, str] = field(default_factory=dict)
    records: list[TraceRecord] = field(default_factory=list)

    def add(self, module: nn.Module, edges: EdgeSet, alpha: Tensor, batch: Tensor) -> None:
        name = self.names.get(id(module), f"{type(module).__name__}#{len(self.records)}")
        self.records.append(
            TraceRecord(
                layer=name,
                index=len(self.records),
                edges=edges.detach().to("cpu"),
                alpha=alpha.detach().to("cpu"),
                batch=batch.detach().to("cpu"),
            )
        )

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[TraceRecord]:
        return iter(self.records)

    def __getitem__(self, i: int) -> TraceRecord:
        return self.records[i]

    def summary(self) -> list[dict[str, Any]]:
        """Per layer: edges, edges per node, attention entropy and edge share by origin."""
        from graphattn.origins import origin_name

        rows = []
        for rec in self.records:
            N = int(rec.batch.numel())
            E = rec.edges.num_edges
            a = rec.alpha.abs().clamp_min(1e-30)
            ent = float(-(a * a.log()).sum() / max(N * rec.num_heads, 1))
            shares: dict[str, float] = {}
            if rec.edges.origin is not None and E:
                codes, counts = torch.unique(rec.edges.origin, return_counts=True)
                shares = {origin_name(int(c)): int(n) / E for c, n in zip(codes, counts, strict=True)}
            rows.append(
                {
                    "layer": rec.layer,
                    "num_edges": E,
                    "edges_per_node": E / max(N, 1),
                    "entropy": ent,
                    "origin_share": shares,
                }
            )
        return rows


def is_tracing() -> bool:
    return bool(_ACTIVE)


def record(module: nn.Module, edges: EdgeSet, alpha: Tensor, batch: Tensor) -> None:
    for t in _ACTIVE:
        t.add(module, edges, alpha, batch)


@contextmanager
def trace(model: nn.Module | None = None) -> Iterator[AttentionTrace]:
    """Context manager collecting an :class:`AttentionTrace`; ``model`` names the layers."""
    names = {}
    if model is not None:
        names = {id(m): name or type(m).__name__ for name, m in model.named_modules()}
    t = AttentionTrace(names=names)
    _ACTIVE.append(t)
    try:
        yield t
    finally:
        _ACTIVE.remove(t)
