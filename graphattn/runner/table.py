"""``graphattn table RUN_DIR ...``: one results table from finished runs.

Each run folder (written by ``graphattn run``) gives one row, read from its ``summary.json``,
``results.jsonl`` and ``config.json`` — nothing is typed by hand: the task, the model and its
producer, the seeds, the test and validation metric as mean ± sample standard deviation over the
seeds, the parameter count, the epochs each seed ran (and the epoch budget), the mean training
time per seed, and the command that made the run (recorded by ``graphattn run`` in
``summary.json``; for a run started from Python, ``graphattn run --config <run>/config.json``,
which reruns its resolved configuration). Markdown by default (``--format csv`` for a
spreadsheet); ``--out FILE`` writes it to a file.

A results table in the documentation sits between ``<!-- results-table: RUN_DIR ... -->`` and
``<!-- /results-table -->``, the marker naming its run folders (relative to the repository root);
``graphattn table --update-docs DOC ...`` rewrites every such block from its folders, and a test
regenerates each one and compares. ``--against REF_DIR`` gives a comparison table instead (each
run against the reference, with Welch's t-test on test and validation; ``graphattn.runner.compare``),
and ``--update-docs`` rewrites ``<!-- comparison-table: REF_DIR RUN_DIR ... -->`` blocks too.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

from graphattn.runner.doc_tables import find_blocks, replace_blocks

COLUMNS = ("task", "model", "seeds", "test", "val", "params", "epochs", "time / seed (s)",
           "command")


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


def render(rows: list[dict[str, Any]], fmt: str = "markdown") -> str:
    """``rows`` (from :func:`read_run`) as a Markdown or CSV table."""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    if fmt != "markdown":
        raise ValueError(f"'format' must be 'markdown' or 'csv', got {fmt!r}")

    def cell(key: str, value: Any) -> str:
        text = str(value).replace("|", "\\|")
        return f"`{text}`" if key == "command" and text else text

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(k, r[k]) for k in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


#: the lines around a results table in a document (``--update-docs`` rewrites what lies between)
DOC_START = "<!-- results-table:"
DOC_END = "<!-- /results-table -->"


def doc_tables(text: str) -> list[tuple[list[str], str]]:
    """``(run folders, table)`` of every results-table block in a document's ``text``."""
    return [(b.args.split(), b.body) for b in find_blocks(text, DOC_START, DOC_END)]


def table_of(runs: list[str], root: str | Path = ".") -> str:
    """The Markdown table of the run folders ``runs`` (relative to ``root``), every one finished."""
    return render([read_run(Path(root) / r) for r in runs])


def update_doc_tables(text: str, root: str | Path = ".") -> str:
    """``text`` with every results-table block rewritten from its run folders."""
    return replace_blocks(text, DOC_START, DOC_END, lambda b: table_of(b.args.split(), root))


def update_docs(text: str, root: str | Path = ".") -> str:
    """``text`` with every results-table and comparison-table block rewritten from its folders; a
    :class:`ValueError` when it has neither kind."""
    from graphattn.runner.compare import DOC_START as COMPARE_START
    from graphattn.runner.compare import update_comparison_tables

    has_results = bool(doc_tables(text))
    has_comparisons = any(line.startswith(COMPARE_START) for line in text.splitlines())
    if not (has_results or has_comparisons):
        raise ValueError(f"no '{DOC_START} ... -->' or '{COMPARE_START} ... -->' markers to put a "
                         f"table between")
    if has_results:
        text = update_doc_tables(text, root)
    return update_comparison_tables(text, root) if has_comparisons else text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="*", metavar="RUN_DIR", help="folders written by 'graphattn run'")
    p.add_argument("--update-docs", nargs="+", metavar="DOC",
                   help="rewrite every '<!-- results-table: RUN_DIR ... -->' block of each DOC from "
                        "the folders its marker names (relative to the current folder)")
    p.add_argument("--against", metavar="REF_DIR",
                   help="a comparison table: each RUN_DIR against the run in REF_DIR (difference "
                        "of the means and Welch's t-test p-value, on test and on validation)")
    p.add_argument("--format", choices=["markdown", "csv"], default="markdown",
                   help="table format (default: markdown)")
    p.add_argument("--out", metavar="FILE", help="write the table to FILE (default: print it)")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "update_docs", None):  # a Namespace built in Python may leave it out
        if args.runs:
            raise ValueError("--update-docs takes its run folders from each block's marker; give "
                             "no RUN_DIR with it")
        if getattr(args, "against", None):
            raise ValueError("--update-docs takes the reference from each comparison block's "
                             "marker; give no --against with it")
        for doc in args.update_docs:
            path = Path(doc)
            path.write_text(update_docs(path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if not args.runs:
        raise ValueError("give the run folders (RUN_DIR ...) or --update-docs DOC ...")
    if getattr(args, "against", None):
        from graphattn.runner.compare import comparison_rows
        from graphattn.runner.compare import render as render_comparison

        if args.format != "markdown":
            raise ValueError("--against writes a Markdown table; leave out --format csv")
        table = render_comparison(comparison_rows(args.against, args.runs))
        if args.out:
            Path(args.out).write_text(table, encoding="utf-8")
        else:
            print(table, end="")
        return 0
    rows, unfinished = [], []
    for run in args.runs:
        try:
            rows.append(read_run(run))
        except (FileNotFoundError, ValueError) as exc:  # listed, not fatal: another may be running
            unfinished.append(f"{run}: {exc}")
    if not rows:
        raise ValueError("no finished run among the folders given:\n  " + "\n  ".join(unfinished))
    table = render(rows, args.format)
    if unfinished and args.format == "markdown":
        table += "\nUnfinished (left out):\n\n" + "".join(f"* {u}\n" for u in unfinished)
    if args.out:
        Path(args.out).write_text(table, encoding="utf-8")
    else:
        print(table, end="")
    return 0
