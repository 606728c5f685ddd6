"""Train and evaluate a model on a benchmark task (default: Cora with a hybrid model)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from graphattn.runner.config import DEFAULTS, load_config_file
from graphattn.runner.tasks import TASKS


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r} ({exc})") from None


def _producer(text: str) -> Any:
    """A producer name, or JSON for a mapping/list."""
    return _json(text) if text.strip()[:1] in "[{" else text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="JSON or TOML file with any of the keys below")
    p.add_argument("--task", choices=sorted(TASKS), help="benchmark task (default: cora)")
    p.add_argument("--task-kwargs", type=_json, help="task options as JSON, e.g. '{\"num_train\": 500}'")
    p.add_argument("--producer", type=_producer, help="producer name or JSON spec")
    p.add_argument("--producer-kwargs", type=_json, help="producer arguments as JSON")
    p.add_argument("--model", help="registered model: hybrid (default) or a mechanism preset")
    p.add_argument("--model-kwargs", type=_json, help="extra model arguments as JSON")
    p.add_argument("--conv", help="local MPNN: gcn, gin, gine, gat, sage, resgated or none")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--dropout", type=float)
    p.add_argument("--attn-dropout", type=float)
    p.add_argument("--input-dropout", type=float)
    p.add_argument("--norm", help="layer_norm, batch_norm, a PyG norm name, or none")
    p.add_argument("--norm-first", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--ffn-ratio", type=int)
    p.add_argument("--act", help="activation (relu, elu, gelu, ...)")
    p.add_argument("--node-encoder", help="default (the task's), none, linear, atom or embedding")
    p.add_argument("--residual", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--ffn", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--head-layers", type=int)
    p.add_argument("--pe", help="laplacian, random_walk or position")
    p.add_argument("--pe-dim", type=int)
    p.add_argument("--optimizer", choices=["adam", "adamw"])
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--scheduler", choices=["none", "cosine"])
    p.add_argument("--warmup-epochs", type=int)
    p.add_argument("--grad-clip", type=float)
    p.add_argument("--aux-weight", type=float)
    p.add_argument("--pg-weight", type=float)
    p.add_argument("--pg-momentum", type=float, help="momentum of the REINFORCE moving-average "
                   "baseline")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--out", help="run directory (default: runs/<task>-<producer>)")
    p.add_argument("--data-root", help="data root (default: $GRAPHATTN_DATA or ~/.cache/graphattn)")
    p.add_argument("--device")
    p.add_argument("--time-budget", type=float, help="minutes of training per seed")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--patience", type=int, help="stop after this many epochs without a better "
                   "validation metric")
    p.add_argument("--threads", type=int)
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from <out>/seed<k>/last.pt where it exists")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None)


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    cfg: dict[str, Any] = load_config_file(args.config) if args.config else {}
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
    if not cfg.get("out"):
        prod = cfg.get("producer", "default")
        name = prod if isinstance(prod, str) else (prod.get("name", "custom") if isinstance(prod, dict)
                                                   else "custom")
        cfg["out"] = f"runs/{cfg.get('task', DEFAULTS['task'])}-{name}"
    return cfg


def main(args: argparse.Namespace) -> int:
    from graphattn.runner.train import run_experiment

    cfg = config_from_args(args)
    try:
        res = run_experiment(cfg)
    except ValueError as exc:
        print(f"graphattn run: error: {exc}", file=sys.stderr)
        return 2
    s = res["summary"]
    out = res["config"]["out"]
    print(f"\n{s['task']} ({res['task_notes']})")
    print((open(f"{out}/summary.md").read()) if out else "")
    print(f"{s['task']} test {s['metric']}: {s['test']} (validation {s['val']}, "
          f"{len(s['seeds'])} seed(s)); results in {out}")
    return 0
