"""Virtual (global) nodes: per-graph summary sources every node of the graph attends to."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.utils import scatter

from graphattn.core.edgeset import EdgeSet
from graphattn.core.index import derived_edge_sets
from graphattn.core.origins import origin_code
from graphattn.core.structured import SharedSourceEdgeSet
from graphattn.memory import DENSE_PAIR_BYTES, check_edges
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer

POOLS = ("mean", "sum", "max", "none")


@register_producer("virtual")
class VirtualNodes(EdgeProducer):
    r"""Each graph :math:`b` gets :math:`m` virtual source nodes
    :math:`u_{b,j} = e_j + \operatorname{pool}_{i \in b}(x_i)`, :math:`j = 1..m`, and every node of
    :math:`b` attends to them: :math:`\mathcal{N}(i) \supseteq \{u_{b,1}, \dots, u_{b,m}\}`.

    The virtual nodes are sources only (a global read-out channel in one hop, as Exphormer's
    virtual nodes seen from the targets); their features are appended as ``virtual_x`` and projected
    by the layer. Alone it is a :class:`~graphattn.SharedSourceEdgeSet`; unite it with local edges
    (``union``) for the usual "edges + virtual node" model. Its :math:`N m` edges (per head, on the
    dense path) are checked against the memory budget (:mod:`graphattn.memory`).

    Args:
        channels (int): width of ``x`` (the learned embeddings :math:`e_j`); ``-1``: lazy, sized by
            the first input (a first layer that reads the raw features).
        num_virtual (int): :math:`m`.
        pool (str): ``"mean"``, ``"sum"``, ``"max"`` or ``"none"`` (embeddings only).
    """

    virtual_sources_only = True

    def __init__(self, channels: int, num_virtual: int = 1, pool: str = "mean") -> None:
        super().__init__()
        if isinstance(channels, bool) or not isinstance(channels, int) or (channels < 1 and channels != -1):
            raise ValueError(f"'channels' must be a positive int or -1 (lazy), got {channels!r}")
        self.channels = channels
        self.num_virtual = check_positive_int("num_virtual", num_virtual)
        if pool not in POOLS:
            raise ValueError(f"'pool' must be one of {POOLS}, got {pool!r}")
        self.pool = pool
        self.embedding: nn.Parameter = (nn.parameter.UninitializedParameter() if channels == -1
                                        else nn.Parameter(torch.empty(num_virtual, channels)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if not isinstance(self.embedding, nn.parameter.UninitializedParameter):
            nn.init.normal_(self.embedding, std=0.02)

    @derived_edge_sets  # virtual_x is pooled from x, which the layer checked
    def produce(self, ctx: ProducerContext) -> EdgeSet:
        if isinstance(self.embedding, nn.parameter.UninitializedParameter):
            self.channels = int(ctx.x.size(1))
            with torch.no_grad():
                self.embedding.materialize((self.num_virtual, self.channels), device=ctx.device)
            self.reset_parameters()
        if ctx.x.size(1) != self.channels:
            raise ValueError(f"VirtualNodes(channels={self.channels}) got x of width {ctx.x.size(1)}")
        B, m, N = ctx.num_graphs, self.num_virtual, ctx.num_nodes
        check_edges(N * m, bytes_per_edge=ctx.num_heads * DENSE_PAIR_BYTES,
                    what=f"VirtualNodes(num_virtual={m:,}) on {N:,} nodes",
                    how_to_lower="lower num_virtual", device=ctx.device)
        ptr = ctx.ptr
        emb = self.embedding.to(ctx.x.dtype)
        if self.pool == "none":
            summary = ctx.x.new_zeros(B, self.channels)
        else:
            summary = scatter(ctx.x, ctx.batch, dim=0, dim_size=B, reduce=self.pool)
        virtual_x = (summary[:, None, :] + emb[None]).reshape(B * m, self.channels)
        virtual_batch = torch.arange(B, device=ctx.device).repeat_interleave(m)
        sources = (N + torch.arange(B * m, device=ctx.device)).view(B, 1, m)
        return SharedSourceEdgeSet(
            sources, ptr, num_heads=ctx.num_heads, virtual_x=virtual_x,
            virtual_batch=virtual_batch, origin=torch.full_like(sources, origin_code("virtual")),
            stats={"edges_per_node": float(m)},
        )

    def extra_repr(self) -> str:
        return f"channels={self.channels}, num_virtual={self.num_virtual}, pool={self.pool!r}"
