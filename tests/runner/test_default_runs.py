"""Every task family's default run learns: the runner's defaults for the task (``TASK_DEFAULTS``,
nothing overridden but the epoch count and, for the image task, the training-set size), trained
on the real data for a few epochs, beat the chance level by a wide margin on the test split.

Measured with these settings (seed 0, 2 CPU threads): Cora 0.813 after 30 epochs (largest class 0.32);
MUTAG, the mean over seeds 0–2, 0.907 after 40 (0.870 with one thread; majority 0.67: its 18 test
graphs make one seed's accuracy swing, seed 0 alone tested 0.944 with two threads and 0.722 with
one, so one seed is not enough); Fashion-MNIST, 1000 training images, 0.311 after 3 (chance
0.10); GeometricShapes 0.100 after 10 (chance 0.025); GunPoint 0.713 after 40 (chance 0.50). The
thresholds sit between chance and those values, far enough from both that a different CPU's
rounding cannot cross them, and close enough to chance-level failures (a model stuck on one class)
to catch them. ListOps is left out: at a size a test can afford it stays near its majority class
(0.24 after 4 epochs on 512 short sequences), as ListOps models do early in training.
"""

from __future__ import annotations

import importlib.util

import pytest

from graphattn.runner.train import run_experiment

#: task → (epochs, task options, the least mean test accuracy that passes, chance level, seeds)
CASES = {
    "cora": (30, {}, 0.65, 0.32, [0]),
    "mutag": (40, {}, 0.74, 0.67, [0, 1, 2]),
    "fashion-mnist": (3, {"limit": 1000}, 0.2, 0.10, [0]),
    "geometric-shapes": (10, {}, 0.06, 0.025, [0]),
    "ucr": (40, {}, 0.6, 0.5, [0]),
}


@pytest.mark.parametrize("task", list(CASES))
def test_the_default_run_of_every_task_family_beats_chance(task, mirror):
    if task == "ucr" and importlib.util.find_spec("sktime") is None:
        pytest.skip("the ucr task reads sktime's bundled data (pip install '.[timeseries]')")
    epochs, options, least, chance, seeds = CASES[task]
    res = run_experiment({"task": task, "epochs": epochs, "task_kwargs": options, "seeds": seeds,
                          "progress": False})
    test = float(res["summary"]["test"].split()[0])
    assert least > chance
    assert test >= least, (f"{task}: mean test accuracy {test:.3f} over seeds {seeds} after {epochs} "
                           f"epochs (chance {chance})")
