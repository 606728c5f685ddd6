"""GraphTransformer: shapes for graph and node tasks, the read-outs, reset_parameters, the
training signals collected from the producers, a producer shared by several layers, determinism
under a seed, and that every parameter receives a gradient."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_mean_pool

from graphattn import GraphTransformer, HybridLayer


def _batch(sizes=(5, 1, 7), seed: int = 0, feats: int = 6) -> Batch:
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for n in sizes:
        s = torch.arange(n)
        ring = torch.stack([s, (s + 1) % n]) if n > 1 else torch.zeros(2, 0, dtype=torch.long)
        graphs.append(Data(x=torch.randn(n, feats, generator=g), edge_index=ring,
                           y=torch.randint(0, 3, (n,), generator=g)))
    return Batch.from_data_list(graphs)


@pytest.mark.parametrize("pool", ["mean", "add", "max", "cls"])
def test_graph_task_gives_one_row_per_graph(pool):
    torch.manual_seed(0)
    batch = _batch()
    model = GraphTransformer(16, 3, num_layers=2, producer="full", pool=pool)
    out = model(batch)
    assert out.shape == (3, 3) and torch.isfinite(out).all()


def test_node_task_gives_one_row_per_node():
    torch.manual_seed(0)
    batch = _batch()
    model = GraphTransformer(16, 3, num_layers=2, producer="window", conv="gcn", task="node")
    assert model(batch).shape == (batch.num_nodes, 3)


def test_layers_are_hybrid_layers_and_repr_names_them():
    model = GraphTransformer(16, 3, num_layers=3, producer="random", conv="gin")
    assert len(model.layers) == 3 and all(isinstance(m, HybridLayer) for m in model.layers)
    text = repr(model)
    assert text.startswith("GraphTransformer(") and "random" in text


def test_reset_parameters_restores_the_initial_function():
    batch = _batch()
    torch.manual_seed(1)
    model = GraphTransformer(16, 3, num_layers=2, producer="full", conv="gcn")
    model.eval()
    model(batch)  # materialise the lazy input widths first
    torch.manual_seed(2)
    model.reset_parameters()
    before = model(batch).detach()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert not torch.allclose(model(batch), before)
    torch.manual_seed(2)
    model.reset_parameters()
    torch.testing.assert_close(model(batch).detach(), before)


def test_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    batch = _batch()
    model = GraphTransformer(16, 3, num_layers=2, producer="full", conv="gcn")
    model(batch).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_evaluation_is_deterministic_and_training_under_a_seed_reproducible():
    batch = _batch()
    torch.manual_seed(0)
    model = GraphTransformer(16, 3, num_layers=2, producer={"name": "random", "k": 2}, dropout=0.2)
    model.eval()
    torch.testing.assert_close(model(batch), model(batch), rtol=0, atol=0)
    model.train()
    torch.manual_seed(5)
    a = model(batch)
    torch.manual_seed(5)
    b = model(batch)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_aux_loss_and_edge_sets_of_the_last_pass():
    torch.manual_seed(0)
    batch = _batch()
    plain = GraphTransformer(16, 3, num_layers=2, producer="full")
    plain(batch)
    assert len(plain.edge_sets()) == 2 and plain.aux_loss() is None
    sbm = GraphTransformer(16, 3, num_layers=2, producer={"name": "sbm", "num_clusters": 4}, heads=2)
    sbm.train()
    sbm(batch)
    loss = sbm.aux_loss()
    assert loss is not None and loss.dim() == 0 and torch.isfinite(loss)
    expected = sum(es.aux_loss.reshape(()) for es in sbm.edge_sets())
    torch.testing.assert_close(loss, expected)


def test_forward_returns_the_training_signals_as_values():
    """``return_signals=True`` returns the pass's edge sets with their aux losses and policy terms
    (the runner's objective reads them from there, not from the layers)."""
    torch.manual_seed(0)
    batch = _batch()
    sbm = GraphTransformer(16, 3, num_layers=2, producer={"name": "sbm", "num_clusters": 4},
                           heads=2).train()
    out, signals = sbm(batch, return_signals=True)
    assert out.shape == (3, 3) and len(signals) == 2
    assert signals.edge_sets == [layer.last_edges for layer in sbm.layers]
    torch.testing.assert_close(signals.aux_loss,
                               sum(es.aux_loss.reshape(()) for es in signals.edge_sets))
    signals.aux_loss.backward()  # differentiable: reaches the producers' parameters
    assert any(p.grad is not None for p in sbm.parameters())
    sac = GraphTransformer(16, 3, num_layers=1, producer={"name": "sac", "warm_start": 0},
                           conv="gcn").train()
    _, sac_signals = sac(batch, return_signals=True)
    ((log_prob, graph),) = sac_signals.policy_terms
    assert log_prob.numel() == graph.numel() > 0 and log_prob.requires_grad
    # both extras at once: (out, trace, signals)
    _, trace, signals2 = sbm.eval()(batch, trace_attention=True, return_signals=True)
    assert len(trace) == 2 and len(signals2) == 2


def test_a_producer_instance_shared_by_layers_is_one_module():
    torch.manual_seed(0)
    batch = _batch()
    model = GraphTransformer(16, 3, num_layers=3, producer={"name": "sac", "shared": True,
                                                            "warm_start": 0, "alpha": 1})
    producers = {id(layer.producer) for layer in model.layers}
    assert len(producers) == 1
    model.train()
    model(batch)
    # the shared predictor samples once per forward: one policy term, later layers reuse the edges
    assert len(model.policy_terms()) == 1


@pytest.mark.parametrize("spec,shared", [
    ("input", True), ({"name": "window", "window": 1}, True), ("full", True),
    ({"name": "expander", "degree": 2}, True), ({"name": "knn", "k": 2, "attr": "pos"}, True),
    ({"name": "union", "producers": ["input", {"name": "expander", "degree": 2}]}, True),
    ({"name": "knn", "k": 2, "attr": "x"}, False),  # neighbours in each layer's input
    ({"name": "union", "producers": ["input", "virtual"]}, False),  # virtual nodes pool x
    ({"name": "random", "k": 2}, False),
])
def test_batch_only_edge_sets_are_built_once_per_forward(spec, shared):
    """Producers whose edges depend only on the batch (``static_key``) build them once per
    forward pass; every layer attends over that one edge set, with the same output as building
    it in every layer."""
    torch.manual_seed(0)
    batch = _batch()
    batch.pos = torch.randn(batch.num_nodes, 2)
    model = GraphTransformer(16, 3, num_layers=3, producer=spec, conv="gcn").train()
    torch.manual_seed(1)
    out, signals = model(batch, return_signals=True)
    first = signals.edge_sets[0]
    assert all((es is first) == shared for es in signals.edge_sets[1:])
    # the same layers, each building its own edge set (no cache): the same numbers
    model.eval()
    out = model(batch)
    h, _ = model.encode(batch)
    for layer in model.layers:
        h = layer(h, batch.edge_index, batch.batch, data=batch)
    expected = model.head(global_mean_pool(h, batch.batch, size=3))  # the default read-out
    torch.testing.assert_close(out, expected)  # same edges; a union's edge order may differ


def test_a_caller_generator_makes_the_expander_draw_in_every_layer():
    batch = _batch()
    model = GraphTransformer(16, 3, num_layers=2, producer={"name": "expander", "degree": 2})
    _, signals = model(batch, generator=torch.Generator().manual_seed(0), return_signals=True)
    assert signals.edge_sets[0] is not signals.edge_sets[1]


def test_raw_feature_models_with_producers_that_need_the_input_width():
    """Without a node encoder the first layer reads the raw features: SAMSA and the Converter,
    whose parameters are sized by their input, need ``in_channels`` (a clear error otherwise);
    Sliceformer's heads of size 1 also make the output layer (``head_layers=0``: concatenated
    single-channel heads, not averaged full-width ones)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 11, generator=g)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8]])
    data = Data(x=x, edge_index=ei)
    for producer in ("samsa", "converter"):
        with pytest.raises(ValueError, match="in_channels="):
            GraphTransformer(16, 3, num_layers=2, producer=producer, node_encoder=None,
                             head_layers=0, task="node")
        model = GraphTransformer(16, 3, num_layers=2, producer={"name": producer}, heads=2,
                                 node_encoder=None, head_layers=0, task="node", in_channels=11)
        assert model(data).shape == (9, 3)
    model = GraphTransformer(16, 3, num_layers=2, producer="sliceformer", node_encoder=None,
                             head_layers=0, task="node", allow_order_dependent=True)
    assert model(data).shape == (9, 3)
    assert model.layers[-1].attn.heads == 3  # three heads of one channel each


@pytest.mark.parametrize("cls", ["GraphTransformer", "HybridLayer"])
def test_every_bad_constructor_argument_is_named(cls):
    """Each argument of the two model constructors, given a value of a wrong type or range, is
    either accepted or refused with an error that names it (norm, act, pool and the kwargs
    mappings used to fail deep in PyG or with an unnamed TypeError)."""
    import inspect

    import graphattn

    klass = getattr(graphattn, cls)
    base = ({"hidden_channels": 16, "out_channels": 3} if cls == "GraphTransformer"
            else {"channels": 16})
    for name in inspect.signature(klass.__init__).parameters:
        if name == "self":
            continue
        for value in ("bogus", -3, 2.5, True, [1], {}):
            try:
                klass(**{**base, name: value})
            except (ValueError, TypeError) as e:
                assert name in str(e), (name, value, str(e))


def test_a_deep_head_is_graphgyms_mlp_and_trains_on_one_graph():
    """``head_layers`` = 3: two ``Linear → BatchNorm → act → dropout`` blocks, then ``Linear`` (the
    batch norm keeps the head's units from dying on nearly equal pooled vectors; see the
    Peptides-func guard in tests/runner/test_defaults_learn.py). A training batch of one graph
    (a single pooled row) still trains: the batch norm leaves a single element as it is."""
    from torch_geometric.nn import BatchNorm

    model = GraphTransformer(16, 3, num_layers=1, conv="gcn", head_layers=3)
    kinds = [type(m) for m in model.head]
    assert kinds.count(BatchNorm) == 2 and len(model.head) == 9
    data = Data(x=torch.randn(5, 4), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]]))
    model.train()
    out = model(data)
    assert out.shape == (1, 3) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in model.head.parameters())


def test_head_norm_none_is_the_plain_mlp_and_a_bad_value_is_named():
    model = GraphTransformer(16, 3, num_layers=1, conv="gcn", head_layers=3, head_norm="none")
    assert len(model.head) == 7 and not any("BatchNorm" in type(m).__name__ for m in model.head)
    with pytest.raises(ValueError, match="'head_norm' must be 'batch_norm' or 'none'"):
        GraphTransformer(16, 3, num_layers=1, head_layers=2, head_norm="layer_norm")
    with pytest.raises(ValueError, match=r"head_norm='none' needs a head with a hidden layer"):
        GraphTransformer(16, 3, num_layers=1, head_layers=1, head_norm="none")
