"""Test-session environment: a private data root and the offline mirror.

``GRAPHATTN_DATA`` points at a fresh temporary directory for the session (set
``GRAPHATTN_TEST_DATA`` to reuse a cache between runs); ``GRAPHATTN_MIRROR`` defaults to
``../shared/datasets`` beside the repository when it exists. Tests that need real data use the
``mirror`` fixture, which skips them when no mirror is available (CI always has one).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
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
