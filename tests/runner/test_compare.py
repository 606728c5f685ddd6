"""``graphattn table --against``: runs against a reference, with Welch's t-test, read from folders."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from graphattn.__main__ import main as cli_main
from graphattn.runner.compare import (
    changes,
    comparison_of,
    comparison_rows,
    difference,
    doc_comparisons,
)
from graphattn.runner.table import update_docs

ROOT = Path(__file__).resolve().parents[2]


def _folder(root: Path, name: str, tests: list[float], vals: list[float], task: str = "cora",
            **config) -> Path:
    """A finished run folder as ``graphattn run`` writes it (summary, results, config)."""
    run = root / name
    run.mkdir()
    cfg = {"task": task, "model": "hybrid", "conv": "gcn", "producer": "input", "hidden": 64,
           "epochs": 10, **config}
    (run / "config.json").write_text(json.dumps(cfg))
    (run / "summary.json").write_text(json.dumps({"task": task, "model": cfg["model"],
                                                  "producer": cfg["producer"],
                                                  "metric": "accuracy", "command": f"run {name}"}))
    (run / "results.jsonl").write_text("".join(
        json.dumps({"seed": s, "metric": "accuracy", "test": t, "val": v, "params": 1000,
                    "epochs_run": 10, "train_time_s": 1.0}) + "\n"
        for s, (t, v) in enumerate(zip(tests, vals, strict=True))))
    return run


def _welch_p(a: list[float], b: list[float]) -> float:
    """Welch's two-sided p-value written out: t on the Welch–Satterthwaite degrees of freedom."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return 2 * stats.t.sf(abs(t), dof)


def test_each_run_is_compared_with_the_reference_on_test_and_validation(tmp_path):
    ref = _folder(tmp_path, "ref", [0.80, 0.82, 0.81], [0.79, 0.80, 0.78])
    run = _folder(tmp_path, "run", [0.84, 0.83, 0.85, 0.86], [0.80, 0.81, 0.79, 0.80],
                  hidden=128, producer={"name": "samsa", "k": 16})
    rows = comparison_rows(ref, [run])
    assert rows[0]["test − ref (Welch p)"] == "reference"
    assert rows[0]["differs from the reference"] == "reference"
    p_test = _welch_p([0.84, 0.83, 0.85, 0.86], [0.80, 0.82, 0.81])
    p_val = _welch_p([0.80, 0.81, 0.79, 0.80], [0.79, 0.80, 0.78])
    assert rows[1]["test − ref (Welch p)"] == f"+0.0350 (p = {p_test:.2g})"
    assert rows[1]["val − ref (Welch p)"] == f"+0.0100 (p = {p_val:.2g})"
    assert rows[1]["differs from the reference"] == (
        'hidden=128, producer={"name": "samsa", "k": 16}')
    assert rows[1]["test"] == "0.8450 ± 0.0129" and rows[1]["seeds"] == "0–3 (4)"
    table = comparison_of(["ref", "run"], tmp_path)
    assert table.splitlines()[0].startswith("| task | model | differs from the reference |")
    assert len(table.splitlines()) == 4


def test_how_a_run_was_made_is_no_difference(tmp_path):
    ref = _folder(tmp_path, "ref", [0.8, 0.9], [0.8, 0.9], seeds=[0, 1], threads=1, out="a")
    run = _folder(tmp_path, "run", [0.8, 0.9], [0.8, 0.9], seeds=[0, 1, 2], threads=2, out="b",
                  resume=True)
    assert changes(run, ref) == ""


@pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")  # scipy, on a side of equal values
def test_the_test_is_left_out_where_it_is_undefined():
    assert difference([0.8], [0.7, 0.75]) == "+0.0750"  # one seed on a side
    assert difference([0.8, 0.8], [0.7, 0.7]) == "+0.1000"  # no spread on either side
    assert difference([0.8, 0.9], [0.7, 0.7]).startswith("+0.1500 (p = ")


def test_runs_of_different_tasks_are_refused(tmp_path):
    ref = _folder(tmp_path, "ref", [0.8, 0.9], [0.8, 0.9])
    run = _folder(tmp_path, "run", [0.8, 0.9], [0.8, 0.9], task="citeseer")
    with pytest.raises(ValueError, match="different tasks"):
        comparison_rows(ref, [run])
    with pytest.raises(ValueError, match="reference folder and at least one run"):
        comparison_of(["ref"], tmp_path)
    with pytest.raises(FileNotFoundError, match="not a finished"):
        comparison_rows(ref, [tmp_path])


def test_the_command_line_and_the_documents(tmp_path, capsys, monkeypatch):
    _folder(tmp_path, "ref", [0.80, 0.82, 0.81], [0.79, 0.80, 0.78])
    _folder(tmp_path, "run", [0.84, 0.83, 0.85], [0.80, 0.81, 0.79])
    monkeypatch.chdir(tmp_path)
    assert cli_main(["table", "--against", "ref", "run"]) == 0
    expected = comparison_of(["ref", "run"], tmp_path)
    assert capsys.readouterr().out == expected
    assert cli_main(["table", "--against", "ref", "run", "--format", "csv"]) != 0
    assert "--format csv" in capsys.readouterr().err

    doc = tmp_path / "doc.md"
    doc.write_text("a\n<!-- comparison-table: ref run -->\nold\n<!-- /comparison-table -->\n"
                   "<!-- results-table: run -->\nold\n<!-- /results-table -->\nb\n")
    assert cli_main(["table", "--update-docs", str(doc)]) == 0
    text = doc.read_text()
    assert doc_comparisons(text) == [(["ref", "run"], expected)]
    assert "old" not in text and text.startswith("a\n") and text.endswith("b\n")
    with pytest.raises(ValueError, match="comparison-table"):
        update_docs("no block", tmp_path)
    assert cli_main(["table", "--update-docs", str(doc), "--against", "ref"]) != 0
    assert "no --against" in capsys.readouterr().err


def test_every_documented_comparison_is_its_committed_folders():
    """Each comparison table in the README and docs/ is what ``graphattn table --update-docs``
    writes from the committed run folders its marker names."""
    blocks = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for folders, body in doc_comparisons(doc.read_text(encoding="utf-8")):
            assert body == comparison_of(folders, ROOT), (doc.name, folders)
            blocks += 1
    assert blocks >= 1
