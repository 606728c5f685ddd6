"""Run folders: the files a run writes (config, per-seed results and histories, the merged
results and summaries), the rules for continuing one (``--resume``: same configuration, or more
epochs to extend it) and the folder lock that lets processes train seeds into one folder."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graphattn.nn import model_options
from graphattn.runner.config import DEFAULTS, producer_spec

#: config keys that say how to run, not what is computed (they may differ when a run is continued)
_RUN_ONLY = ("resume", "overwrite", "progress", "out", "seeds", "threads")


def _fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def summarise(results: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    vals = [r["val"] for r in results]
    tests = [r["test"] for r in results]
    # a model without an attention branch (the GCN / GAT anchors) has no producer to name
    uses_producer = "producer" in model_options(cfg["model"])
    summary = {
        "task": cfg["task"], "model": cfg["model"],
        "producer": producer_spec(cfg) if uses_producer else None,
        "metric": results[0]["metric"],
        "seeds": [r["seed"] for r in results],
        "val_mean": statistics.mean(vals), "val_std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "test_mean": statistics.mean(tests),
        "test_std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
        "val": _fmt(vals), "test": _fmt(tests),
    }
    return summary


def markdown_table(results: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [f"| task | producer | seed | best epoch | val {summary['metric']} | test {summary['metric']} "
             f"| epochs | time (s) | params |", "|---|---|---|---|---|---|---|---|---|"]
    prod = summary["producer"]
    prod = prod if isinstance(prod, str) else json.dumps(prod)
    if summary.get("model", "hybrid") != "hybrid":
        prod = summary["model"] if summary["producer"] is None else f"{summary['model']}: {prod}"
    for r in results:
        lines.append(f"| {r['task']} | {prod} | {r['seed']} | {r['best_epoch']} | {r['val']:.4f} | "
                     f"{r['test']:.4f} | {r['epochs_run']} | {r['train_time_s']} | {r['params']} |")
    lines.append(f"| **{summary['task']}** | {prod} | {len(results)} seeds | | **{summary['val']}** | "
                 f"**{summary['test']}** | | | |")
    return "\n".join(lines) + "\n"


#: what a run writes into its folder (``--overwrite`` removes these and nothing else)
RUN_FILES = ("config.json", "results.jsonl", "summary.json", "summary.md")


def _claim_run_folder(out_dir: Path, *, overwrite: bool, resume: bool) -> None:
    """Creates ``out_dir``; refuses one that already holds a run unless ``resume`` (continue it)
    or ``overwrite`` (remove the earlier run's files first)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} exists and is not a folder")
    if resume and not out_dir.exists():
        raise ValueError(f"--resume: {out_dir} holds no run to continue (check --out, or leave "
                         f"out --resume to start one)")
    earlier = [p for p in (out_dir / f for f in RUN_FILES) if p.exists()]
    earlier += sorted(p for p in out_dir.glob("seed*") if p.is_dir()) if out_dir.is_dir() else []
    if earlier and not resume:
        if not overwrite:
            raise ValueError(f"--out {out_dir} already holds a run ({earlier[0].name}); pass "
                             f"--overwrite to replace it, --resume to continue it, or choose "
                             f"another --out")
        for p in earlier:
            if p.is_dir():
                for f in ("best.pt", "last.pt", *SEED_FILES):
                    (p / f).unlink(missing_ok=True)
                for f in p.glob(".*.tmp"):
                    f.unlink()
                if not any(p.iterdir()):
                    p.rmdir()
            else:
                p.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


#: per seed, beside its checkpoints: the seed's result (with the configuration that made it) and
#: its per-epoch history (JSON)
SEED_FILES = ("result.json", "history.json")


def _run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a configuration computes (without the keys that only say how to run it), as JSON."""
    return json.loads(json.dumps({k: v for k, v in cfg.items() if k not in _RUN_ONLY},
                                 default=str))


def _write_seed(out_dir: Path, result: dict[str, Any], history: list[dict[str, Any]],
                cfg: dict[str, Any]) -> None:
    """``seed<k>/result.json`` (``{"result", "config"}``) and ``seed<k>/history.json`` of one
    finished seed (each written to a temporary file first and renamed, so a reader never sees half
    a file)."""
    folder = out_dir / f"seed{result['seed']}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in (("result.json", {"result": result, "config": _run_config(cfg)}),
                        ("history.json", history)):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(json.dumps(value, indent=1, default=str))
        os.replace(tmp, folder / name)


def _seed_result(path: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The result in a ``seed<k>/result.json`` if it was made by ``cfg``'s configuration."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(saved, dict) and isinstance(saved.get("result"), dict)
            and saved.get("config") == _run_config(cfg)):
        return None
    return saved["result"]


def _check_same_run(out_dir: Path, cfg: dict[str, Any]) -> None:
    """``--resume`` continues the run in ``out_dir`` only if it has ``cfg``'s configuration (the
    seeds and how to run may differ): a :class:`ValueError` naming the keys that differ."""
    try:
        earlier = json.loads((out_dir / "config.json").read_text())
    except (OSError, ValueError):
        return  # a folder another process is starting, or one with checkpoints only
    check_resumable(cfg, {**DEFAULTS, **earlier}, f"--resume: {out_dir}",
                    hint="; choose another --out, or --overwrite to replace it")


def check_resumable(cfg: dict[str, Any], earlier: dict[str, Any], what: str,
                    hint: str = "") -> None:
    """A run of ``earlier``'s configuration can be continued by ``cfg``: the same configuration
    (how to run it aside), or the same with more ``epochs`` (``--resume --epochs N`` extends a
    finished run: each seed goes on from its last checkpoint, so the run equals one trained for N
    epochs from the start). A :class:`ValueError` starting with ``what`` otherwise: it names the keys
    that differ and, for ``epochs`` alone, why the extension is refused (fewer epochs; a cosine
    schedule, whose learning rate at every epoch depends on the length)."""
    mine, theirs = _run_config(cfg), _run_config(earlier)
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if not diff:
        return
    differs = f"{what} holds a run of another configuration (it differs in {diff})"
    if diff != ["epochs"]:
        raise ValueError(differs + hint)
    new, old = mine["epochs"], theirs["epochs"]
    if new < old:
        raise ValueError(f"{differs}: --epochs {new} would cut its {old} epochs (a run is only "
                         f"ever extended){hint}")
    if mine["scheduler"] == "cosine":
        raise ValueError(f"{differs}: a run with a cosine schedule cannot be extended (the learning "
                         f"rate of every epoch after the warm-up depends on its length, {old} "
                         f"epochs){hint}")


def _finished_seed(out_dir: Path, seed: int, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The result of ``seed`` if its ``seed<k>/result.json`` says it finished in ``out_dir`` under
    the same configuration (``--resume`` then keeps it instead of training the seed again, with or
    without its checkpoints), else ``None``."""
    result = _seed_result(out_dir / f"seed{seed}" / "result.json", cfg)
    return result if result is not None and result.get("seed") == seed else None


def _check_continuable(out_dir: Path, cfg: dict[str, Any]) -> None:
    """``--resume`` refuses, before anything is written, to train from scratch a seed that finished
    under another configuration and keeps no checkpoint: an extension (more ``epochs``) continues
    from the seed's ``last.pt``, which a committed run folder does not keep."""
    for seed in cfg["seeds"]:
        folder = out_dir / f"seed{seed}"
        if ((folder / "result.json").exists() and _finished_seed(out_dir, seed, cfg) is None
                and not (folder / "last.pt").exists()):
            raise ValueError(f"--resume: {folder} finished under another configuration and keeps "
                             f"no checkpoint (last.pt) to continue from; --overwrite trains it "
                             f"again")


def _folder_results(out_dir: Path, results: list[dict[str, Any]],
                    cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """``results`` and every other seed's ``seed<k>/result.json`` of the same configuration in
    ``out_dir`` (another process may have trained seeds into the same folder), one per seed,
    sorted by seed; this process's own results win."""
    merged: dict[int, dict[str, Any]] = {}
    for path in out_dir.glob("seed*/result.json"):
        r = _seed_result(path, cfg)
        if r is not None and isinstance(r.get("seed"), int):
            merged[r["seed"]] = r
    for r in results:
        merged[int(r["seed"])] = r
    return [merged[k] for k in sorted(merged)]


@contextmanager
def _folder_lock(out_dir: Path) -> Iterator[None]:
    """An exclusive lock on ``out_dir/.lock`` (``fcntl.flock``; a no-op where fcntl is missing):
    processes writing seeds into one folder take turns to rewrite its result files."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(out_dir / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_config(out_dir: Path, cfg: dict[str, Any]) -> None:
    """Writes ``config.json`` under the folder lock, after :func:`_claim_run_folder`. Its ``seeds``
    are this run's and those of a ``config.json`` already there: a run it resumes, or another
    process training other seeds into the same folder (which joins it with ``--resume``, possibly
    before the first process wrote its own), so the file lists every seed the folder holds, as
    ``results.jsonl`` does. (A replaced run's ``config.json`` was removed by the claim.)"""
    seeds = list(cfg["seeds"])
    with _folder_lock(out_dir):
        try:
            earlier = json.loads((out_dir / "config.json").read_text()).get("seeds")
        except (OSError, ValueError, AttributeError):
            earlier = None  # no readable config.json yet: this run's seeds
        if isinstance(earlier, list) and all(isinstance(s, int) for s in earlier):
            seeds = sorted(set(earlier) | set(seeds))
        (out_dir / "config.json").write_text(json.dumps({**cfg, "seeds": seeds}, indent=2,
                                                        default=str))


def _write_results(out_dir: Path, results: list[dict[str, Any]], cfg: dict[str, Any],
                   command: str | None) -> None:
    """Writes ``results.jsonl``, ``summary.json`` (with the ``command`` that made the run, for
    ``graphattn table``) and ``summary.md`` for every seed finished in the folder so far: this
    process's and those other processes wrote (``seed<k>/result.json``), under a folder lock."""
    with _folder_lock(out_dir):
        results = _folder_results(out_dir, results, cfg)
        summary = summarise(results, cfg)
        if command:
            summary["command"] = command
        with open(out_dir / "results.jsonl", "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        (out_dir / "summary.md").write_text(markdown_table(results, summary))
