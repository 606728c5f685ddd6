"""The GCN+ anchor (``--model gcnplus``): its forward pass composed by hand, the recipe's size,
argument checks, determinism and a run through the runner."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_mean_pool

from graphattn.nn import MODELS, create_model
from graphattn.nn.gcn_plus import GCNPlus
from graphattn.runner import run_experiment


def _molecules(num: int = 3, pe_dim: int = 8, seed: int = 0) -> Batch:
    """Small molecule-like graphs: 9 integer atom features, 3 integer bond features, an RWSE."""
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for b in range(num):
        n = 4 + b
        src = torch.arange(n - 1)
        ei = torch.stack([torch.cat([src, src + 1]), torch.cat([src + 1, src])])
        graphs.append(Data(x=torch.randint(0, 2, (n, 9), generator=g),
                           edge_index=ei, edge_attr=torch.randint(0, 2, (ei.size(1), 3), generator=g),
                           random_walk_pe=torch.rand(n, pe_dim, generator=g),
                           y=torch.randint(0, 2, (1, 10), generator=g).float()))
    return Batch.from_data_list(graphs)


def _model(**kw) -> GCNPlus:
    args = dict(hidden_channels=24, out_channels=10, num_layers=3, pe="random_walk", pe_dim=8,
                pe_channels=6, head_layers=3)
    return GCNPlus(**{**args, **kw})


def test_registered():
    assert MODELS["gcnplus"] is GCNPlus


def test_forward_is_the_documented_composition():
    torch.manual_seed(0)
    data = _molecules()
    model = _model()
    model.train()  # move the BatchNorm statistics away from their initial values
    for _ in range(3):
        model(data)
    model.eval()
    out = model(data)
    assert out.shape == (3, 10)
    with torch.no_grad():
        atoms = model.node_encoder(data.x)
        assert atoms.shape == (data.num_nodes, 24 - 6)
        h = torch.cat([atoms, model.pe_encoder(model.pe_norm(data.random_walk_pe))], -1)
        e = model.edge_encoder(data.edge_attr)
        for layer in model.layers:
            conv = layer.conv
            src, dst = data.edge_index
            m = (conv.lin(h)[src] + e).relu()
            agg = torch.zeros_like(h).index_add_(0, dst, m) + conv.bias
            h = layer.norm(agg).relu()  # dropout is the identity in evaluation
        pooled = global_mean_pool(h, data.batch)
        torch.testing.assert_close(out, model.head(pooled), rtol=1e-5, atol=1e-6)
    assert [type(m).__name__ for m in model.head] == ["Linear", "BatchNorm1d", "Dropout", "ReLU",
                                                      "Linear", "BatchNorm1d", "Dropout", "ReLU",
                                                      "Linear"]


def test_the_peptides_recipe_is_within_the_budget():
    # 3 × 275, RWSE-32 → 28, bond features, 4-layer head: the authors report ~507k parameters
    model = GCNPlus(hidden_channels=275, out_channels=10, num_layers=3, pe="random_walk", pe_dim=32,
                    pe_channels=28, head_layers=4)
    count = sum(p.numel() for p in model.parameters())
    assert count == 509_001 and count < 510_000


def test_residual_and_no_edge_features():
    data = _molecules()
    model = _model(residual=True, edge_encoder=None).eval()
    assert all(layer.residual for layer in model.layers) and model.edge_encoder is None
    assert model(data).shape == (3, 10)


def test_node_task_on_raw_features():
    g = torch.Generator().manual_seed(1)
    data = Data(x=torch.randn(7, 5, generator=g), edge_index=torch.randint(0, 7, (2, 20), generator=g))
    model = GCNPlus(hidden_channels=16, out_channels=3, node_encoder=None, edge_encoder=None,
                    task="node", head_layers=1).eval()
    assert model(data).shape == (7, 3)


def test_deterministic_under_a_seed_in_training():
    data = _molecules()

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(0)
        model = _model(dropout=0.5).train()
        torch.manual_seed(seed)
        return model(data)

    torch.testing.assert_close(run(3), run(3), rtol=0, atol=0)
    assert not torch.equal(run(3), run(4))  # dropout draws differ


def test_signals_are_empty():
    out, signals = _model().eval()(_molecules(), return_signals=True)
    assert out.shape == (3, 10) and len(signals) == 0 and signals.aux_loss is None


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"'gcnplus' model .* does not use 'producer'"):
        create_model("gcnplus", hidden_channels=24, out_channels=10, producer="sbm")
    with pytest.raises(ValueError, match="does not use 'heads'"):
        create_model("gcnplus", hidden_channels=24, out_channels=10, heads=8)
    with pytest.raises(TypeError, match="'heads'"):
        _model(heads=8)
    with pytest.raises(TypeError, match="unexpected"):
        _model(colour="red")
    with pytest.raises(ValueError, match=r"'pe_channels' .* must be below 'hidden_channels'"):
        _model(pe_channels=24)
    with pytest.raises(ValueError, match="needs a 'node_encoder'"):
        _model(node_encoder=None)
    with pytest.raises(ValueError, match="'pe' must be"):
        _model(pe="position")
    with pytest.raises(ValueError, match="'head_layers' must be >= 1"):
        _model(head_layers=0)
    with pytest.raises(ValueError, match="'pool'"):
        _model(pool="cls")
    with pytest.raises(ValueError, match="'task'"):
        _model(task="edge")


def test_bad_data_is_named():
    model = _model().eval()
    data = _molecules()
    with pytest.raises(ValueError, match="random_walk_pe"):
        model(Data(x=data.x, edge_index=data.edge_index, edge_attr=data.edge_attr))
    bad = data.clone()
    bad.random_walk_pe = bad.random_walk_pe.clone()
    bad.random_walk_pe[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model(bad)
    with pytest.raises(ValueError, match=r"data\.x and data\.edge_index"):
        model(Data(x=data.x))


def test_float_features_of_another_dtype_are_named():
    g = torch.Generator().manual_seed(1)
    data = Data(x=torch.randn(7, 5, generator=g, dtype=torch.float64),
                edge_index=torch.randint(0, 7, (2, 20), generator=g))
    for encoder in ("linear", None):
        model = GCNPlus(hidden_channels=16, out_channels=3, node_encoder=encoder,
                        edge_encoder=None, task="node", head_layers=1).eval()
        with pytest.raises(ValueError, match=r"'data\.x' has dtype torch\.float64"):
            model(data)


def test_runs_through_the_runner(mirror, tmp_path):
    res = run_experiment({"task": "peptides-func", "model": "gcnplus", "epochs": 2, "hidden": 32,
                          "layers": 2, "norm": "batch_norm", "residual": False, "head_layers": 2,
                          "pe": "random_walk", "pe_dim": 8, "model_kwargs": {"pe_channels": 4},
                          "batch_size": 4, "task_kwargs": {"limit": 8}, "progress": False,
                          "out": str(tmp_path / "run")})
    r = res["results"][0]
    assert res["summary"]["model"] == "gcnplus" and r["epochs_run"] == 2
    assert 0.0 <= r["test"] <= 1.0


def test_trains_and_evaluates_on_device(device):
    torch.manual_seed(0)
    check_on_device(_model(), _molecules(), device)


def check_on_device(model: torch.nn.Module, data: Batch, device: str) -> None:
    """``model`` moved to ``device`` evaluates ``data`` as on the CPU (1e-4) and trains there:
    every parameter gets a finite gradient on the device."""
    model.eval()
    with torch.no_grad():
        expected = model(data)
    model.to(device)
    data = data.to(device)
    with torch.no_grad():
        out = model(data)
    assert out.device.type == device
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)
    model.train()
    model(data).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.device.type == device and torch.isfinite(g).all() for g in grads)
