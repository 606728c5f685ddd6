"""UCR/UEA time series bundled with sktime: the data set (offline), the ``ucr`` task and a tiny
training run through the runner."""

from __future__ import annotations

import socket

import pytest
import torch
from torch_geometric.data import Batch

import graphattn.data.ucr as ucr_module


def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test (the data must come from sktime's wheel)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_missing_sktime_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setattr(ucr_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install sktime"):
        ucr_module.UCRDataset("GunPoint", tmp_path)


def test_gunpoint_official_split(tmp_path, monkeypatch):
    pytest.importorskip("sktime")
    _no_network(monkeypatch)
    train = ucr_module.UCRDataset("gunpoint", tmp_path, "train")  # case-insensitive
    test = ucr_module.UCRDataset("GunPoint", tmp_path, "test")
    assert (len(train), len(test)) == (50, 150)
    assert train.classes == test.classes == ["1", "2"] and train.num_classes == 2
    assert torch.bincount(train.labels).tolist() == [24, 26]
    assert torch.bincount(test.labels).tolist() == [76, 74]
    g = train[0]
    assert tuple(g.x.shape) == (150, 1) and g.x.dtype == torch.float32 and g.y.shape == (1,)
    assert (train.lengths() == 150).all() and train.num_channels == 1
    again = ucr_module.UCRDataset("GunPoint", tmp_path, "train")  # from the cache
    assert torch.equal(again.values, train.values)


@pytest.mark.parametrize("name,channels,sizes,lengths", [
    ("BasicMotions", 6, (40, 40), (100, 100)),
    ("JapaneseVowels", 12, (270, 370), (7, 26)),  # unequal lengths (train)
])
def test_multivariate_problems(tmp_path, monkeypatch, name, channels, sizes, lengths):
    pytest.importorskip("sktime")
    _no_network(monkeypatch)
    graph = ucr_module.SequenceToGraph(patch_size=4, cls=True)
    train = ucr_module.UCRDataset(name, tmp_path, "train", graph=graph)
    test = ucr_module.UCRDataset(name, tmp_path, "test")
    assert (len(train), len(test)) == sizes and train.num_channels == channels
    assert (int(train.lengths().min()), int(train.lengths().max())) == lengths
    L = int(train.lengths()[0])
    g = train[0]
    assert tuple(g.x.shape) == (1 + -(-L // 4), 1 + 4 * channels + 1)
    Batch.from_data_list([train[i] for i in range(5)])  # lengths differ, features do not


def test_unknown_problem_is_refused_without_download(tmp_path, monkeypatch):
    pytest.importorskip("sktime")
    _no_network(monkeypatch)
    assert {"GunPoint", "ArrowHead", "BasicMotions"} <= set(ucr_module.bundled_datasets())
    with pytest.raises(ValueError, match=r"'dataset' must be .*GunPoint"):
        ucr_module.UCRDataset("Coffee", tmp_path)
    with pytest.raises(ValueError, match="'split'"):
        ucr_module.UCRDataset("GunPoint", tmp_path, "val")


def test_ucr_task(tmp_path):
    pytest.importorskip("sktime")
    from graphattn.runner.tasks import build_task, task_options

    assert {"dataset", "patch_size", "cls", "normalize", "val_fraction"} <= set(task_options("ucr"))
    task = build_task("ucr", tmp_path, patch_size=10, cls=True)
    assert (len(task.splits["train"]), len(task.splits["val"]), len(task.splits["test"])) == (40, 10, 150)
    val_y = torch.cat([d.y for d in task.splits["val"]])
    assert torch.bincount(val_y).tolist() == [5, 5]  # stratified
    assert task.out_channels == 2 and task.model_defaults["pool"] == "cls"
    assert task.splits["train"][0].x.shape == (16, 12)  # CLS + 15 patches; 1 + 10 + 1 features
    with pytest.raises(ValueError, match="'val_fraction'"):
        build_task("ucr", tmp_path, val_fraction=1.0)


def test_tiny_ucr_run_end_to_end(tmp_path):
    pytest.importorskip("sktime")
    from graphattn.runner.train import run_experiment

    res = run_experiment({
        "task": "ucr", "task_kwargs": {"dataset": "ItalyPowerDemand", "limit": 12, "patch_size": 4},
        "conv": "none", "producer": "full", "layers": 1, "hidden": 8, "heads": 2, "epochs": 2,
        "batch_size": 4, "seeds": [0], "progress": False, "data_root": str(tmp_path),
        "out": str(tmp_path / "run")})
    test = res["results"][0]["test"]
    assert 0.0 <= test <= 1.0
    assert (tmp_path / "run" / "summary.json").is_file()
