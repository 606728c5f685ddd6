"""``graphattn table``: the results table is read from the run folders, never typed."""

from __future__ import annotations

import json
import statistics

import pytest

from graphattn.__main__ import main as cli_main
from graphattn.runner.table import read_run, render


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


def test_table_refuses_a_folder_without_a_finished_run(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match=r"summary\.json"):
        read_run(tmp_path)
    assert cli_main(["table", str(tmp_path)]) != 0
    assert "not a finished" in capsys.readouterr().err
    with pytest.raises(ValueError, match="format"):
        render([], "html")


def test_producer_labels_keep_every_option():
    from graphattn.runner.table import _producer

    spec = {"name": "union", "producers": ["input", {"name": "expander", "degree": 3}, "virtual"],
            "origin_bias": True}
    assert _producer(spec) == "union(input, expander(degree=3), virtual, origin_bias=true)"
    assert _producer({"name": "union", "producers": ["input", "virtual"]}) == "union(input, virtual)"
    assert _producer({"name": "samsa", "k": 32}) == "samsa(k=32)" and _producer("full") == "full"
