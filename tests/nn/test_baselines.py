"""The citation anchors (``--model gcn`` / ``--model gat``): PyG's layers in the published
recipes, equal to the same PyG layers applied by hand, and refusing what they do not use."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GATConv, GCNConv

from graphattn.nn import MODELS, create_model, get_model
from graphattn.nn.baselines import GATAnchor, GCNAnchor
from graphattn.runner import run_experiment


def _graph(n: int = 12, f: int = 5) -> Data:
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 40), generator=g)
    return Data(x=torch.randn(n, f, generator=g), edge_index=ei)


def test_registered_under_their_names():
    assert MODELS["gcn"] is GCNAnchor and get_model("gat") is GATAnchor


def test_gcn_anchor_is_pygs_gcn_stack():
    torch.manual_seed(0)
    data = _graph()
    model = GCNAnchor(hidden_channels=16, out_channels=3, num_layers=3, task="node").eval()
    out = model(data)
    assert out.shape == (12, 3)
    ref = [GCNConv(5, 16), GCNConv(16, 16), GCNConv(16, 3)]
    for mine, theirs in zip(model.layers, ref, strict=True):
        theirs.load_state_dict(mine.state_dict())
    x = data.x
    x = F.relu(ref[0](x, data.edge_index))
    x = F.relu(ref[1](x, data.edge_index))
    torch.testing.assert_close(out, ref[2](x, data.edge_index))
    out2, signals = model(data, return_signals=True)
    torch.testing.assert_close(out2, out)
    assert len(signals) == 0 and signals.aux_loss is None


def test_gat_anchor_is_pygs_gat_stack():
    torch.manual_seed(0)
    data = _graph()
    model = GATAnchor(hidden_channels=16, out_channels=3, heads=4, out_heads=2, task="node").eval()
    out = model(data)
    assert out.shape == (12, 3)
    first, last = model.layers
    assert (first.heads, first.out_channels, first.concat) == (4, 4, True)
    assert (last.heads, last.out_channels, last.concat) == (2, 3, False)
    ref = [GATConv(5, 4, heads=4), GATConv(16, 3, heads=2, concat=False)]
    for mine, theirs in zip(model.layers, ref, strict=True):
        theirs.load_state_dict(mine.state_dict())
    x = F.elu(ref[0](data.x, data.edge_index))
    torch.testing.assert_close(out, ref[1](x, data.edge_index))
    # training mode drops inputs, features and attention coefficients
    model.train()
    torch.manual_seed(1)
    a = model(data)
    torch.manual_seed(2)
    assert not torch.allclose(a, model(data))


def test_anchors_refuse_what_they_do_not_use():
    with pytest.raises(ValueError, match="node-level"):
        GCNAnchor(hidden_channels=8, out_channels=2, task="graph")
    with pytest.raises(ValueError, match=r"'gcn' model \(GCNAnchor\) does not use 'producer'"):
        create_model("gcn", hidden_channels=8, out_channels=2, producer="sbm")
    with pytest.raises(ValueError, match="does not use 'heads'"):
        create_model("gcn", hidden_channels=8, out_channels=2, heads=8)
    with pytest.raises(TypeError, match="'heads'"):
        GCNAnchor(hidden_channels=8, out_channels=2, heads=8)
    with pytest.raises(ValueError, match="multiple of 'heads'"):
        GATAnchor(hidden_channels=10, out_channels=2, heads=4)
    with pytest.raises(TypeError, match="unexpected"):
        GATAnchor(hidden_channels=8, out_channels=2, heads=4, colour="red")
    with pytest.raises(ValueError, match=r"data\.x"):
        GATAnchor(hidden_channels=8, out_channels=2, heads=4)(Data(x=torch.randn(3, 2)))


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_anchors_run_through_the_runner(mirror, tmp_path, model):
    res = run_experiment({"task": "cora", "model": model, "epochs": 3, "hidden": 16,
                          "progress": False, "out": str(tmp_path / model)})
    assert res["summary"]["producer"] is None and res["summary"]["model"] == model
    assert 0.0 <= res["results"][0]["test"] <= 1.0
    assert f"| cora | {model} |" in (tmp_path / model / "summary.md").read_text()
