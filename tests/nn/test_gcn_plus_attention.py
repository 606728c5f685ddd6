"""GCN+ with a global attention branch (``--model gcnplus_attention``): exactly GCN+ at
initialisation, the branch composed by hand, argument checks, determinism, a stochastic producer's
signals and a run through the runner."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch

from graphattn.nn import MODELS, create_model
from graphattn.nn.gcn_plus import GCNPlus
from graphattn.nn.gcn_plus_attention import GCNPlusAttention
from graphattn.producers import FullAttention
from graphattn.runner import run_experiment
from tests.nn.test_gcn_plus import _molecules, check_on_device

ARGS = dict(hidden_channels=24, out_channels=10, num_layers=3, pe="random_walk", pe_dim=8,
            pe_channels=6, head_layers=3)


def _model(**kw) -> GCNPlusAttention:
    return GCNPlusAttention(**{**ARGS, "attn_channels": 8, "heads": 2, **kw})


def _train_a_little(model: torch.nn.Module, data: Batch, steps: int = 3) -> None:
    """A few Adam steps (moves W_O away from zero and the BatchNorm statistics)."""
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()


def test_registered_and_repr():
    assert MODELS["gcnplus_attention"] is GCNPlusAttention
    text = repr(_model(attn_layers=[1]))
    assert "producer='full'" in text and "attn_layers=[1]" in text and "attn_channels=8" in text


def test_is_gcn_plus_at_initialisation():
    data = _molecules()
    torch.manual_seed(0)
    model = _model(producer="full").double().eval()
    anchor = GCNPlus(**ARGS).double().eval()
    extra = set(model.state_dict()) - set(anchor.state_dict())
    assert set(anchor.state_dict()) < set(model.state_dict())
    assert extra and all(".branch." in k for k in extra)
    anchor.load_state_dict({k: v for k, v in model.state_dict().items() if k not in extra})
    assert all(torch.count_nonzero(b.out.weight) == 0 for b in model.branches())
    torch.testing.assert_close(model(data), anchor(data), rtol=0, atol=0)
    # reset_parameters draws new weights and puts W_O back to zero
    _train_a_little(model, data)
    assert all(torch.count_nonzero(b.out.weight) > 0 for b in model.branches())
    model.reset_parameters()
    assert all(torch.count_nonzero(b.out.weight) == 0 for b in model.branches())


def test_branch_is_the_documented_composition():
    """Layer 1's pre-norm sum is GCN+'s convolution plus W_O · softmax attention over every node
    of the same graph (the ``full`` producer), computed here with dense float64 tensors."""
    data = _molecules()
    torch.manual_seed(0)
    model = _model(attn_layers=[1]).double()
    _train_a_little(model, data)
    model.eval()
    seen = {}
    layer = model.layers[1]
    handle = layer.norm.register_forward_pre_hook(lambda m, args: seen.update(m=args[0]))
    captured = {}
    hook = layer.register_forward_pre_hook(lambda m, args: captured.update(h=args[0]))
    model(data)
    handle.remove()
    hook.remove()
    h, branch = captured["h"], layer.branch
    e = model.edge_encoder(data.edge_attr)
    with torch.no_grad():
        expected = layer.conv(h, data.edge_index, e)
        heads, c = branch.attn.heads, branch.attn.out_channels
        q = branch.attn.lin_query(h).view(-1, heads, c)
        k = branch.attn.lin_key(h).view(-1, heads, c)
        v = branch.attn.lin_value(h).view(-1, heads, c)
        att = torch.zeros_like(q)
        for g in range(data.num_graphs):
            idx = (data.batch == g).nonzero().flatten()
            s = torch.einsum("ihc,jhc->hij", q[idx], k[idx]) / c**0.5
            att[idx] = torch.einsum("hij,jhc->ihc", s.softmax(-1), v[idx])
        expected = expected + branch.out(att.reshape(-1, heads * c))
    torch.testing.assert_close(seen["m"], expected, rtol=1e-10, atol=1e-10)
    assert layer.last_edges is not None and model.layers[0].last_edges is None


def test_only_the_chosen_layers_have_a_branch():
    model = _model(attn_layers=[0, 2])
    assert model.attn_layers == [0, 2]
    assert [layer.branch is not None for layer in model.layers] == [True, False, True]
    per_branch = 4 * 24 * 8 + 3 * 8  # W_Q, W_K, W_V (with biases) and W_O
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in GCNPlus(**ARGS).parameters())
    assert extra == 2 * per_branch


def test_an_instance_serves_every_layer():
    producer = FullAttention()
    model = _model(producer=producer).eval()
    assert all(b.producer is producer for b in model.branches())
    assert model(_molecules()).shape == (3, 10)


def test_stochastic_producer_reports_signals_and_is_seeded():
    data = _molecules()
    torch.manual_seed(0)
    model = _model(producer={"name": "sbm", "num_clusters": 4})
    _train_a_little(model, data)  # W_O away from zero: the edges change the output
    out, signals = model(data, generator=torch.Generator().manual_seed(1), return_signals=True)
    assert out.shape == (3, 10) and signals.aux_loss is not None and len(signals.edge_sets) == 3
    # dropout draws from torch's generator: reseed it too; the same seeds give the same output
    torch.manual_seed(5)
    a = model(data, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    b = model(data, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(5)
    assert not torch.equal(a, model(data, generator=torch.Generator().manual_seed(2)))


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"'attn_channels' .* divisible by 'heads'"):
        _model(attn_channels=9)
    with pytest.raises(ValueError, match="'attn_channels'"):
        _model(attn_channels=0)
    for bad in ([], [3], [0, 0], [-1], [True]):
        with pytest.raises(ValueError, match="'attn_layers'"):
            _model(attn_layers=bad)
    with pytest.raises(ValueError, match="'producer'"):
        _model(producer=None)
    with pytest.raises(ValueError, match="'heads'"):
        _model(heads=0)
    with pytest.raises(ValueError, match=r"'gcnplus_attention' model .* does not use 'conv'"):
        create_model("gcnplus_attention", **ARGS, conv="gine")
    with pytest.raises(TypeError, match="'conv'"):
        _model(conv="gine")
    with pytest.raises(TypeError, match="unexpected"):
        _model(colour="red")


def test_runs_through_the_runner(mirror, tmp_path):
    res = run_experiment({"task": "peptides-func", "model": "gcnplus_attention", "epochs": 2,
                          "hidden": 32, "layers": 2, "heads": 2, "producer": "full",
                          "norm": "batch_norm", "residual": False, "head_layers": 2,
                          "pe": "random_walk", "pe_dim": 8,
                          "model_kwargs": {"pe_channels": 4, "attn_channels": 8},
                          "batch_size": 4, "task_kwargs": {"limit": 8}, "progress": False,
                          "out": str(tmp_path / "run")})
    r = res["results"][0]
    assert res["summary"]["model"] == "gcnplus_attention" and r["epochs_run"] == 2
    assert res["summary"]["producer"] == "full" and 0.0 <= r["test"] <= 1.0


@pytest.mark.parametrize("features", [False, True])
def test_bond_features_reach_the_attention_only_when_asked(features):
    data = _molecules()
    model = _model(producer={"name": "union", "producers": ["input", "virtual"]},
                   attn_edge_features=features).eval()
    model(data)
    edges = model.layers[0].last_edges
    assert (edges.edge_attr is not None) == features
    assert (model.branches()[0].attn.lin_edge is not None) == features
    if features:  # the input edges carry the encoded bonds, the virtual edges zeros
        assert edges.edge_attr.shape[1] == ARGS["hidden_channels"]


def test_bond_features_need_an_edge_encoder():
    with pytest.raises(ValueError, match="'attn_edge_features' needs an 'edge_encoder'"):
        _model(attn_edge_features=True, edge_encoder=None)
    with pytest.raises(ValueError, match="'attn_edge_features' must be a bool"):
        _model(attn_edge_features="yes")


def test_trains_and_evaluates_on_device(device):
    data = _molecules()
    torch.manual_seed(0)
    model = _model(producer={"name": "union", "producers": ["input", "virtual"]})
    _train_a_little(model, data)  # W_O away from zero: the attention shapes the output
    check_on_device(model, data, device)
