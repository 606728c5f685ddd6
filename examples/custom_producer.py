"""A new producer in one small class, used in HybridLayer without editing any other file.

"Dilated" attention: every node attends to the nodes 1, 2, 4, 8, ... positions before and after
it in its graph's node order (a logarithmic reach in one hop). Run:

    python examples/custom_producer.py
"""

from __future__ import annotations

import torch
from torch_geometric.data import Batch, Data

import graphattn
from graphattn import EdgeSet, HybridLayer
from graphattn.producers import EdgeProducer, ProducerContext, explicit_edge_set, register_producer


@register_producer("dilated")
class DilatedEdges(EdgeProducer):
    r""":math:`\mathcal{N}(i) = \{i\} \cup \{i \pm 2^m : m < \text{levels}\}` within each graph."""

    def __init__(self, levels: int = 4) -> None:
        super().__init__()
        self.levels = levels

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        dev = ctx.device  # every tensor on the features' device: the producer runs on a GPU too
        start = ctx.ptr[ctx.batch]  # first node of each node's graph (needs a sorted batch)
        local = torch.arange(ctx.num_nodes, device=dev) - start
        n = ctx.counts[ctx.batch]
        steps = torch.tensor([0] + [s * 2**m for m in range(self.levels) for s in (-1, 1)], device=dev)
        src_local = local[:, None] + steps[None, :]
        ok = (src_local >= 0) & (src_local < n[:, None])
        src = (start[:, None] + src_local)[ok]
        dst = torch.arange(ctx.num_nodes, device=dev)[:, None].expand_as(src_local)[ok]
        # the layer's heads, the origin label "dilated" (shown by the trace and the viewer)
        return explicit_edge_set(torch.stack([src, dst]), ctx, "dilated")


def main() -> None:
    torch.manual_seed(0)
    graphs = [Data(x=torch.randn(n, 16), edge_index=torch.randint(0, n, (2, 2 * n)))
              for n in (12, 30, 7)]
    batch = Batch.from_data_list(graphs)
    layer = HybridLayer(16, conv="gcn", producer={"name": "dilated", "levels": 3}, heads=4)
    with graphattn.trace(layer) as t:
        out = layer(batch.x, batch.edge_index, batch.batch, data=batch)
    print(layer)
    print("output", tuple(out.shape), "| attention edges per node:",
          round(t.summary()[0]["edges_per_node"], 2), "| origins:", t.summary()[0]["origin_share"])


if __name__ == "__main__":
    main()
