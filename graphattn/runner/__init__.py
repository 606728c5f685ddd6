"""The experiment runner: tasks, metrics, training with model selection on validation,
multi-seed aggregation, resumable checkpoints.

Names are imported on first use (PEP 562): the command line reads the configuration module
without importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphattn._lazy import lazy_exports

_EXPORTS = {
    "DEFAULTS": "graphattn.runner.config",
    "TASK_DEFAULTS": "graphattn.runner.config",
    "resolve_config": "graphattn.runner.config",
    "restore": "graphattn.runner.checkpoint",
    "accuracy": "graphattn.runner.metrics",
    "lrgb_ap": "graphattn.runner.metrics",
    "mae": "graphattn.runner.metrics",
    "TASKS": "graphattn.runner.tasks",
    "Task": "graphattn.runner.tasks",
    "build_task": "graphattn.runner.tasks",
    "build_model": "graphattn.runner.build",
    "run_experiment": "graphattn.runner.train",
}

__all__ = [
    "DEFAULTS",
    "TASKS",
    "TASK_DEFAULTS",
    "Task",
    "accuracy",
    "build_model",
    "build_task",
    "lrgb_ap",
    "mae",
    "resolve_config",
    "restore",
    "run_experiment",
]

if TYPE_CHECKING:  # pragma: no cover
    from graphattn.runner.build import build_model
    from graphattn.runner.checkpoint import restore
    from graphattn.runner.config import DEFAULTS, TASK_DEFAULTS, resolve_config
    from graphattn.runner.metrics import accuracy, lrgb_ap, mae
    from graphattn.runner.tasks import TASKS, Task, build_task
    from graphattn.runner.train import run_experiment


__getattr__, __dir__ = lazy_exports("graphattn.runner", globals(), _EXPORTS)
