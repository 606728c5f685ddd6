"""The experiment runner: tasks, metrics, training with model selection on validation,
multi-seed aggregation, resumable checkpoints."""

from graphattn.runner.checkpoint import restore
from graphattn.runner.config import DEFAULTS, TASK_DEFAULTS, resolve_config
from graphattn.runner.metrics import accuracy, lrgb_ap, mae
from graphattn.runner.tasks import TASKS, Task, build_task
from graphattn.runner.train import build_model, run_experiment

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
