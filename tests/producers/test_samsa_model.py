"""The SAMSA preset model: the paper's block (Pre-RMSNorm, shared zero-initialised residual scalar),
its registry entry and the runner's build path (spec tests T6, T17)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import softmax

from graphattn.nn import GraphModel, create_model, get_model
from graphattn.producers.samsa import SAMSA
from graphattn.producers.samsa.model import SAMSABlock, SAMSATransformer, drop_path
from graphattn.runner.build import build_model
from graphattn.runner.config import resolve_config
from graphattn.runner.tasks import Task
from tests.helpers import make_batch

F_IN = 8


def model(**kw):
    torch.manual_seed(0)
    args = {"hidden_channels": 16, "out_channels": 3, "num_layers": 2, "heads": 2,
            "producer": {"name": "samsa", "k": 3}, **kw}
    return SAMSATransformer(**args)


def batch(dtype=torch.float32):
    return make_batch([0, 4, 9, 1], channels=F_IN, dtype=dtype, seed=1)


def test_registered():
    assert get_model("samsa") is SAMSATransformer
    assert issubclass(SAMSATransformer, GraphModel)  # GraphTransformer's encoders and head


def test_t17_zero_initialised_shared_scalar_makes_the_stack_the_identity():
    m = model()
    data = batch()
    assert m.residual_scale.item() == 0.0
    h, _ = m.encode(data)
    x = h
    alpha = m.residual_scale
    for layer in m.layers:
        x = layer(x, data.batch, alpha, data=data)
    assert torch.equal(x, h)  # exactly the input, in training and evaluation alike
    m.train()
    for layer in m.layers:
        x = layer(x, data.batch, alpha, data=data)
    assert torch.equal(x, h)
    # one scalar for all layers: a single parameter named residual_scale
    names = [n for n, _ in m.named_parameters() if "residual_scale" in n]
    assert names == ["residual_scale"]


def test_t6_first_step_gradients_and_alpha_nonzero():
    m = model(readout="attention")
    data = batch()
    m.train()
    m(data).pow(2).sum().backward()
    assert m.residual_scale.grad is not None and m.residual_scale.grad.abs() > 0
    for layer in m.layers:  # alpha = 0: the branches receive no gradient in the first step
        for name, p in layer.named_parameters():
            assert p.grad is None or torch.all(p.grad == 0), name
    m.zero_grad(set_to_none=True)
    with torch.no_grad():
        m.residual_scale.fill_(0.5)
    m(data).pow(2).sum().backward()
    for layer in m.layers:
        for name in ("producer.score.out.weight", "producer.support_score", "attn.lin_key.weight",
                     "mlp.0.weight"):
            p = layer.get_parameter(name)
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_block_formula():
    """x + α·(W_O·Attn(RMSNorm1 x)) + α·MLP(RMSNorm2(...)), the scores read the raw x."""
    torch.manual_seed(1)
    data = batch(torch.float64)
    blk = SAMSABlock(F_IN, 2, {"name": "samsa", "k": 3}, ffn_channels=16).double().eval()
    x = data.x
    alpha = torch.tensor([0.7], dtype=torch.float64)
    out = blk(x, data.batch, alpha, data=data)
    xh = blk.norm1(x)
    prod = blk.producer
    assert prod.score_from == "residual"
    att = blk.attn(xh, prod, data.batch, data=data, inputs={"residual": x})
    y = x + alpha * blk.attn_out(att)
    y = y + alpha * blk.mlp(blk.norm2(y))
    torch.testing.assert_close(out, y)
    # the scores come from the raw x, not from x̂: scaling x changes x̂ not at all
    assert not torch.equal(blk.attn(xh, prod, data.batch, data=data, inputs={"residual": 3 * x}), att)


def test_attention_readout():
    m = model(readout="attention").double().eval()
    data = batch(torch.float64)
    h, _ = m.encode(data)
    w = softmax(m.readout_score(h).squeeze(-1), data.batch, num_nodes=data.num_graphs)
    pooled = torch.zeros(data.num_graphs, 16, dtype=torch.float64).index_add_(
        0, data.batch, w[:, None] * h)
    torch.testing.assert_close(m(data), m.head(pooled))  # alpha = 0: layers are the identity
    assert torch.isfinite(m(data)).all()


def test_eval_is_deterministic_and_edge_sets_exposed():
    m = model()
    data = batch()
    with torch.no_grad():
        m.residual_scale.fill_(1.0)
    m.eval()
    a, b = m(data), m(data)
    assert torch.equal(a, b)
    es = m.edge_sets()
    assert len(es) == 2 and all(e.stats["edges_per_node"] == 2 * 3 for e in es)
    assert m.aux_loss() is None and m.policy_terms() == []
    out, tr = m(data, trace_attention=True)
    assert len(tr.records) == 2
    torch.testing.assert_close(out, a)


def test_training_is_deterministic_under_a_generator():
    m = model(dropout=0.0)
    data = batch()
    with torch.no_grad():
        m.residual_scale.fill_(1.0)
    m.train()
    o1 = m(data, generator=torch.Generator().manual_seed(1))
    o2 = m(data, generator=torch.Generator().manual_seed(1))
    assert torch.equal(o1, o2)


def test_errors():
    with pytest.raises(ValueError, match="conv"):
        model(conv="gine")
    with pytest.raises(ValueError, match="samsa"):
        model(producer="full")
    with pytest.raises(ValueError, match="head_layers"):
        model(head_layers=0)
    with pytest.raises(ValueError, match="readout"):
        model(readout="median")
    with pytest.raises(ValueError, match="num_layers"):
        model(producer=["samsa"] * 3)


def test_per_layer_specs_and_producer_kwargs():
    m = model(producer=[{"name": "samsa", "k": 2}, "samsa"], producer_kwargs={"tau": 0.5})
    assert [layer.producer.k for layer in m.layers] == [2, 32]
    assert all(layer.producer.tau == 0.5 for layer in m.layers)
    assert all(isinstance(layer.producer, SAMSA) for layer in m.layers)


def test_node_task():
    m = model(task="node")
    data = batch()
    assert m(data).shape == (data.num_nodes, 3)


def test_drop_path_per_graph():
    x = torch.ones(6, 2)
    b = torch.tensor([0, 0, 1, 1, 2, 2])
    torch.manual_seed(0)
    y = drop_path(x, b, 3, 0.5, True)
    assert set(y.unique().tolist()) <= {0.0, 2.0}
    assert torch.equal(y[0], y[1]) and torch.equal(y[2], y[3])  # one decision per graph
    assert torch.equal(drop_path(x, b, 3, 0.5, False), x)


def test_runner_builds_the_preset():
    cfg = resolve_config({"task": "mutag", "model": "samsa", "conv": "none",
                          "producer": {"name": "samsa", "k": 4}, "hidden": 16, "heads": 2,
                          "layers": 2, "model_kwargs": {"readout": "attention", "drop_path": 0.1}})
    task = Task(name="toy", level="graph", modality="graph", loss="ce", metric="accuracy",
                out_channels=2, model_defaults={"node_encoder": "linear", "pool": "mean"})
    m = build_model(cfg, task)
    assert isinstance(m, SAMSATransformer) and m.readout == "attention"
    assert len(m.layers) == 2 and m.layers[0].drop_path == 0.1
    data = batch()
    assert m(data).shape == (data.num_graphs, 2)


@pytest.mark.parametrize("arg", [{"norm": "batch_norm"},
                                 {"residual": False}, {"edge_encoder": "bond"}])
def test_preset_refuses_arguments_it_does_not_use(arg):
    name = next(iter(arg))
    with pytest.raises(ValueError, match=f"'samsa' model .* does not use '{name}'"):
        create_model("samsa", hidden_channels=16, out_channels=2, **arg)
    with pytest.raises(TypeError, match=f"'{name}'"):
        SAMSATransformer(16, 2, **arg)
    # an option left out is not given: the preset builds
    create_model("samsa", hidden_channels=16, out_channels=2)
