"""The league's protocols, entrants and run folders (:mod:`graphattn.runner.league` trains them).

Every entrant is the same hybrid model of a task's protocol with only its attention's edge set
changed; each (task, entrant) cell is one ``graphattn run`` folder, ``<out>/<task>/<entrant>``.

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
* ``peptides-func`` (the GPU tier, :data:`GPU_TIER`: not trained by default): the LRGB set-up
  (GINE branch, RWSE-16, 4 layers of width 96, cosine schedule with warm-up, official split,
  macro AP) compressed to 40 epochs (2 warm-up). Reference: ``full`` ≥ 0.55 AP;
* ``cora``: the public Planetoid split with a GAT-sized model (2 layers, 8 heads of 8, ELU, dropout
  0.6 on the input, the attention and each branch, Adam at 0.005 with L2 5e-4, 200 epochs,
  patience 100) and, so that every node keeps its own features whatever the edge set, a linear
  node encoder, an identity residual around each attention and a one-layer head; no GCN branch,
  so the attention alone carries the graph. References: ``full`` ≥ 0.55 (the level of an MLP on
  the features) and ``exphormer`` ≥ 0.78. Sliceformer is not applicable to this node task
  (:data:`NOT_APPLICABLE`): its slot ``r`` receives the ``r``-th order statistic of each channel,
  not a value computed from node ``r``;
* ``citeseer``: the Cora protocol on CiteSeer. References: ``full`` ≥ 0.55 (an MLP on the
  features: 0.565) and ``exphormer`` ≥ 0.61: the level of attention over the input edges under
  this protocol (0.6305, seeds 0–1) less 0.02; the protocol costs that edge set 8.6 points against
  GAT's own set-up on CiteSeer (``benchmarks/results/cpu-2026-11-29/citeseer_floor/``).

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

import copy
import json
import statistics
from pathlib import Path
from typing import Any

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
#: CiteSeer: the Cora protocol on the second citation graph (SAC's paper reports both)
PROTOCOLS["citeseer"] = {**copy.deepcopy(PROTOCOLS["cora"]), "task": "citeseer"}

#: task → why its protocol is the GPU tier: its cells are not trained by a CPU league (an
#: unfinished cell prints "GPU tier" in the table), and ``graphattn league`` without ``--tasks``
#: trains the other tasks (:data:`CPU_TIER`)
GPU_TIER: dict[str, str] = {
    "peptides-func": "about 8.5 min per epoch on one CPU core for the full entrant (10,873 "
                     "training graphs), so 40 epochs × 27 cells ≈ 150 CPU hours; a schedule that "
                     "fits 2–3 hours (≈ 250 steps per cell) stays far under the 0.55 AP floor",
}

#: the tasks a CPU league trains by default (every task but the GPU tier)
CPU_TIER: list[str] = [t for t in PROTOCOLS if t not in GPU_TIER]

#: task → the reference entrants that must learn for the task's column to mean anything, with the
#: floor each must reach (mean test metric over the seeds); below it the column is marked invalid
REFERENCES: dict[str, tuple[tuple[str, float], ...]] = {
    "listops": (("full", 0.30),),          # majority class 0.17
    "fashion-mnist": (("full", 0.72),),
    "peptides-func": (("full", 0.55),),
    "cora": (("full", 0.55), ("exphormer", 0.78)),  # full: the level of an MLP on the features
    # full: an MLP on the features reaches 0.565 (benchmarks/planetoid_mlp.py); exphormer: attention
    # over the input edges under this protocol reaches 0.6305, less 0.02 (cpu-2026-11-29/citeseer_floor)
    "citeseer": (("full", 0.55), ("exphormer", 0.61)),
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
    ("sliceformer", "cora"): "n/a: order-dependent (see docs/league.md)",
}
NOT_APPLICABLE[("sliceformer", "citeseer")] = NOT_APPLICABLE[("sliceformer", "cora")]

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
    ("sac", "citeseer"): "0.738",
}


def run_dir(out: str | Path, task: str, entrant: str) -> Path:
    return Path(out) / task / entrant


def league_config(task: str, entrant: str, *, seeds: list[int], out: str | Path,
                  overrides: dict[str, Any] | None = None,
                  setting: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``graphattn run`` configuration of one (task, entrant) cell: the protocol, the
    entrant, its tuning ``setting`` (:data:`graphattn.runner.search.SEARCH`) and ``overrides``."""
    if task not in PROTOCOLS:
        raise ValueError(f"'task' must be one of {sorted(PROTOCOLS)}, got {task!r}")
    if entrant not in ENTRANTS:
        raise ValueError(f"'entrant' must be one of {list(ENTRANTS)}, got {entrant!r}")
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"'--set' must be a JSON object of config keys, got {overrides!r}")
    cfg = copy.deepcopy(PROTOCOLS[task])
    cfg.update(copy.deepcopy(ENTRANTS[entrant]))
    cfg.update(copy.deepcopy(setting or {}))
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


def earlier_run(folder: Path, cfg: dict[str, Any]) -> tuple[bool, bool, list[str]]:
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


def cell_results(folder: Path) -> list[dict[str, Any]]:
    """The result row of every finished seed of the run in ``folder`` (``results.jsonl``, which
    the runner writes with ``summary.json``; empty: not run)."""
    try:
        results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()
                   if line.strip()]
        json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    return results


def cell_tests(folder: Path) -> list[float]:
    """The test metric of every finished seed of the run in ``folder`` (empty: not run)."""
    return [float(r["test"]) for r in cell_results(folder)]


def train_folder(cfg: dict[str, Any], *, rerun: bool, threads: int | None,
                 progress: bool) -> None:
    """Trains the run ``cfg`` into its folder ``cfg["out"]``: resumed where the folder holds the
    same configuration, replaced with ``rerun``, refused (naming the differing keys) where it
    holds another one."""
    from graphattn.runner.train import run_experiment

    folder = Path(cfg["out"])
    exists, _, diff = earlier_run(folder, cfg)
    if exists and diff and not rerun:
        raise ValueError(f"{folder} holds a run of another configuration (it differs in {diff}); "
                         f"pass --rerun to replace it, or choose another --out")
    cfg = {**cfg, "threads": threads, "progress": progress}
    if rerun:
        cfg["overwrite"] = True
    elif exists:
        cfg["resume"] = True  # the same configuration, unfinished: continue it
    run_experiment(cfg)


#: seeds of a finished cell (``graphattn league``'s default); a cell with fewer says how many
LEAGUE_SEEDS = 3


def task_validity(out: str | Path, task: str) -> tuple[bool | None, str]:
    """Whether ``task``'s column means anything: ``(True, why)`` when every reference entrant of
    :data:`REFERENCES` reaches its floor (mean test over its seeds), ``(False, why)`` when one
    falls below it, ``(None, why)`` while a reference has not run."""
    notes, valid = [], True
    for entrant, floor in REFERENCES.get(task, ()):
        tests = cell_tests(run_dir(out, task, entrant))
        if not tests:
            tier = " (GPU tier)" if task in GPU_TIER else ""
            return None, f"reference {entrant} not run{tier}"
        mean = statistics.mean(tests)
        ok = mean >= floor
        valid = valid and ok
        notes.append(f"{entrant} {mean:.3f} {'≥' if ok else '<'} {floor:.2f}")
    return valid, ", ".join(notes) or "no reference"
