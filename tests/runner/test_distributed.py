"""Data-parallel training under torchrun (gloo, CPU): the global batch split across ranks, the
1- vs 2-process equivalence, kill-and-resume, and the errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler

from graphattn.runner import distributed as D
from graphattn.runner.config import resolve_config
from graphattn.runner.tasks import build_task
from graphattn.runner.trainer import Trainer

# a linear head: a batch norm in the head normalises over each process's share of the batch (as
# DistributedDataParallel does without SyncBatchNorm), so only a batch-independent model gives the
# one-process numbers
TINY = ["--task", "mutag", "--layers", "2", "--hidden", "16", "--heads", "2", "--batch-size", "32",
        "--head-layers", "1", "--seeds", "0", "--no-progress", "--threads", "1"]


@pytest.mark.parametrize("n,batch,world", [(150, 32, 2), (150, 32, 3), (100, 10, 4), (33, 8, 3),
                                           (9, 4, 2)])
def test_rank_shards_make_up_the_single_process_batches(n, batch, world):
    data = list(range(n))
    single = list(BatchSampler(RandomSampler(data, generator=torch.Generator().manual_seed(5)),
                               batch, drop_last=False))
    shards = []
    for rank in range(world):
        w = D.World(rank=rank, local_rank=rank, size=world)
        sampler = D.RankShardSampler(data, batch, torch.Generator().manual_seed(5), w)
        shards.append(list(sampler))
        assert len(shards[-1]) == len(sampler)
    kept = [b for b in single if len(b) >= world]
    assert all(len(s) == len(kept) for s in shards)
    for k, global_batch in enumerate(kept):
        parts = [shards[r][k] for r in range(world)]
        assert [i for part in parts for i in part] == global_batch  # contiguous, in rank order
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    dropped = sum(len(b) for b in single) - sum(len(b) for b in kept)
    assert D.RankShardSampler(data, batch, torch.Generator(), D.World(0, 0, world)).dropped == dropped


def test_loss_weights_turn_the_mean_of_rank_gradients_into_the_global_gradient():
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    x, y = torch.randn(11, 3, dtype=torch.float64), torch.randn(11, dtype=torch.float64)

    def grad(idx, scale=1.0):
        g, = torch.autograd.grad(scale * ((x[idx] @ w - y[idx]) ** 2).mean(), w)
        return g

    idx = list(range(11))
    for world in (2, 3, 4):
        parts = [D.shard(idx, 11, D.World(r, r, world)) for r in range(world)]
        averaged = sum(grad(p, D.loss_weight(len(p), 11, D.World(r, r, world)))
                       for r, p in enumerate(parts)) / world
        torch.testing.assert_close(averaged, grad(idx), rtol=1e-12, atol=1e-12)


def test_single_process_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert D.world_from_env() is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert D.setup("cpu") == (None, "cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(RuntimeError, match="RANK"):
        D.world_from_env()


def test_node_tasks_are_refused_in_a_distributed_run(mirror):
    cfg = resolve_config({"task": "cora", "epochs": 1})
    with pytest.raises(ValueError, match="graph-level tasks"):
        Trainer(cfg, build_task("cora"), 0, None, world=D.World(0, 0, 2))


def test_teardown_meets_every_rank_only_after_a_normal_end(monkeypatch, tmp_path):
    """A run that ended normally collects the garbage and waits at a barrier before destroying the
    group; after an error the group is destroyed without the barrier (a dead rank would hang it)."""
    import torch.distributed as dist

    events = []
    monkeypatch.setattr(D.gc, "collect", lambda: events.append("collect"))
    monkeypatch.setattr(D.dist, "barrier", lambda *a, **k: events.append("barrier"))
    for synchronize in (True, False):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / str(synchronize)}",
                                rank=0, world_size=1)
        D.teardown(D.World(0, 0, 1), synchronize=synchronize)
        assert not dist.is_initialized()
        events.append("destroyed")
    assert events == ["collect", "barrier", "destroyed", "destroyed"]
    D.teardown(None)  # a single-process run has no group


def _torchrun(args: list[str], nproc: int, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "graphattn", "run", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, **kw)


def _finish(p: subprocess.Popen) -> None:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err.decode()[-3000:]


def _last(run: Path) -> dict:
    return torch.load(run / "seed0" / "last.pt", weights_only=True)


def test_two_processes_train_the_single_process_model(mirror, tmp_path):
    """The same global batch and seed (no dropout, deterministic edges): 2 processes give the
    1-process run's losses, metrics and weights within float tolerance."""
    args = [*TINY, "--epochs", "3", "--dropout", "0"]
    one, two = tmp_path / "one", tmp_path / "two"
    _finish(_torchrun([*args, "--out", str(one)], 1))
    _finish(_torchrun([*args, "--out", str(two)], 2))
    a, b = _last(one), _last(two)
    assert b["world_size"] == 2 and len(b["ranks"]) == 2 and "world_size" not in a
    for ra, rb in zip(a["history"], b["history"], strict=True):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
        for key in ("val", "train_accuracy"):
            assert rb[key] == pytest.approx(ra[key], abs=1e-6), key
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=1e-3, atol=1e-3)
    res = [json.loads((d / "results.jsonl").read_text()) for d in (one, two)]
    assert res[0]["processes"] == 1 and res[1]["processes"] == 2
    assert res[1]["test"] == pytest.approx(res[0]["test"], abs=1e-6)


def test_killed_two_process_run_resumes_to_the_uninterrupted_result(mirror, tmp_path):
    """Dropout and randomly sampled edges draw from each rank's own stream; the checkpoint keeps
    every rank's state, so a run killed mid-way resumes to the uninterrupted result."""
    args = [*TINY, "--epochs", "6", "--dropout", "0.3", "--producer", "random",
            "--producer-kwargs", '{"k": 4}']
    full, killed = tmp_path / "full", tmp_path / "killed"
    _finish(_torchrun([*args, "--out", str(full)], 2))

    p = _torchrun([*args, "--out", str(killed)], 2)
    last = killed / "seed0" / "last.pt"
    deadline = time.time() + 600
    while time.time() < deadline:
        if last.exists() and torch.load(last, weights_only=True)["epoch"] >= 2:
            break
        if p.poll() is not None:
            pytest.fail(f"run ended before it could be killed: {p.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # torchrun and both workers
    p.wait()
    at = torch.load(last, weights_only=True)["epoch"]
    assert 2 <= at < 6
    assert not (killed / "results.jsonl").exists()
    _finish(_torchrun([*args, "--out", str(killed), "--resume"], 2))

    a = json.loads((full / "results.jsonl").read_text())
    b = json.loads((killed / "results.jsonl").read_text())
    for key in ("best_epoch", "epochs_run"):
        assert a[key] == b[key], key
    for key in ("val", "test"):
        assert b[key] == pytest.approx(a[key], abs=1e-6), key
    sa, sb = _last(full), _last(killed)
    for k, v in sa["model"].items():
        torch.testing.assert_close(sb["model"][k], v, rtol=1e-5, atol=1e-6)

    # a different number of processes cannot take over the ranks' random states
    cfg = resolve_config(json.loads((killed / "config.json").read_text()))
    one = Trainer(cfg, build_task("mutag"), 0, killed)
    with pytest.raises(ValueError, match=r"written by a run of 2 process\(es\), this one has 1"):
        one.resume()
