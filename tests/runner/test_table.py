"""``graphattn table``: the results table is read from the run folders, never typed."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from graphattn.__main__ import main as cli_main
from graphattn.runner.table import doc_tables, read_run, render, table_of, update_doc_tables

ROOT = Path(__file__).resolve().parents[2]


def test_table_rows_come_from_the_runs(mirror, tmp_path, capsys):
    out = tmp_path / "mutag-run"
    args = ["run", "--task", "mutag", "--layers", "1", "--hidden", "8", "--heads", "2", "--epochs",
            "2", "--seeds", "0", "1", "--out", str(out), "--no-progress"]
    assert cli_main(args) == 0
    capsys.readouterr()
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    row = read_run(out)
    tests = [r["test"] for r in results]
    assert row["test"] == f"{statistics.mean(tests):.4f} ± {statistics.stdev(tests):.4f}"
    assert row["seeds"] == "0, 1" and row["task"] == "mutag (accuracy)"
    assert row["command"] == "graphattn " + " ".join(args[:-3]) + f" --out {out} --no-progress"
    assert row["params"] == f"{results[0]['params']:,}" and row["epochs"] == "2"

    assert cli_main(["table", str(out), "--out", str(tmp_path / "t.md")]) == 0
    md = (tmp_path / "t.md").read_text()
    assert md.splitlines()[0].startswith("| task | model | seeds | test |")
    assert row["test"] in md and f"`{row['command']}`" in md
    assert cli_main(["table", str(out), "--format", "csv"]) == 0
    assert row["test"] in capsys.readouterr().out

    # a documented table: the marker names the folders, --update-docs rewrites only the block
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- results-table: mutag-run -->\nold\n<!-- /results-table -->\nend\n")
    assert update_doc_tables(doc.read_text(), tmp_path) == (
        "intro\n<!-- results-table: mutag-run -->\n" + render([row]) + "<!-- /results-table -->\nend\n")
    with pytest.raises(ValueError, match="no '<!-- results-table:"):
        update_doc_tables("no block", tmp_path)


def test_table_refuses_a_folder_without_a_finished_run(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"summary\.json"):
        read_run(tmp_path)
    assert cli_main(["table", str(tmp_path)]) != 0
    assert "not a finished" in capsys.readouterr().err
    with pytest.raises(ValueError, match="format"):
        render([], "html")


def test_producer_labels_keep_every_option():
    from graphattn.runner.run_row import _producer

    spec = {"name": "union", "producers": ["input", {"name": "expander", "degree": 3}, "virtual"],
            "origin_bias": True}
    assert _producer(spec) == "union(input, expander(degree=3), virtual, origin_bias=true)"
    assert _producer({"name": "union", "producers": ["input", "virtual"]}) == "union(input, virtual)"
    assert _producer({"name": "samsa", "k": 32}) == "samsa(k=32)" and _producer("full") == "full"


def test_a_consistency_trained_model_is_named_so():
    """Two runs of one model, one of them with consistency training, get different labels."""
    row = read_run(ROOT / "benchmarks" / "results" / "citation" / "cora-consistency")
    assert row["model"] == ("gcn + input(self_loops=true), consistency training (4 passes, "
                            "weight 1.5)")
    assert read_run(ROOT / "benchmarks" / "results" / "citation" / "cora-hybrid")["model"] == \
        "gcn + input(self_loops=true)"


def test_every_documented_results_table_is_its_committed_folders():
    """Each results table in the README and docs/ sits between ``<!-- results-table: RUN_DIR ...
    -->`` markers and is what ``graphattn table`` writes from those committed run folders
    (``graphattn table --update-docs README.md docs/*.md`` rewrites them)."""
    blocks = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for runs, body in doc_tables(doc.read_text(encoding="utf-8")):
            assert runs, doc
            assert body == table_of(runs, ROOT), (doc.name, runs)
            blocks += 1
    assert blocks >= 1
