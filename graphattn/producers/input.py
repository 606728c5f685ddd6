"""The input graph's edges (optionally with self-loops), or any edge attribute of the data."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.producers.registry import register_producer


@register_producer("input")
class InputEdges(EdgeProducer):
    r"""Attend along the edges of the data: :math:`\mathcal{N}(i) = \{j : (j, i) \in E\}`.

    Args:
        self_loops (bool): add a self-loop :math:`i \to i` to every node that has none
            (origin ``"self_loop"``; its edge features are zeros).
        attr (str): the data attribute holding the edges (``"edge_index"``; any ``[2, E]`` attribute
            works, e.g. a precomputed ``"expander_edge_index"``).
        edge_attr (str, optional): the data attribute with edge features passed to the layer, or
            ``None``. A missing attribute is not an error (no features).
    """

    def __init__(self, self_loops: bool = False, attr: str = "edge_index",
                 edge_attr: str | None = "edge_attr") -> None:
        super().__init__()
        self.self_loops = bool(self_loops)
        self.attr = attr
        self.edge_attr_name = edge_attr

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        return ("input", self.self_loops, self.attr, self.edge_attr_name)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        edge_index = ctx.attr(self.attr)
        # checked here (shape, dtype, index range, no edge joining two graphs; one host read)
        # before it is indexed below
        EdgeSet(edge_index, num_heads=ctx.num_heads).validate(ctx.num_nodes, ctx.batch)
        edge_attr = None
        if self.edge_attr_name is not None and ctx.data is not None:
            edge_attr = getattr(ctx.data, self.edge_attr_name, None)
            if edge_attr is not None and edge_attr.dim() == 1:
                edge_attr = edge_attr.unsqueeze(-1)
            if edge_attr is not None and not edge_attr.is_floating_point():
                raise ValueError(
                    f"data.{self.edge_attr_name} must be floating point for attention; encode it "
                    f"first (GraphTransformer does this with its edge encoder)"
                )
        E = edge_index.size(1)
        origin = torch.full((E,), origin_code("input"), dtype=torch.long, device=ctx.device)
        if self.self_loops:
            src, dst = edge_index
            has_loop = torch.zeros(ctx.num_nodes, dtype=torch.bool, device=ctx.device)
            has_loop[src[src == dst]] = True
            missing = (~has_loop).nonzero().view(-1)
            edge_index = torch.cat([edge_index, torch.stack([missing, missing])], 1)
            origin = torch.cat([origin, torch.full_like(missing, origin_code("self_loop"))])
            if edge_attr is not None:
                edge_attr = torch.cat([edge_attr, edge_attr.new_zeros(missing.numel(),
                                                                      edge_attr.size(1))])
        return EdgeSet(edge_index, num_heads=ctx.num_heads, origin=origin, edge_attr=edge_attr,
                       stats={"edges_per_node": edge_index.size(1) / max(ctx.num_nodes, 1)})

    def extra_repr(self) -> str:
        return f"self_loops={self.self_loops}, attr={self.attr!r}"
