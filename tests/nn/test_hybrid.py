"""HybridLayer and GraphTransformer: wiring, norms, encoders, traces and training signals."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Batch, Data

import graphattn
from graphattn import EdgeSet, GraphTransformer, HybridLayer
from graphattn.nn import positional_encoding
from graphattn.producers import EdgeProducer
from tests.helpers import make_batch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("conv", [None, "gcn", "gin", "gat", "sage"])
def test_hybrid_layer_shapes_and_grads(conv, norm_first):
    batch = make_batch([6, 1, 0, 4], channels=8, dtype=torch.float32)
    layer = HybridLayer(8, conv=conv, producer="full", heads=2, norm_first=norm_first, dropout=0.1)
    x = batch.x.clone().requires_grad_()
    out = layer(x, batch.edge_index, batch.batch, data=batch)
    assert out.shape == x.shape and torch.isfinite(out).all()
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    assert all(p.grad is not None for n, p in layer.named_parameters() if "norm" not in n)
    layer.reset_parameters()


def test_hybrid_layer_local_only_and_errors():
    batch = make_batch([4], channels=8, dtype=torch.float32)
    layer = HybridLayer(8, conv="gcn", producer=None)
    assert layer(batch.x, batch.edge_index, batch.batch).shape == (4, 8)
    with pytest.raises(ValueError, match="divisible"):
        HybridLayer(10, producer="full", heads=3)
    with pytest.raises(ValueError, match="conv"):
        HybridLayer(8, conv=None, producer=None)
    with pytest.raises(ValueError, match="unknown conv"):
        HybridLayer(8, conv="nope")


def test_hybrid_layer_gine_edge_features_reach_conv_and_attention():
    batch = make_batch([5, 3], channels=8, dtype=torch.float32)
    ea = torch.randn(batch.edge_index.size(1), 8)
    view = Batch.from_data_list([Data(x=d.x, edge_index=d.edge_index) for d in batch.to_data_list()])
    view.edge_attr = ea
    layer = HybridLayer(8, conv="gine", producer="input", heads=2, edge_dim=8)
    out = layer(batch.x, batch.edge_index, batch.batch, ea, data=view)
    # a weighted sum: the plain sum through a (post-)LayerNorm has zero gradient by construction
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    assert layer.attn.lin_edge.weight.grad.abs().sum() > 0
    assert layer.conv.lin.weight.grad.abs().sum() > 0


class _AuxProducer(EdgeProducer):
    """Input edges plus a differentiable aux loss and a fake policy-gradient term."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def produce(self, ctx):
        ei = ctx.attr("edge_index")
        lp = self.scale * torch.zeros(ei.size(1))
        return EdgeSet(ei, num_heads=ctx.num_heads, aux_loss=self.scale ** 2,
                       log_prob=lp, log_prob_graph=ctx.batch[ei[1]])


def test_graph_transformer_collects_aux_and_policy_terms():
    batch = make_batch([5, 3], channels=8, dtype=torch.float32)
    model = GraphTransformer(16, 2, num_layers=2, producer=[_AuxProducer(16), "full"], heads=2)
    out = model(batch)
    assert out.shape == (2, 2)
    assert len(model.edge_sets()) == 2
    assert torch.allclose(model.aux_loss(), torch.tensor(1.0))
    (lp, graph), = model.policy_terms()
    assert lp.shape == graph.shape


def test_graph_transformer_node_task_pe_and_trace():
    batch = make_batch([9, 5], channels=8, dtype=torch.float32)
    pe = positional_encoding("random_walk", 4)
    batch = Batch.from_data_list([pe(d) for d in batch.to_data_list()])
    model = GraphTransformer(16, 3, num_layers=3, task="node", conv="gcn", heads=4,
                             producer=["full", {"name": "union", "producers": ["input", "virtual"]},
                                       {"name": "knn", "k": 3}],
                             pe="random_walk", norm_first=True)
    out, t = model(batch, trace_attention=True)
    assert out.shape == (14, 3)
    assert [r.layer for r in t] == ["layers.0.attn", "layers.1.attn", "layers.2.attn"]
    for rec in t:
        assert rec.alpha.shape == (rec.edges.num_edges, 4)
        assert rec.edges.origin is not None
    assert torch.allclose(model(batch), out, atol=1e-5)  # tracing only changes the kernel
    shares = t.summary()[1]["origin_share"]
    assert set(shares) == {"input", "virtual"}


def test_graph_transformer_molecules_with_ogb_encoders():
    from ogb.utils import smiles2graph

    graphs = []
    for smi in ["CCO", "c1ccccc1O", "C"]:
        g = smiles2graph(smi)
        graphs.append(Data(x=torch.from_numpy(g["node_feat"]),
                           edge_index=torch.from_numpy(g["edge_index"]),
                           edge_attr=torch.from_numpy(g["edge_feat"])))
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(16, 10, num_layers=2, conv="gine", heads=2, node_encoder="atom",
                             edge_encoder="bond", producer={"name": "input", "self_loops": True})
    assert model(batch).shape == (3, 10)


def test_missing_pe_is_a_clear_error():
    batch = make_batch([4], dtype=torch.float32)
    model = GraphTransformer(8, 2, num_layers=1, pe="laplacian")
    with pytest.raises(ValueError, match="laplacian_eigenvector_pe"):
        model(batch)


def test_small_model_learns():
    """A 2-layer model fits a toy graph-level target (sanity of the whole stack)."""
    torch.manual_seed(0)
    graphs = []
    for i in range(40):
        n = 4 + i % 5
        x = torch.randn(n, 4)
        graphs.append(Data(x=x, edge_index=torch.randint(0, n, (2, 2 * n)),
                           y=torch.tensor([float(x[:, 0].sum() > 0)])))
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(16, 1, num_layers=2, producer="full", heads=2, conv="gcn")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch).view(-1), batch.y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_custom_producer_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "custom_producer.py"), run_name="__main__")
    assert "dilated" in capsys.readouterr().out
    assert "dilated" in graphattn.producers.PRODUCERS


@pytest.mark.parametrize("spec", [{"name": "samsa", "k": 3}, {"name": "sbm"}, {"name": "sac"}],
                         ids=lambda s: s["name"])
def test_shared_producer_spec_builds_with_the_layer_defaults(spec):
    """``"shared": true`` builds one instance with the same defaults a layer would pass
    (``channels``, ``heads``), and every layer uses it."""
    from tests.helpers import make_batch

    b = make_batch([5, 4], channels=16, dtype=torch.float32)
    model = GraphTransformer(16, 2, num_layers=2, producer={**spec, "shared": True}, heads=2)
    assert model.layers[0].producer is model.layers[1].producer
    assert model(b).shape == (2, 2)


@pytest.mark.parametrize("output_layer", [False, True])
@pytest.mark.parametrize("in_channels", [8, 12, -1])
def test_a_requested_residual_is_never_dropped(in_channels, output_layer):
    """``residual=True`` between different widths (or in an output layer) is a learned projection
    (as ``GATConv(residual=True)``), never silently skipped: the output is the layer without the
    residual plus the projected input, exactly."""
    batch = make_batch([5, 3], channels=12 if in_channels == -1 else in_channels,
                       dtype=torch.float64)
    kw = dict(conv="gcn", producer="full", heads=2, in_channels=in_channels,
              output_layer=output_layer, norm=None, ffn=False, act=torch.nn.Identity())
    torch.manual_seed(0)
    with_res = HybridLayer(8, residual=True, **kw).double()
    torch.manual_seed(0)
    without = HybridLayer(8, residual=False, **kw).double()
    with_res(batch.x, batch.edge_index, batch.batch, data=batch)  # sizes a lazy projection
    without(batch.x, batch.edge_index, batch.batch, data=batch)
    without.load_state_dict({k: v for k, v in with_res.state_dict().items()
                             if not k.startswith("skip.")})
    assert with_res.residual and not without.residual
    same_width = in_channels == 8
    assert isinstance(with_res.skip, torch.nn.Identity) == same_width
    skip = batch.x if same_width else batch.x @ with_res.skip.weight.T
    # identity: x is added to each of the two branches (GPS); an output layer adds it once
    copies = 1 if output_layer else 2
    out = with_res(batch.x, batch.edge_index, batch.batch, data=batch)
    ref = without(batch.x, batch.edge_index, batch.batch, data=batch) + copies * skip
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert "skip.weight" in dict(with_res.named_parameters()) or same_width


def test_gcn_plus_residual_between_widths_is_projected():
    from graphattn.nn.gcn_plus import _GCNPlusLayer

    layer = _GCNPlusLayer(6, 4, None, None, "relu", 0.0, residual=True)
    assert layer.residual and not isinstance(layer.skip, torch.nn.Identity)
    assert _GCNPlusLayer(4, 4, None, None, "relu", 0.0, residual=True).skip.__class__ is torch.nn.Identity
    assert not _GCNPlusLayer(6, 4, None, None, "relu", 0.0, residual=False).residual


def test_a_node_model_refuses_an_order_dependent_producer_unless_allowed():
    with pytest.raises(ValueError, match=r"'sliceformer' \(layer 1\) is order-dependent.*"
                                         r"allow_order_dependent=True"):
        GraphTransformer(16, 3, num_layers=2, producer=["full", "sliceformer"], task="node")
    GraphTransformer(16, 3, num_layers=2, producer="sliceformer", task="graph")
    model = GraphTransformer(16, 3, num_layers=1, producer="sliceformer", task="node",
                             allow_order_dependent=True)
    batch = make_batch([5], channels=4, dtype=torch.float32)
    assert model(batch).shape == (5, 3)


@pytest.mark.parametrize("producer", [{"name": "knn", "k": 2}, "input", {"name": "sac", "warm_start": 0}])
@pytest.mark.parametrize("bad", ["pos_rows", "pos_3d", "pos_int", "edge_attr_rows", "edge_attr_3d"])
def test_malformed_pos_or_edge_attr_is_refused_whatever_the_producer(producer, bad):
    """A malformed ``data.pos`` / ``data.edge_attr`` is refused, naming it, even by a producer that
    does not read it (the same data would feed another producer wrong values)."""
    x = torch.randn(6, 8)
    ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    attrs = {"pos": torch.randn(6, 2), "edge_attr": torch.randn(5, 4)}
    attrs.update({"pos_rows": {"pos": torch.randn(4, 2)}, "pos_3d": {"pos": torch.randn(6, 2, 2)},
                  "pos_int": {"pos": torch.ones(6, 2, dtype=torch.long)},
                  "edge_attr_rows": {"edge_attr": torch.randn(3, 4)},
                  "edge_attr_3d": {"edge_attr": torch.randn(5, 2, 2)}}[bad])
    data = Data(x=x, edge_index=ei, **attrs)
    layer = HybridLayer(8, producer=producer, heads=2)
    name = "data.pos" if bad.startswith("pos") else "data.edge_attr"
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        layer(x, None, torch.zeros(6, dtype=torch.long), data=data)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        GraphTransformer(8, 3, num_layers=1, producer=producer)(data)


@pytest.mark.parametrize("producer", [{"name": "random", "k": 2}, "expander", "sbm", "samsa"])
def test_a_generator_of_the_wrong_type_is_named(producer):
    x = torch.randn(5, 8)
    layer = HybridLayer(8, producer=producer, heads=2)
    with pytest.raises(ValueError, match=r"'generator' must be a torch\.Generator or None, got int"):
        layer(x, None, torch.zeros(5, dtype=torch.long), data=Data(x=x), generator=3)


def test_a_read_out_the_node_task_does_not_use_is_refused():
    with pytest.raises(ValueError, match="'pool' is the graph read-out; task='node' has none"):
        GraphTransformer(8, 3, num_layers=1, task="node", pool="max")
    GraphTransformer(8, 3, num_layers=1, task="node")  # the default is not a choice


def test_the_readme_model_builds_and_a_gine_model_names_what_it_needs():
    spec = {"name": "union", "producers": ["input", "expander", "virtual"]}
    with pytest.raises(ValueError, match=r"conv='gine' adds edge features.*set edge_encoder='linear'"):
        GraphTransformer(64, 10, num_layers=4, conv="gine", producer=spec)
    model = GraphTransformer(64, 10, num_layers=4, conv="gine", edge_encoder="linear", producer=spec)
    x, ei = torch.randn(6, 5), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    assert model(Data(x=x, edge_index=ei, edge_attr=torch.randn(5, 3))).shape == (1, 10)
    with pytest.raises(ValueError, match=r"'data\.edge_attr' is missing: conv='gine'"):
        model(Data(x=x, edge_index=ei))


def test_the_training_loop_example_runs(mirror, capsys):
    """``examples/train_loop.py``: the hybrid in a plain PyTorch loop on Cora (30 epochs here)."""
    namespace = runpy.run_path(str(ROOT / "examples" / "train_loop.py"), run_name="example")
    test = namespace["main"](epochs=30)
    assert test > 0.5  # the largest class is 0.32
    assert "best validation accuracy" in capsys.readouterr().out
