"""Building what a run trains from its configuration: the task (with the positional-encoding
transform the config asks for) and the model. Used by the trainer and by :func:`~graphattn.runner.
checkpoint.restore`, which imports nothing from the trainer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphattn.nn import create_model, model_options
from graphattn.nn.registry import check_model_options
from graphattn.runner.config import DEFAULTS, TASK_DEFAULTS, producer_names, producer_spec
from graphattn.runner.tasks import Task, build_task


def build_model(cfg: dict[str, Any], task: Task) -> nn.Module:
    """The model of an experiment: ``cfg["model"]`` from the model registry (default
    ``"hybrid"``, a :class:`~graphattn.GraphTransformer`), built from the task defaults, then the
    config's choices, then ``cfg["model_kwargs"]``. Of the options the configuration sets, a model
    is given those it takes (its ``OPTIONS``), and of the others those the user chose (not left at
    the runner's or the task's default), which it refuses: a :class:`ValueError` naming the
    option, where it was set and the model."""
    md = dict(task.model_defaults)
    pe = cfg["pe"] if cfg["pe"] is not None else md.pop("pe", None)
    pe = None if pe == "none" else pe  # --pe none: no encoding, whatever the task's default
    md.pop("pe", None)
    conv = cfg["conv"]
    name = cfg["model"]
    accepted = model_options(name)
    kwargs = dict(
        hidden_channels=cfg["hidden"],
        out_channels=task.out_channels,
        num_layers=cfg["layers"],
        producer=producer_spec(cfg),
        conv=None if conv in (None, "none") else conv,
        heads=cfg["heads"],
        dropout=cfg["dropout"],
        attn_dropout=cfg["attn_dropout"],
        input_dropout=cfg["input_dropout"],
        norm=cfg["norm"],
        norm_first=cfg["norm_first"],
        ffn_ratio=cfg["ffn_ratio"],
        residual=cfg["residual"],
        ffn=cfg["ffn"],
        head_layers=cfg["head_layers"],
        pe=pe,
        pe_dim=cfg["pe_dim"],
        task=task.level,
        node_encoder=_node_encoder(cfg, md),
        act=cfg["act"],
        num_embeddings=md.get("num_embeddings"),
        edge_encoder=md.get("edge_encoder"),
        pool=md.get("pool", "mean"),
    )
    # an option the model does not take (e.g. the Converter's heads) is passed only where the user
    # chose it, to be refused; the runner's and the task's defaults, and what the task gives
    # (its edge encoder, read-out, ...), are not choices
    for arg in [a for a in kwargs if a not in accepted and not _user_chose(cfg, a)]:
        del kwargs[arg]
    model_kwargs = dict(cfg.get("model_kwargs") or {})
    if (kwargs.get("node_encoder", "") is None and "in_channels" in accepted
            and "in_channels" not in model_kwargs
            and not all(getattr(c, "lazy_channels", True) for c in _producer_classes(kwargs["producer"]))):
        # the first layer reads the raw features and its producer cannot size itself lazily
        # (SAMSA, the Converter): it is given the features' width (other models keep their lazy
        # first layer, whose initialisation order the published runs depend on)
        width = _float_feature_width(task)
        if width is not None:
            kwargs["in_channels"] = width
    where = {a: f"set by --{'/--'.join(k.replace('_', '-') for k in _CONFIG_KEYS[a])}"
             for a in kwargs if a in _CONFIG_KEYS}
    both = sorted(a for a in model_kwargs if a in _CONFIG_KEYS)
    if both:  # the config key would be overridden without a word
        keys = ", ".join("--" + _CONFIG_KEYS[a][0].replace("_", "-") for a in both)
        raise ValueError(f"model argument(s) {', '.join(map(repr, both))} in --model-kwargs: "
                         f"set them with {keys} instead")
    where.update({k: "in --model-kwargs" for k in model_kwargs})
    check_model_options(name, {**kwargs, **model_kwargs}, where)
    try:  # --model-kwargs over the task's defaults (e.g. its read-out) and the runner's
        return create_model(name, **{**kwargs, **model_kwargs})
    except ValueError as exc:
        raise ValueError(f"{exc}{_where_set(str(exc), cfg)}") from None


#: the config keys that set each model argument the runner passes (the others come from the task)
_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "hidden_channels": ("hidden",), "num_layers": ("layers",),
    "producer": ("producer", "producer_kwargs"),
    **{k: (k,) for k in ("conv", "heads", "dropout", "attn_dropout", "input_dropout", "norm",
                         "norm_first", "ffn_ratio", "residual", "ffn", "head_layers", "pe",
                         "pe_dim", "node_encoder", "act")},
}


def _user_chose(cfg: dict[str, Any], arg: str) -> bool:
    """Whether the configuration's value of model argument ``arg`` is the user's choice: a config
    key setting it differs from the runner's default and the task's."""
    task_defaults = TASK_DEFAULTS.get(cfg["task"], {})
    return any(cfg[k] not in (DEFAULTS[k], task_defaults.get(k, DEFAULTS[k]))
               for k in _CONFIG_KEYS.get(arg, ()))


#: model arguments whose command-line option has another name than ``--<argument>``
_FLAGS = {"hidden_channels": "hidden", "num_layers": "layers"}


def _where_set(message: str, cfg: dict[str, Any]) -> str:
    """For a model error that names an argument the task's defaults chose (not the user), where it
    came from and the option that changes it; for one with no option, ``--model-kwargs``."""
    task_defaults = TASK_DEFAULTS.get(cfg["task"], {})
    notes = []
    for key, value in task_defaults.items():
        arg = {v: k for k, v in _FLAGS.items()}.get(key, key)
        if (f"{arg}=" in message or f"'{arg}'" in message) and cfg.get(key) == value:
            notes.append(f"{key}={value!r} is the {cfg['task']} task's default: set "
                         f"--{key.replace('_', '-')} to change it")
    if not notes and "edge_encoder" in message:
        notes.append("set it with --model-kwargs '{\"edge_encoder\": \"linear\"}'")
    return f" ({'; '.join(notes)})" if notes else ""


def _producer_classes(spec: Any) -> list[type]:
    """The registered producer classes a spec names (a union's parts too); unknown names are left
    to the model to report. A producer instance stands for its own class."""
    from graphattn.producers.registry import PRODUCERS

    if isinstance(spec, (list, tuple)):  # one spec per layer
        return [c for part in spec for c in _producer_classes(part)]
    if spec is not None and not isinstance(spec, (str, dict)):
        return [type(spec)]
    return [PRODUCERS[n] for n in producer_names(spec) if n in PRODUCERS]


def _float_feature_width(task: Task) -> int | None:
    """The width of the task's floating-point node features (``None``: integer, absent or
    unknown), read from its graph (node tasks) or first training graph."""
    graph = task.graph if task.level == "node" else (task.splits.get("train") or [None])[0]
    x = getattr(graph, "x", None)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        return None
    return int(x.size(1))


def _node_encoder(cfg: dict[str, Any], md: dict[str, Any]) -> str | None:
    enc = cfg["node_encoder"]
    if enc == "default":
        return md.get("node_encoder", "linear")
    return None if enc == "none" else enc


def build_configured_task(cfg: dict[str, Any]) -> Task:
    """The config's task; its ``progress`` setting also silences the data set's build (Peptides'
    SMILES conversion bar), unless the task options set ``progress`` themselves."""
    kwargs = {"progress": bool(cfg["progress"]), **cfg["task_kwargs"]}
    return build_task(cfg["task"], cfg["data_root"], **kwargs)


def prepare_task(task: Task, cfg: dict[str, Any]) -> Task:
    """Adds the positional-encoding transform a config asks for (random walk / Laplacian)."""
    pe = cfg["pe"]
    if pe not in ("random_walk", "laplacian"):
        return task
    from graphattn.nn import positional_encoding

    transform = positional_encoding(pe, cfg["pe_dim"])
    if task.level == "node":
        assert task.graph is not None
        task.graph = transform(task.graph)
        return task
    for ds in task.splits.values():
        prev = getattr(ds, "transform", None)
        ds.transform = transform if prev is None else _Chain(prev, transform)
    return task


class _Chain:
    def __init__(self, *fns: Any) -> None:
        self.fns = fns

    def __call__(self, data: Any) -> Any:
        for fn in self.fns:
            data = fn(data)
        return data

    def __repr__(self) -> str:
        return " -> ".join(repr(f) for f in self.fns)
