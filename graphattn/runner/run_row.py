"""One row of a results table from a finished ``graphattn run`` folder (:func:`read_run`): the
task, the model and its producer, the seeds, the test and validation metric as mean ± sample
standard deviation over the seeds, the parameter count, the epochs, the training time per seed and
the command that made the run. ``graphattn table`` (results tables), ``graphattn table --against``
(comparisons) and ``graphattn league`` (the per-run table) read their folders through it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def _mean_std(values: list[float], digits: int = 4) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _seeds(seeds: list[int]) -> str:
    """``0–9 (10)`` for consecutive seeds, else the list."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}–{seeds[-1]} ({len(seeds)})"
    return ", ".join(str(s) for s in seeds)


def _producer(spec: Any) -> str:
    if spec is None:
        return ""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict) and spec.get("name") == "union" and isinstance(spec.get("producers"),
                                                                             list):
        options = [f"{k}={json.dumps(v)}" for k, v in spec.items() if k not in ("name", "producers")]
        return "union(" + ", ".join([*(_producer(p) for p in spec["producers"]), *options]) + ")"
    if isinstance(spec, dict):
        args = ", ".join(f"{k}={json.dumps(v)}" for k, v in spec.items() if k != "name")
        return f"{spec.get('name', 'custom')}({args})" if args else str(spec.get("name", "custom"))
    return json.dumps(spec)


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """One row of the table from a finished run folder; :class:`FileNotFoundError` names a file
    that is missing (an unfinished or foreign folder)."""
    run = Path(run_dir)
    for name in ("summary.json", "results.jsonl", "config.json"):
        if not (run / name).is_file():
            raise FileNotFoundError(f"{run} has no {name}: not a finished 'graphattn run' folder")
    summary = json.loads((run / "summary.json").read_text())
    results = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()
               if line.strip()]
    config = json.loads((run / "config.json").read_text())
    if not results:
        raise ValueError(f"{run}/results.jsonl holds no result")
    model = summary.get("model", "hybrid")
    producer = _producer(summary.get("producer"))
    if model == "hybrid":
        conv = config.get("conv")
        model = (f"{conv} + {producer}" if conv not in (None, "none") and producer
                 else producer or str(conv))
    elif producer:
        model = f"{model} ({producer})"
    if int(config.get("consistency_samples", 1)) > 1:
        model += (f", consistency training ({config['consistency_samples']} passes, weight "
                  f"{config.get('consistency_weight')})")
    if config.get("loader") == "neighbor":
        hops = config.get("num_neighbors") or [10] * int(config.get("layers", 1))
        model += f", NeighborLoader {hops} × {config.get('batch_size')} seeds"
    processes = max(int(r.get("processes", 1)) for r in results)
    # the recorded command line, or one that reruns the resolved configuration exactly
    command = summary.get("command") or f"graphattn run --config {run / 'config.json'}"
    if processes > 1 and command:
        command = f"{command} ({processes} processes)"
    epochs_run = [int(r["epochs_run"]) for r in results]
    budget = config.get("epochs")
    epochs = (str(epochs_run[0]) if len(set(epochs_run)) == 1
              else " / ".join(str(e) for e in epochs_run))
    if budget is not None and any(e != budget for e in epochs_run):
        epochs += f" (of {budget})"
    metric = summary.get("metric", results[0].get("metric", ""))
    return {
        "task": f"{summary['task']} ({metric})" if metric else summary["task"],
        "model": model,
        "seeds": _seeds([int(r["seed"]) for r in results]),
        "test": _mean_std([float(r["test"]) for r in results]),
        "val": _mean_std([float(r["val"]) for r in results]),
        "params": f"{int(results[0]['params']):,}",
        "epochs": epochs,
        "time / seed (s)": f"{statistics.mean(float(r['train_time_s']) for r in results):.0f}",
        "command": command,
    }
