"""A producer written as a newcomer would, in one file, from public names only: a k-hop producer
(each node attends to every node within k hops of the input graph). It registers by name, runs in a
layer and in a model built by name, keeps the edge-set invariants, runs without editing any
other file, and the arguments its user gives are never overwritten by the model's defaults."""

from __future__ import annotations

import torch
from torch_geometric.data import Batch, Data

import graphattn as ga
from graphattn import EdgeSet
from graphattn.producers import (
    PRODUCERS,
    EdgeProducer,
    ProducerContext,
    build_producer,
    explicit_edge_set,
    register_producer,
)


@register_producer("test-khop")
class KHopEdges(EdgeProducer):
    r""":math:`\mathcal{N}(i) = \{j : d(j, i) \le k\}` in the input graph ``data.edge_index``
    (self included), from the boolean powers of :math:`A + I` (dense, for small graphs)."""

    def __init__(self, k: int = 2, channels: int = -1) -> None:
        super().__init__()
        self.k = k
        self.channels = channels  # not used: shows that a user's value survives the model's default

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        N, dev = ctx.num_nodes, ctx.device
        ei = ctx.attr("edge_index")
        adj = torch.eye(N, device=dev)  # dense (N x N): fine for the small graphs of this test
        adj[ei[0], ei[1]] = 1.0
        reach = adj
        for _ in range(self.k - 1):
            reach = (reach @ adj).clamp(max=1.0)
        row, col = reach.nonzero().t()  # (source, target) pairs within k hops
        return explicit_edge_set(torch.stack([row, col]), ctx, "test-khop")


def _path_batch() -> Batch:
    def path(n: int) -> Data:
        s = torch.arange(n - 1)
        both_ways = torch.cat([torch.stack([s, s + 1]), torch.stack([s + 1, s])], 1)
        return Data(x=torch.randn(n, 8), edge_index=both_ways)

    return Batch.from_data_list([path(5), path(3), path(1)])


def test_khop_edges_in_a_batch():
    batch = _path_batch()
    edges = KHopEdges(k=2)(batch.x, batch.batch, data=batch)
    edges.validate(batch.num_nodes, batch.batch)  # no cross-graph edge, indices in range
    src, dst = edges.edge_index
    assert torch.equal(batch.batch[src], batch.batch[dst])
    # on a path, node i reaches i-2 .. i+2 within its graph
    for i in range(batch.num_nodes):
        g = int(batch.batch[i])
        lo, hi = int(batch.ptr[g]), int(batch.ptr[g + 1])
        want = {j for j in range(lo, hi) if abs(j - i) <= 2}
        assert set(src[dst == i].tolist()) == want


def test_khop_runs_in_a_layer_and_in_a_model_by_name():
    torch.manual_seed(0)
    batch = _path_batch()
    layer = ga.HybridLayer(8, conv=None, producer={"name": "test-khop", "k": 3}, heads=2)
    out = layer(batch.x, batch.edge_index, batch.batch, data=batch)
    assert out.shape == (batch.num_nodes, 8) and torch.isfinite(out).all()
    model = ga.GraphTransformer(16, 3, num_layers=2, producer="test-khop")
    assert model(batch).shape == (3, 3)
    assert PRODUCERS["test-khop"] is KHopEdges


def test_a_users_argument_is_never_overwritten():
    assert build_producer({"name": "test-khop", "channels": 7}, channels=16).channels == 7
    assert build_producer("test-khop", channels=16).channels == 16
    model = ga.GraphTransformer(16, 3, num_layers=1, producer={"name": "test-khop", "channels": 5})
    producers = [m for m in model.modules() if isinstance(m, KHopEdges)]
    assert producers and all(p.channels == 5 for p in producers)


def test_num_heads_is_the_one_spelling_and_heads_the_older_one():
    import pytest

    from graphattn.producers.sac import SAC
    from graphattn.producers.sbm import SBMEdges

    for cls in (SBMEdges, SAC):
        assert cls(num_heads=2).heads == 2
        assert cls(heads=2).heads == 2
        assert cls(num_heads=3, heads=3).heads == 3  # what the model passes: both, equal
        with pytest.raises(ValueError, match="num_heads=2 and heads=3"):
            cls(num_heads=2, heads=3)
    assert SAC().heads == 1 and SBMEdges().heads is None
