"""Random sources per node (BigBird-style random attention), sampled without replacement."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.edgeset import EdgeSet
from graphattn.producers._util import explicit_edge_set, graph_of_local, producer_generator, rand
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer


def sample_without_replacement(n: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    """For each row ``r``, ``min(k, n[r])`` distinct uniform integers in ``[0, n[r])``.

    Robert Floyd's algorithm, vectorised over rows: step ``s`` draws ``t ~ U{0..j}`` with
    ``j = n - k_r + s`` and keeps ``t`` unless already chosen, else ``j``. Every ``k_r``-subset is
    equally likely. Returns ``[R, k]`` with ``-1`` in unused slots. Cost ``O(R k^2)``.
    """
    R = n.numel()
    kr = n.clamp(max=k)
    out = torch.full((R, k), -1, dtype=torch.long, device=n.device)
    for s in range(k):
        active = s < kr
        j = n - kr + s
        u = rand((R,), generator, device=n.device, dtype=torch.float64)
        t = torch.minimum((u * (j + 1).to(torch.float64)).long(), j)
        present = (out == t[:, None]).any(1)
        out[:, s] = torch.where(active, torch.where(present, j, t), out[:, s])
    return out


@register_producer("random")
class RandomEdges(EdgeProducer):
    r"""Each node attends to :math:`k` sources drawn uniformly without replacement from its own graph
    (BigBird's random attention): in-degree exactly :math:`\min(k, n_b)` (:math:`\min(k, n_b - 1)`
    with ``exclude_self``).

    Randomness: the caller's generator if given; otherwise fresh edges from the global RNG in
    training and a fixed pattern (seeded by ``seed``) in evaluation.

    Args:
        k (int): sources per node.
        exclude_self (bool): never draw :math:`j = i`.
        seed (int): seed of the evaluation pattern.
    """

    def __init__(self, k: int = 8, exclude_self: bool = False, seed: int = 0) -> None:
        super().__init__()
        self.k = check_positive_int("k", k)
        self.exclude_self = bool(exclude_self)
        self.seed = int(seed)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        graph, local, start = graph_of_local(ctx)
        n = ctx.counts[graph]
        if self.exclude_self:
            n = n - 1
        gen = producer_generator(ctx, self.seed)
        draw = sample_without_replacement(n, self.k, gen)  # [N, k] local ids
        if self.exclude_self:
            draw = draw + (draw >= local[:, None]).long()  # skip the node itself
        valid = draw >= 0
        src = start[graph][:, None] + draw
        dst = torch.arange(ctx.num_nodes, device=ctx.device)[:, None].expand_as(src)
        edge_index = torch.stack([src[valid], dst[valid]])
        return explicit_edge_set(edge_index, ctx, "random")

    def extra_repr(self) -> str:
        return f"k={self.k}, exclude_self={self.exclude_self}"
