"""Test-session environment: a private data root and the offline mirror.

``GRAPHATTN_DATA`` points at a fresh temporary directory for the session (set
``GRAPHATTN_TEST_DATA`` to reuse a cache between runs); ``GRAPHATTN_MIRROR`` defaults to
``../shared/datasets`` beside the repository when it exists. Tests that need real data use the
``mirror`` fixture, which skips them when no mirror is available (CI always has one).

Devices: the ``device`` fixture runs a test on ``"cpu"`` and on ``"cuda"``; the CUDA variant
carries the ``cuda`` marker (``pytest -m cuda`` runs only the CUDA tests) and is skipped on a
machine without a CUDA device. ``tests.helpers.DEVICES`` gives the same two parameters for
``@pytest.mark.parametrize("device", DEVICES)``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import DEVICES

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # also declared in pyproject.toml; repeated here for runs that use another configuration file
    config.addinivalue_line("markers", "cuda: tests that need a CUDA device (skipped without one)")
    if not os.environ.get("GRAPHATTN_MIRROR"):
        default = ROOT.parent / "shared" / "datasets"
        if default.is_dir():
            os.environ["GRAPHATTN_MIRROR"] = str(default)


@pytest.fixture(scope="session", autouse=True)
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = os.environ.get("GRAPHATTN_TEST_DATA")
    root = Path(path) if path else tmp_path_factory.mktemp("graphattn-data")
    old = os.environ.get("GRAPHATTN_DATA")
    os.environ["GRAPHATTN_DATA"] = str(root)
    yield root
    if old is None:
        os.environ.pop("GRAPHATTN_DATA", None)
    else:
        os.environ["GRAPHATTN_DATA"] = old


@pytest.fixture(scope="session")
def mirror() -> Path:
    m = os.environ.get("GRAPHATTN_MIRROR")
    if not m or not Path(m).is_dir():
        pytest.skip("no offline data mirror (set GRAPHATTN_MIRROR; CI sets it)")
    return Path(m)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """``"cpu"``, then ``"cuda"`` (marked ``cuda``; skipped without a CUDA device)."""
    return request.param
