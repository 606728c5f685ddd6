"""The runner on CUDA (marked ``cuda``): shipped configs, shrunk as in ``test_configs.py`` (a dozen
samples, a couple of epochs), trained with ``device="cuda"``. The run finishes with finite metrics,
its checkpoint holds the device's tensors, and resuming the finished run on the device (its RNG
states, the CUDA generator's included, restored from a checkpoint mapped to the device) changes
nothing. ``restore`` brings a trained model back on the device (on the CPU too).

The ListOps configs generate their data in the project; the citation ones need the data mirror
(``mirror`` fixture: skipped without one). Every config also runs on the CPU in ``test_configs.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Batch

from graphattn.runner import restore, run_experiment
from graphattn.runner.config import load_config_file
from tests.helpers import CUDA_MARKS, DEVICES
from tests.runner.test_configs import tiny

CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "configs"
#: config -> whether it needs the data mirror
RUNS = {
    "listops": False,
    "samsa_listops": False,
    "sbm_listops": False,
    "converter_listops": False,
    "sliceformer_listops": False,
    "cora": True,
    "sac_cora": True,
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_shipped_config_runs_on_device(name, device, tmp_path, request):
    if RUNS[name]:
        request.getfixturevalue("mirror")
    out = tmp_path / "run"
    cfg = tiny(load_config_file(CONFIG_DIR / f"{name}.toml"), out)
    if cfg["task"] == "listops":  # two epochs (the warm-up, when there is one, and one after it)
        cfg["epochs"] = 2
    cfg["device"] = device
    (r,) = run_experiment(cfg)["results"]
    assert r["epochs_run"] == cfg["epochs"] and r["stopped"] is None
    assert math.isfinite(r["val"]) and math.isfinite(r["test"])

    # the checkpoints were written from the device
    ck = torch.load(out / "seed0" / "last.pt", weights_only=True, map_location=None)
    assert ck["model"] and all(t.device.type == device for t in ck["model"].values())
    # resuming the finished run (states mapped to the device) runs nothing and changes nothing
    (again,) = run_experiment({**cfg, "resume": True})["results"]
    for key in ("epochs_run", "best_epoch", "val", "test"):
        assert again[key] == r[key], key


@pytest.mark.parametrize("device", DEVICES)
def test_restored_model_predicts_on_device(device, tmp_path):
    """``restore(run, device=...)`` brings the best model back on the device, where it predicts."""
    out = tmp_path / "run"
    cfg = tiny(load_config_file(CONFIG_DIR / "listops.toml"), out)
    run_experiment({**cfg, "epochs": 1, "warmup_epochs": 0, "device": device})
    model, task = restore(out, device=device)
    assert all(p.device.type == device for p in model.parameters())
    first = Batch.from_data_list([task.splits["val"][0]]).to(device)
    with torch.no_grad():
        pred = model(first)
    assert pred.device.type == device and torch.isfinite(pred).all()
