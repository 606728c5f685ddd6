"""Recording what every attention layer attended to, for the viewer and for statistics.

Usage::

    with graphattn.trace(model) as t:
        model(data)
    for rec in t.records:        # one per EdgeAttention call, in call order
        rec.layer, rec.edges.edge_index, rec.alpha, rec.edges.origin

While a trace is active every :class:`~graphattn.EdgeAttention` call records the edges it really
used (``to_explicit()``, detached, on the CPU) and the coefficients ``alpha [E, H]`` of each source's
value in its target's output. Tracing forces the explicit path, so use it on small samples.

``t.summary()`` gives per-layer statistics (attention entropy in nats and normalised, edges per node,
density, shares by origin), defined once in :mod:`graphattn.attention_stats` and shared with the
viewer's table (:func:`graphattn.viz.view.layer_stats`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from graphattn.core.edgeset import EdgeSet

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

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

    def statistics(self) -> dict[str, Any]:
        """This call's statistics over every graph of the batch: see
        :func:`graphattn.attention_stats.layer_statistics` for the keys and their math."""
        from graphattn.attention_stats import layer_statistics

        def np_(t: Tensor) -> Any:
            return t.detach().cpu().numpy()

        es = self.edges
        alpha = self.alpha.abs() if self.alpha.is_complex() else self.alpha
        return layer_statistics(
            np_(es.edge_index[0]), np_(es.edge_index[1]), np_(alpha.double()),
            num_targets=int(self.batch.numel()),
            head=None if es.head is None else np_(es.head),
            origin=None if es.origin is None else np_(es.origin),
            batch=np_(self.batch),
            name=self.layer,
        )

    def to_networkx(self, head: int | None = None,
                    graph: int | None = None) -> nx.DiGraph | nx.MultiDiGraph:
        r"""This call's attention graph as a networkx graph: edge :math:`j \to i` with ``weight``
        :math:`\alpha_{ij}^h` of head ``head`` (``None``: the mean over heads), its ``origin`` name
        and ``edge_id`` (row of :attr:`alpha`); nodes with their ``graph`` id; ``graph=g`` keeps
        graph ``g`` only, relabelled ``0 .. n-1`` (traced id in the node attribute ``index``).
        Every traced edge is one networkx edge: a :class:`networkx.MultiDiGraph` when a pair occurs
        twice. See :func:`graphattn.interop.record_to_networkx` for the full rules."""
        from graphattn.interop import record_to_networkx

        return record_to_networkx(self, head=head, graph=graph)


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
        """Per recorded call, :meth:`TraceRecord.statistics`: edges, edges per node, density,
        attention entropy (``entropy_nats``, ``entropy_normalized``), mean largest weight and the
        shares of edges and of attention mass by origin, over every graph of the traced batch.
        The viewer's per-layer table (:func:`graphattn.viz.view.layer_stats`) is the same function
        restricted to one graph."""
        return [rec.statistics() for rec in self.records]

    def record(self, layer: int | str) -> TraceRecord:
        """A record by position (negative counts from the end) or by layer name (which must name
        exactly one recorded call)."""
        if isinstance(layer, str):
            found = [rec for rec in self.records if rec.layer == layer]
            if len(found) != 1:
                names = [rec.layer for rec in self.records]
                raise ValueError(f"'layer' {layer!r} must name exactly one recorded call, "
                                 f"found {len(found)}; recorded: {names}")
            return found[0]
        n = len(self.records)
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
            raise ValueError(f"'layer' must be a layer name or an int in [-{n}, {n}) (one per "
                             f"recorded call), got {layer!r}")
        return self.records[layer]

    def to_networkx(self, layer: int | str, head: int | None = None,
                    graph: int | None = None) -> nx.DiGraph | nx.MultiDiGraph:
        """:meth:`TraceRecord.to_networkx` of the recorded call ``layer`` (see :meth:`record`)."""
        return self.record(layer).to_networkx(head=head, graph=graph)


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
