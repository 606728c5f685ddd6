"""``graphattn league --search``: the same tuning budget for every entrant, chosen on validation.

Every entrant, the static edge sets included, has at most :data:`MAX_SETTINGS` settings of its own
knobs (:data:`SEARCH`); the first is the league's default (``{}``). Each setting trains on the
search seed (:data:`SEARCH_SEEDS`) of a task's protocol into ``<out>/search/<task>/<entrant>/<i>``
(the default's run is the league cell itself when that cell holds the seed: the same
configuration). The chosen setting has the best validation metric of the seed, provided it beats
the default's by :data:`SEARCH_MARGIN` (else the default stays; a tie goes to the lower index);
the test metric is never read to choose.

``graphattn league --tuned`` then trains each cell with its chosen setting (:func:`chosen`), and
the per-run table's command shows the setting as the ``--set`` that reproduces the cell.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from graphattn.runner.protocols import (
    ENTRANTS,
    NOT_APPLICABLE,
    cell_results,
    earlier_run,
    league_config,
    run_dir,
    train_folder,
)

#: the most settings an entrant is given (its default included): the same budget for all
MAX_SETTINGS = 4
#: the seeds each setting trains on
SEARCH_SEEDS = [0]
#: how much a setting's validation metric must beat the default's to replace it: one seed cannot
#: tell smaller differences apart (on Cora's 500 validation nodes 0.01 is 5 nodes; a 0.002 lead
#: chosen without it lowered Exphormer's 3-seed test mean from 0.788 to 0.769)
SEARCH_MARGIN = 0.01


def _window_global(window: int) -> dict[str, Any]:
    return {"producer": {"name": "union", "producers": [
        {"name": "window", "window": window}, {"name": "global", "positions": [0]}]}}


def _bigbird(k: int, window: int) -> dict[str, Any]:
    return {"producer": {"name": "union", "producers": [
        {"name": "random", "k": k}, {"name": "window", "window": window},
        {"name": "global", "positions": [0]}]}}


def _exphormer(degree: int, virtual: bool = True, origin_bias: bool = True) -> dict[str, Any]:
    producers: list[Any] = ["input", {"name": "expander", "degree": degree}]
    if virtual:
        producers.append("virtual")
    return {"producer": {"name": "union", "producers": producers, "origin_bias": origin_bias}}


def _patch(entrant: dict[str, Any], **producer: Any) -> dict[str, Any]:
    """The entrant's producer with ``producer``'s options changed."""
    spec = entrant["producer"]
    spec = {"name": spec} if isinstance(spec, str) else copy.deepcopy(spec)
    return {"producer": {**spec, **producer}}


def _search() -> dict[str, tuple[dict[str, Any], ...]]:
    E = ENTRANTS
    return {
        # no knob of its edge set: the attention dropout of its scores
        "full": ({}, {"attn_dropout": 0.1}, {"attn_dropout": 0.3}, {"attn_dropout": 0.5}),
        "window+global": ({}, _window_global(2), _window_global(8), _window_global(16)),
        "bigbird": ({}, _bigbird(8, 4), _bigbird(3, 8), _bigbird(8, 8)),
        "exphormer": ({}, _exphormer(6), _exphormer(3, virtual=False),
                      _exphormer(3, origin_bias=False)),
        "samsa": ({}, _patch(E["samsa"], k=8), _patch(E["samsa"], k=16), _patch(E["samsa"], k=64)),
        # λ = 0 is the paper's headline setting; 16 clusters suit graphs of tens of nodes
        "sbm": ({}, {"aux_weight": 0.0}, _patch(E["sbm"], num_clusters=16),
                {**_patch(E["sbm"], num_clusters=16), "aux_weight": 0.0}),
        "sliceformer": ({}, _patch(E["sliceformer"], order="descend"),
                        _patch(E["sliceformer"], order="interleave"),
                        _patch(E["sliceformer"], order="max_exchange")),
        # the fourth: the predictor imitates the input edges during the warm start (docs/league.md)
        "sac": ({}, _patch(E["sac"], max_distance=1), _patch(E["sac"], alpha=2),
                _patch(E["sac"], warm_start_imitation=1.0)),
        # the paper's initialisation leaves the shift ≈ the identity at width 64; the third
        # setting starts it mixing (docs/converter.md)
        "converter": ({}, _patch(E["converter"], order=4), _patch(E["converter"], kernel="jackson"),
                      _patch(E["converter"], phase_readout="linear", gamma_offset=0.25)),
    }


#: entrant → its settings (config overrides on top of the entrant's; the first, ``{}``, is the
#: league's default)
SEARCH: dict[str, tuple[dict[str, Any], ...]] = _search()


def setting_config(task: str, entrant: str, setting: int, *, seeds: list[int],
                   out: str | Path) -> dict[str, Any]:
    """The ``graphattn run`` configuration of ``entrant`` with its setting ``setting`` on ``task``
    (``out`` names the run folder itself)."""
    settings = SEARCH[entrant]
    if isinstance(setting, bool) or not isinstance(setting, int) \
            or not 0 <= setting < len(settings):
        raise ValueError(f"'setting' of {entrant!r} must be an int in [0, {len(settings)}), got "
                         f"{setting!r}")
    cfg = league_config(task, entrant, seeds=seeds, out=out)
    cfg.update(copy.deepcopy(settings[setting]))
    cfg["out"] = str(out)
    return cfg


def search_dir(out: str | Path, task: str, entrant: str, setting: int) -> Path:
    return Path(out) / "search" / task / entrant / str(setting)


def _seed_result(folder: Path, seed: int) -> dict[str, Any] | None:
    return next((r for r in cell_results(folder) if int(r["seed"]) == seed), None)


def _same_config(folder: Path, cfg: dict[str, Any]) -> bool:
    exists, _, diff = earlier_run(folder, cfg)
    return exists and not diff


def setting_result(out: str | Path, task: str, entrant: str, setting: int
                   ) -> dict[str, Any] | None:
    """The search seed's result of one setting (``None`` while it has not run): the league cell's
    own for the default when the cell holds the seed with the default configuration."""
    seed = SEARCH_SEEDS[0]
    own = _seed_result(search_dir(out, task, entrant, setting), seed)
    if setting == 0 and own is None:
        cell = run_dir(out, task, entrant)
        if _same_config(cell, setting_config(task, entrant, 0, seeds=[seed], out=cell)):
            row = _seed_result(cell, seed)
            if row is not None:
                return row
    return own


def _copy_seed(source: Path, target: Path, seed: int) -> None:
    """Copies one finished seed's files (:data:`~graphattn.runner.folders.SEED_FILES`: its result
    with the configuration that made it, and its history) from run folder ``source`` into
    ``target``; no checkpoints."""
    from graphattn.runner.folders import SEED_FILES

    (target / f"seed{seed}").mkdir(parents=True, exist_ok=True)
    for name in SEED_FILES:
        src = source / f"seed{seed}" / name
        if src.is_file():
            (target / f"seed{seed}" / name).write_text(src.read_text())


def keep_default(out: str | Path, task: str, entrant: str) -> None:
    """Copies the league cell's search seed (its config, result, summary and history: what the
    search reads) into setting 0's search folder, before ``--tuned`` replaces the default cell; a
    no-op when that folder has the seed already or the cell is not the default."""
    seed = SEARCH_SEEDS[0]
    target = search_dir(out, task, entrant, 0)
    cell = run_dir(out, task, entrant)
    row = _seed_result(cell, seed)
    if _seed_result(target, seed) is not None or row is None or not _same_config(
            cell, setting_config(task, entrant, 0, seeds=[seed], out=cell)):
        return
    _copy_seed(cell, target, seed)
    config = json.loads((cell / "config.json").read_text())
    config.update(seeds=[seed], out=str(target))
    (target / "config.json").write_text(json.dumps(config, indent=1))
    (target / "results.jsonl").write_text(json.dumps(row) + "\n")
    summary = json.loads((cell / "summary.json").read_text())
    (target / "summary.json").write_text(json.dumps({**summary, "seeds": [seed]}, indent=1))


def adopt_search_seed(out: str | Path, task: str, entrant: str, setting: int,
                      cfg: dict[str, Any], *, replace: bool) -> bool:
    """Starts the ``--tuned`` cell ``cfg`` (a run of ``setting``) from the search's own run of
    that setting: its search seed's ``result.json`` and ``history.json`` are copied into the
    cell, which then holds ``cfg``'s configuration, so the run resumes there and trains only the
    other seeds (the seed is the same configuration trained from the same seed: training it again
    would only repeat it). A run of another configuration in the cell is removed first when
    ``replace`` (else the cell is left for the trainer to refuse); one of ``cfg``'s keeps its other
    seeds. Returns whether it did so: not when the search's seed is missing, made by another
    configuration, or not among ``cfg``'s seeds, nor when the cell holds that seed already."""
    from graphattn.runner.config import resolve_config
    from graphattn.runner.folders import _claim_run_folder, _finished_seed

    seed = SEARCH_SEEDS[0]
    source = search_dir(out, task, entrant, setting)
    cell = Path(cfg["out"])
    resolved = resolve_config(cfg)  # what the trainer compares a seed's configuration with
    if (seed not in cfg["seeds"] or _finished_seed(source, seed, resolved) is None
            or _finished_seed(cell, seed, resolved) is not None):
        return False
    exists, _, diff = earlier_run(cell, cfg)
    if diff and not replace:
        return False
    _claim_run_folder(cell, overwrite=bool(diff), resume=exists and not diff)
    _copy_seed(source, cell, seed)
    if not exists or diff:
        (cell / "config.json").write_text(json.dumps(resolved, indent=2, default=str))
    return True


def cell_setting(folder: Path, task: str, entrant: str) -> int | None:
    """Which of the entrant's settings the run in ``folder`` was trained with (``0``: the
    default; ``None``: none of them, e.g. a ``--set`` protocol, or no run)."""
    for i in range(len(SEARCH[entrant])):
        exists, _, diff = earlier_run(folder, setting_config(task, entrant, i, seeds=[0],
                                                             out=folder))
        if not exists:
            return None
        if not diff:
            return i
    return None


def chosen(out: str | Path, task: str, entrant: str) -> int | None:
    """The index of the setting with the best validation metric on the search seed (``None``
    while a setting has not run; ties go to the lower index), or ``0`` (the default) unless that
    one beats the default by :data:`SEARCH_MARGIN`."""
    return _choose(_rows(out, task, entrant))


def _rows(out: str | Path, task: str, entrant: str) -> list[dict[str, Any] | None]:
    return [setting_result(out, task, entrant, i) for i in range(len(SEARCH[entrant]))]


def _choose(rows: list[dict[str, Any] | None]) -> int | None:
    if any(r is None for r in rows):
        return None
    sign = -1.0 if rows[0].get("metric") == "mae" else 1.0  # type: ignore[union-attr]
    vals = [sign * float(r["val"]) for r in rows]  # type: ignore[index]
    best = max(range(len(vals)), key=lambda i: (vals[i], -i))
    return best if vals[best] >= vals[0] + SEARCH_MARGIN else 0


def check_settings(settings: list[int] | None) -> list[int] | None:
    """``settings`` (``None``: all) as :func:`run_search` takes them: a :class:`ValueError` unless
    each is an int in ``[0, MAX_SETTINGS)``."""
    if settings is None:
        return None
    bad = [s for s in settings
           if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < MAX_SETTINGS]
    if bad or not settings:
        raise ValueError(f"'settings' must be setting indices in [0, {MAX_SETTINGS}), got "
                         f"{settings!r}")
    return sorted(set(settings))


def run_search(tasks: list[str], entrants: list[str], *, out: str | Path,
               threads: int | None = None, progress: bool = True, rerun: bool = False,
               keep_going: bool = False, settings: list[int] | None = None
               ) -> dict[tuple[str, str, int], str]:
    """Trains every setting not run yet (:func:`setting_result`; ``rerun``: every setting but a
    default the league cell holds), or only those of ``settings`` (indices; ``None``: all); returns
    each one's status. Settings are independent runs in their own folders, so processes given
    different ``settings`` can train one entrant's search at the same time."""
    only = check_settings(settings)
    status: dict[tuple[str, str, int], str] = {}
    for task in tasks:
        for entrant in entrants:
            if (entrant, task) in NOT_APPLICABLE:
                continue
            for i in range(len(SEARCH[entrant])):
                if only is not None and i not in only:
                    continue
                folder = search_dir(out, task, entrant, i)
                cfg = setting_config(task, entrant, i, seeds=list(SEARCH_SEEDS), out=folder)
                in_cell = i == 0 and _seed_result(folder, SEARCH_SEEDS[0]) is None
                if setting_result(out, task, entrant, i) is not None and (not rerun or in_cell):
                    status[(task, entrant, i)] = "reused"  # the league cell's is never retrained
                    continue
                try:
                    train_folder(cfg, rerun=rerun, threads=threads, progress=progress)
                except Exception as exc:  # reported in the table with keep_going
                    if not keep_going:
                        raise
                    status[(task, entrant, i)] = f"failed: {type(exc).__name__}: {exc}"
                    continue
                status[(task, entrant, i)] = "trained"
    return status


def describe(entrant: str, setting: int) -> str:
    """A setting in words: ``default`` or its overrides as compact JSON."""
    if setting == 0:
        return "default"
    return json.dumps(SEARCH[entrant][setting], separators=(",", ":"))


def search_table(out: str | Path, tasks: list[str], entrants: list[str]) -> str:
    """Markdown: for each entrant and task, the search seed's validation metric of every setting
    (``–`` not run), the chosen one in bold; then the settings themselves."""
    lines = ["| entrant | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for e in entrants:
        cells = []
        for t in tasks:
            if (e, t) in NOT_APPLICABLE:
                cells.append("n/a")
                continue
            rows = _rows(out, t, e)
            best = _choose(rows)
            vals = []
            for i, row in enumerate(rows):
                text = "–" if row is None else f"{float(row['val']):.3f}"
                vals.append(f"**{text}**" if i == best else text)
            cells.append(" / ".join(vals))
        lines.append(f"| {e} | " + " | ".join(cells) + " |")
    lines += ["", "Settings, in the order of the cells above:", ""]
    lines += [f"* {e}: " + "; ".join(f"{i}: `{describe(e, i)}`" for i in range(len(SEARCH[e])))
              for e in entrants]
    return "\n".join(lines) + "\n"
