"""Train and evaluate a model on a benchmark task (``graphattn run``; default: Cora with a hybrid
model).

Every option can also be given in a ``--config`` file (TOML or JSON, same keys with ``_`` for
``-``); options on the command line override the file, the file overrides the task's defaults, and
those override the global defaults. ``--show-config`` prints the resolved configuration.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from graphattn.runner.choices import CONV_NAMES, MODEL_NAMES, PRODUCER_NAMES, TASK_NAMES
from graphattn.runner.config import (
    DEFAULTS,
    ConfigError,
    check_device,
    default_out,
    load_config_file,
    producer_names,
    resolve_config,
)

EPILOG = f"""\
producers: {", ".join(PRODUCER_NAMES)}
  (a JSON spec sets arguments: '{{"name": "samsa", "k": 32}}'; a union:
   '{{"name": "union", "producers": ["input", "expander", "virtual"]}}')
models:    {", ".join(MODEL_NAMES)}
tasks:     {", ".join(TASK_NAMES)}

Where a default says "tasks may set their own", the task's value wins (e.g. the citation tasks use
a GAT-shaped model); 'graphattn run --task T --show-config' prints every value a run would use.

examples:
  graphattn run                                              # Cora, the main job
  graphattn run --task citeseer --seeds 0 1 2
  graphattn run --config examples/configs/listops.toml --epochs 2 --out runs/listops-try
  graphattn run --task peptides-func --conv gine \\
      --producer '{{"name": "union", "producers": ["input", "expander", "virtual"]}}'
  torchrun --nproc-per-node 2 -m graphattn run --task peptides-func  # data-parallel, 2 processes
  graphattn run --task pubmed --loader neighbor --batch-size 32 --num-neighbors 10 10
"""


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r} ({exc})") from None


def _producer(text: str) -> Any:
    """A producer name, or JSON for a mapping/list."""
    return _json(text) if text.strip()[:1] in "[{" else text


def _d(key: str, task: bool = True) -> str:
    value = DEFAULTS[key]
    shown = "none" if value is None else value
    return f" (default: {shown}{'; tasks may set their own' if task else ''})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    g = p.add_argument_group("what to run")
    g.add_argument("--config", metavar="FILE",
                   help="TOML or JSON file with any of the options below (keys with '_' for '-')")
    g.add_argument("--task", metavar="TASK",
                   help=f"benchmark task, one of: {', '.join(TASK_NAMES)} (default: {DEFAULTS['task']})")
    g.add_argument("--task-kwargs", type=_json, metavar="JSON",
                   help="task options as JSON, e.g. '{\"num_train\": 500}'; '{\"limit\": N}' keeps the "
                        "first N samples of every split (a quick check)")
    g.add_argument("--producer", type=_producer, metavar="NAME|JSON",
                   help="edge-set producer of the attention branch: a name (see below) or a JSON spec"
                        + _d("producer"))
    g.add_argument("--producer-kwargs", type=_json, metavar="JSON",
                   help="producer arguments as JSON, merged into --producer")
    g.add_argument("--model", metavar="NAME",
                   help=f"registered model: {', '.join(MODEL_NAMES)} (default: hybrid, a "
                        f"GraphTransformer of HybridLayers)")
    g.add_argument("--model-kwargs", type=_json, metavar="JSON", help="extra model arguments as JSON")

    m = p.add_argument_group("model")
    m.add_argument("--conv", metavar="NAME",
                   help=f"local message-passing branch: {', '.join(CONV_NAMES)} or none" + _d("conv"))
    m.add_argument("--layers", type=int, metavar="N", help="number of layers" + _d("layers"))
    m.add_argument("--hidden", type=int, metavar="N", help="width of every layer" + _d("hidden"))
    m.add_argument("--heads", type=int, metavar="N", help="attention heads" + _d("heads"))
    m.add_argument("--dropout", type=float, metavar="P", help="dropout after each branch and in the "
                   "feed-forward block" + _d("dropout"))
    m.add_argument("--attn-dropout", type=float, metavar="P",
                   help="dropout on the attention coefficients" + _d("attn_dropout"))
    m.add_argument("--input-dropout", type=float, metavar="P",
                   help="dropout on the raw input features" + _d("input_dropout"))
    m.add_argument("--norm", metavar="NAME", help="layer_norm, batch_norm, a PyG norm name, or none"
                   + _d("norm"))
    m.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None,
                   help="pre-norm layers (norm before each branch)" + _d("norm_first"))
    m.add_argument("--ffn-ratio", type=int, metavar="R",
                   help="feed-forward width as a multiple of --hidden" + _d("ffn_ratio"))
    m.add_argument("--act", metavar="NAME", help="activation: relu, elu, gelu, ..." + _d("act"))
    m.add_argument("--node-encoder", metavar="NAME",
                   help="input encoder: default (the task's), none, linear, atom or embedding"
                        + _d("node_encoder", task=False))
    m.add_argument("--residual", action=argparse.BooleanOptionalAction, default=None,
                   help="residual connections around each branch" + _d("residual"))
    m.add_argument("--ffn", action=argparse.BooleanOptionalAction, default=None,
                   help="feed-forward block in every layer" + _d("ffn"))
    m.add_argument("--head-layers", type=int, metavar="N",
                   help="layers of the prediction MLP (0: the last layer outputs the classes)"
                        + _d("head_layers"))
    m.add_argument("--pe", metavar="NAME", help="positional encoding: laplacian, random_walk, "
                   "position, or none (also turns a task's default off)" + _d("pe"))
    m.add_argument("--pe-dim", type=int, metavar="N", help="positional-encoding size" + _d("pe_dim"))

    o = p.add_argument_group("optimisation")
    o.add_argument("--optimizer", choices=["adam", "adamw"], help="optimizer" + _d("optimizer"))
    o.add_argument("--epochs", type=int, metavar="N", help="training epochs" + _d("epochs"))
    o.add_argument("--lr", type=float, metavar="LR", help="learning rate" + _d("lr"))
    o.add_argument("--weight-decay", type=float, metavar="W", help="weight decay" + _d("weight_decay"))
    o.add_argument("--batch-size", type=int, metavar="N",
                   help="graphs per batch (graph tasks; the global batch when distributed), or "
                        "seed nodes per batch with --loader neighbor"
                   + _d("batch_size"))
    o.add_argument("--loader", choices=["full", "neighbor"],
                   help="node tasks: the whole graph every step, or PyG's NeighborLoader "
                        "(--batch-size seed nodes, --num-neighbors per hop)" + _d("loader"))
    o.add_argument("--num-neighbors", type=int, nargs="+", metavar="K",
                   help="neighbours sampled per hop with --loader neighbor, -1 for all "
                        "(default: 10 per layer)")
    o.add_argument("--scheduler", choices=["none", "cosine"],
                   help="learning-rate schedule after the warm-up" + _d("scheduler"))
    o.add_argument("--warmup-epochs", type=int, metavar="N", help="linear learning-rate warm-up"
                   + _d("warmup_epochs"))
    o.add_argument("--grad-clip", type=float, metavar="NORM", help="clip the gradient norm"
                   + _d("grad_clip"))
    o.add_argument("--aux-weight", type=float, metavar="W",
                   help="weight of the producers' auxiliary losses (e.g. SBM's density term)"
                        + _d("aux_weight"))
    o.add_argument("--pg-weight", type=float, metavar="W",
                   help="weight of the REINFORCE surrogate of sampling producers (SAC)" + _d("pg_weight"))
    o.add_argument("--pg-momentum", type=float, metavar="M",
                   help="momentum of the REINFORCE moving-average baseline" + _d("pg_momentum"))
    o.add_argument("--pg-lr", type=float, metavar="LR",
                   help="learning rate of the parameters only the policy gradient trains (SAC's edge "
                        "predictor; default: --lr)")
    o.add_argument("--consistency-samples", type=int, metavar="S",
                   help="stochastic forward passes per step (dropout, DropNode, sampled edge sets); "
                        "S > 1 adds the consistency loss between them (GRAND)"
                        + _d("consistency_samples"))
    o.add_argument("--consistency-weight", type=float, metavar="W",
                   help="weight of the consistency loss" + _d("consistency_weight"))
    o.add_argument("--consistency-temperature", type=float, metavar="T",
                   help="sharpening temperature of the consistency target"
                        + _d("consistency_temperature"))
    o.add_argument("--patience", type=int, metavar="N",
                   help="stop after this many epochs without a better validation metric (0: never)"
                        + _d("patience"))
    o.add_argument("--select", choices=["metric", "loss"],
                   help="the epoch kept: the best validation metric, or the lowest validation loss "
                        "(patience counts from it)" + _d("select"))
    o.add_argument("--eval-every", type=int, metavar="N", help="evaluate every N epochs"
                   + _d("eval_every"))

    r = p.add_argument_group("running")
    r.add_argument("--seeds", type=int, nargs="+", metavar="S",
                   help="seeds to train, aggregated as mean ± std" + _d("seeds", task=False))
    r.add_argument("--out", metavar="DIR",
                   help="run folder (default: runs/<task>-<producer>, runs/<task>-<model> for a "
                        "preset); an existing run there is refused unless --overwrite or --resume")
    r.add_argument("--overwrite", action="store_true", default=None,
                   help="replace the run already in --out")
    r.add_argument("--resume", action="store_true", default=None,
                   help="continue the run in --out: finished seeds are kept, the others go on from "
                        "<out>/seed<k>/last.pt; a larger --epochs extends a finished run "
                        "(not with a cosine schedule)")
    r.add_argument("--data-root", metavar="DIR",
                   help="data root (default: $GRAPHATTN_DATA or ~/.cache/graphattn)")
    r.add_argument("--device", metavar="DEV", help="cpu, cuda or cuda:N" + _d("device", task=False))
    r.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: torch's choice)")
    r.add_argument("--time-budget", type=float, metavar="MIN",
                   help="stop training a seed after this many minutes, checked after every step "
                        "(results then depend on the machine's speed; prefer --epochs)")
    r.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress bar")
    r.add_argument("--show-config", action="store_true",
                   help="print the resolved configuration as JSON and exit")


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The run's configuration: the ``--config`` file, then the options given on the command line;
    ``out`` defaults to :func:`~graphattn.runner.config.default_out`. Every value is checked here,
    before any data is loaded: a bad one raises a ``ValueError`` naming the option (``--lr``) or,
    where it came from the file, the key and the file."""
    cfg: dict[str, Any] = load_config_file(args.config) if args.config else {}
    given = set()
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
            given.add(key)
    try:
        check_names(cfg)
        resolved = resolve_config(cfg)
        check_device(resolved["device"])
    except ConfigError as exc:
        if exc.key in given:
            raise ConfigError(exc.key, exc.problem, f"--{exc.key.replace('_', '-')}") from None
        if exc.key in cfg and args.config:
            raise ConfigError(exc.key, f"{exc.problem} (in config file {args.config})") from None
        raise
    if not cfg.get("out"):
        cfg["out"] = default_out(resolved)
    return cfg


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.show_config:
        print(json.dumps(resolve_config(cfg), indent=2))
        return 0
    from graphattn.runner.train import run_experiment

    argv = getattr(args, "_argv", None)  # the command, for 'graphattn table'
    res = run_experiment(cfg, command="graphattn " + shlex.join(argv) if argv else None)
    if not res["is_main"]:  # a torchrun rank other than 0: rank 0 reports
        return 0
    s = res["summary"]
    out = res["config"]["out"]
    print(f"\n{s['task']} ({res['task_notes']})")
    if out:
        with open(f"{out}/summary.md", encoding="utf-8") as f:
            print(f.read())
    print(f"{s['task']} test {s['metric']}: {s['test']} (validation {s['val']}, "
          f"{len(s['seeds'])} seed(s)); results in {out}")
    return 0


def check_names(cfg: dict[str, Any]) -> None:
    """The task, model, conv and producer names set in ``cfg``, checked before torch or any data is
    loaded (a :class:`ValueError` naming the option and the choices): against the built-in names,
    or the live registries where they are already imported (names registered from Python)."""
    tasks, models, producers = TASK_NAMES, MODEL_NAMES, PRODUCER_NAMES
    if "graphattn.runner.tasks" in sys.modules:
        tasks = tuple(sys.modules["graphattn.runner.tasks"].TASKS)
    if "graphattn.nn.registry" in sys.modules:
        models = tuple(sys.modules["graphattn.nn.registry"].MODELS)
    if "graphattn.producers.registry" in sys.modules:
        producers = tuple(sys.modules["graphattn.producers.registry"].PRODUCERS)
    for key, names in (("task", tasks), ("model", models)):
        value = cfg.get(key)
        if isinstance(value, str) and value not in names:  # a wrong type: resolve_config says so
            raise ConfigError(key, f"unknown {key} {value!r}; choose from {', '.join(names)}")
    conv = cfg.get("conv")
    if isinstance(conv, str) and conv != "none" and conv not in CONV_NAMES:
        raise ConfigError("conv", f"unknown conv {conv!r}; choose from none, {', '.join(CONV_NAMES)}")
    unknown = [n for n in producer_names(cfg.get("producer")) if n not in producers]
    if unknown:
        raise ConfigError("producer", f"unknown producer {unknown[0]!r}; choose from "
                                      f"{', '.join(producers)}")
