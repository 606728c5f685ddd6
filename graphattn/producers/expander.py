"""Expander edges: a random d-regular graph on each graph's nodes (Exphormer)."""

from __future__ import annotations

import functools

import networkx as nx
import torch
from torch import Tensor

from graphattn.edgeset import EdgeSet
from graphattn.producers._util import explicit_edge_set, graph_of_local
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer


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
    generator draws a fresh seed per graph instead.

    Args:
        degree (int): :math:`d`.
        seed (int): seed of the per-size templates.
    """

    def __init__(self, degree: int = 3, seed: int = 0) -> None:
        super().__init__()
        self.degree = check_positive_int("degree", degree)
        self.seed = int(seed)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        _graph, _, start = graph_of_local(ctx)
        counts = ctx.counts.tolist()
        parts = []
        for b, n in enumerate(counts):
            if n < 2:
                continue
            if ctx.generator is not None:
                seed = int(torch.randint(0, 2**31 - 1, (1,), generator=ctx.generator,
                                         device=ctx.generator.device))
                tmpl = _regular_template.__wrapped__(n, self.degree, seed)
            else:
                tmpl = _regular_template(n, self.degree, self.seed * 1_000_003 + n)
            parts.append(tmpl.to(ctx.device) + start[b])
        if parts:
            edge_index = torch.cat(parts, 1)
        else:
            edge_index = torch.empty(2, 0, dtype=torch.long, device=ctx.device)
        return explicit_edge_set(edge_index, ctx, "expander")

    def extra_repr(self) -> str:
        return f"degree={self.degree}"
