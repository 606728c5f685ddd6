"""The papers' claims table: each row's status follows from the run folders (shown, not shown,
pending, not testable), with the reference a league entrant or a citation-benchmark folder."""

from __future__ import annotations

import json
from pathlib import Path

from graphattn.runner.claims import CLAIMS, Claim, claims_table, evaluate
from graphattn.runner.league import ENTRANTS, PROTOCOLS, REFERENCES, run_dir


def write(folder: Path, tests: list[float], **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(
        json.dumps({"seed": i, "test": t, "val": t, **extra}) + "\n" for i, t in enumerate(tests)))
    (folder / "summary.json").write_text(json.dumps({"seeds": list(range(len(tests)))}))


def test_every_claim_names_a_league_cell_and_a_reference():
    for c in CLAIMS:
        assert c.entrant in ENTRANTS and c.task in PROTOCOLS
        assert c.reference in ENTRANTS or c.reference.startswith("citation/")
    assert {c.paper for c in CLAIMS} == {"SAMSA", "SBM-Transformer", "Sliceformer", "SAC",
                                         "Converter"}


def test_status_follows_the_means_the_margin_and_the_seeds(tmp_path):
    out = tmp_path / "league"
    write(run_dir(out, "fashion-mnist", "full"), [0.74, 0.73, 0.76])
    write(run_dir(out, "fashion-mnist", "sliceformer"), [0.78, 0.79, 0.79])
    shown = evaluate(out, Claim("S", "sliceformer", "≥ full", "fashion-mnist", "full"))
    assert shown["status"] == "**shown**" and shown["difference"] == "+0.043"
    assert 0 < float(shown["p"]) < 0.05
    # the same numbers fall short of a 10-point margin
    margin = evaluate(out, Claim("S", "sliceformer", "≥ full + 10", "fashion-mnist", "full", 0.10))
    assert margin["status"] == "**not shown**"
    # SBM: not shown, with the first layer's sampled density said
    write(run_dir(out, "fashion-mnist", "sbm"), [0.66, 0.65, 0.67],
          edge_stats=[{"density": 0.2}, {"density": 0.1}])
    sbm = evaluate(out, Claim("SBM", "sbm", "≥ full", "fashion-mnist", "full"))
    assert sbm["status"] == "**not shown** (first-layer density 0.20)"
    # fewer than the league's seeds: pending, the numbers still shown
    write(run_dir(out, "listops", "full"), [0.43, 0.44, 0.42])
    write(run_dir(out, "listops", "converter"), [0.30, 0.31])
    pending = evaluate(out, Claim("C", "converter", "≥ full + 10", "listops", "full", 0.10))
    assert pending["status"] == "pending" and pending["entrant"] == "0.305 ± 0.007 (2)"
    gpu = evaluate(out, Claim("SAMSA", "samsa", "≥ full", "peptides-func", "full"))
    assert gpu["status"] == "pending (GPU tier)" and gpu["entrant"] == "not run"


def test_an_invalid_reference_column_makes_a_claim_not_testable(tmp_path):
    floor = dict(REFERENCES["listops"])["full"]
    write(run_dir(tmp_path, "listops", "full"), [floor - 0.1] * 3)
    write(run_dir(tmp_path, "listops", "sliceformer"), [0.5] * 3)
    row = evaluate(tmp_path, Claim("S", "sliceformer", "≥ full", "listops", "full"))
    assert row["status"].startswith("not testable")


def test_a_citation_folder_is_the_reference_of_sac(tmp_path):
    out = tmp_path / "results" / "league"
    write(run_dir(out, "cora", "sac"), [0.60, 0.58, 0.59])
    write(tmp_path / "results" / "citation" / "cora-gat", [0.82, 0.84] * 5)
    write(run_dir(out, "cora", "full"), [0.59] * 3)
    write(run_dir(out, "cora", "exphormer"), [0.79] * 3)
    row = evaluate(out, Claim("SAC", "sac", "≥ GAT", "cora", "citation/cora-gat"))
    assert row["reference"] == "0.830 ± 0.011 (10)" and row["status"] == "**not shown**"
    table = claims_table(out)
    assert table.count("\n") == 2 + len(CLAIMS)
    assert "| SAC | ≥ GAT (its paper's table) | cora | 0.590 ± 0.010 (3) | GAT " in table
