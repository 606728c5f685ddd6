"""Sliding-window (banded) attention over the node order of each graph."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from graphattn.core.edgeset import EdgeSet
from graphattn.memory import EDGE_BYTES, check_edges, within_budget
from graphattn.producers._util import explicit_edge_set, graph_of_local
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer


@register_producer("window")
class SlidingWindow(EdgeProducer):
    r"""Local attention over each graph's node order (sequence position):
    :math:`\mathcal{N}(i) = \{j : 0 \le i - j \le w\}` if ``causal`` else
    :math:`\{j : |i - j| \le w\}`, with :math:`i, j` local indices within one graph.

    Interior nodes have in-degree :math:`2w + 1` (:math:`w + 1` causal); nodes near either end of
    their graph have fewer. Needs a sorted ``batch`` (nodes of a graph in sequence order, as the
    sequence loaders produce). The producer builds an ``[N, 2w + 1]`` grid of candidates; when it
    would exceed the memory budget (:mod:`graphattn.memory`) the window is first narrowed to the
    largest graph (same edges), and if it still does not fit a
    :class:`~graphattn.MemoryBudgetError` is raised before anything is allocated.

    Args:
        window (int): half-width :math:`w` (``window=0`` is self-attention only).
        causal (bool): only attend backwards.
    """

    def __init__(self, window: int = 8, causal: bool = False) -> None:
        super().__init__()
        self.window = check_positive_int("window", window, allow_zero=True)
        self.causal = bool(causal)

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        return ("window", self.window, self.causal)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        graph, local, start = graph_of_local(ctx)
        counts = ctx.counts
        w = self._check_memory(ctx, counts)
        offsets = torch.arange(-w, 1 if self.causal else w + 1, device=ctx.device)
        src_local = local[:, None] + offsets[None, :]  # [N, W]
        valid = (src_local >= 0) & (src_local < counts[graph][:, None])
        dst = torch.arange(ctx.num_nodes, device=ctx.device)[:, None].expand_as(src_local)
        src = start[graph][:, None] + src_local
        edge_index = torch.stack([src[valid], dst[valid]])
        return explicit_edge_set(edge_index, ctx, "window")

    def _check_memory(self, ctx: ProducerContext, counts: torch.Tensor) -> int:
        """The memory guard on the ``[N, W]`` grid of candidate edges (``W = 2w + 1``, ``w + 1``
        causal) built below. Returns the half-width to use: ``window``, or, when the grid would not
        fit, the largest graph's size minus 1 (a wider window adds no edge; one host read)."""
        N, w = ctx.num_nodes, self.window
        width = (w + 1 if self.causal else 2 * w + 1)
        if not within_budget(N * width * EDGE_BYTES, ctx.device):
            w = min(w, max(int(counts.max()) - 1, 0) if counts.numel() else 0)
            width = (w + 1 if self.causal else 2 * w + 1)
        check_edges(N * width, what=f"SlidingWindow(window={self.window:,}) on {ctx.num_nodes:,} "
                    f"nodes ({N:,} × {width:,} candidate edges)",
                    how_to_lower="lower window or use smaller graphs", device=ctx.device)
        return w

    def extra_repr(self) -> str:
        return f"window={self.window}, causal={self.causal}"
