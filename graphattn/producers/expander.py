"""Expander edges: a random d-regular graph on each graph's nodes (Exphormer)."""

from __future__ import annotations

import functools
from collections.abc import Hashable

import networkx as nx
import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.memory import check_edges
from graphattn.producers._util import explicit_edge_set
from graphattn.producers.base import (
    EdgeProducer,
    ProducerContext,
    check_int,
    check_positive_int,
)
from graphattn.producers.registry import register_producer

#: host bytes per directed edge while a template is built: networkx's adjacency dicts (two entries
#: and an attribute dict per undirected edge), the edge list and the tensors
NETWORKX_EDGE_BYTES = 256


def regular_degree(n: int, d: int) -> int:
    """The degree actually used on ``n`` nodes: ``d`` if a d-regular graph exists (``d < n`` and
    ``n·d`` even), ``d - 1`` if only the parity fails, and ``n - 1`` (complete graph) if ``n <= d``."""
    if n <= d:
        return max(n - 1, 0)
    return d if (n * d) % 2 == 0 else d - 1


@functools.lru_cache(maxsize=256)
def _regular_template(n: int, d: int, seed: int) -> Tensor:
    """Directed edges ``[2, n·d_eff]`` (both directions) of a random d_eff-regular graph on ``n``."""
    de = regular_degree(n, d)
    if de == 0:
        return torch.empty(2, 0, dtype=torch.long)
    if de == n - 1:
        g = nx.complete_graph(n)
    else:
        g = nx.random_regular_graph(de, n, seed=seed)
    e = torch.tensor(list(g.edges()), dtype=torch.long).t().reshape(2, -1)
    return torch.cat([e, e.flip(0)], 1)


@register_producer("expander")
class ExpanderEdges(EdgeProducer):
    r"""Edges of a random :math:`d`-regular graph on the nodes of each graph, in both directions
    (Exphormer's expander): every node has in-degree exactly :func:`regular_degree`
    :math:`(n_b, d)` — :math:`d` when a :math:`d`-regular graph on :math:`n_b` nodes exists.

    Random regular graphs are expanders with high probability, so :math:`O(\log n)` layers connect
    every pair. Built with :func:`networkx.random_regular_graph`. The graph for a size :math:`n`
    is fixed by ``(seed, n)`` and cached, so a graph keeps its expander across epochs; a caller's
    generator draws a fresh seed per call instead (each graph's template then follows from that
    seed and its size, so a graph's edges never depend on its batch-mates). The edge count is
    checked against the memory budget (:mod:`graphattn.memory`) before any template is built.

    Args:
        degree (int): :math:`d`.
        seed (int): seed of the per-size templates.
    """

    def __init__(self, degree: int = 3, seed: int = 0) -> None:
        super().__init__()
        self.degree = check_positive_int("degree", degree)
        self.seed = check_int("seed", seed)

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        if ctx.generator is not None:  # a caller's generator: a fresh draw in every call
            return None
        return ("expander", self.degree, self.seed)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        _ = ctx.ptr  # the graphs must be contiguous (a sorted batch): raises a clear error if not
        counts = ctx.counts.tolist()
        self._check_memory(ctx, counts)
        parts = []
        # a caller's generator gives one seed per call; a graph's template follows from it and the
        # graph's size alone, never from its position in the batch
        drawn = None if ctx.generator is None else int(torch.randint(
            0, 2**31 - 1, (), generator=ctx.generator, device=ctx.generator.device))
        # the batch is assembled on the host (the sizes are there) and copied to the device once:
        # no loop of per-graph device operations
        start = 0
        for n in counts:
            if n >= 2:
                if drawn is not None:
                    tmpl = _regular_template.__wrapped__(n, self.degree,
                                                         (drawn * 1_000_003 + n) % 2**62)
                else:
                    tmpl = _regular_template(n, self.degree, self.seed * 1_000_003 + n)
                parts.append(tmpl + start)
            start += n
        if parts:
            edge_index = torch.cat(parts, 1).to(ctx.device)
        else:
            edge_index = torch.empty(2, 0, dtype=torch.long, device=ctx.device)
        return explicit_edge_set(edge_index, ctx, "expander")

    def _check_memory(self, ctx: ProducerContext, counts: list[int]) -> None:
        """The memory guard: the exact edge count, from the graph sizes (already on the host)."""
        edges = sum(n * regular_degree(n, self.degree) for n in counts if n >= 2)
        what = f"ExpanderEdges(degree={self.degree:,}) on {ctx.num_nodes:,} nodes"
        lower = "lower degree (a degree at or above a graph's size gives the complete graph)"
        # the networkx template (dicts of dicts, built on the host) holds far more than the edges
        check_edges(edges, bytes_per_edge=NETWORKX_EDGE_BYTES, what=what, how_to_lower=lower)
        if ctx.device.type != "cpu":
            check_edges(edges, what=what, how_to_lower=lower, device=ctx.device)

    def extra_repr(self) -> str:
        return f"degree={self.degree}"
