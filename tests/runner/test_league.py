"""``graphattn league``: every protocol and every entrant trains on tiny data (the shipped-config
rule of ``test_configs.py``), finished cells are reused, and the tables come from the run folders."""

from __future__ import annotations

import json

import pytest

from graphattn.__main__ import main as cli
from graphattn.runner.config import resolve_config
from graphattn.runner.league import (
    CPU_TIER,
    ENTRANTS,
    GPU_TIER,
    NOT_APPLICABLE,
    PAPER,
    PROTOCOLS,
    REFERENCES,
    TABLE_END,
    TABLE_START,
    league_config,
    league_table,
    replace_table_block,
    run_dir,
    run_league,
    table_block,
    task_validity,
)
from tests.runner.test_configs import tiny

#: the data-backed tasks: some entrants each (every entrant trains on ListOps, generated offline).
#: The Peptides protocol is the runner's Peptides defaults with 40 epochs (checked in
#: test_every_cell_resolves_to_a_valid_config); those defaults train in test_configs.py's
#: peptides_func and samsa_peptides_func runs, each a minute or more even at tiny size (RWSE).
#: On Cora (a linear node encoder, a residual, a one-layer head) the entrants whose producers have
#: parameters (SAMSA, Converter, SAC) or refuse attention dropout (Converter's operator) train;
#: Sliceformer is not applicable to a node task (NOT_APPLICABLE) and is skipped.
DATA_CELLS = {"fashion-mnist": ["exphormer", "sliceformer"],
              "cora": ["window+global", "sac", "samsa", "converter"],
              "citeseer": ["exphormer"]}


def _tiny_overrides(task: str, tmp_path, epochs: int | None = None) -> dict:
    """The protocol's config shrunk by ``test_configs.tiny`` (limit, short phases)."""
    small = tiny(league_config(task, "full", seeds=[0], out=tmp_path), tmp_path / "unused")
    keep = ("task_kwargs", "warmup_epochs", "epochs", "batch_size", "patience", "time_budget")
    over = {k: small[k] for k in keep}
    if epochs is not None:
        over["epochs"] = epochs
    return over


def _train(task: str, entrants: list[str], tmp_path, over: dict, **kw) -> dict:
    """``run_league`` cell by cell, SAC's warm start shrunk to 2 steps (as test_configs does) so
    that the tiny run crosses it."""
    status = {}
    for e in entrants:
        cell = dict(over)
        producer = ENTRANTS[e].get("producer")
        if isinstance(producer, dict) and producer.get("warm_start"):
            cell["producer"] = {**producer, "warm_start": 2}
        status.update(run_league([task], [e], seeds=[0], out=tmp_path, overrides=cell,
                                 progress=False, **kw))
    return status


ENTRANT_EXCEPTIONS = {("converter", "attn_dropout")}


def test_every_cell_resolves_to_a_valid_config(tmp_path):
    for task in PROTOCOLS:
        for entrant in ENTRANTS:
            cfg = league_config(task, entrant, seeds=[0, 1, 2], out=tmp_path)
            resolved = resolve_config(cfg)
            assert resolved["task"] == task and resolved["seeds"] == [0, 1, 2]
            assert cfg["out"] == str(run_dir(tmp_path, task, entrant))
            for key, value in PROTOCOLS[task].items():  # the protocol is shared by every entrant
                if key != "task_kwargs" and (entrant, key) not in ENTRANT_EXCEPTIONS:
                    assert resolved[key] == value, (task, entrant, key)
    # the one departure from a protocol: the Converter's operator edge set has no edges to drop
    overridden = {(e, k) for e, spec in ENTRANTS.items() for k in spec
                  if any(k in p for p in PROTOCOLS.values())}
    assert overridden == ENTRANT_EXCEPTIONS
    assert all(t in PROTOCOLS and e in ENTRANTS for e, t in PAPER)
    with pytest.raises(ValueError, match="'task' must be one of"):
        league_config("mnist", "full", seeds=[0], out=tmp_path)
    with pytest.raises(ValueError, match="'entrant' must be one of"):
        league_config("cora", "performer", seeds=[0], out=tmp_path)
    with pytest.raises(ValueError, match="'--set' must be a JSON object"):
        league_config("cora", "full", seeds=[0], out=tmp_path, overrides=[1])


def test_every_entrant_trains_on_listops_and_finished_cells_are_reused(tmp_path):
    over = _tiny_overrides("listops", tmp_path, epochs=2)  # the warm-up epoch, then the schedule
    entrants = list(ENTRANTS)
    status = _train("listops", entrants, tmp_path, over)
    assert set(status.values()) == {"trained"}, status
    again = _train("listops", entrants, tmp_path, over)
    assert set(again.values()) == {"reused"}
    # another protocol in the same folder is refused (named), unless --rerun replaces it
    other = {**over, "epochs": over["epochs"] + 1}
    with pytest.raises(ValueError, match=r"another configuration \(it differs in \['epochs'\]\)"):
        run_league(["listops"], ["window+global"], seeds=[0], out=tmp_path, overrides=other,
                   progress=False)
    failed = run_league(["listops"], ["window+global"], seeds=[0], out=tmp_path, overrides=other,
                        progress=False, keep_going=True)
    assert failed[("listops", "window+global")].startswith("failed: ValueError")
    # more seeds of the same protocol: the finished seed is kept, seed 1 is added (resumed)
    more = run_league(["listops"], ["window+global"], seeds=[0, 1], out=tmp_path, overrides=over,
                      progress=False)
    assert more == {("listops", "window+global"): "trained"}
    table = league_table(tmp_path, ["listops", "cora"], entrants)
    lines = table.splitlines()
    # a tiny full-attention run is at chance: the listops column is marked invalid, not hidden
    assert lines[0] == "| entrant | listops (invalid) | cora |" and len(lines) == 3 + len(entrants)
    full = next(line for line in lines if line.startswith("| full |"))
    assert "(1 seed)" in full and "[paper: 0.3637]" in full and "not run" in full
    window = next(line for line in lines if line.startswith("| window+global |"))
    assert "(2 seeds)" in window.split("|")[2]  # fewer than the league's 3 seeds: said
    for line in lines[2:-1]:
        test = line.split("|")[2].split()[0]
        assert 0.0 <= float(test) <= 1.0
    assert lines[-1].startswith("| *reference ≥ floor* | **invalid**: full 0.")
    assert lines[-1].endswith("< 0.30 | pending: reference full not run |")
    slice_row = next(line for line in lines if line.startswith("| sliceformer |"))
    assert "n/a: order-dependent" in slice_row.split("|")[3]


def test_task_validity_follows_the_reference_floors(tmp_path):
    def write(task, entrant, tests):
        folder = run_dir(tmp_path, task, entrant)
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text("{}")
        (folder / "results.jsonl").write_text("".join(
            json.dumps({"seed": i, "test": t}) + "\n" for i, t in enumerate(tests)))

    assert task_validity(tmp_path, "cora") == (None, "reference full not run")
    write("cora", "full", [0.56, 0.58])
    assert task_validity(tmp_path, "cora") == (None, "reference exphormer not run")
    write("cora", "exphormer", [0.76, 0.79])
    assert task_validity(tmp_path, "cora") == (False, "full 0.570 ≥ 0.55, exphormer 0.775 < 0.78")
    write("listops", "full", [0.31, 0.35])
    assert task_validity(tmp_path, "listops") == (True, "full 0.330 ≥ 0.30")
    assert set(REFERENCES) == set(PROTOCOLS)
    assert all(e in ENTRANTS for refs in REFERENCES.values() for e, _ in refs)


def test_order_dependent_entrants_are_not_applicable_to_node_tasks(tmp_path):
    """Sliceformer gives node r the r-th order statistic: refused by a node-level model, and the
    league skips the cell (it says why) instead of training it."""
    assert run_league(["cora"], ["sliceformer"], seeds=[0], out=tmp_path,
                      progress=False) == {("cora", "sliceformer"): "n/a"}
    assert not run_dir(tmp_path, "cora", "sliceformer").exists()
    for (entrant, task) in NOT_APPLICABLE:
        cfg = resolve_config(league_config(task, entrant, seeds=[0], out=tmp_path))
        assert cfg["task"] in ("cora", "citeseer")


@pytest.mark.parametrize("task", list(DATA_CELLS))
def test_every_protocol_trains_on_tiny_data(task, mirror, tmp_path):
    over = _tiny_overrides(task, tmp_path)
    status = _train(task, DATA_CELLS[task], tmp_path, over)
    assert set(status.values()) == {"trained"}, status
    for entrant in DATA_CELLS[task]:
        summary = json.loads((run_dir(tmp_path, task, entrant) / "summary.json").read_text())
        assert summary["task"] == task and summary["seeds"] == [0]


def test_command_writes_the_tables_and_reports_failed_cells(tmp_path, capsys):
    over = _tiny_overrides("listops", tmp_path, epochs=1)
    args = ["league", "--tasks", "listops", "--entrants", "full", "window+global", "--seeds", "0",
            "--out", str(tmp_path), "--set", json.dumps(over), "--no-progress"]
    assert cli(args) == 0
    text = (tmp_path / "league.md").read_text()
    assert "## League" in text and "## Runs" in text and "| full |" in text
    # the per-run table names the command that reproduces each cell (the protocol's changes too)
    assert "`graphattn league --tasks listops --entrants full --seeds 0 --out" in text
    assert "--set" in text and '"epochs": 1' in text
    assert cli([*args[:-1], "--table-only", "--table", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text() == text
    # a cell that fails (an option the task does not take) is reported, the others still run
    bad = {**over, "task_kwargs": {**over["task_kwargs"], "no_such_option": 1}}
    code = cli(["league", "--tasks", "listops", "--entrants", "full", "--seeds", "0", "--out",
                str(tmp_path / "bad"), "--set", json.dumps(bad), "--keep-going", "--no-progress"])
    assert code == 1
    assert "## Failed cells" in (tmp_path / "bad" / "league.md").read_text()
    capsys.readouterr()


def test_the_documented_league_tables_are_the_committed_folders():
    """README.md and docs/league.md carry the table ``graphattn league --table-only --out
    benchmarks/results/league --update-docs README.md docs/league.md`` writes from the committed
    run folders: regenerated here and compared."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = root / "benchmarks" / "results" / "league"
    table = league_table(out, list(PROTOCOLS), list(ENTRANTS))
    for doc in ("README.md", "docs/league.md"):
        assert table_block((root / doc).read_text(encoding="utf-8")) == table, doc
    from graphattn.runner.claims import claims_table
    from graphattn.runner.doc_tables import find_blocks
    from graphattn.runner.league import CLAIMS_END, CLAIMS_START

    blocks = find_blocks((root / "docs" / "league.md").read_text(encoding="utf-8"), CLAIMS_START,
                         CLAIMS_END)
    assert [b.body for b in blocks] == [claims_table(out)]
    from graphattn.runner.league import SEARCH_END, SEARCH_START
    from graphattn.runner.search import search_table

    blocks = find_blocks((root / "docs" / "league.md").read_text(encoding="utf-8"), SEARCH_START,
                         SEARCH_END)
    assert [b.body for b in blocks] == [search_table(out, list(PROTOCOLS), list(ENTRANTS))]


def test_the_gpu_tier_is_not_trained_without_tasks_and_says_so(tmp_path, monkeypatch, capsys):
    """``graphattn league`` without ``--tasks`` trains the CPU tier; the tables still show every
    task, a GPU-tier cell not run saying so."""
    import graphattn.runner.league as league

    trained: list = []
    monkeypatch.setattr(league, "run_league", lambda tasks, entrants, **kw: trained.append(tasks)
                        or {})
    assert cli(["league", "--entrants", "full", "--out", str(tmp_path), "--no-progress"]) == 0
    assert trained == [CPU_TIER] and "peptides-func" in GPU_TIER
    assert set(CPU_TIER) | set(GPU_TIER) == set(PROTOCOLS) and not set(CPU_TIER) & set(GPU_TIER)
    table = (tmp_path / "league.md").read_text()
    assert "not run (GPU tier)" in table and "reference full not run (GPU tier)" in table
    assert all(f" {t} " in table.splitlines()[2] for t in PROTOCOLS)
    capsys.readouterr()


def test_update_docs_rewrites_only_the_marked_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{TABLE_START} x -->\nold\n{TABLE_END}\nafter\n")
    over = _tiny_overrides("listops", tmp_path, epochs=1)
    assert cli(["league", "--tasks", "listops", "--entrants", "full", "--seeds", "0", "--out",
                str(tmp_path / "lg"), "--set", json.dumps(over), "--no-progress",
                "--update-docs", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"intro\n{TABLE_START} x -->\n| entrant | listops")
    assert text.endswith(f"{TABLE_END}\nafter\n") and "old" not in text
    assert table_block(text) == league_table(tmp_path / "lg", ["listops"], ["full"])
    with pytest.raises(ValueError, match="markers"):
        replace_table_block("no markers", "table")
