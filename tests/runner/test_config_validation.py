"""Every bad option or config value ends in one line ``graphattn run: error: ...`` naming the
option (``--lr``) or key and file, with exit status 2, before any data is loaded or anything trained;
every valid config (defaults, task defaults, shipped configs) still resolves."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphattn.__main__ import main
from graphattn.runner.config import (
    DEFAULTS,
    SCHEMA,
    TASK_DEFAULTS,
    ConfigError,
    check_device,
    load_config_file,
    resolve_config,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.toml"))


@pytest.fixture
def no_run(monkeypatch, tmp_path):
    """Fails the test if anything gets as far as training or loading data."""
    import graphattn.runner.build as build
    import graphattn.runner.train as train

    def refuse(*args, **kwargs):
        raise AssertionError("the error must come before any data loading or training")

    monkeypatch.setattr(train, "run_experiment", refuse)
    monkeypatch.setattr(build, "build_task", refuse)
    monkeypatch.chdir(tmp_path)


def _one_line_error(capsys, argv) -> str:
    assert main(["run", *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("graphattn run: error: "), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv,expected", [
    (["--grad-clip", "-1"], "--grad-clip must be a non-negative number (0 or left out: no "
                            "clipping), got -1.0"),
    (["--task-kwargs", '{"nope": 1}'], "unknown task option(s) 'nope' for task 'cora'"),
    (["--task", "listops", "--task-kwargs", '{"num_train": 5, "max_lenght": 9}'],
     "unknown task option(s) 'max_lenght' for task 'listops' (--task-kwargs / task_kwargs); it "
     "accepts: limit, max_length, min_length, num_test, num_train, num_val, pad_to, progress, seed, "
     "window"),
    (["--task-kwargs", "[1, 2]"], "--task-kwargs must be a table/object of options"),
    (["--producer-kwargs", "3"], "--producer-kwargs must be a table/object of options"),
    (["--patience", "-1"], "--patience must be a non-negative int"),
    (["--warmup-epochs", "-2"], "--warmup-epochs must be a non-negative int, got -2"),
    (["--pe-dim", "0"], "--pe-dim must be a positive int, got 0"),
    (["--eval-every", "0"], "--eval-every must be a positive int, got 0"),
    (["--time-budget", "-1"], "--time-budget must be a positive number of minutes"),
    (["--time-budget", "0"], "--time-budget must be a positive number of minutes"),
    (["--threads", "-2"], "--threads must be a positive int"),
    (["--threads", "0"], "--threads must be a positive int"),
    (["--device", "nope"], "--device must be 'cpu', 'cuda' or 'cuda:N', got 'nope'"),
    (["--device", "cuda:x"], "--device must be 'cpu', 'cuda' or 'cuda:N'"),
    (["--lr", "0"], "--lr must be a positive number, got 0.0"),
    (["--lr", "nan"], "--lr must be a positive number, got nan"),
    (["--weight-decay", "-0.0001"], "--weight-decay must be a non-negative number"),
    (["--dropout", "1"], "--dropout must be a number in [0, 1), got 1.0"),
    (["--attn-dropout", "-0.1"], "--attn-dropout must be a number in [0, 1)"),
    (["--pg-momentum", "1.5"], "--pg-momentum must be a number in [0, 1)"),
    (["--pg-lr", "0"], "--pg-lr must be a positive number"),
    (["--aux-weight", "-1"], "--aux-weight must be a non-negative number"),
    (["--epochs", "0"], "--epochs must be a positive int, got 0"),
    (["--hidden", "-8"], "--hidden must be a positive int"),
    (["--ffn-ratio", "0"], "--ffn-ratio must be a positive int"),
    (["--head-layers", "-1"], "--head-layers must be a non-negative int"),
    (["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),  # argparse's own
    (["--task", "imagenet"], "unknown task 'imagenet'"),
])
def test_bad_options_are_one_line_errors_before_any_work(argv, expected, capsys, no_run):
    argparse_error = expected.startswith("argument ")
    err = _argparse_error(capsys, argv) if argparse_error else _one_line_error(capsys, argv)
    assert expected in err


def _argparse_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as info:
        main(["run", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("graphattn run: error: ")
    return err


def test_cuda_without_a_cuda_device_is_refused(capsys, no_run, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0"):
        err = _one_line_error(capsys, ["--device", device])
        assert f"--device is {device!r} but no CUDA device is available here" in err


def test_a_missing_cuda_index_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_device("cuda:0")
    with pytest.raises(ConfigError, match=r"'cuda:1' but this machine has 1 CUDA device\(s\)"):
        check_device("cuda:1")


def test_a_gpu_run_config_still_resolves_without_a_gpu(monkeypatch):
    """Restoring a run trained on a GPU (``graphattn viz``) resolves its saved config on any machine;
    only the command line refuses to start a run on a missing device."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_config({"device": "cuda:1"})["device"] == "cuda:1"


@pytest.mark.parametrize("text,expected", [
    ('lr = "fast"\n', "'lr' must be a positive number, got 'fast'"),
    ("epochs = true\n", "'epochs' must be a positive int, got True"),
    ("epochs = 2.5\n", "'epochs' must be a positive int, got 2.5"),
    ('hidden = "64"\n', "'hidden' must be a positive int, got '64'"),
    ("residual = 1\n", "'residual' must be true or false, got 1"),
    ("seeds = []\n", "'seeds' must be a non-empty list of int seeds, got []"),
    ('seeds = [0, "1"]\n', "'seeds' must be a non-empty list of int seeds"),
    ("seeds = true\n", "'seeds' must be a non-empty list of int seeds"),
    ("dropout = 1.0\n", "'dropout' must be a number in [0, 1), got 1.0"),
    ("grad_clip = -1.0\n", "'grad_clip' must be a non-negative number"),
    ("patience = -5\n", "'patience' must be a non-negative int"),
    ('device = "gpu"\n', "'device' must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ("task_kwargs = 3\n", "'task_kwargs' must be a table/object of options"),
    ("task = 3\n", "'task' must be a task name"),
    ('optimizer = "sgd"\n', "'optimizer' must be 'adam' or 'adamw', got 'sgd'"),
    ("[task_kwargs]\nnum_trian = 5\n", "unknown task option(s) 'num_trian' for task 'cora'"),
    ("foo = 1\n", "unknown key(s) ['foo']"),
    ("epochs = = 3\n", "is not valid TOML"),
])
def test_bad_config_file_values_name_the_key_and_the_file(text, expected, tmp_path, capsys, no_run):
    f = tmp_path / "exp.toml"
    f.write_text(text)
    err = _one_line_error(capsys, ["--config", str(f)])
    assert expected in err
    if "task option" not in expected:
        assert str(f) in err


def test_the_command_line_overrides_a_bad_file_value(tmp_path, capsys):
    f = tmp_path / "exp.toml"
    f.write_text('lr = "fast"\n')
    assert main(["run", "--config", str(f), "--lr", "0.1", "--show-config"]) == 0
    assert '"lr": 0.1' in capsys.readouterr().out


@pytest.mark.parametrize("name,content,expected", [
    ("exp.yaml", "lr: 1\n", "config file must be .toml or .json, got 'exp.yaml'"),
    ("missing.toml", None, "missing.toml does not exist"),
    ("bad.json", "{1: 2}", "is not valid JSON"),
    ("list.json", "[1, 2]", "must hold a table/object of options, got list"),
    ("latin1.toml", b"lr = 0.1 # \xff\n", "is not UTF-8 text"),
    ("syntax.toml", "lr = \n", "is not valid TOML"),
    ("folder.toml", "dir", "is a directory, not a file"),
])
def test_config_file_problems_name_the_file(name, content, expected, tmp_path, capsys, no_run):
    f = tmp_path / name
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content == "dir":
        f.mkdir()
    elif content is not None:
        f.write_text(content)
    err = _one_line_error(capsys, ["--config", str(f)])
    assert expected in err and name in err


def test_an_unreadable_config_file_is_named(tmp_path, capsys, no_run, monkeypatch):
    f = tmp_path / "locked.toml"
    f.write_text("lr = 0.1\n")
    real = Path.read_text

    def no_permission(self, *args, **kwargs):
        if self == f:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_permission)
    err = _one_line_error(capsys, ["--config", str(f)])
    assert f"config file {f} cannot be read (Permission denied)" in err


def test_debug_raises_the_config_error(no_run):
    with pytest.raises(ConfigError, match="--eval-every must be a positive int, got 0") as info:
        main(["--debug", "run", "--eval-every", "0"])
    assert info.value.key == "eval_every"


@pytest.mark.parametrize("cfg,expected", [
    ({"lr": "fast"}, "'lr' must be a positive number, got 'fast'"),
    ({"epochs": True}, "'epochs' must be a positive int, got True"),
    ({"layers": 1.0}, "'layers' must be a positive int"),
    ({"grad_clip": -1}, "'grad_clip' must be a non-negative number"),
    ({"eval_every": 0}, "'eval_every' must be a positive int"),
    ({"time_budget": -1}, "'time_budget' must be a positive number"),
    ({"threads": True}, "'threads' must be a positive int"),
    ({"seeds": [True]}, "'seeds' must be a non-empty list of int seeds"),
    ({"producer": 3}, "'producer' must be a producer name, a table/object or a list, got 3"),
    ({"conv": 3}, "'conv' must be a conv name or 'none'"),
    ({"norm_first": "yes"}, "'norm_first' must be true or false"),
    ({"out": 3}, "'out' must be a folder path"),
    ({"task": "mutag", "task_kwargs": {"num_train": 5}}, "unknown task option(s) 'num_train' for "
                                                         "task 'mutag'"),
    ({"task": "imagenet"}, "unknown task 'imagenet'"),
])
def test_resolve_config_refuses(cfg, expected):
    with pytest.raises(ValueError) as info:
        resolve_config(cfg)
    assert expected in str(info.value)


def test_valid_edge_values_are_kept():
    cfg = resolve_config({"lr": 1, "dropout": 0, "seeds": 3, "patience": 0, "warmup_epochs": 0,
                          "head_layers": 0, "weight_decay": 0, "conv": "none", "pe": "none",
                          "time_budget": 1e-9, "threads": 1, "device": "cpu", "out": Path("r"),
                          "task_kwargs": {"limit": 3, "progress": False}})
    assert cfg["seeds"] == [3] and cfg["lr"] == 1 and cfg["patience"] == 0
    assert resolve_config({"seeds": (0, 1)})["seeds"] == [0, 1]
    assert resolve_config({"task": "listops", "conv": None})["conv"] is None  # the task's default


def test_the_schema_covers_every_key_and_every_default_passes():
    assert set(SCHEMA) == set(DEFAULTS)
    for task in TASK_DEFAULTS:
        resolve_config({"task": task})


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_resolves(path):
    cfg = load_config_file(path)
    resolve_config(cfg)
    # with the options the config tests add for tiny data
    kwargs = {**cfg.get("task_kwargs", {}), "limit": 12, "progress": False}
    if resolve_config(cfg)["task"] in ("listops", "fashion-mnist"):
        kwargs.update(num_train=12, num_val=12)
    if resolve_config(cfg)["task"] == "listops":
        kwargs.update(num_test=12, min_length=16, max_length=48)
    resolve_config({**cfg, "task_kwargs": kwargs})


def test_task_options_come_from_the_builders():
    from graphattn.runner.tasks import TASKS, build_task, task_options

    for name in TASKS:
        assert {"limit", "progress"} <= set(task_options(name) or ())
    assert task_options("listops") == ("limit", "max_length", "min_length", "num_test", "num_train",
                                       "num_val", "pad_to", "progress", "seed", "window")
    assert task_options("mutag") == ("limit", "progress", "split_seed")
    with pytest.raises(ValueError, match=r"unknown task option\(s\) 'sise' for task 'cora'"):
        build_task("cora", "/nonexistent", sise=3)  # refused before any data is read


def test_a_builder_with_open_kwargs_takes_any_option(monkeypatch):
    from graphattn.runner import tasks

    monkeypatch.setitem(tasks.TASKS, "mine", lambda name, root, **kwargs: None)
    assert tasks.task_options("mine") is None
    tasks.check_task_options("mine", {"anything": 1})
    assert resolve_config({"task": "mine", "task_kwargs": {"anything": 1}})["task"] == "mine"


def test_model_kwargs_override_the_task_defaults_and_a_double_setting_is_refused():
    """``--model-kwargs`` overrides what the task gives (its read-out); a model argument that a
    config key sets is refused, naming the key, instead of a TypeError or a silent override."""
    from graphattn.runner.build import build_model
    from graphattn.runner.tasks import Task

    task = Task(name="listops", level="graph", modality="sequence", loss="ce", metric="accuracy",
                out_channels=10, model_defaults={"node_encoder": "embedding",
                                                 "num_embeddings": 20, "pool": "cls"})
    cfg = resolve_config({"task": "listops", "producer": "full"})
    assert build_model(cfg, task).pool == "cls"
    mean = resolve_config({"task": "listops", "producer": "full", "model_kwargs": {"pool": "mean"}})
    assert build_model(mean, task).pool == "mean"
    for hidden in (32, 64):  # a value equal to the default is a choice too
        twice = resolve_config({"task": "listops", "producer": "full", "hidden": hidden,
                                "model_kwargs": {"hidden_channels": 48}})
        with pytest.raises(ValueError, match=r"'hidden_channels' in --model-kwargs: set them "
                                             r"with --hidden instead"):
            build_model(twice, task)
