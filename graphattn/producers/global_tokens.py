"""Global tokens (Longformer / BigBird / ETC style): a few positions of every graph see, and are seen
by, the whole graph."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from graphattn.core.edgeset import EdgeSet
from graphattn.memory import check_edges
from graphattn.producers._util import explicit_edge_set, graph_of_local
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer


@register_producer("global")
class GlobalTokens(EdgeProducer):
    r"""Global tokens at fixed local positions :math:`G` of every graph (e.g. ``G = {0}``, the CLS node
    the sequence and image loaders put at local index 0).

    In a graph with nodes :math:`V`, a global token :math:`g \in G \cap V` attends to every node
    (:math:`\mathcal{N}(g) = V`) and every node attends to every global token
    (:math:`G \cap V \subseteq \mathcal{N}(i)` for all :math:`i`), each edge once. With ``G = {0}`` a node
    has in-degree 1 (:math:`n` for the token itself); the edge count is :math:`O(|G| \cdot n)`, so it
    combines with a local producer (``union`` with ``window``) into BigBird's global + local pattern and
    gives a CLS read-out the whole sequence in one layer. Positions beyond a graph's size are skipped.
    The :math:`2 N |G|` bound on the edges is checked against the memory budget
    (:mod:`graphattn.memory`) first.

    Args:
        positions (sequence of int): local indices of the global tokens.
        attend_to_all (bool): global tokens attend to every node of their graph.
        attended_by_all (bool): every node attends to the global tokens.
    """

    def __init__(self, positions: Sequence[int] = (0,), attend_to_all: bool = True,
                 attended_by_all: bool = True) -> None:
        super().__init__()
        if isinstance(positions, int):
            positions = (positions,)
        if not isinstance(positions, Sequence) or not positions:
            raise ValueError(f"'positions' must be a non-empty sequence of local indices, got {positions!r}")
        self.positions = tuple(sorted({check_positive_int("positions", p, allow_zero=True)
                                       for p in positions}))
        if not (attend_to_all or attended_by_all):
            raise ValueError("at least one of 'attend_to_all' and 'attended_by_all' must be True")
        self.attend_to_all = bool(attend_to_all)
        self.attended_by_all = bool(attended_by_all)

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        return ("global", self.positions, self.attend_to_all, self.attended_by_all)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        # memory guard: [N, |G|] tables, at most two edges per entry
        G = len(self.positions)
        check_edges(2 * ctx.num_nodes * G, what=f"GlobalTokens with {G:,} positions on "
                    f"{ctx.num_nodes:,} nodes", how_to_lower="use fewer global positions",
                    device=ctx.device)
        graph, local, start = graph_of_local(ctx)
        g = torch.tensor(self.positions, dtype=torch.long, device=ctx.device)  # [|G|]
        node = torch.arange(ctx.num_nodes, device=ctx.device)
        exists = g[None, :] < ctx.counts[graph][:, None]  # [N, |G|]: the token exists in i's graph
        token = start[graph][:, None] + g[None, :]  # [N, |G|] global node id of each token
        is_token = (local[:, None] == g[None, :]).any(1)  # [N]
        parts = []
        if self.attend_to_all:  # i -> g: the token's query sees every node of its graph
            parts.append(torch.stack([node[:, None].expand_as(token)[exists], token[exists]]))
        if self.attended_by_all:  # g -> i: every node sees the tokens (once, if the above has it)
            keep = exists & ~is_token[:, None] if self.attend_to_all else exists
            parts.append(torch.stack([token[keep], node[:, None].expand_as(token)[keep]]))
        return explicit_edge_set(torch.cat(parts, 1), ctx, "global")

    def extra_repr(self) -> str:
        return (f"positions={list(self.positions)}, attend_to_all={self.attend_to_all}, "
                f"attended_by_all={self.attended_by_all}")
