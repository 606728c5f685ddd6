"""The five papers' claims, each tested on the league cells of the task that fits it.

Every row of :func:`claims_table` is computed from the committed run folders: the entrant's test
metric and its reference's (mean ± sample std over the seeds), the difference of the means, Welch's
t-test p-value, and a status: **shown** when the entrant's mean reaches the reference's plus the
claim's margin, **not shown** when it does not, *pending* while a cell has fewer than the league's
seeds (or is the GPU tier), *not testable* when the task's reference column is invalid. The
diagnosis of a claim not shown is prose in ``docs/league.md``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from graphattn.runner.compare import welch_p
from graphattn.runner.protocols import (
    ENTRANTS,
    GPU_TIER,
    LEAGUE_SEEDS,
    cell_results,
    run_dir,
    task_validity,
)


@dataclass(frozen=True)
class Claim:
    """One paper claim on one task: ``entrant`` ≥ ``reference`` + ``margin`` (test metric means).
    ``reference`` is a league entrant, or a run folder relative to the league folder's parent
    (e.g. ``citation/cora-gat``: GAT as the citation benchmark trains it)."""

    paper: str
    entrant: str
    claim: str
    task: str
    reference: str
    margin: float = 0.0


CLAIMS: tuple[Claim, ...] = (
    Claim("SAMSA", "samsa", "≥ full attention", "listops", "full"),
    Claim("SAMSA", "samsa", "≥ full attention", "peptides-func", "full"),
    Claim("SBM-Transformer", "sbm", "≥ full attention at a lower edge density", "listops", "full"),
    Claim("SBM-Transformer", "sbm", "≥ full attention at a lower edge density", "fashion-mnist",
          "full"),
    Claim("Sliceformer", "sliceformer", "≥ full attention", "fashion-mnist", "full"),
    Claim("Sliceformer", "sliceformer", "≥ full attention", "listops", "full"),
    Claim("SAC", "sac", "≥ GAT (its paper's table)", "cora", "citation/cora-gat"),
    Claim("SAC", "sac", "≥ GAT (its paper's table)", "citeseer", "citation/citeseer-gat"),
    Claim("Converter", "converter", "≥ full attention + 10 points", "listops", "full", 0.10),
)


def _folder(out: str | Path, claim: Claim, entrant: str) -> Path:
    if entrant in ENTRANTS:
        return run_dir(out, claim.task, entrant)
    return Path(out).resolve().parent / entrant


def _first_layer_density(results: list[dict]) -> float | None:
    dens = [r["edge_stats"][0]["density"] for r in results
            if r.get("edge_stats") and "density" in r["edge_stats"][0]]
    return statistics.mean(dens) if dens else None


def _summary(tests: list[float]) -> str:
    if len(tests) == 1:
        return f"{tests[0]:.3f} (1 seed)"
    return f"{statistics.mean(tests):.3f} ± {statistics.stdev(tests):.3f} ({len(tests)})"


def evaluate(out: str | Path, claim: Claim) -> dict[str, str]:
    """One claim's row: ``entrant``, ``reference``, ``difference``, ``p``, ``status``."""
    mine = cell_results(_folder(out, claim, claim.entrant))
    ref = cell_results(_folder(out, claim, claim.reference))
    a = [float(r["test"]) for r in mine]
    b = [float(r["test"]) for r in ref]
    row = {"entrant": _summary(a) if a else "not run", "reference": _summary(b) if b else "not run",
           "difference": "", "p": "", "status": ""}
    if len(a) >= 2 and len(b) >= 2:
        row["difference"] = f"{statistics.mean(a) - statistics.mean(b):+.3f}"
        p = welch_p(a, b)
        row["p"] = "" if p is None else f"{p:.2g}"
    valid, _ = task_validity(out, claim.task)
    if len(a) < LEAGUE_SEEDS or len(b) < LEAGUE_SEEDS:
        row["status"] = "pending (GPU tier)" if claim.task in GPU_TIER else "pending"
    elif valid is False:
        row["status"] = "not testable: the task's reference is under its floor"
    else:
        shown = statistics.mean(a) >= statistics.mean(b) + claim.margin
        row["status"] = "**shown**" if shown else "**not shown**"
    density = _first_layer_density(mine) if claim.entrant == "sbm" else None
    if density is not None:
        row["status"] += f" (first-layer density {density:.2f})"
    return row


def claims_table(out: str | Path) -> str:
    """Markdown: one row per claim (:data:`CLAIMS`), from the run folders under ``out``."""
    lines = ["| paper | claim | task | mechanism, test (seeds) | reference | test (seeds) | "
             "difference | Welch p | status |", "|---|---|---|---|---|---|---|---|---|"]
    for c in CLAIMS:
        r = evaluate(out, c)
        ref = c.reference if "/" not in c.reference else f"GAT (`{c.reference}`)"
        lines.append(f"| {c.paper} | {c.claim} | {c.task} | {r['entrant']} | {ref} | "
                     f"{r['reference']} | {r['difference']} | {r['p']} | {r['status']} |")
    return "\n".join(lines) + "\n"
