"""Experiment configuration: defaults, per-task defaults, and loading from files."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import tomllib

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
    "scheduler": "none",
    "warmup_epochs": 0,
    "grad_clip": None,
    "aux_weight": 1.0,
    "pg_weight": 1.0,
    "pg_momentum": 0.9,
    # running
    "seeds": [0],
    "out": None,
    "data_root": None,
    "device": "cpu",
    "time_budget": None,
    "eval_every": 1,
    "patience": None,
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
}


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or TOML experiment file (keys as in :data:`DEFAULTS`)."""
    path = Path(path)
    if path.suffix not in (".toml", ".json"):
        raise ValueError(f"config file must be .toml or .json, got {path.name!r}")
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        cfg = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError
        raise ValueError(f"config file {path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"config file {path} must hold a table/object of options, got "
                         f"{type(cfg).__name__}")
    return cfg


def resolve_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """Defaults ← task defaults ← ``overrides`` (``None`` values in overrides are ignored)."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; known: {sorted(DEFAULTS)}")
    task = overrides.get("task") or DEFAULTS["task"]
    cfg = copy.deepcopy(DEFAULTS)
    cfg.update(copy.deepcopy(TASK_DEFAULTS.get(task, {})))
    cfg.update({k: copy.deepcopy(v) for k, v in overrides.items() if v is not None})
    if isinstance(cfg["seeds"], int):
        cfg["seeds"] = [cfg["seeds"]]
    if not cfg["seeds"]:
        raise ValueError("'seeds' must name at least one seed")
    for key in ("epochs", "layers", "hidden", "heads", "batch_size"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"'{key}' must be a positive int, got {cfg[key]!r}")
    if cfg["optimizer"] not in ("adam", "adamw"):
        raise ValueError(f"'optimizer' must be 'adam' or 'adamw', got {cfg['optimizer']!r}")
    if cfg["scheduler"] not in ("none", "cosine"):
        raise ValueError(f"'scheduler' must be 'none' or 'cosine', got {cfg['scheduler']!r}")
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
