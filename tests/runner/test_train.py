"""The runner: outputs, multi-seed aggregation, model selection, resumption after SIGKILL,
auxiliary and policy-gradient losses, configuration errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from graphattn import EdgeSet
from graphattn.__main__ import main as cli_main
from graphattn.producers import EdgeProducer, register_producer
from graphattn.runner import resolve_config, restore, run_experiment
from graphattn.runner.trainer import Trainer

SMALL = {"task": "mutag", "layers": 2, "hidden": 16, "heads": 2, "epochs": 3, "batch_size": 32,
         "progress": False}


def test_run_writes_results_and_aggregates_seeds(mirror, tmp_path):
    out = tmp_path / "run"
    res = run_experiment({**SMALL, "seeds": [0, 1], "out": str(out)})
    lines = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in lines] == [0, 1]
    for r in lines:
        assert 1 <= r["best_epoch"] <= 3 and 0 <= r["test"] <= 1
        assert (out / f"seed{r['seed']}" / "best.pt").exists()
    s = res["summary"]
    tests = [r["test"] for r in lines]
    assert s["test_mean"] == pytest.approx(sum(tests) / 2)
    assert "±" in (out / "summary.md").read_text() and "±" in s["test"]
    # the selected model is the best-validation epoch's, and restore() brings it back
    model, task = restore(out, seed=1)
    ck = torch.load(out / "seed1" / "best.pt", weights_only=True)
    assert ck["best"]["val"] == lines[1]["val"]
    trainer = Trainer(resolve_config({**SMALL, "seeds": [1]}), task, 1, None)
    trainer.model.load_state_dict(model.state_dict())
    assert trainer.evaluate()["val"] == pytest.approx(lines[1]["val"])
    assert task.name == "mutag" and task.level == "graph"


def test_a_run_stopped_in_a_later_seed_keeps_the_finished_seeds_results(mirror, tmp_path,
                                                                          monkeypatch):
    """results.jsonl and summary.json (with the command) are written after every finished seed,
    so ``graphattn table`` reads a long multi-seed run that was stopped; resuming completes it."""

    class Stopped(Exception):
        pass

    real_fit = Trainer.fit

    def fit_until_seed_1(self, announce=False):
        if self.out_dir.name == "seed1":
            raise Stopped
        return real_fit(self, announce=announce)

    out = tmp_path / "run"
    cfg = {**SMALL, "epochs": 2, "seeds": [0, 1], "out": str(out)}
    monkeypatch.setattr(Trainer, "fit", fit_until_seed_1)
    with pytest.raises(Stopped):
        run_experiment(cfg, command="graphattn run --task mutag")
    monkeypatch.undo()
    lines = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in lines] == [0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0] and summary["command"] == "graphattn run --task mutag"
    assert summary["test_mean"] == pytest.approx(lines[0]["test"])
    res = run_experiment({**cfg, "resume": True}, command="graphattn run --resume")
    lines = [json.loads(s) for s in (out / "results.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in lines] == [0, 1]
    assert res["summary"]["command"] == "graphattn run --resume"
    assert json.loads((out / "summary.json").read_text())["seeds"] == [0, 1]


def test_node_task_and_cli(mirror, tmp_path, capsys):
    out = tmp_path / "cora"
    code = cli_main(["run", "--task", "cora", "--epochs", "3", "--seeds", "0", "--out", str(out),
                     "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "cora test accuracy:" in printed
    r = json.loads((out / "results.jsonl").read_text())
    assert r["task"] == "cora" and r["epochs_run"] == 3


@pytest.mark.parametrize("flag,expected", [([], True), (["--no-progress"], False)])
def test_progress_setting_reaches_the_data_set_build(flag, expected, monkeypatch, tmp_path):
    """``--no-progress`` also silences the data set's build (Peptides' SMILES conversion bar)."""
    from graphattn.runner import build as build_module

    seen = {}

    class Stop(Exception):
        pass

    def fake_build_task(name, root, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(build_module, "build_task", fake_build_task)
    with pytest.raises(Stop):
        cli_main(["run", "--debug", "--task", "peptides-func", "--epochs", "1", "--out",
                  str(tmp_path / "run"), *flag])
    assert seen["progress"] is expected


def _run_cli(args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "graphattn", "run", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def test_resume_after_sigkill_matches_uninterrupted_run(mirror, tmp_path):
    args = ["--task", "mutag", "--layers", "2", "--hidden", "16", "--heads", "2", "--epochs", "12",
            "--dropout", "0.3", "--producer", "random", "--producer-kwargs", '{"k": 4}',
            "--seeds", "0", "--no-progress"]
    full = tmp_path / "full"
    assert _run_cli([*args, "--out", str(full)]).wait(timeout=600) == 0

    killed = tmp_path / "killed"
    p = _run_cli([*args, "--out", str(killed)])
    last = killed / "seed0" / "last.pt"
    deadline = time.time() + 600
    while time.time() < deadline:
        if last.exists() and torch.load(last, weights_only=True)["epoch"] >= 3:
            break
        if p.poll() is not None:
            pytest.fail(f"run ended before it could be killed: {p.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    interrupted_at = torch.load(last, weights_only=True)["epoch"]
    assert 3 <= interrupted_at < 12
    assert _run_cli([*args, "--out", str(killed), "--resume"]).wait(timeout=600) == 0

    a = json.loads((full / "results.jsonl").read_text())
    b = json.loads((killed / "results.jsonl").read_text())
    for key in ("best_epoch", "val", "test", "epochs_run"):
        assert a[key] == b[key], key
    sa = torch.load(full / "seed0" / "last.pt", weights_only=True)["model"]
    sb = torch.load(killed / "seed0" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_two_processes_training_different_seeds_into_one_folder_keep_every_seed(mirror, tmp_path):
    """Seeds run in parallel into one ``--out`` (the first process starts the run, the others
    join it with ``--resume``): each seed's ``seed<k>/result.json`` is merged under a folder lock,
    so the last process to finish does not drop the other's seeds."""
    out = tmp_path / "run"
    args = ["--task", "mutag", "--layers", "1", "--hidden", "8", "--heads", "2", "--epochs", "3",
            "--producer", "input", "--no-progress", "--threads", "1", "--out", str(out)]
    procs = [_run_cli([*args, "--seeds", "0"])]
    deadline = time.time() + 300
    while not out.is_dir() and time.time() < deadline and procs[0].poll() is None:
        time.sleep(0.05)
    procs += [_run_cli([*args, "--resume", "--seeds", str(s)]) for s in (1, 2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read().decode()[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 1, 2]
    assert json.loads((out / "summary.json").read_text())["seeds"] == [0, 1, 2]
    # config.json too: each joining process adds its seeds to those the folder holds
    assert json.loads((out / "config.json").read_text())["seeds"] == [0, 1, 2]
    for s in (0, 1, 2):
        saved = json.loads((out / f"seed{s}" / "result.json").read_text())
        assert saved["result"]["seed"] == s and saved["config"]["task"] == "mutag"
        history = json.loads((out / f"seed{s}" / "history.json").read_text())
        assert len(history) >= 1 and "loss" in history[0]
    # a committed run folder has no checkpoints: --resume keeps each finished seed's result
    for ckpt in out.glob("seed*/*.pt"):
        ckpt.unlink()
    assert _run_cli([*args, "--resume", "--seeds", "0", "1", "2"]).wait(timeout=600) == 0
    assert [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] == rows
    assert not list(out.glob("seed*/*.pt"))  # nothing was trained again
    # a finished seed of another configuration is not reused: resuming it is refused (more epochs
    # would extend it, but without its checkpoint there is nothing to continue from)
    with pytest.raises(ValueError, match=r"seed0 finished under another configuration and keeps "
                                         r"no checkpoint"):
        run_experiment({"task": "mutag", "layers": 1, "hidden": 8, "heads": 2, "epochs": 4,
                        "producer": "input", "progress": False, "threads": 1, "out": str(out),
                        "resume": True, "seeds": [0]})
    with pytest.raises(ValueError, match=r"another configuration \(it differs in \['hidden'\]\)"):
        run_experiment({"task": "mutag", "layers": 1, "hidden": 16, "heads": 2, "epochs": 3,
                        "producer": "input", "progress": False, "threads": 1, "out": str(out),
                        "resume": True, "seeds": [0]})


def test_resume_with_more_epochs_extends_a_finished_run(mirror, tmp_path):
    """``--resume --epochs N`` goes on from each seed's last checkpoint: the same result, history
    and weights as a run of N epochs from the start (a schedule that does not depend on the length,
    every epoch evaluated). Fewer epochs, or a cosine schedule, are refused with the reason."""
    base = {"task": "mutag", "layers": 1, "hidden": 8, "heads": 2, "producer": "input",
            "progress": False, "threads": 1, "seeds": [0, 1], "warmup_epochs": 1}
    straight, extended = tmp_path / "straight", tmp_path / "extended"
    run_experiment({**base, "epochs": 5, "out": str(straight)})
    run_experiment({**base, "epochs": 2, "out": str(extended)})
    run_experiment({**base, "epochs": 5, "out": str(extended), "resume": True})
    for s in (0, 1):
        a, b = (json.loads((d / f"seed{s}" / "result.json").read_text()) for d in (straight, extended))
        assert {k: v for k, v in a["result"].items() if k != "train_time_s"} == \
            {k: v for k, v in b["result"].items() if k != "train_time_s"}
        assert a["config"] == b["config"]
        ha, hb = (json.loads((d / f"seed{s}" / "history.json").read_text())
                  for d in (straight, extended))
        drop = ("time_s", "elapsed_s")
        assert [{k: v for k, v in r.items() if k not in drop} for r in ha] == \
            [{k: v for k, v in r.items() if k not in drop} for r in hb]
        wa, wb = (torch.load(d / f"seed{s}" / "last.pt", weights_only=True)["model"]
                  for d in (straight, extended))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    with pytest.raises(ValueError, match=r"--epochs 3 would cut its 5 epochs"):
        run_experiment({**base, "epochs": 3, "out": str(extended), "resume": True})
    cosine = tmp_path / "cosine"
    run_experiment({**base, "epochs": 2, "scheduler": "cosine", "out": str(cosine)})
    with pytest.raises(ValueError, match=r"a run with a cosine schedule cannot be extended"):
        run_experiment({**base, "epochs": 4, "scheduler": "cosine", "out": str(cosine),
                        "resume": True})


@register_producer("test-signals")
class _Signals(EdgeProducer):
    """Input edges with a learnable aux loss and a learnable policy over edges (for the runner)."""

    def __init__(self) -> None:
        super().__init__()
        self.logit = torch.nn.Parameter(torch.zeros(()))
        self.gate = torch.nn.Parameter(torch.ones(()))

    def produce(self, ctx):
        ei = ctx.attr("edge_index")
        lp = torch.nn.functional.logsigmoid(self.logit).expand(ei.size(1))
        return EdgeSet(ei, num_heads=ctx.num_heads, aux_loss=(self.gate - 3.0) ** 2,
                       log_prob=lp, log_prob_graph=ctx.batch[ei[1]])


def test_aux_and_policy_losses_reach_the_producer(mirror, tmp_path):
    cfg = resolve_config({**SMALL, "producer": "test-signals", "lr": 0.05, "epochs": 1})
    from graphattn.runner import build_task

    task = build_task("mutag")
    tr = Trainer(cfg, task, 0, None)
    prod = tr.model.layers[0].producer
    loss = tr.train_epoch()
    # the logged loss is the task loss alone; the optimised objective adds aux + surrogate
    assert tr.last_objective != loss
    assert float(prod.gate.detach()) > 1.0  # pulled towards 3 by the aux loss
    assert float(prod.logit.detach()) != 0.0  # moved by REINFORCE
    assert tr.baseline.value is not None


def test_pg_lr_gives_the_policy_parameters_their_own_learning_rate(mirror):
    from graphattn.runner import build_task

    task = build_task("cora")
    spec = {"name": "sac", "alpha": 1, "all_nodes": True, "warm_start": 1, "shared": True,
            "max_distance": 1}
    cfg = resolve_config({"task": "cora", "conv": "none", "producer": spec, "epochs": 1,
                          "hidden": 16, "heads": 2, "lr": 0.01, "pg_lr": 0.001})
    tr = Trainer(cfg, task, 0, None)
    groups = tr.optimizer.param_groups
    (sac,) = {id(m): m for m in tr.model.modules() if type(m).__name__ == "SAC"}.values()
    assert [g["lr"] for g in groups] == [0.01, 0.001]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in sac.policy_parameters()}
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(tr.model.parameters()))
    # without it: one group, as before the option existed
    tr = Trainer({**cfg, "pg_lr": None}, task, 0, None)
    assert len(tr.optimizer.param_groups) == 1
    with pytest.raises(ValueError, match=r"'pg_lr'.*has none"):
        Trainer({**cfg, "producer": "input", "pg_lr": 0.001}, task, 0, None)


def test_config_errors():
    with pytest.raises(ValueError, match="unknown config key"):
        resolve_config({"epoch": 3})
    with pytest.raises(ValueError, match="epochs"):
        resolve_config({"epochs": 0})
    with pytest.raises(ValueError, match="unknown task"):
        run_experiment({"task": "imagenet", "progress": False})


def test_config_file(tmp_path):
    f = tmp_path / "exp.toml"
    f.write_text('task = "mutag"\nepochs = 2\n[producer]\nname = "knn"\nk = 3\n')
    from graphattn.runner.config import load_config_file

    cfg = resolve_config(load_config_file(f))
    assert cfg["epochs"] == 2 and cfg["producer"] == {"name": "knn", "k": 3}
    assert Path(f).exists()


class _Payload:
    """An object whose unpickling would create a file: a checkpoint must never run it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_malicious_checkpoint_runs_no_code(mirror, tmp_path):
    from graphattn.runner.checkpoint import load_checkpoint

    out = tmp_path / "run"
    run_experiment({**SMALL, "epochs": 1, "seeds": [0], "out": str(out)})
    last = out / "seed0" / "last.pt"
    ck = load_checkpoint(last)  # the runner's own checkpoints hold only safe types
    marker = tmp_path / "pwned"
    ck["history"].append(_Payload(marker))
    torch.save(ck, last)
    torch.save({**ck, "extra": _Payload(marker)}, out / "seed0" / "best.pt")
    (out / "seed0" / "result.json").unlink()  # else --resume keeps the finished seed's result
    with pytest.raises(ValueError, match="never need code to load"):
        run_experiment({**SMALL, "epochs": 1, "seeds": [0], "out": str(out), "resume": True})
    with pytest.raises(ValueError, match="never need code to load"):
        restore(out, seed=0)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_a_damaged_checkpoint_names_the_file(mirror, tmp_path, damage):
    from graphattn.runner.checkpoint import load_checkpoint

    out = tmp_path / "run"
    run_experiment({**SMALL, "epochs": 1, "seeds": [0], "out": str(out)})
    last = out / "seed0" / "last.pt"
    data = last.read_bytes()
    rng = random.Random(0)
    # random bytes: 200 draws, some starting like a pickle (protocol 2 header), which drive the
    # unpickler into arbitrary states (IndexError, KeyError, ... inside torch.load)
    variants = {"truncated": [data[: len(data) // 2]], "empty": [b""],
                "random": [(b"\x80\x02" if i % 2 else b"") + rng.randbytes(rng.randint(1, 4096))
                           for i in range(200)]}[damage]
    for blob in variants:
        last.write_bytes(blob)
        with pytest.raises(ValueError, match=str(last)):
            load_checkpoint(last)


def test_resume_removes_the_temporary_checkpoint_a_killed_run_left(mirror, tmp_path, monkeypatch):
    """A run SIGKILLed while writing ``last.pt`` leaves ``.last.pt.<random>.tmp``; the resumed run's
    next checkpoint write removes it."""

    class Killed(Exception):
        pass

    real_save = Trainer.save

    def save_then_die(self, name):
        real_save(self, name)
        if name == "last.pt":
            raise Killed

    out = tmp_path / "run"
    monkeypatch.setattr(Trainer, "save", save_then_die)
    with pytest.raises(Killed):
        run_experiment({**SMALL, "epochs": 2, "seeds": [0], "out": str(out)})
    monkeypatch.undo()
    seed_dir = out / "seed0"
    assert torch.load(seed_dir / "last.pt", weights_only=True)["epoch"] == 1
    stale = seed_dir / ".last.pt.k1ll3d_0.tmp"
    stale.write_bytes((seed_dir / "last.pt").read_bytes()[:100])
    old = time.time() - 7200
    os.utime(stale, (old, old))
    run_experiment({**SMALL, "epochs": 2, "seeds": [0], "out": str(out), "resume": True})
    assert not stale.exists()
    assert not list(seed_dir.glob(".*.tmp"))
    assert torch.load(seed_dir / "last.pt", weights_only=True)["epoch"] == 2


def test_consistency_samples_add_the_consistency_loss(mirror):
    """S passes per step: the objective is the mean task loss plus λ × the consistency loss of
    the passes (recomputed here from the same random draws)."""
    from graphattn.consistency import consistency_loss
    from graphattn.runner import build_task
    from graphattn.runner.metrics import task_loss

    task = build_task("cora")
    cfg = resolve_config({"task": "cora", "model": "grand", "hidden": 8, "input_dropout": 0.0,
                          "consistency_samples": 3, "consistency_weight": 0.7,
                          "consistency_temperature": 0.4, "progress": False})
    tr = Trainer(cfg, task, 0, None)
    g, mask = task.graph, task.graph.train_mask
    tr.model.train()
    state = torch.get_rng_state()
    loss, task_value, out = tr._step_loss(g, mask)
    torch.set_rng_state(state)
    outs = [tr.model(g) for _ in range(3)]
    torch.testing.assert_close(out, outs[0])
    tasks = torch.stack([task_loss(task, o[mask], g.y[mask]) for o in outs]).mean()
    torch.testing.assert_close(task_value, tasks.detach())
    torch.testing.assert_close(loss, tasks + 0.7 * consistency_loss(outs, 0.4, "ce"))
    epoch_loss = tr.train_epoch()  # a whole step: the objective adds the (positive) term
    assert tr.last_objective > epoch_loss


def test_consistency_refuses_regression_tasks():
    from graphattn.runner.tasks import Task

    cfg = resolve_config({"task": "cora", "consistency_samples": 2, "progress": False})
    task = Task(name="reg", level="graph", modality="graph", loss="l1", metric="mae",
                out_channels=1, splits={})
    with pytest.raises(ValueError, match="consistency-samples"):
        Trainer(cfg, task, 0, None)


def test_select_loss_keeps_the_lowest_validation_loss(mirror, tmp_path):
    out = tmp_path / "sel"
    run_experiment({"task": "cora", "model": "gcn", "hidden": 8, "epochs": 6, "select": "loss",
                    "seeds": [0], "out": str(out), "progress": False})
    ck = torch.load(out / "seed0" / "last.pt", weights_only=True)
    evaluated = [r for r in ck["history"] if "val_loss" in r]
    best = min(evaluated, key=lambda r: r["val_loss"])
    assert ck["best"]["epoch"] == best["epoch"] and ck["best"]["val"] == best["val"]
    with pytest.raises(ValueError, match="'select'"):
        resolve_config({"select": "accuracy"})


@register_producer("_warm_probe")
class _WarmProbe(EdgeProducer):
    """The input edges; "in its warm start" for the first ``warm`` training forward passes."""

    def __init__(self, warm: int = 2) -> None:
        super().__init__()
        self.warm = warm
        self.calls = 0

    def in_warm_start(self) -> bool:
        return self.calls < self.warm

    def produce(self, ctx):
        if ctx.training:
            self.calls += 1
        return EdgeSet(ctx.data.edge_index, num_heads=ctx.num_heads)


def test_no_epoch_is_selected_in_a_warm_start(mirror, tmp_path):
    """Evaluations while a producer is in its warm start (its edges are not its own) are recorded
    with ``warm_start`` but never selected, and patience counts only after it; a run that never
    leaves the warm start says so."""
    cfg = {"task": "cora", "epochs": 5, "seeds": [0], "progress": False, "patience": 1,
           "producer": {"name": "_warm_probe", "warm": 3}, "conv": "none"}
    res = run_experiment({**cfg, "out": str(tmp_path / "a")})
    (r,) = res["results"]
    history = torch.load(tmp_path / "a" / "seed0" / "last.pt", weights_only=False)["history"]
    flags = [row.get("warm_start", False) for row in history]
    warm = flags.count(True)
    assert warm >= 2 and flags[:warm] == [True] * warm  # the warm evaluations come first
    assert r["best_epoch"] > warm and r["epochs_run"] >= warm + 1
    with pytest.raises(RuntimeError, match="fell in a producer's warm start"):
        run_experiment({**cfg, "epochs": 2, "out": str(tmp_path / "b")})


def test_a_busy_machine_is_noted_once_when_threads_are_not_set(monkeypatch, capsys):
    from graphattn.runner import train as train_module

    monkeypatch.setattr(train_module.sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(train_module.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(train_module.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(train_module.os, "getloadavg", lambda: (1.9, 1.0, 1.0))
    train_module._note_busy_machine()
    assert "--threads 1 may train faster" in capsys.readouterr().err
    monkeypatch.setattr(train_module.os, "getloadavg", lambda: (0.2, 1.0, 1.0))
    train_module._note_busy_machine()
    assert capsys.readouterr().err == ""


def test_threads_hold_for_the_run_and_are_restored_after_it(mirror, monkeypatch):
    """``threads`` sets torch's intra-op threads for the run only: the caller's count is back
    afterwards (a test or notebook that ran ``threads=1`` once is not left on one thread)."""
    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    seen: list[int] = []
    set_threads = torch.set_num_threads

    def spy(n: int) -> None:
        seen.append(n)
        set_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", spy)
    run_experiment({**SMALL, "seeds": [0], "epochs": 1, "threads": target})
    assert seen == [target, before]
    assert torch.get_num_threads() == before
