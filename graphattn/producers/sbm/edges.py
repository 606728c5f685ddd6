r"""The SBM edges as drawn: :class:`SampledEdges` (``query`` = target :math:`i`, ``key`` = source
:math:`j`, ``head``, ``kind``), their kinds (:data:`SAMPLED`, :data:`EXPLORATION`, :data:`SELF_LOOP`),
:func:`dedupe` and :func:`add_self_loops`. The producer turns them into an :class:`~graphattn.EdgeSet`
with ``edge_index = [key; query]`` (PyG: source → target).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from graphattn.core.index import unique_first

#: edge kinds, in the priority order of :func:`dedupe` (an SBM draw beats an exploration draw beats an
#: added self-loop)
SAMPLED, EXPLORATION, SELF_LOOP = 0, 1, 2


class SampledEdges(NamedTuple):
    """Drawn edges (all ``[E]`` long): ``query`` (target :math:`i`), ``key`` (source :math:`j`),
    ``head`` and ``kind`` (:data:`SAMPLED`, :data:`EXPLORATION` or :data:`SELF_LOOP`)."""

    query: Tensor
    key: Tensor
    head: Tensor
    kind: Tensor

    @property
    def num_edges(self) -> int:
        return int(self.query.numel())

    def take(self, index: Tensor) -> SampledEdges:
        return SampledEdges(self.query[index], self.key[index], self.head[index], self.kind[index])

    @staticmethod
    def empty(device: torch.device | str | None = None) -> SampledEdges:
        e = torch.empty(0, dtype=torch.long, device=device)
        return SampledEdges(e, e.clone(), e.clone(), e.clone())

    @staticmethod
    def cat(parts: list[SampledEdges], device: torch.device | str | None = None) -> SampledEdges:
        parts = [p for p in parts if p.num_edges]
        if not parts:
            return SampledEdges.empty(device)
        if len(parts) == 1:
            return parts[0]
        return SampledEdges(*(torch.cat(cols) for cols in zip(*parts, strict=True)))


def dedupe(edges: SampledEdges, num_nodes: int, num_heads: int) -> SampledEdges:
    """Distinct ``(query, head, key)`` edges, sorted by query, then head, then key (the layer's CSR
    order), each kept at its first occurrence (:func:`~graphattn.core.edgeset.first_occurrences`, as
    :meth:`EdgeSet.coalesce`). The samplers list SBM draws, then exploration draws, and
    :func:`add_self_loops` appends loops last, so a copy of the lowest ``kind`` is kept."""
    if edges.num_edges == 0:
        return edges
    N, H = num_nodes, num_heads
    if N * N * H >= 2**62:
        raise ValueError(f"too many nodes ({N}) x heads ({H}) to de-duplicate with int64 keys")
    flat = edges.query * H  # (query · H + head) · N + key, in place (one allocation)
    flat += edges.head
    flat *= N
    flat += edges.key
    keep, pair = unique_first(flat)
    # the indices from the sorted keys themselves (a division is cheaper than a random gather)
    row, key = torch.div(pair, N, rounding_mode="floor"), pair % N
    return SampledEdges(torch.div(row, H, rounding_mode="floor"), key, row % H, edges.kind[keep])


def add_self_loops(edges: SampledEdges, num_nodes: int, num_heads: int, *,
                   dedupe_edges: bool = True) -> SampledEdges:
    """Adds the loop ``(i, i, h)`` for every node and head that has none (kind :data:`SELF_LOOP`).

    With ``dedupe_edges`` the result is de-duplicated (:func:`dedupe`), so a sampled loop keeps its
    kind; otherwise loops are appended only where no drawn loop exists and multi-edges stay."""
    N, H = num_nodes, num_heads
    dev = edges.query.device
    loops = torch.arange(N, device=dev).repeat_interleave(H)
    head = torch.arange(H, device=dev).repeat(N)
    if dedupe_edges:
        extra = SampledEdges(loops, loops, head, torch.full_like(loops, SELF_LOOP))
        return dedupe(SampledEdges.cat([edges, extra], dev), N, H)
    has = torch.zeros(N * H, dtype=torch.bool, device=dev)
    is_loop = edges.query == edges.key
    has[(edges.query * H + edges.head)[is_loop]] = True
    keep = ~has
    extra = SampledEdges(loops[keep], loops[keep], head[keep], torch.full_like(loops[keep], SELF_LOOP))
    return SampledEdges.cat([edges, extra], dev)
