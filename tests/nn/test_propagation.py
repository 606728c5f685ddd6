"""``--model grand``: mixed-order propagation over a producer's edge set, DropNode, and the exact
project-first fast path, against dense float64 references."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from graphattn.core.edgeset import EdgeSet
from graphattn.nn import MODELS, create_model
from graphattn.nn.propagation import MixedOrderPropagation, RandomPropagation, drop_node
from graphattn.producers.base import EdgeProducer, ProducerContext


def _graph(n: int = 9, f: int = 6, e: int = 20, seed: int = 0, sparse: bool = False) -> Data:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g, dtype=torch.float64)
    if sparse:
        x = x * (torch.rand(n, f, generator=g, dtype=torch.float64) < 0.05)
    ei = torch.randint(0, n, (2, e), generator=g)
    return Data(x=x, edge_index=ei)


def _dense_reference(x: torch.Tensor, ei: torch.Tensor, steps: int) -> torch.Tensor:
    n = x.size(0)
    a = torch.zeros(n, n, dtype=torch.float64)
    a[ei[1], ei[0]] = 1.0  # target row, source column; duplicates count once
    a.fill_diagonal_(1.0)  # self loops where missing
    d = a.sum(1).rsqrt()
    ahat = d[:, None] * a * d[None, :]
    total, h = x.clone(), x.clone()
    for _ in range(steps):
        h = ahat @ h
        total += h
    return total / (steps + 1)


def _simple_graph(n: int = 9, seed: int = 0) -> Data:
    """Without duplicate edges (gcn_norm sums duplicates; the dense reference sets them once)."""
    data = _graph(n, seed=seed)
    ei = torch.unique(data.edge_index, dim=1)
    data.edge_index = ei[:, ei[0] != ei[1]]
    return data


@pytest.mark.parametrize("steps", [0, 1, 3, 8])
def test_mixed_order_propagation_matches_dense_float64(steps):
    data = _simple_graph()
    out = MixedOrderPropagation(steps)(data.x, data.edge_index)
    torch.testing.assert_close(out, _dense_reference(data.x, data.edge_index, steps),
                               rtol=1e-12, atol=1e-12)


def test_propagation_keeps_graphs_apart():
    a, b = _simple_graph(7, 1), _simple_graph(5, 2)
    batch = Batch.from_data_list([a, b])
    out = MixedOrderPropagation(4)(batch.x, batch.edge_index)
    torch.testing.assert_close(out[:7], MixedOrderPropagation(4)(a.x, a.edge_index))
    torch.testing.assert_close(out[7:], MixedOrderPropagation(4)(b.x, b.edge_index))


def test_propagation_tiny_and_bad_input():
    x = torch.randn(1, 3, dtype=torch.float64)
    torch.testing.assert_close(MixedOrderPropagation(3)(x, torch.empty(2, 0, dtype=torch.long)), x)
    with pytest.raises(ValueError, match="'steps'"):
        MixedOrderPropagation(-1)
    with pytest.raises(ValueError, match="'x'"):
        MixedOrderPropagation(2)(torch.randn(3), torch.empty(2, 0, dtype=torch.long))


def test_drop_node_rows_and_scale():
    """GRAND's convention: kept rows unscaled in training, every row times 1 - p in evaluation."""
    x = torch.ones(20000, 3)
    g = torch.Generator().manual_seed(0)
    out = drop_node(x, 0.3, True, g)
    kept = out[:, 0] != 0
    assert torch.equal(out[kept], torch.ones_like(out[kept]))
    assert (out[~kept] == 0).all()
    assert abs(kept.float().mean().item() - 0.7) < 0.02
    torch.testing.assert_close(drop_node(x, 0.3, False), torch.full_like(x, 0.7))
    assert drop_node(x, 0.0, True) is x and drop_node(x, 0.0, False) is x
    # dropout's convention: kept rows scaled in training, evaluation unchanged
    out = drop_node(x, 0.3, True, torch.Generator().manual_seed(0), rescale=True)
    torch.testing.assert_close(out, torch.where(kept[:, None], 1 / 0.7, 0.0).expand_as(x))
    assert drop_node(x, 0.3, False, rescale=True) is x


def _model(**kw) -> RandomPropagation:
    args = dict(hidden_channels=8, out_channels=3, steps=3, drop_node=0.5, input_dropout=0.0,
                dropout=0.0)
    args.update(kw)
    return RandomPropagation(**args).double()


@pytest.mark.parametrize("sparse", [False, True])
def test_project_first_equals_propagate_first(sparse):
    data = _graph(sparse=sparse)
    fast = _model()
    assert fast.projects_first
    fast.eval()
    fast(data)  # materialise
    slow = _model()
    slow.load_state_dict(fast.state_dict())
    slow.projects_first = False
    for training in (False, True):
        fast.train(training)
        slow.train(training)
        outs = []
        for m in (fast, slow):
            torch.manual_seed(3)
            out = m(data, generator=torch.Generator().manual_seed(5))
            out.pow(2).sum().backward()
            outs.append((out, [p.grad.clone() for p in m.parameters()]))
            m.zero_grad()
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-12)
        for a, b in zip(outs[0][1], outs[1][1], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_eval_output_is_mlp_of_dense_reference():
    data = _simple_graph()
    model = _model(num_layers=2).eval()
    out = model(data)
    xbar = _dense_reference(data.x * 0.5, data.edge_index, 3)  # evaluation: X times 1 - δ
    l1, l2 = model.lins
    torch.testing.assert_close(out, l2(torch.relu(l1(xbar))), rtol=1e-12, atol=1e-12)


def test_projection_shared_by_passes_of_a_step_and_refreshed():
    """The passes of one step reuse X W1; gradients equal separate computations; a second
    backward without an optimizer step works (the cache is cleared by the first)."""
    data = _graph()
    model = _model().train()
    model(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    loss = model(data, generator=gen).sum() + model(data, generator=gen).pow(2).sum()
    loss.backward()
    shared = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = _model().train()
    ref.load_state_dict(model.state_dict())
    ref.projects_first = True
    gen = torch.Generator().manual_seed(0)
    a = ref(data, generator=gen).sum()
    ref._xw_key = None  # force a separate projection for the second pass
    b = ref(data, generator=gen).pow(2).sum()
    (a + b).backward()
    for x, y in zip(shared, [p.grad for p in ref.parameters()], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    model(data).sum().backward()  # no step in between: recomputed, not a freed graph
    opt.step()
    before = model._xw
    model(data)
    assert model._xw is not before


def test_deterministic_under_a_seed_and_uses_the_generator():
    data = _graph()
    model = _model(dropout=0.3)
    model.eval()(data)  # materialise the lazy layer
    model.train()
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        outs.append(model(data, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    torch.manual_seed(0)
    other = model(data, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(outs[0], other)


def test_registered_signals_and_repr():
    assert MODELS["grand"] is RandomPropagation
    data = _graph()
    model = _model().eval()
    out, signals = model(data, return_signals=True)
    assert out.shape == (9, 3) and len(signals) == 1
    assert model.layers[0].last_edges is signals.edge_sets[0]
    assert "steps=3" in repr(model) and "producer=input" in repr(model)


class _Virtual(EdgeProducer):
    def produce(self, ctx: ProducerContext) -> EdgeSet:
        n = ctx.num_nodes
        return EdgeSet(torch.stack([torch.full((n,), n), torch.arange(n)]),
                       virtual_x=torch.zeros(1, ctx.x.size(1), dtype=ctx.x.dtype))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="node-level"):
        _model(task="graph")
    with pytest.raises(ValueError, match="'norm'"):
        _model(norm="layer_norm")
    with pytest.raises(ValueError, match="'drop_node'"):
        _model(drop_node=1.0)
    with pytest.raises(ValueError, match="'producer'"):
        _model(producer=None)
    with pytest.raises(ValueError, match=r"'grand' model .* does not use 'heads'"):
        create_model("grand", hidden_channels=8, out_channels=3, heads=3)
    with pytest.raises(TypeError, match="'heads'"):
        _model(heads=3)
    with pytest.raises(ValueError, match="virtual sources"):
        _model(producer=_Virtual())(_graph())
    bad = _graph()
    bad.x[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        _model()(bad)
    with pytest.raises(ValueError, match=r"data\.x"):
        _model()(Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=3))


def test_batch_norm_path_trains():
    data = _graph()
    model = _model(norm="batch_norm", input_dropout=0.2, dropout=0.2).train()
    assert not model.projects_first
    out = model(data)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_sparse_features_product_and_gradient():
    from graphattn.nn.propagation import SparseFeatures

    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 5, generator=g, dtype=torch.float64)
    x = x * (torch.rand(7, 5, generator=g, dtype=torch.float64) < 0.4)
    sf = SparseFeatures(x)
    w = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(sf.matmul(w), x @ w.t(), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda w: sf.matmul(w), (w,))
    # replacement values (a dropout of the non-zeros, in CSR order) in both products
    scale = torch.rand(sf.values.numel(), generator=g, dtype=torch.float64)
    dense = torch.zeros_like(x)
    dense[x != 0] = sf.values * scale  # row-major order is CSR order
    torch.testing.assert_close(sf.matmul(w, sf.values * scale), dense @ w.t())
    assert torch.autograd.gradcheck(lambda w: sf.matmul(w, sf.values * scale), (w,))


def test_static_edges_kept_across_passes_until_the_graph_changes():
    data = _simple_graph()
    model = _model().eval()
    out = model(data)
    _, adj = model._edge_value
    model(data)
    assert model._edge_value[1] is adj  # same graph: the operator is reused
    data.edge_index[1, 0] = (data.edge_index[1, 0] + 1) % 9  # in place: a new version
    data.edge_index = torch.unique(data.edge_index[:, data.edge_index[0] != data.edge_index[1]],
                                   dim=1)
    changed = model(data)
    assert model._edge_value[1] is not adj
    xbar = _dense_reference(data.x * 0.5, data.edge_index, 3)
    l1, l2 = model.lins
    torch.testing.assert_close(changed, l2(torch.relu(l1(xbar))), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(changed, out)


class _Sampled(EdgeProducer):
    """A stochastic producer (no static key): a new edge set on every call."""

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        n = ctx.num_nodes
        return EdgeSet(torch.randint(0, n, (2, 3 * n), generator=ctx.generator))


def test_stochastic_producer_gives_a_new_edge_set_per_pass():
    data = _graph()
    model = _model(producer=_Sampled()).train()
    gen = torch.Generator().manual_seed(0)
    model(data, generator=gen)
    first = model.layers[0].last_edges
    model(data, generator=gen)
    assert model._edge_key is None
    assert not torch.equal(first.edge_index, model.layers[0].last_edges.edge_index)
