"""Random sources per node (BigBird-style random attention), sampled without replacement."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.memory import check_edges
from graphattn.producers._util import explicit_edge_set, graph_of_local
from graphattn.producers.base import (
    EdgeProducer,
    ProducerContext,
    check_int,
    check_positive_int,
)
from graphattn.producers.keyed_random import KeyedRandom, KeyedRows
from graphattn.producers.registry import register_producer


def sample_without_replacement(n: Tensor, k: int,
                               rng: KeyedRows | torch.Generator | None = None) -> Tensor:
    """For each row ``r``, ``min(k, n[r])`` distinct uniform integers in ``[0, n[r])``.

    Robert Floyd's algorithm, vectorised over rows: step ``s`` draws ``t ~ U{0..j}`` with
    ``j = n - k_r + s`` and keeps ``t`` unless already chosen, else ``j``. Every ``k_r``-subset is
    equally likely. Returns ``[R, k]`` with ``-1`` in unused slots. Cost ``O(R k^2)``.

    ``rng``: the rows' keys (:class:`~graphattn.producers.keyed_random.KeyedRows`, ``[R]``; step
    ``s`` of row ``r`` uses the uniform keyed by ``(key_r, s)``, so a row's draw depends on its key
    only), or a generator / ``None`` (the global RNG), from which one seed is drawn and the rows
    are keyed by their index.
    """
    R = n.numel()
    if not isinstance(rng, KeyedRows):
        rng = KeyedRandom.coerce(rng, n.device).rows(torch.arange(R, device=n.device))
    kr = n.clamp(max=k)
    out = torch.full((R, k), -1, dtype=torch.long, device=n.device)
    for s in range(k):
        active = s < kr
        j = n - kr + s
        u = rng.uniform(s)
        t = torch.minimum((u * (j + 1).to(torch.float64)).long(), j)
        present = (out == t[:, None]).any(1)
        out[:, s] = torch.where(active, torch.where(present, j, t), out[:, s])
    return out


@register_producer("random")
class RandomEdges(EdgeProducer):
    r"""Each node attends to :math:`k` sources drawn uniformly without replacement from its own graph
    (BigBird's random attention): in-degree exactly :math:`\min(k, n_b)` (:math:`\min(k, n_b - 1)`
    with ``exclude_self``).

    Randomness: node :math:`i`'s draws are keyed by its graph and its index within the graph
    (:mod:`~graphattn.producers.keyed_random`). The call's seed is drawn from the caller's generator
    if given, else from the global RNG in training (fresh edges every step) and fixed by ``seed``
    in evaluation. In a seeded call (evaluation, or a caller's generator) a graph is named by its
    size and a fingerprint of its raw features ``data.x``, so its edges never depend on its
    batch-mates (copies of one graph share their pattern; without ``data.x`` graphs of equal size
    do, as BigBird's random blocks are shared across a batch). Unseeded training calls name graphs
    by position: every graph draws independently.

    Args:
        k (int): sources per node.
        exclude_self (bool): never draw :math:`j = i`.
        seed (int): seed of the evaluation pattern.
    """

    def __init__(self, k: int = 8, exclude_self: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.k = check_positive_int("k", k)
        self.exclude_self = bool(exclude_self)
        self.seed = check_int("seed", seed)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        # memory guard: the sampler holds an [N, k] table of draws (graphattn.memory)
        check_edges(ctx.num_nodes * self.k, what=f"RandomEdges(k={self.k:,}) on {ctx.num_nodes:,} nodes",
                    how_to_lower="lower k (a k above the largest graph's size adds no edge)",
                    device=ctx.device)
        graph, local, start = graph_of_local(ctx)
        n = ctx.counts[graph]
        if self.exclude_self:
            n = n - 1
        rng = KeyedRandom.for_context(ctx, self.seed)
        keys = rng.rows(rng.graph_words(ctx.counts)[graph], local)
        draw = sample_without_replacement(n, self.k, keys)  # [N, k] local ids
        if self.exclude_self:
            draw = draw + (draw >= local[:, None]).long()  # skip the node itself
        valid = draw >= 0
        src = start[graph][:, None] + draw
        dst = torch.arange(ctx.num_nodes, device=ctx.device)[:, None].expand_as(src)
        edge_index = torch.stack([src[valid], dst[valid]])
        return explicit_edge_set(edge_index, ctx, "random")

    def extra_repr(self) -> str:
        return f"k={self.k}, exclude_self={self.exclude_self}"
