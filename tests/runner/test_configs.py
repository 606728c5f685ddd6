"""Every shipped config (``examples/configs/*.toml``) trains on tiny data past all its phase
changes: the producer's warm start (SAC's input edges, then predicted edges), the learning-rate
warm-up and the schedule after it. Phase lengths are shrunk (warm start 2 steps, warm-up 1 epoch)
so that the run stays short while still crossing every boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphattn.runner.config import load_config_file, resolve_config
from graphattn.runner.train import run_experiment

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "examples" / "configs").glob("*.toml"))
#: samples per split (graph tasks) / nodes per mask (node tasks: limit // 3 each)
LIMIT = 12


def tiny(cfg: dict, out: Path) -> dict:
    """``cfg`` on tiny data with shortened phases; everything else as shipped."""
    cfg = dict(cfg)
    cfg["task_kwargs"] = {**cfg.get("task_kwargs", {}), "limit": LIMIT}
    if cfg["task"] == "listops":  # shorter sequences; the generator is the same
        cfg["task_kwargs"].update(num_train=LIMIT, num_val=LIMIT, num_test=LIMIT, min_length=16,
                                  max_length=48)
    if cfg["task"] == "fashion-mnist":
        cfg["task_kwargs"].update(num_train=LIMIT, num_val=LIMIT)
    producer = cfg.get("producer")
    if isinstance(producer, dict) and producer.get("warm_start"):
        cfg["producer"] = {**producer, "warm_start": 2}
    resolved = resolve_config(cfg)
    warm = 1 if resolved["warmup_epochs"] else 0
    cfg.update(warmup_epochs=warm, epochs=max(4, warm + 3), batch_size=min(resolved["batch_size"], 4),
               seeds=[0], out=str(out), progress=False, time_budget=None, patience=None)
    return cfg


def test_every_config_is_covered():
    names = {p.stem for p in CONFIGS}
    assert {"cora", "listops", "peptides_func", "sac_cora", "sbm_cora", "converter_listops",
            "samsa_listops", "sliceformer_fashion_mnist"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_runs_past_every_phase(path, mirror, tmp_path):
    shipped = load_config_file(path)
    assert "time_budget" not in shipped, "shipped configs train a fixed number of epochs"
    cfg = tiny(shipped, tmp_path / "run")
    res = run_experiment(cfg)
    (r,) = res["results"]
    assert r["epochs_run"] == cfg["epochs"]
    assert r["stopped"] is None
    assert r["val"] == r["val"] and r["test"] == r["test"]  # not NaN
    if isinstance(shipped.get("producer"), dict) and shipped["producer"].get("warm_start"):
        # the last forward pass used the predicted edges, not the warm-start input edges
        stats = [s for s in r["edge_stats"] if s is not None]
        assert stats and all(not s.get("warm_start") for s in stats), stats
        # the selected epoch is one of the producer's own edges, never a warm-start evaluation
        import torch

        history = torch.load(tmp_path / "run" / "seed0" / "last.pt", map_location="cpu",
                             weights_only=False)["history"]
        warm = [row["epoch"] for row in history if row.get("warm_start")]
        assert warm and r["best_epoch"] > max(warm), (warm, r["best_epoch"])
    assert (tmp_path / "run" / "seed0" / "best.pt").exists()
