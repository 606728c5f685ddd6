"""Running an experiment: the run folder, the data set, each seed's
:class:`~graphattn.runner.trainer.Trainer`, the results and their summary (data-parallel under
``torchrun`` too)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from graphattn.runner import distributed as D
from graphattn.runner.build import build_configured_task, prepare_task
from graphattn.runner.config import check_device, resolve_config
from graphattn.runner.folders import (
    _check_continuable,
    _check_same_run,
    _claim_run_folder,
    _finished_seed,
    _write_config,
    _write_results,
    _write_seed,
    summarise,
)
from graphattn.runner.trainer import Trainer


def _note_busy_machine() -> None:
    """Says once, when other processes already keep the cores busy, that fewer threads may be
    faster (torch's default takes every core and then waits for the other processes). Only on a
    terminal: a log or a test reads stderr for other things."""
    if not sys.stderr.isatty():
        return
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return
    cores = os.cpu_count() or 1
    if load >= 0.75 * cores and torch.get_num_threads() > 1:
        tqdm.write(f"graphattn run: note: the machine is busy (load {load:.1f} on {cores} cores); "
                   f"--threads 1 may train faster than torch's {torch.get_num_threads()} threads",
                   file=sys.stderr)


def run_experiment(config: dict[str, Any], *, command: str | None = None) -> dict[str, Any]:
    """Trains and evaluates ``config`` (keys of :data:`~graphattn.runner.config.DEFAULTS`) for
    every seed; returns ``{"config", "results" (one per seed), "summary"}`` and, with ``out``,
    writes ``config.json``, ``results.jsonl``, ``summary.json``, ``summary.md`` (rewritten after
    every finished seed) and per-seed ``best.pt`` / ``last.pt`` checkpoints there. ``command``,
    the command line that started the run, is recorded in the summary (``graphattn table`` prints
    it).

    Started by ``torchrun`` (``WORLD_SIZE`` > 1), every process runs this: they join one process
    group and train data-parallel (see :mod:`graphattn.runner.distributed`); rank 0 prepares the
    data set and the run folder first and writes every file."""
    cfg = resolve_config(config)
    check_device(cfg["device"])
    threads_before = torch.get_num_threads()
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    else:
        _note_busy_machine()
    world, device = D.setup(cfg["device"])
    finished = False
    try:
        out = _run(cfg, world, device, command)
        finished = True
        return out
    finally:
        D.teardown(world, synchronize=finished)
        torch.set_num_threads(threads_before)  # ``threads`` holds for the run, not the caller after it


def _run(cfg: dict[str, Any], world: D.World | None, device: str,
         command: str | None) -> dict[str, Any]:
    main = world is None or world.is_main
    out_dir = Path(cfg["out"]) if cfg["out"] else None
    # each node's local rank 0 builds the data set's files first (the others then load them), and
    # rank 0 claims the run folder, before any rank goes on
    first = world is None or world.local_rank == 0
    if not first:
        D.barrier(world)
    if out_dir is not None and main:
        _claim_run_folder(out_dir, overwrite=bool(cfg["overwrite"]), resume=bool(cfg["resume"]))
        if cfg["resume"]:
            _check_same_run(out_dir, cfg)
            _check_continuable(out_dir, cfg)
        _write_config(out_dir, cfg)
    task = prepare_task(build_configured_task(cfg), cfg)
    if first:
        D.barrier(world)
    results = []
    for i, seed in enumerate(cfg["seeds"]):
        finished = (_finished_seed(out_dir, seed, cfg) if cfg["resume"] and out_dir is not None
                    else None)
        if finished is not None:  # a committed run folder keeps no checkpoints: reuse its result
            results.append(finished)
            continue
        trainer = Trainer(cfg, task, seed, out_dir, world=world, device=device)
        if cfg["resume"]:
            trainer.resume()
        if i == 0 and main and trainer.dropped_per_epoch():
            tqdm.write(f"graphattn run: note: {trainer.dropped_per_epoch()} training "
                       f"graph(s) per epoch are left out: the last global batch is smaller than "
                       f"the {world.size if world else 1} processes", file=sys.stderr)
        results.append(trainer.fit(announce=i == 0))
        if out_dir is not None and main:
            _write_seed(out_dir, results[-1], trainer.history, cfg)
            # after every seed, so that a run stopped later keeps its finished seeds' results
            _write_results(out_dir, results, cfg, command)
    summary = summarise(results, cfg)
    if command:
        summary["command"] = command
    return {"config": cfg, "results": results, "summary": summary, "task_notes": task.notes,
            "is_main": main}
