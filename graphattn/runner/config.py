"""Experiment configuration: defaults, per-task defaults, and loading from files."""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib

from graphattn.runner.choices import TASK_NAMES

DEFAULTS: dict[str, Any] = {
    # what
    "task": "cora",
    "task_kwargs": {},
    "producer": "input",
    "producer_kwargs": {},
    "conv": "gcn",
    # model: a registered model name ("hybrid" = GraphTransformer; mechanism presets register
    # their own) and its extra keyword arguments
    "model": "hybrid",
    "model_kwargs": {},
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "dropout": 0.5,
    "attn_dropout": 0.0,
    "input_dropout": 0.0,
    "norm": "layer_norm",
    "norm_first": False,
    "ffn_ratio": 2,
    "act": "relu",
    "node_encoder": "default",
    "residual": True,
    "ffn": True,
    "head_layers": 1,
    "pe": None,
    "pe_dim": 16,
    # optimisation: "adam" (L2 penalty in the gradient, as the GCN/GAT citation set-ups) or
    # "adamw" (decoupled weight decay)
    "optimizer": "adam",
    "epochs": 200,
    "lr": 0.01,
    "weight_decay": 5e-4,
    "batch_size": 32,
    # node tasks: "full" (the whole graph every step) or "neighbor" (PyG's NeighborLoader:
    # batch_size seed nodes per step, num_neighbors sampled per hop; none: 10 per layer)
    "loader": "full",
    "num_neighbors": None,
    "scheduler": "none",
    "warmup_epochs": 0,
    "grad_clip": None,
    "aux_weight": 1.0,
    "pg_weight": 1.0,
    "pg_momentum": 0.9,
    # learning rate of the parameters only the policy gradient trains (SAC's predictor); none: lr
    "pg_lr": None,
    # consistency regularisation (GRAND): S stochastic passes per step, weight, temperature
    "consistency_samples": 1,
    "consistency_weight": 1.0,
    "consistency_temperature": 0.5,
    # running
    "seeds": [0],
    "out": None,
    "data_root": None,
    "device": "cpu",
    "time_budget": None,
    "eval_every": 1,
    "patience": None,
    # model selection on validation: "metric" (the best metric) or "loss" (the lowest task loss)
    "select": "metric",
    "resume": False,
    "overwrite": False,
    "progress": True,
    "threads": None,
}

CITATION: dict[str, Any] = {"producer": {"name": "input", "self_loops": True}, "conv": "gcn",
              "node_encoder": "none", "head_layers": 0, "hidden": 64, "heads": 8, "act": "elu",
              "dropout": 0.6, "attn_dropout": 0.6, "input_dropout": 0.6, "norm": "none",
              "residual": False, "ffn": False, "lr": 0.005, "weight_decay": 5e-4, "epochs": 300,
              "patience": 100}

# Sensible starting points per task (any key can still be overridden).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    # GCN/GAT-shaped hybrid for the few-label citation graphs: the first layer reads the raw
    # features, the last one outputs the classes, a GCN branch plus attention over the input edges.
    "cora": CITATION,
    "citeseer": CITATION,
    "pubmed": CITATION,
    "peptides-func": {"conv": "gine", "producer": "full", "layers": 4, "hidden": 96, "heads": 4,
                      "dropout": 0.1, "lr": 1e-3, "weight_decay": 0.0, "epochs": 100,
                      "optimizer": "adamw", "batch_size": 64, "scheduler": "cosine", "warmup_epochs": 5,
                      "head_layers": 3, "grad_clip": 1.0, "pe": "random_walk", "pe_dim": 16},
    "peptides-struct": {"conv": "gine", "producer": "full", "layers": 4, "hidden": 96, "heads": 4,
                        "dropout": 0.1, "lr": 1e-3, "weight_decay": 0.0, "epochs": 100,
                        "optimizer": "adamw", "batch_size": 64, "scheduler": "cosine", "warmup_epochs": 5,
                        "head_layers": 3, "grad_clip": 1.0, "pe": "random_walk", "pe_dim": 16},
    "mutag": {"conv": "gin", "producer": "full", "layers": 3, "dropout": 0.2, "lr": 1e-3,
              "weight_decay": 0.0, "epochs": 100, "head_layers": 2},
    "proteins": {"conv": "gin", "producer": "full", "layers": 3, "dropout": 0.2, "lr": 1e-3,
                 "weight_decay": 0.0, "epochs": 100, "head_layers": 2},
    "enzymes": {"conv": "gin", "producer": "full", "layers": 3, "dropout": 0.2, "lr": 1e-3,
                "weight_decay": 0.0, "epochs": 100, "head_layers": 2},
    "listops": {"conv": None,  # BigBird-style: a local window plus the CLS token as a global token
                "producer": {"name": "union", "producers": [{"name": "window", "window": 4},
                                                            {"name": "global", "positions": [0]}]},
                "layers": 4,
                "hidden": 64, "heads": 4, "dropout": 0.1, "lr": 1e-3, "weight_decay": 0.01,
                "optimizer": "adamw", "epochs": 10, "batch_size": 32, "scheduler": "cosine",
                "warmup_epochs": 1,
                "norm_first": True, "head_layers": 2, "grad_clip": 1.0},
    "fashion-mnist": {"conv": None, "producer": "full", "layers": 3, "hidden": 64, "heads": 4,
                      "dropout": 0.1, "lr": 1e-3, "weight_decay": 0.01, "epochs": 5, "optimizer": "adamw",
                      "batch_size": 64, "scheduler": "cosine", "warmup_epochs": 1,
                      "norm_first": True, "head_layers": 2},
    "geometric-shapes": {"conv": None, "producer": {"name": "knn", "k": 16}, "layers": 3,
                         "hidden": 64, "dropout": 0.0, "lr": 1e-3, "weight_decay": 0.0,
                         "epochs": 100, "batch_size": 8, "head_layers": 2},
    # UCR/UEA time series (sktime's bundled files), one node per step: full attention, pre-norm
    "ucr": {"conv": None, "producer": "full", "layers": 3, "hidden": 64, "heads": 4, "dropout": 0.1,
            "lr": 1e-3, "weight_decay": 0.01, "optimizer": "adamw", "epochs": 100, "batch_size": 16,
            "scheduler": "cosine", "warmup_epochs": 5, "norm_first": True, "head_layers": 2},
}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or TOML experiment file (keys as in :data:`DEFAULTS`)."""
    path = Path(path)
    if path.suffix not in (".toml", ".json"):
        raise ValueError(f"config file must be .toml or .json, got {path.name!r}")
    if path.is_dir():
        raise ValueError(f"config file {path} is a directory, not a file")
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"config file {path} cannot be read ({exc.strerror or exc})") from None
    try:
        cfg = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError
        raise ValueError(f"config file {path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"config file {path} must hold a table/object of options, got "
                         f"{type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"config file {path}: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    return cfg


class ConfigError(ValueError):
    """A config value of the wrong type or out of range; ``key`` names it and ``problem`` says
    what it must be and what it got (the message is ``'key' problem``, or ``name problem`` where
    the command line names the option: ``--lr``)."""

    def __init__(self, key: str, problem: str, name: str | None = None) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{name or repr(key)} {problem}")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # bool is an int subclass: refused


def _num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _name(v: Any) -> bool:
    return isinstance(v, str) and v.strip() != ""


def _options(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) for k in v)


DEVICE_FORMS = "'cpu', 'cuda' or 'cuda:N'"
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")

_POS_INT = (lambda v: _int(v) and v >= 1, "a positive int")
_NONNEG_INT = (lambda v: _int(v) and v >= 0, "a non-negative int")
_POS_NUM = (lambda v: _num(v) and v > 0, "a positive number")
_NONNEG_NUM = (lambda v: _num(v) and v >= 0, "a non-negative number")
_PROB = (lambda v: _num(v) and 0 <= v < 1, "a number in [0, 1)")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_OPTIONS = (_options, "a table/object of options (e.g. {\"k\": 32})")
_PATH = (_optional(lambda v: isinstance(v, (str, os.PathLike))), "a folder path")

#: every key of :data:`DEFAULTS`: (check, what it must be); :func:`resolve_config` refuses a value
#: the check rejects with ``'key' must be <what>, got <value>``
SCHEMA: dict[str, tuple[Callable[[Any], bool], str]] = {
    "task": (_name, f"a task name ({', '.join(TASK_NAMES)})"),
    "task_kwargs": _OPTIONS,
    "producer": (lambda v: v is None or isinstance(v, (str, dict, list)),
                 "a producer name, a table/object or a list"),
    "producer_kwargs": _OPTIONS,
    "conv": (_optional(_name), "a conv name or 'none'"),
    "model": (_name, "a model name"),
    "model_kwargs": _OPTIONS,
    "layers": _POS_INT,
    "hidden": _POS_INT,
    "heads": _POS_INT,
    "dropout": _PROB,
    "attn_dropout": _PROB,
    "input_dropout": _PROB,
    "norm": (_optional(_name), "a norm name or 'none'"),
    "norm_first": _BOOL,
    "ffn_ratio": _POS_INT,
    "act": (_name, "an activation name"),
    "node_encoder": (_name, "an encoder name (default, none, linear, atom or embedding)"),
    "residual": _BOOL,
    "ffn": _BOOL,
    "head_layers": _NONNEG_INT,
    "pe": (_optional(_name), "a positional-encoding name or 'none'"),
    "pe_dim": _POS_INT,
    "optimizer": (lambda v: v in ("adam", "adamw"), "'adam' or 'adamw'"),
    "epochs": _POS_INT,
    "lr": _POS_NUM,
    "weight_decay": _NONNEG_NUM,
    "batch_size": _POS_INT,
    "loader": (lambda v: v in ("full", "neighbor"), "'full' or 'neighbor'"),
    "num_neighbors": (lambda v: v is None or (isinstance(v, list) and len(v) > 0
                                             and all(_int(k) and (k > 0 or k == -1) for k in v)),
                      "a non-empty list of neighbours per hop (positive ints, -1 for all)"),
    "scheduler": (lambda v: v in ("none", "cosine"), "'none' or 'cosine'"),
    "warmup_epochs": _NONNEG_INT,
    "grad_clip": (_optional(_NONNEG_NUM[0]), "a non-negative number (0 or left out: no clipping)"),
    "aux_weight": _NONNEG_NUM,
    "pg_weight": _NONNEG_NUM,
    "pg_momentum": _PROB,
    "pg_lr": (_optional(_POS_NUM[0]), "a positive number (leave it out: the lr)"),
    "consistency_samples": _POS_INT,
    "consistency_weight": _NONNEG_NUM,
    "consistency_temperature": _POS_NUM,
    "seeds": (lambda v: isinstance(v, list) and len(v) > 0 and all(_int(s) for s in v),
              "a non-empty list of int seeds"),
    "out": _PATH,
    "data_root": _PATH,
    "device": (lambda v: isinstance(v, str) and _DEVICE.fullmatch(v) is not None, DEVICE_FORMS),
    "time_budget": (_optional(_POS_NUM[0]), "a positive number of minutes (leave it out for none)"),
    "eval_every": _POS_INT,
    "select": (lambda v: v in ("metric", "loss"), "'metric' or 'loss'"),
    "patience": (_optional(_NONNEG_INT[0]), "a non-negative int (0 or left out: no early stopping)"),
    "resume": _BOOL,
    "overwrite": _BOOL,
    "progress": _BOOL,
    "threads": (_optional(_POS_INT[0]), "a positive int (leave it out for torch's choice)"),
}


def check_config(cfg: dict[str, Any]) -> None:
    """Raises :class:`ConfigError` for the first value of ``cfg`` that :data:`SCHEMA` refuses."""
    for key, value in cfg.items():
        check, expected = SCHEMA[key]
        if not check(value):
            raise ConfigError(key, f"must be {expected}, got {value!r}")


def check_device(device: str) -> None:
    """Raises :class:`ConfigError` for a CUDA device this machine does not have (torch is imported
    only for a CUDA device). Not part of :func:`resolve_config`: a run trained on a GPU is still
    restored (``graphattn viz``) on a machine without one; the command line checks before a run."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("device", f"is {device!r} but no CUDA device is available here; use 'cpu'")
    count = torch.cuda.device_count()
    if int(device.partition(":")[2] or 0) >= count:
        raise ConfigError("device", f"is {device!r} but this machine has {count} CUDA device(s) "
                                    f"(cuda:0 to cuda:{count - 1})")


def resolve_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """Defaults ← task defaults ← ``overrides`` (``None`` values in overrides are ignored), checked
    against :data:`SCHEMA` (:class:`ConfigError`, a ``ValueError``, names the first bad key) and
    ``task_kwargs`` against the options the task's builder takes; nothing is loaded or trained."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known: {sorted(DEFAULTS)}")
    task = overrides.get("task") or DEFAULTS["task"]
    if not _name(task):
        raise ConfigError("task", f"must be {SCHEMA['task'][1]}, got {task!r}")
    cfg = copy.deepcopy(DEFAULTS)
    cfg.update(copy.deepcopy(TASK_DEFAULTS.get(task, {})))
    cfg.update({k: copy.deepcopy(v) for k, v in overrides.items() if v is not None})
    if _int(cfg["seeds"]):
        cfg["seeds"] = [cfg["seeds"]]
    elif isinstance(cfg["seeds"], tuple):
        cfg["seeds"] = list(cfg["seeds"])
    check_config(cfg)
    if task not in TASK_NAMES or cfg["task_kwargs"]:  # a task registered by the user, or options
        from graphattn.runner.tasks import check_task_options  # imports torch

        check_task_options(task, cfg["task_kwargs"])
    return cfg


def default_out(cfg: dict[str, Any]) -> str:
    """The run folder of a resolved config without ``out``: ``runs/<task>-<producer>``, or
    ``runs/<task>-<model>`` for a model preset (the preset's producer is part of it)."""
    if cfg["model"] != "hybrid":
        return f"runs/{cfg['task']}-{cfg['model']}"
    prod = cfg["producer"]
    if isinstance(prod, dict):
        name = str(prod.get("name", "custom"))
        if name == "union" and isinstance(prod.get("producers"), list):
            parts = [p if isinstance(p, str) else str(p.get("name", "custom")) if isinstance(p, dict)
                     else "custom" for p in prod["producers"]]
            name = "+".join(parts)
    elif isinstance(prod, str):
        name = prod
    elif prod is None:
        name = "none"
    else:
        name = "custom"
    return f"runs/{cfg['task']}-{name}"


def producer_names(spec: Any) -> list[str]:
    """Every producer name in a producer spec: a name, a mapping with ``name`` (a union's
    ``producers`` too), or a list with one spec per layer; other values name none."""
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, dict):
        names = [spec["name"]] if isinstance(spec.get("name"), str) else []
        return names + [n for part in spec.get("producers") or [] for n in producer_names(part)]
    if isinstance(spec, (list, tuple)):
        return [n for part in spec for n in producer_names(part)]
    return []


def producer_spec(cfg: dict[str, Any]) -> Any:
    """The producer spec for the model: a name/mapping merged with ``producer_kwargs``."""
    prod = cfg["producer"]
    if prod in (None, "none"):
        return None
    kwargs = dict(cfg.get("producer_kwargs") or {})
    if isinstance(prod, str):
        return {"name": prod, **kwargs} if kwargs else prod
    if isinstance(prod, dict):
        return {**prod, **kwargs}
    if isinstance(prod, list):
        return prod
    raise ValueError(f"'producer' must be a name, a mapping or a list, got {type(prod).__name__}")
