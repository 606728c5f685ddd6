"""``--loader neighbor``: node tasks trained on PyG NeighborLoader subgraphs, loss on the seed
nodes, evaluation on the full graph, reproducible under a seed, resumable, clear errors."""

from __future__ import annotations

import pytest
import torch

from graphattn.runner import resolve_config, run_experiment
from graphattn.runner.tasks import build_task
from graphattn.runner.trainer import Trainer

pytest.importorskip("torch_sparse")  # PyG's NeighborLoader samples with torch-sparse or pyg-lib

NEIGHBOR = {"task": "cora", "loader": "neighbor", "batch_size": 32, "num_neighbors": [5, 5],
            "epochs": 2, "progress": False}


def test_batches_are_sampled_subgraphs_with_the_loss_on_their_seed_nodes(mirror, monkeypatch):
    task = build_task("cora")
    tr = Trainer(resolve_config(NEIGHBOR), task, 0, None)
    n_train = int(task.graph.train_mask.sum())
    assert tr.steps_per_epoch() == -(-n_train // 32)
    seen_masks, seen_nodes = [], []
    step = tr.train_step

    def spy(batch, mask=None, weight=1.0):
        assert batch.num_nodes < task.graph.num_nodes  # a subgraph, not the whole graph
        assert int(mask.sum()) == batch.batch_size and bool(mask[:batch.batch_size].all())
        assert bool(task.graph.train_mask[batch.n_id[:batch.batch_size]].all())
        seen_masks.append(int(mask.sum()))
        seen_nodes.append(batch.n_id[:batch.batch_size])
        return step(batch, mask, weight)

    monkeypatch.setattr(tr, "train_step", spy)
    tr.train_epoch()
    assert len(seen_masks) == tr.steps_per_epoch() and sum(seen_masks) == n_train
    # every training node is a seed exactly once per epoch
    assert torch.cat(seen_nodes).sort().values.tolist() == \
        task.graph.train_mask.nonzero().view(-1).tolist()
    full = tr.evaluate()  # the full graph
    assert set(full) == {"val", "test", "val_loss"}  # the loss for --select loss


def test_neighbor_runs_are_reproducible_and_resume(mirror, tmp_path):
    a = run_experiment({**NEIGHBOR, "epochs": 3, "out": str(tmp_path / "a")})
    b = run_experiment({**NEIGHBOR, "epochs": 3, "out": str(tmp_path / "b")})
    assert a["results"][0]["val"] == b["results"][0]["val"]
    sa = torch.load(tmp_path / "a" / "seed0" / "last.pt", weights_only=True)["model"]
    sb = torch.load(tmp_path / "b" / "seed0" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # stopped after 2 of 3 epochs (as a kill would: last.pt is written after every epoch), then
    # resumed: the same model as 3 straight epochs (the sampler's stream is in the checkpoint)
    calls = {"n": 0}
    epoch = Trainer.train_epoch

    class Killed(Exception):
        pass

    def stop_in_third(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Killed
        return epoch(self, *args, **kwargs)

    out = tmp_path / "c"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "train_epoch", stop_in_third)
        with pytest.raises(Killed):
            run_experiment({**NEIGHBOR, "epochs": 3, "out": str(out)})
    assert torch.load(out / "seed0" / "last.pt", weights_only=True)["epoch"] == 2
    c = run_experiment({**NEIGHBOR, "epochs": 3, "out": str(out), "resume": True})
    sc = torch.load(out / "seed0" / "last.pt", weights_only=True)
    assert sc["epoch"] == 3 and c["results"][0]["val"] == a["results"][0]["val"]
    assert all(torch.equal(sa[k], sc["model"][k]) for k in sa)


def test_neighbor_loader_errors(mirror, monkeypatch):
    with pytest.raises(ValueError, match="node tasks"):
        Trainer(resolve_config({**NEIGHBOR, "task": "mutag"}), build_task("mutag"), 0, None)
    with pytest.raises(ValueError, match="num_neighbors"):
        resolve_config({**NEIGHBOR, "num_neighbors": [0]})
    with pytest.raises(ValueError, match="loader"):
        resolve_config({**NEIGHBOR, "loader": "cluster"})
    import torch_geometric.typing as pyg_typing

    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    tr = Trainer(resolve_config(NEIGHBOR), build_task("cora"), 0, None)
    with pytest.raises(ImportError, match="torch-sparse"):
        tr.train_epoch()
