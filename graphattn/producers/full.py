"""Full attention within each graph, as a shared-sources edge set (dense SDPA fast path)."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.core.structured import SharedSourceEdgeSet
from graphattn.memory import DENSE_PAIR_BYTES, check_edges
from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.producers.registry import register_producer


@register_producer("full")
class FullAttention(EdgeProducer):
    r"""Every node attends to every node of its own graph, itself included:
    :math:`\mathcal{N}(i) = \{j : \text{batch}_j = \text{batch}_i\}`.

    Emitted as a :class:`~graphattn.SharedSourceEdgeSet` (``sources [B, 1, n_max]`` with a padding
    mask), so the layer runs padded-key SDPA per graph instead of enumerating :math:`\sum_b n_b^2`
    edges. Needs a sorted ``batch``.

    Memory guard (:mod:`graphattn.memory`): the dense path may hold a ``[B, H, n_max, n_max]`` fp32
    logit and probability per pair (:data:`~graphattn.memory.DENSE_PAIR_BYTES`); above the memory
    budget the producer raises a :class:`~graphattn.MemoryBudgetError` before building anything.
    """

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        return ("full",)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        ptr = ctx.ptr
        counts = ptr[1:] - ptr[:-1]
        B = counts.numel()
        n_max = int(counts.max()) if B else 0
        pairs = int((counts * counts).sum())  # the edge count (also the statistic below)
        check_edges(pairs, what=f"full attention on {ctx.num_nodes:,} nodes ({B:,} graph(s) of up to "
                    f"{n_max:,} nodes, {ctx.num_heads} head(s))",
                    how_to_lower="use a sparse producer (window, knn, random, expander, samsa, ...) "
                    "or smaller graphs / batches", device=ctx.device,
                    num_bytes=B * n_max * n_max * ctx.num_heads * DENSE_PAIR_BYTES)
        slot = torch.arange(n_max, device=ctx.device)
        sources = (ptr[:-1, None] + slot[None, :]).view(B, 1, n_max)
        if B * n_max == ctx.num_nodes:  # graphs of equal size: every slot is a source, no mask
            mask = None
        else:
            mask = (slot[None, :] < counts[:, None]).view(B, 1, n_max)
            sources = torch.where(mask, sources, torch.zeros_like(sources))
        origin = torch.full_like(sources, origin_code("full"))
        return SharedSourceEdgeSet(
            sources, ptr, num_heads=ctx.num_heads, source_mask=mask, origin=origin,
            stats={"edges_per_node": pairs / max(ctx.num_nodes, 1)},
        )
