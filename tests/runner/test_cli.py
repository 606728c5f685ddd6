"""The command line: a fast ``--help`` that documents every option, one-line errors, run folders
that are never silently overwritten, the summary naming the producer actually used, time budgets
checked per step and a warning for runs far beyond their budget."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from graphattn.__main__ import build_parser, main
from graphattn.runner.choices import CONV_NAMES, MODEL_NAMES, PRODUCER_NAMES, TASK_NAMES
from graphattn.runner.config import default_out, resolve_config

TINY = ["--task", "mutag", "--layers", "1", "--hidden", "8", "--heads", "2", "--epochs", "2",
        "--seeds", "0", "--no-progress"]


def _imports_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["viz", "--help"]])
def test_help_imports_neither_torch_nor_pyg(argv):
    """``graphattn --help`` and ``graphattn run --help`` stay fast: no torch, no PyG."""
    code = ("import contextlib, io\nfrom graphattn.__main__ import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass")
    mods = _imports_after(code)
    assert "torch" not in mods and "torch_geometric" not in mods


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield action


def test_every_option_has_help_text():
    missing = [a.option_strings or a.dest for a in _actions(build_parser()) if not (a.help or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_run_help_lists_producers_tasks_and_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in (*PRODUCER_NAMES, *TASK_NAMES, *MODEL_NAMES):
        assert name in text
    assert "(default: 64; tasks may set their own)" in text  # --hidden
    assert "``" not in text  # no raw reST markup


def test_static_name_lists_match_the_registries():
    from graphattn.nn.blocks import CONVS
    from graphattn.nn.registry import MODELS
    from graphattn.producers.registry import PRODUCERS
    from graphattn.runner.tasks import TASKS

    builtin = {n for n, cls in PRODUCERS.items() if cls.__module__.startswith("graphattn.")}
    assert set(PRODUCER_NAMES) == builtin
    assert set(MODEL_NAMES) == {n for n, cls in MODELS.items() if cls.__module__.startswith("graphattn.")}
    assert tuple(TASK_NAMES) == tuple(TASKS)
    assert tuple(CONV_NAMES) == tuple(CONVS)


@pytest.mark.parametrize("argv,expected", [
    (["--config", "no/such/file.toml"], "config file no/such/file.toml does not exist"),
    (["--config", "exp.yaml"], "config file must be .toml or .json"),
    (["--task", "imagenet"], "unknown task 'imagenet'"),
    (["--producer", "nope"], "unknown producer 'nope'"),
])
def test_errors_are_one_line_without_traceback(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *TINY[:2], "--epochs", "1", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert err.startswith("graphattn run: error: ") and len(err.strip().splitlines()) == 1


def test_bad_toml_names_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = = 3\n")
    assert main(["run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not valid TOML" in err and "Traceback" not in err


def test_missing_data_prints_the_message_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GRAPHATTN_MIRROR", str(tmp_path / "no-mirror"))
    code = main(["run", *TINY, "--data-root", str(tmp_path / "empty"), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.startswith("graphattn run: error: ")


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="unknown producer"):
        main(["--debug", "run", *TINY, "--producer", "nope", "--out", str(tmp_path / "r")])
    with pytest.raises(ValueError, match="unknown producer"):
        main(["run", "--debug", *TINY, "--producer", "nope", "--out", str(tmp_path / "r2")])


def test_default_out_names_task_and_producer():
    assert default_out(resolve_config({})) == "runs/cora-input"
    assert default_out(resolve_config({"task": "mutag", "producer": "sbm"})) == "runs/mutag-sbm"
    assert default_out(resolve_config({"task": "listops", "model": "samsa"})) == "runs/listops-samsa"
    union = {"name": "union", "producers": ["input", {"name": "expander", "degree": 3}, "virtual"]}
    assert default_out(resolve_config({"producer": union})) == "runs/cora-input+expander+virtual"


def test_show_config_prints_the_resolved_values(capsys):
    assert main(["run", "--task", "listops", "--hidden", "32", "--show-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["task"] == "listops" and cfg["hidden"] == 32 and cfg["norm_first"] is True


def test_a_used_out_is_refused_unless_overwrite_or_resume(mirror, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["run", *TINY, "--out", out]) == 0
    first = json.loads((tmp_path / "run" / "results.jsonl").read_text())
    capsys.readouterr()
    assert main(["run", *TINY, "--out", out, "--lr", "0.5"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "results.jsonl").read_text()) == first  # untouched
    assert main(["run", *TINY, "--out", out, "--resume"]) == 0  # nothing left to train: same result
    assert json.loads((tmp_path / "run" / "results.jsonl").read_text())["test"] == first["test"]
    assert main(["run", *TINY, "--out", out, "--overwrite", "--epochs", "1"]) == 0
    assert json.loads((tmp_path / "run" / "results.jsonl").read_text())["epochs_run"] == 1


def test_summary_shows_the_producer_kwargs(mirror, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--producer", "random", "--producer-kwargs", '{"k": 3}',
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["producer"] == {"name": "random", "k": 3}
    assert '{"name": "random", "k": 3}' in (out / "summary.md").read_text()


def test_history_logs_training_and_validation_not_test_every_epoch(mirror, tmp_path):
    from graphattn.runner.train import run_experiment

    res = run_experiment({"task": "mutag", "layers": 1, "hidden": 8, "heads": 2, "epochs": 4,
                          "seeds": [0], "progress": False, "out": str(tmp_path / "r")})
    import torch

    hist = torch.load(tmp_path / "r" / "seed0" / "last.pt", weights_only=True)["history"]
    assert all("train_accuracy" in row and "val" in row for row in hist)
    best = res["results"][0]["best_epoch"]
    assert hist[best - 1]["test"] == res["results"][0]["test"]
    # test is computed only for new best validation epochs
    vals = [row["val"] for row in hist]
    for i, row in enumerate(hist):
        assert ("test" in row) == (i == 0 or vals[i] > max(vals[:i]))


def test_time_budget_is_checked_after_every_step(mirror, tmp_path):
    from graphattn.runner.train import run_experiment

    res = run_experiment({"task": "mutag", "layers": 1, "hidden": 8, "heads": 2, "epochs": 50,
                          "batch_size": 4, "time_budget": 1e-9, "seeds": [0], "progress": False})
    (r,) = res["results"]
    assert r["epochs_run"] == 1 and "mid-epoch 1" in r["stopped"]


def test_far_over_budget_runs_say_so(mirror, capsys):
    from graphattn.runner.tasks import build_task
    from graphattn.runner.trainer import Trainer

    cfg = resolve_config({"task": "mutag", "layers": 1, "hidden": 8, "heads": 2, "epochs": 300,
                          "progress": False})
    trainer = Trainer(cfg, build_task("mutag"), 0, None)
    trainer._announce(epoch_s=50.0, budget=None)
    err = capsys.readouterr().err
    assert "300 epochs will take ~4 h 10 min" in err
    trainer._announce(epoch_s=50.0, budget=300.0)
    assert "stops training after ~6 epoch(s)" in capsys.readouterr().err
    trainer._announce(epoch_s=0.1, budget=None)
    assert capsys.readouterr().err == ""


def test_the_estimate_is_made_once_early_in_the_first_epoch(mirror, monkeypatch):
    from graphattn.runner.train import run_experiment
    from graphattn.runner.trainer import Trainer

    calls = []
    monkeypatch.setattr(Trainer, "_announce", lambda self, epoch_s, budget: calls.append(epoch_s))
    run_experiment({"task": "mutag", "layers": 1, "hidden": 8, "heads": 2, "epochs": 2,
                    "batch_size": 8, "seeds": [0, 1], "progress": False})
    assert len(calls) == 1 and calls[0] > 0  # first seed only, once


def test_viz_help_imports_no_torch_and_its_figures_match_the_api():
    code = ("import contextlib, io\nfrom graphattn.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['viz', '--help'])\n    except SystemExit:\n        pass")
    assert "torch" not in _imports_after(code)
    from graphattn.viz import api, cli

    assert cli.FIGURES == api.FIGURES


def test_one_line_errors_for_json_a_missing_resume_and_unfinished_table_folders(tmp_path, capsys):
    """Bad JSON is one line (not the usage), ``--resume`` on a folder with no run is an error, and
    ``graphattn table`` lists an unfinished folder instead of aborting."""
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--producer", "{bad"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid JSON" in err and "usage:" not in err
    missing = tmp_path / "no-such-run"
    assert main(["run", "--task", "mutag", "--epochs", "1", "--out", str(missing),
                     "--resume"]) == 2
    assert "holds no run to continue" in capsys.readouterr().err and not missing.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no finished run"):
        from graphattn.runner import table

        table.main(argparse.Namespace(runs=[str(tmp_path / "empty")], format="markdown", out=None))


@pytest.mark.parametrize("args, message", [
    (["--task", "nosuch"], "--task unknown task 'nosuch'; choose from cora"),
    (["--producer", '{"name": "union", "producers": ["input", "expandr"]}'],
     "--producer unknown producer 'expandr'"),
    (["--model", "gpt"], "--model unknown model 'gpt'"),
    (["--conv", "gcnn"], "--conv unknown conv 'gcnn'"),
])
def test_misspelt_names_fail_before_torch_is_imported(args, message):
    """The names are checked against the built-in lists in a fresh interpreter without importing
    torch (fast), and no run folder is claimed."""
    code = ("import sys\nfrom graphattn.__main__ import main\nrc = main(['run', *sys.argv[1:]])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(rc)\n")
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_a_model_error_from_a_task_default_names_the_option(mirror, tmp_path, capsys):
    """``--task cora --conv gine`` fails on the task's ``head_layers=0``, which the user never
    set: the error says so and names the option that changes it."""
    assert main(["run", "--task", "cora", "--conv", "gine", "--epochs", "1", "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "(head_layers=0 is the cora task's default: set --head-layers to change it)" in err
