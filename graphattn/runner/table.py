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
from pathlib import Path
from typing import Any

from graphattn.runner.compare import DOC_START as COMPARE_START
from graphattn.runner.compare import comparison_rows, doc_comparisons, update_comparison_tables
from graphattn.runner.compare import render as render_comparison
from graphattn.runner.doc_tables import find_blocks, replace_blocks
from graphattn.runner.run_row import read_run

COLUMNS = ("task", "model", "seeds", "test", "val", "params", "epochs", "time / seed (s)",
           "command")


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
    has_results = bool(doc_tables(text))
    has_comparisons = bool(doc_comparisons(text))
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
