"""``graphattn league``: the five paper mechanisms and the static baselines under one protocol.

Every entrant is the same hybrid model (:class:`~graphattn.GraphTransformer`) of a task's
protocol with only its attention's edge set changed, trained for the same fixed number of epochs
with the same seeds, data, split, metric and model selection (validation). Each (task, entrant)
is one ``graphattn run`` folder, ``<out>/<task>/<entrant>``; a finished folder is reused
(``--rerun`` trains it again) and an unfinished one is resumed, so the command can be stopped and
started again. The league table (entrants × tasks, test metric mean ± sample std over the seeds,
the paper's own number beside each mechanism) and the per-run table
(:mod:`graphattn.runner.table`: parameters, epochs, time per seed and the command that reruns each
run) are written from the run folders, never typed by hand.

Protocols (:data:`PROTOCOLS`), sized so that the nine entrants × three seeds of one task train in a
few CPU hours, each with reference entrants that must learn (:data:`REFERENCES`; a column whose
reference falls below its floor is marked invalid in the table):

* ``listops``: LRA's generator (operators MIN, MAX, MED, SM; depth ≤ 10; ≤ 10 arguments) at
  shorter lengths, 50–200 tokens, with 10,000 training and 1,000 validation and test sequences,
  4 pre-norm layers of width 64, 4 heads, no local branch, 5 epochs (1 warm-up). LRA's own sizes
  (500–2000 tokens, 96k sequences) are the GPU tier: ``--set '{"task_kwargs": {"min_length": 500,
  "max_length": 2000, "num_train": 96000}}'``. Reference: ``full`` ≥ 0.30 (majority class 0.17);
* ``fashion-mnist``: 4×4 patches (49 nodes + a CLS node), 5000 training and 1000 validation images
  (the 10k test images), 3 pre-norm layers of width 64, 4 heads, no local branch, 6 epochs.
  Reference: ``full`` ≥ 0.72;
* ``peptides-func``: the LRGB set-up (GINE branch, RWSE-16, 4 layers of width 96, cosine schedule
  with warm-up, official split, macro AP) compressed to 40 epochs (2 warm-up). Reference:
  ``full`` ≥ 0.55 AP;
* ``cora``: the public Planetoid split with a GAT-sized model (2 layers, 8 heads of 8, ELU, dropout
  0.6 on the input, the attention and each branch, Adam at 0.005 with L2 5e-4, 200 epochs,
  patience 100) and, so that every node keeps its own features whatever the edge set, a linear
  node encoder, an identity residual around each attention and a one-layer head; no GCN branch,
  so the attention alone carries the graph. References: ``full`` ≥ 0.55 (the level of an MLP on
  the features) and ``exphormer`` ≥ 0.78. Sliceformer is not applicable to this node task
  (:data:`NOT_APPLICABLE`): its slot ``r`` receives the ``r``-th order statistic of each channel,
  not a value computed from node ``r``.

Entrants (:data:`ENTRANTS`): ``full``; ``window+global`` (a local window of 4 and the first node
as a global token); ``bigbird`` (3 random sources + the same window + global); ``exphormer``
(input edges + a 3-regular expander + a virtual node, with a learned attention bias per edge
origin and head: Exphormer's edge types, without which the attention cannot tell an input edge
from an expander edge); the paper mechanisms ``samsa`` (k = 32),
``sbm`` (the settings of ``examples/configs/sbm_*.toml``), ``sliceformer``, ``sac`` (the producer of
``examples/configs/sac_cora.toml``: one LSTM-predicted structure shared by the layers, greedy
decoding, 100 warm-start steps on the input edges, plus a self-loop per node: without the GCN
branch of that config a node that no predicted edge reaches would get no message at all, and the
GAT it is compared with attends to itself too) and ``converter``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path
from typing import Any

from graphattn.runner.cli import _json
from graphattn.runner.doc_tables import find_blocks, replace_blocks
from graphattn.runner.table import read_run, render

WINDOW = {"name": "window", "window": 4}
GLOBAL = {"name": "global", "positions": [0]}

#: task → the overrides every entrant shares (same model size, epochs, data)
PROTOCOLS: dict[str, dict[str, Any]] = {
    "listops": {
        "task": "listops",
        "task_kwargs": {"num_train": 10000, "num_val": 1000, "num_test": 1000, "min_length": 50,
                        "max_length": 200},
        "conv": "none", "layers": 4, "hidden": 64, "heads": 4, "epochs": 5, "warmup_epochs": 1,
        "batch_size": 32,
    },
    "fashion-mnist": {
        "task": "fashion-mnist",
        "task_kwargs": {"patch_size": 4, "num_train": 5000, "num_val": 1000, "cls": True},
        "conv": "none", "layers": 3, "hidden": 64, "heads": 4, "epochs": 6,
        # the 2-layer head without its batch norm, as the column's cells were trained (the
        # reference learns with it: full 0.743 against the 0.72 floor)
        "model_kwargs": {"head_norm": "none"},
    },
    "peptides-func": {
        "task": "peptides-func", "epochs": 40, "warmup_epochs": 2,
    },
    "cora": {
        "task": "cora", "conv": "none", "node_encoder": "linear", "head_layers": 1, "layers": 2,
        "hidden": 64, "heads": 8, "act": "elu", "dropout": 0.6, "attn_dropout": 0.6,
        "input_dropout": 0.6, "norm": "none", "residual": True, "ffn": False, "lr": 0.005,
        "weight_decay": 5e-4, "epochs": 200, "patience": 100,
    },
}

#: task → the reference entrants that must learn for the task's column to mean anything, with the
#: floor each must reach (mean test metric over the seeds); below it the column is marked invalid
REFERENCES: dict[str, tuple[tuple[str, float], ...]] = {
    "listops": (("full", 0.30),),          # majority class 0.17
    "fashion-mnist": (("full", 0.72),),
    "peptides-func": (("full", 0.55),),
    "cora": (("full", 0.55), ("exphormer", 0.78)),  # full: the level of an MLP on the features
}

#: entrant → the overrides that make it (its producer and what its training needs)
ENTRANTS: dict[str, dict[str, Any]] = {
    "full": {"producer": "full"},
    "window+global": {"producer": {"name": "union", "producers": [WINDOW, GLOBAL]}},
    "bigbird": {"producer": {"name": "union",
                             "producers": [{"name": "random", "k": 3}, WINDOW, GLOBAL]}},
    "exphormer": {"producer": {"name": "union", "producers": [
        "input", {"name": "expander", "degree": 3}, "virtual"], "origin_bias": True}},
    "samsa": {"producer": {"name": "samsa", "k": 32}},
    "sbm": {"producer": {"name": "sbm", "num_clusters": 128, "delta": 0.01, "reg_weight": 0.5},
            "aux_weight": 0.01},
    "sliceformer": {"producer": "sliceformer"},
    "sac": {"producer": {"name": "sac", "shared": True, "policy": "lstm", "alpha": 1,
                         "all_nodes": True, "distance": "input_graph", "max_distance": 3,
                         "decode": "greedy", "warm_start": 100, "self_loops": True}},
    # an operator edge set has no enumerated edges to drop: no attention dropout (Cora's 0.6)
    "converter": {"producer": "converter", "attn_dropout": 0.0},
}

#: (entrant, task) cells that are not trained, with the reason the table prints
NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("sliceformer", "cora"): "n/a: order-dependent (node r gets the r-th order statistic, not its "
                             "own value; see docs/league.md)",
}

#: the papers' own numbers on the same task (their protocols and sizes, not this one; LRA ListOps
#: trains on 96k sequences): (entrant, task) → text. Sources: the LRA and Sliceformer tables
#: (Transformer 36.37, BigBird 36.05, Sliceformer_ascend 37.65), SBM-Transformer 37.45, Converter
#: 60.38, SAMSA Table 1 (k = 128, hard), LRGB/GPS/Exphormer (Peptides-func AP), SAC (Cora).
PAPER: dict[tuple[str, str], str] = {
    ("full", "listops"): "0.3637",
    ("bigbird", "listops"): "0.3605",
    ("sbm", "listops"): "0.3745",
    ("converter", "listops"): "0.6038",
    ("sliceformer", "listops"): "0.3765",
    ("samsa", "listops"): "0.4113",
    ("full", "peptides-func"): "0.6535 (GPS)",
    ("exphormer", "peptides-func"): "0.6527",
    ("samsa", "peptides-func"): "0.7201",
    ("sac", "cora"): "0.848",
}


def run_dir(out: str | Path, task: str, entrant: str) -> Path:
    return Path(out) / task / entrant


def league_config(task: str, entrant: str, *, seeds: list[int], out: str | Path,
                  overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``graphattn run`` configuration of one (task, entrant) cell."""
    if task not in PROTOCOLS:
        raise ValueError(f"'task' must be one of {sorted(PROTOCOLS)}, got {task!r}")
    if entrant not in ENTRANTS:
        raise ValueError(f"'entrant' must be one of {list(ENTRANTS)}, got {entrant!r}")
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"'--set' must be a JSON object of config keys, got {overrides!r}")
    cfg = copy.deepcopy(PROTOCOLS[task])
    cfg.update(copy.deepcopy(ENTRANTS[entrant]))
    for key, value in (overrides or {}).items():
        if key == "task_kwargs":
            cfg["task_kwargs"] = {**cfg.get("task_kwargs", {}), **value}
        else:
            cfg[key] = value
    cfg["seeds"] = list(seeds)
    cfg["out"] = str(run_dir(out, task, entrant))
    return cfg


#: config keys that do not change what a run computes (the runner's resume rule: the seeds too,
#: since a finished seed is kept and a new one is added)
_HOW = ("resume", "overwrite", "progress", "out", "seeds", "threads")


def _earlier(folder: Path, cfg: dict[str, Any]) -> tuple[bool, bool, list[str]]:
    """``(exists, finished, differing keys)`` of the run in ``folder`` against ``cfg``: a run
    exists where ``config.json`` is; it is finished when ``summary.json`` lists every seed."""
    try:
        earlier = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False, False, []
    from graphattn.runner.config import resolve_config

    want = json.loads(json.dumps(resolve_config(cfg), default=str))
    diff = sorted(k for k in set(want) | set(earlier)
                  if k not in _HOW and want.get(k) != earlier.get(k))
    try:
        seeds = json.loads((folder / "summary.json").read_text()).get("seeds", [])
    except (OSError, ValueError):
        seeds = []
    return True, sorted(seeds) == sorted(cfg["seeds"]) and not diff, diff


def _tests(folder: Path) -> list[float]:
    """The test metric of every finished seed of the run in ``folder`` (empty: not run)."""
    try:
        results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()
                   if line.strip()]
        json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    return [float(r["test"]) for r in results]


#: seeds of a finished cell (``graphattn league``'s default); a cell with fewer says how many
LEAGUE_SEEDS = 3


def _cell(folder: Path, task: str, entrant: str) -> str:
    if (entrant, task) in NOT_APPLICABLE:
        return NOT_APPLICABLE[(entrant, task)]
    tests = _tests(folder)
    if not tests:
        return "not run"
    if len(tests) == 1:
        return f"{tests[0]:.3f} (1 seed)"
    cell = f"{statistics.mean(tests):.3f} ± {statistics.stdev(tests):.3f}"
    return cell if len(tests) >= LEAGUE_SEEDS else f"{cell} ({len(tests)} seeds)"


def task_validity(out: str | Path, task: str) -> tuple[bool | None, str]:
    """Whether ``task``'s column means anything: ``(True, why)`` when every reference entrant of
    :data:`REFERENCES` reaches its floor (mean test over its seeds), ``(False, why)`` when one
    falls below it, ``(None, why)`` while a reference has not run."""
    notes, valid = [], True
    for entrant, floor in REFERENCES.get(task, ()):
        tests = _tests(run_dir(out, task, entrant))
        if not tests:
            return None, f"reference {entrant} not run"
        mean = statistics.mean(tests)
        ok = mean >= floor
        valid = valid and ok
        notes.append(f"{entrant} {mean:.3f} {'≥' if ok else '<'} {floor:.2f}")
    return valid, ", ".join(notes) or "no reference"


def league_table(out: str | Path, tasks: list[str], entrants: list[str]) -> str:
    """Markdown: entrants × tasks (test mean ± std; the paper's number in brackets), and a last
    row saying for each task whether its reference entrants learned (:data:`REFERENCES`): a
    column whose reference falls below its floor is marked **invalid** (kept, not hidden)."""
    validity = {t: task_validity(out, t) for t in tasks}
    heads = [t + (" (invalid)" if validity[t][0] is False else "") for t in tasks]
    lines = ["| entrant | " + " | ".join(heads) + " |", "|---|" + "---|" * len(tasks)]
    for e in entrants:
        cells = []
        for t in tasks:
            cell = _cell(run_dir(out, t, e), t, e)
            if (e, t) in PAPER:
                cell += f" [paper: {PAPER[(e, t)]}]"
            cells.append(cell)
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    words = {True: "valid", False: "**invalid**", None: "pending"}
    lines.append("| *reference ≥ floor* | " + " | ".join(
        f"{words[v]}: {why}" for v, why in (validity[t] for t in tasks)) + " |")
    return "\n".join(lines) + "\n"


#: the lines around a league table in a document (``--update-docs`` rewrites what lies between)
TABLE_START = "<!-- league-table: generated by graphattn league --table-only"
TABLE_END = "<!-- /league-table -->"


def replace_table_block(text: str, table: str) -> str:
    """``text`` with the lines between each pair of its league-table markers replaced by ``table``."""
    return replace_blocks(text, TABLE_START, TABLE_END, lambda _: table)


def table_block(text: str) -> str:
    """What lies between the (first) league-table markers of ``text``."""
    blocks = find_blocks(text, TABLE_START, TABLE_END)
    if not blocks:
        raise ValueError(f"no '{TABLE_START} ... -->' / '{TABLE_END}' markers in the text")
    return blocks[0].body


def run_league(tasks: list[str], entrants: list[str], *, seeds: list[int], out: str | Path,
               overrides: dict[str, Any] | None = None, rerun: bool = False,
               threads: int | None = None, progress: bool = True,
               keep_going: bool = False) -> dict[tuple[str, str], str]:
    """Trains every (task, entrant) cell not finished yet; returns each cell's status
    (``"reused"``, ``"trained"`` or ``"failed: ..."`` with ``keep_going``)."""
    from graphattn.runner.train import run_experiment

    status: dict[tuple[str, str], str] = {}
    for task in tasks:
        for entrant in entrants:
            if (entrant, task) in NOT_APPLICABLE:
                status[(task, entrant)] = "n/a"
                continue
            cfg = league_config(task, entrant, seeds=seeds, out=out, overrides=overrides)
            folder = Path(cfg["out"])
            exists, finished, diff = _earlier(folder, cfg)
            if finished and not rerun:
                status[(task, entrant)] = "reused"
                continue
            cfg.update(threads=threads, progress=progress)
            if rerun:
                cfg["overwrite"] = True
            elif exists:
                cfg["resume"] = True  # the same protocol, unfinished: continue it
            try:
                if exists and diff and not rerun:
                    raise ValueError(f"{folder} holds a run of another configuration (it differs "
                                     f"in {diff}); pass --rerun to replace it, or choose "
                                     f"another --out")
                run_experiment(cfg)
            except Exception as exc:  # reported in the table with keep_going
                if not keep_going:
                    raise
                status[(task, entrant)] = f"failed: {type(exc).__name__}: {exc}"
                continue
            status[(task, entrant)] = "trained"
    return status


def cell_command(folder: Path, task: str, entrant: str, out: str | Path) -> str:
    """The ``graphattn league`` command that reproduces one finished cell (its seeds, and the
    ``--set`` changes of its configuration from the protocol, if any)."""
    import shlex

    results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()
               if line.strip()]
    seeds = sorted(int(r["seed"]) for r in results)
    ran = json.loads((folder / "config.json").read_text())
    from graphattn.runner.config import resolve_config

    base = json.loads(json.dumps(resolve_config(league_config(task, entrant, seeds=seeds,
                                                               out=out)), default=str))
    changed = {k: v for k, v in ran.items() if k not in _HOW and base.get(k) != v}
    cmd = ["graphattn", "league", "--tasks", task, "--entrants", entrant, "--seeds",
           *map(str, seeds)]
    if str(out) != "runs/league":
        cmd += ["--out", str(out)]
    if changed:
        cmd += ["--set", json.dumps(changed)]
    return shlex.join(cmd)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS),
                   metavar="TASK", help=f"tasks (default: all: {', '.join(PROTOCOLS)})")
    p.add_argument("--entrants", nargs="+", default=list(ENTRANTS), choices=list(ENTRANTS),
                   metavar="NAME", help=f"entrants (default: all: {', '.join(ENTRANTS)})")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(LEAGUE_SEEDS)), metavar="S",
                   help="seeds (default: 0 1 2)")
    p.add_argument("--out", default="runs/league", metavar="DIR",
                   help="folder of the run folders (default: runs/league)")
    p.add_argument("--set", dest="overrides", type=_json, default=None, metavar="JSON",
                   help="config keys changed for every cell, e.g. '{\"epochs\": 1}' (a smaller "
                        "protocol; its table is not the league's)")
    p.add_argument("--rerun", action="store_true", help="train finished cells again")
    p.add_argument("--keep-going", action="store_true",
                   help="a cell that fails is reported and the others still run")
    p.add_argument("--table-only", action="store_true",
                   help="train nothing; write the tables from the folders there are")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads per run")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")
    p.add_argument("--table", metavar="FILE",
                   help="also write the tables to FILE (default: <out>/league.md)")
    p.add_argument("--update-docs", nargs="+", default=[], metavar="DOC",
                   help="rewrite the league table between the '<!-- league-table ... -->' markers "
                        "of these documents (e.g. README.md docs/league.md)")


def main(args: argparse.Namespace) -> int:
    status: dict[tuple[str, str], str] = {}
    if not args.table_only:
        status = run_league(args.tasks, args.entrants, seeds=args.seeds, out=args.out,
                            overrides=args.overrides, rerun=args.rerun, threads=args.threads,
                            progress=args.progress, keep_going=args.keep_going)
    table = league_table(args.out, args.tasks, args.entrants)
    for doc in args.update_docs:
        path = Path(doc)
        path.write_text(replace_table_block(path.read_text(encoding="utf-8"), table),
                        encoding="utf-8")
    text = "## League (test metric, mean ± std over seeds)\n\n" + table
    rows = []
    for t in args.tasks:
        for e in args.entrants:
            folder = run_dir(args.out, t, e)
            if (folder / "summary.json").is_file():
                row = read_run(folder)
                rows.append({**row, "model": f"{e}: {row['model']}",
                             "command": cell_command(folder, t, e, args.out)})
    if rows:
        text += "\n## Runs\n\n" + render(rows)
    failed = {k: v for k, v in status.items() if v.startswith("failed")}
    if failed:
        text += "\n## Failed cells\n\n" + "".join(f"* {t} / {e}: {v}\n"
                                                  for (t, e), v in failed.items())
    path = Path(args.table) if args.table else Path(args.out) / "league.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(text, end="")
    return 1 if failed else 0
