"""Comparison tables: finished runs against a reference run, with Welch's t-test.

``graphattn table --against REF_DIR RUN_DIR ...`` (and a document block
``<!-- comparison-table: REF_DIR RUN_DIR ... -->`` … ``<!-- /comparison-table -->``, rewritten by
``graphattn table --update-docs``) gives one row per folder, the reference first: the task, the
model, the seeds, the parameter count, and for the test metric and the validation metric (the one
the checkpoint is chosen on) the mean ± sample standard deviation over the seeds, and for each
other run the difference of the means to the reference, ``Δ = mean(run) − mean(ref)``, with the
two-sided p-value of Welch's unequal-variance t-test,

    t = Δ / sqrt(s_run² / n_run + s_ref² / n_ref),

on the Welch–Satterthwaite degrees of freedom (``scipy.stats.ttest_ind(equal_var=False)``). The
seeds are treated as independent samples of each configuration; a p-value is left blank when a
side has one seed or both sides have no spread (the test is undefined there).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from scipy import stats

from graphattn.runner.config import DEFAULTS
from graphattn.runner.doc_tables import find_blocks, replace_blocks
from graphattn.runner.folders import _run_config
from graphattn.runner.run_row import read_run

COLUMNS = ("task", "model", "differs from the reference", "seeds", "params", "test",
           "test − ref (Welch p)", "val", "val − ref (Welch p)")

#: the lines around a comparison table in a document (``--update-docs`` rewrites what lies between)
DOC_START = "<!-- comparison-table:"
DOC_END = "<!-- /comparison-table -->"


def _settings(run: Path) -> dict[str, Any]:
    """What the run computes: its ``config.json`` over the defaults, without how it was run."""
    return _run_config({**DEFAULTS, **json.loads((run / "config.json").read_text())})


def changes(run: Path, reference: Path) -> str:
    """``head_layers=3, hidden=275``: the settings in which ``run`` differs from ``reference``."""
    mine, ref = _settings(run), _settings(reference)
    return ", ".join(f"{k}={json.dumps(mine.get(k))}" for k in sorted(set(mine) | set(ref))
                     if mine.get(k) != ref.get(k))


def _metric(run: Path, key: str) -> list[float]:
    lines = (run / "results.jsonl").read_text().splitlines()
    return [float(json.loads(line)[key]) for line in lines if line.strip()]


def welch_p(values: list[float], reference: list[float]) -> float | None:
    """Welch's two-sided p-value of ``values`` against ``reference``; ``None`` where the test is
    undefined (fewer than two values on a side, or no spread on either)."""
    if len(values) < 2 or len(reference) < 2:
        return None
    if statistics.stdev(values) == 0 and statistics.stdev(reference) == 0:
        return None
    return float(stats.ttest_ind(values, reference, equal_var=False).pvalue)


def difference(values: list[float], reference: list[float]) -> str:
    """``+0.0091 (p = 0.097)``: the difference of the means, and :func:`welch_p` where defined."""
    diff = f"{statistics.mean(values) - statistics.mean(reference):+.4f}"
    p = welch_p(values, reference)
    return diff if p is None else f"{diff} (p = {p:.2g})"


def comparison_rows(reference: str | Path, runs: list[str | Path]) -> list[dict[str, str]]:
    """One row per folder, ``reference`` first (its difference cells say ``reference``)."""
    ref = Path(reference)
    rows = []
    for run in [ref, *map(Path, runs)]:
        base = read_run(run)  # checks the folder is a finished run
        row = {k: base[k] for k in ("task", "model", "seeds", "params", "test", "val")}
        row["differs from the reference"] = "reference" if run == ref else changes(run, ref)
        for key in ("test", "val"):
            row[f"{key} − ref (Welch p)"] = ("reference" if run == ref else
                                             difference(_metric(run, key), _metric(ref, key)))
        rows.append(row)
    if len({r["task"] for r in rows}) > 1:
        raise ValueError(f"--against: the runs are of different tasks or metrics "
                         f"({', '.join(sorted({r['task'] for r in rows}))}); compare runs of one task")
    return rows


def render(rows: list[dict[str, str]]) -> str:
    """``rows`` (from :func:`comparison_rows`) as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[k]).replace("|", "\\|") for k in COLUMNS) + " |"
              for r in rows]
    return "\n".join(lines) + "\n"


def comparison_of(folders: list[str], root: str | Path = ".") -> str:
    """The Markdown comparison table of ``folders`` (the reference first, relative to ``root``)."""
    if len(folders) < 2:
        raise ValueError(f"a comparison table needs a reference folder and at least one run, got "
                         f"{folders}")
    base = Path(root)
    return render(comparison_rows(base / folders[0], [base / f for f in folders[1:]]))


def doc_comparisons(text: str) -> list[tuple[list[str], str]]:
    """``(folders, table)`` of every comparison-table block in a document's ``text``."""
    return [(b.args.split(), b.body) for b in find_blocks(text, DOC_START, DOC_END)]


def update_comparison_tables(text: str, root: str | Path = ".") -> str:
    """``text`` with every comparison-table block rewritten from its folders."""
    return replace_blocks(text, DOC_START, DOC_END, lambda b: comparison_of(b.args.split(), root))
