"""``graphattn league --search``: the same budget for every entrant, every setting trains, the
choice goes by validation only, and ``--tuned`` trains the cell with the chosen setting."""

from __future__ import annotations

import copy
import json

import pytest

from graphattn.__main__ import main as cli
from graphattn.runner import league
from graphattn.runner.config import resolve_config
from graphattn.runner.league import ENTRANTS, PROTOCOLS, league_config, run_dir, run_league
from graphattn.runner.search import (
    MAX_SETTINGS,
    SEARCH,
    SEARCH_MARGIN,
    chosen,
    run_search,
    search_dir,
    search_table,
    setting_config,
)
from tests.runner.test_configs import tiny


@pytest.fixture
def tiny_listops(tmp_path, monkeypatch):
    """The ListOps protocol shrunk to tiny data (as ``test_configs.tiny``), SAC's warm start to 2
    steps in every setting, so that a run crosses it."""
    small = tiny(league_config("listops", "full", seeds=[0], out=tmp_path), tmp_path / "unused")
    keep = ("task", "task_kwargs", "conv", "layers", "hidden", "heads", "warmup_epochs", "epochs",
            "batch_size", "patience", "time_budget")
    protocol = {k: small[k] for k in keep if k in small}
    protocol["epochs"] = 2  # the warm-up epoch, then the schedule (SAC's 2-step warm start within)
    monkeypatch.setitem(PROTOCOLS, "listops", protocol)
    sac = []
    for s in SEARCH["sac"]:
        s = copy.deepcopy(s)
        if "producer" in s:
            s["producer"]["warm_start"] = 2
        sac.append(s)
    monkeypatch.setitem(ENTRANTS, "sac", {"producer": {**ENTRANTS["sac"]["producer"],
                                                       "warm_start": 2}})
    monkeypatch.setitem(SEARCH, "sac", tuple(sac))
    return tmp_path


def test_every_entrant_gets_the_same_budget_with_its_default_first():
    assert set(SEARCH) == set(ENTRANTS)
    for entrant, settings in SEARCH.items():
        assert len(settings) == MAX_SETTINGS and settings[0] == {}, entrant
        resolved = [json.dumps(resolve_config(setting_config(task, entrant, i, seeds=[0],
                                                             out="unused")), sort_keys=True,
                               default=str)
                    for task in PROTOCOLS for i in range(len(settings))]
        assert len(set(resolved)) == len(resolved), f"{entrant}: two settings are the same run"


def test_a_setting_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"'setting' of 'samsa' must be an int in \[0, 4\)"):
        setting_config("cora", "samsa", 4, seeds=[0], out="unused")


def test_every_setting_trains_and_the_default_is_the_league_cell(tiny_listops):
    out = tiny_listops
    entrants = list(ENTRANTS)
    run_league(["listops"], entrants, seeds=[0], out=out, progress=False)
    status = run_search(["listops"], entrants, out=out, progress=False)
    assert {s for (_, _, i), s in status.items() if i == 0} == {"reused"}  # the league cells
    assert {s for (_, _, i), s in status.items() if i > 0} == {"trained"}, status
    assert not search_dir(out, "listops", "full", 0).exists()
    again = run_search(["listops"], entrants, out=out, progress=False)
    assert set(again.values()) == {"reused"}
    table = search_table(out, ["listops"], entrants)
    for entrant in entrants:
        best = chosen(out, "listops", entrant)
        assert best is not None
        row = next(line for line in table.splitlines() if line.startswith(f"| {entrant} |"))
        assert row.split("|")[2].split(" / ")[best].strip().startswith("**")


def test_settings_split_an_entrants_search_between_processes(tiny_listops, capsys):
    out = tiny_listops
    run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False)
    first = run_search(["listops"], ["window+global"], out=out, progress=False, settings=[3, 1])
    assert first == {("listops", "window+global", 1): "trained",
                     ("listops", "window+global", 3): "trained"}
    assert not search_dir(out, "listops", "window+global", 2).exists()
    # the rest, as another process would: the finished settings are reused, not retrained
    rest = run_search(["listops"], ["window+global"], out=out, progress=False)
    assert rest == {("listops", "window+global", 0): "reused",
                    ("listops", "window+global", 1): "reused",
                    ("listops", "window+global", 2): "trained",
                    ("listops", "window+global", 3): "reused"}
    with pytest.raises(ValueError, match=r"'settings' must be setting indices in \[0, 4\), got "
                                         r"\[4\]"):
        run_search(["listops"], ["window+global"], out=out, progress=False, settings=[4])
    with pytest.raises(ValueError, match="'settings' must be setting indices"):
        run_search(["listops"], ["window+global"], out=out, progress=False, settings=[])
    capsys.readouterr()
    base = ["league", "--tasks", "listops", "--entrants", "window+global", "--out", str(out)]
    assert cli([*base, "--settings", "2"]) == 2  # not without --search
    assert "--settings picks settings of the tuning search: it needs --search" in \
        capsys.readouterr().err
    assert cli([*base, "--search", "--table-only", "--settings", "2"]) == 2
    assert "--table-only trains nothing" in capsys.readouterr().err
    assert cli([*base, "--search", "--settings", "2", "--no-progress"]) == 0  # reused


def _write(folder, cfg, val, test):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(resolve_config(cfg), default=str))
    (folder / "results.jsonl").write_text(json.dumps(
        {"seed": 0, "val": val, "test": test, "metric": "accuracy"}) + "\n")
    (folder / "summary.json").write_text(json.dumps({"seeds": [0]}))


def test_the_choice_goes_by_validation_and_a_tie_keeps_the_default(tmp_path):
    vals = [0.50, 0.60, 0.55, 0.60]
    for i, val in enumerate(vals):
        folder = search_dir(tmp_path / "a", "cora", "samsa", i)
        _write(folder, setting_config("cora", "samsa", i, seeds=[0], out=folder), val,
               test=1.0 - val)  # the test metric would choose otherwise: it is never read
    assert chosen(tmp_path / "a", "cora", "samsa") == 1
    # without a search folder of its own, setting 0's result is the default league cell's
    for i, val in enumerate(vals[1:], start=1):
        folder = search_dir(tmp_path, "cora", "samsa", i)
        _write(folder, setting_config("cora", "samsa", i, seeds=[0], out=folder), val,
               test=1.0 - val)
    assert chosen(tmp_path, "cora", "samsa") is None
    cell = run_dir(tmp_path, "cora", "samsa")
    _write(cell, league_config("cora", "samsa", seeds=[0], out=tmp_path), 0.60, test=0.0)
    assert chosen(tmp_path, "cora", "samsa") == 0  # a tie keeps the default
    # a lead under SEARCH_MARGIN keeps the default too: one seed cannot tell it apart
    for i, val in enumerate([0.50, 0.505, 0.509, 0.40]):
        folder = search_dir(tmp_path / "b", "cora", "samsa", i)
        _write(folder, setting_config("cora", "samsa", i, seeds=[0], out=folder), val, test=0.5)
    assert SEARCH_MARGIN == 0.01 and chosen(tmp_path / "b", "cora", "samsa") == 0
    assert chosen(tmp_path, "cora", "sac") is None  # not run
    table = search_table(tmp_path, ["cora"], ["samsa", "sliceformer"])
    assert "| samsa | **0.600** / 0.600 / 0.550 / 0.600 |" in table
    assert "| sliceformer | n/a |" in table and '1: `{"producer":{"name":"samsa","k":8}}`' in table


def test_tuned_trains_the_chosen_setting_and_says_how_to_reproduce_it(tiny_listops, capsys):
    out = tiny_listops
    with pytest.raises(ValueError, match=r"the search of listops / window\+global has not "
                                         r"finished"):
        run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False,
                   tuned=True)
    for i, val in enumerate([0.1, 0.2, 0.9, 0.3]):
        folder = search_dir(out, "listops", "window+global", i)
        _write(folder, setting_config("listops", "window+global", i, seeds=[0], out=folder), val,
               test=0.5)
    assert run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False,
                      tuned=True) == {("listops", "window+global"): "trained"}
    ran = json.loads((run_dir(out, "listops", "window+global") / "config.json").read_text())
    assert ran["producer"]["producers"][0] == {"name": "window", "window": 8}
    command = league.cell_command(run_dir(out, "listops", "window+global"), "listops",
                                  "window+global", out)
    assert '"window": 8' in command and "--set" in command
    # --search and its table from the CLI; --set is refused with it
    assert cli(["league", "--search", "--table-only", "--tasks", "listops", "--entrants",
                "window+global", "--out", str(out)]) == 0
    assert "**0.900**" in (out / "search.md").read_text()
    capsys.readouterr()
    assert cli(["league", "--search", "--tasks", "listops", "--out", str(out), "--set",
                '{"epochs": 1}']) == 2
    assert "it takes no --set, --seeds or --tuned" in capsys.readouterr().err
    assert cli(["league", "--search", "--tasks", "listops", "--out", str(out), "--seeds", "1"]) == 2
    capsys.readouterr()


def test_tuned_replaces_a_default_cell_and_the_search_keeps_its_default(tiny_listops):
    """A default cell whose search chose another setting is retrained with it; the default's seed
    0 moves to the search's setting 0 first, so the choice still stands afterwards."""
    out = tiny_listops
    run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False)
    default_val = json.loads((run_dir(out, "listops", "window+global") / "results.jsonl")
                             .read_text())["val"]
    for i in (1, 2, 3):
        folder = search_dir(out, "listops", "window+global", i)
        _write(folder, setting_config("listops", "window+global", i, seeds=[0], out=folder),
               2.0 if i == 2 else -1.0, test=0.5)  # setting 2 beats any accuracy
    assert chosen(out, "listops", "window+global") == 2
    assert run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False,
                      tuned=True) == {("listops", "window+global"): "trained"}
    kept = json.loads((search_dir(out, "listops", "window+global", 0) / "results.jsonl")
                      .read_text())
    assert kept["val"] == default_val and chosen(out, "listops", "window+global") == 2
    assert "(setting 2)" in league.league_table(out, ["listops"], ["window+global"])
    assert run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False,
                      tuned=True) == {("listops", "window+global"): "reused"}


def _mark_chosen(out, entrant, setting, val=2.0):
    """Makes ``setting``'s search seed the best on validation, in ``results.jsonl`` and in its
    ``seed0/result.json`` (whose configuration stays), so a copy of it can be told from a rerun."""
    folder = search_dir(out, "listops", entrant, setting)
    row = json.loads((folder / "results.jsonl").read_text())
    (folder / "results.jsonl").write_text(json.dumps({**row, "val": val}) + "\n")
    saved = json.loads((folder / "seed0" / "result.json").read_text())
    saved["result"]["val"] = val
    (folder / "seed0" / "result.json").write_text(json.dumps(saved))


def _seed_vals(folder):
    return {r["seed"]: r["val"] for r in map(json.loads, (folder / "results.jsonl").read_text()
                                             .splitlines())}


def test_tuned_starts_from_the_search_seed_of_its_setting_and_trains_the_others(tiny_listops):
    """The search's run of the chosen setting is seed 0 of the tuned cell (the same configuration
    and seed): it is copied, not trained again; the other seeds train; ``--rerun`` trains all."""
    out = tiny_listops
    run_league(["listops"], ["window+global"], seeds=[0, 1], out=out, progress=False)
    run_search(["listops"], ["window+global"], out=out, progress=False)
    _mark_chosen(out, "window+global", 2)
    assert chosen(out, "listops", "window+global") == 2
    cell = run_dir(out, "listops", "window+global")
    assert run_league(["listops"], ["window+global"], seeds=[0, 1], out=out, progress=False,
                      tuned=True) == {("listops", "window+global"): "trained"}
    vals = _seed_vals(cell)
    assert vals[0] == 2.0 and 0.0 <= vals[1] <= 1.0  # seed 0 copied, seed 1 trained
    ran = json.loads((cell / "config.json").read_text())
    assert ran["producer"]["producers"][0] == {"name": "window", "window": 8}
    assert json.loads((cell / "summary.json").read_text())["seeds"] == [0, 1]
    assert chosen(out, "listops", "window+global") == 2  # the default's seed 0 was kept
    assert run_league(["listops"], ["window+global"], seeds=[0, 1], out=out, progress=False,
                      tuned=True) == {("listops", "window+global"): "reused"}
    run_league(["listops"], ["window+global"], seeds=[0, 1], out=out, progress=False,
               tuned=True, rerun=True)
    assert _seed_vals(cell)[0] <= 1.0  # --rerun trains seed 0 again


def test_tuned_leaves_a_cell_of_another_setting_to_be_refused(tiny_listops):
    """A cell trained with another non-default setting is not the search's to replace: the
    trainer refuses it (naming what differs) and nothing in it is removed."""
    out = tiny_listops
    run_search(["listops"], ["window+global"], out=out, progress=False)
    cell = run_dir(out, "listops", "window+global")
    run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False,
               overrides=SEARCH["window+global"][1])
    before = (cell / "results.jsonl").read_text()
    _mark_chosen(out, "window+global", 3)
    with pytest.raises(ValueError, match="holds a run of another configuration"):
        run_league(["listops"], ["window+global"], seeds=[0], out=out, progress=False,
                   tuned=True)
    assert (cell / "results.jsonl").read_text() == before


def test_a_setting_goes_over_the_entrant_and_under_nothing_else(monkeypatch):
    """A setting's keys replace the entrant's and the protocol's (read at call time)."""
    monkeypatch.setitem(SEARCH, "converter", ({}, {"attn_dropout": 0.2}))
    cfg = setting_config("cora", "converter", 1, seeds=[0], out="x")
    assert cfg["attn_dropout"] == 0.2 and ENTRANTS["converter"]["attn_dropout"] == 0.0
    assert cfg["lr"] == PROTOCOLS["cora"]["lr"] and cfg["out"] == "x"
