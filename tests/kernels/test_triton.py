"""The Triton kernels on the CPU, through Triton's interpreter, in a subprocess.

The interpreter needs ``TRITON_INTERPRET=1`` before triton is imported, and PyG imports triton at
import time, so the cases (``triton_cases.py``) run in one fresh ``pytest`` process with that
variable set; each test here checks the outcome of one case function (all its parametrisations).
The slow case (gradcheck) runs only under ``-m slow``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES_FILE = HERE / "triton_cases.py"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (pip install triton)"
)


def _case_functions() -> dict[str, bool]:
    """Case function name → whether it is marked slow (read from the file, not imported)."""
    tree = ast.parse(CASES_FILE.read_text())
    cases = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            cases[node.name] = any("slow" in ast.unparse(d) for d in node.decorator_list)
    return cases


CASES = _case_functions()


def _run_cases(tmp: Path, marker: str) -> dict[str, list[tuple[str, str]]]:
    report = tmp / "report.xml"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
         f"--junitxml={report}", str(CASES_FILE)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    if not report.exists():
        pytest.fail(f"the interpreter run produced no report:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    outcomes: dict[str, list[tuple[str, str]]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        status, text = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                status, text = tag, (child.get("message") or "") + "\n" + (child.text or "")
        outcomes.setdefault(name, []).append((status, text))
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[str, str]]]:
    return _run_cases(tmp_path_factory.mktemp("triton"), "not slow")


@pytest.mark.parametrize("case", [c for c, slow in CASES.items() if not slow])
def test_triton_interpreter(case: str, outcomes: dict[str, list[tuple[str, str]]]) -> None:
    results = outcomes.get(case)
    assert results, f"{case} did not run in the interpreter subprocess"
    for status, text in results:
        assert status == "passed", text[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c, slow in CASES.items() if slow])
def test_triton_interpreter_slow(case: str, tmp_path: Path) -> None:
    results = _run_cases(tmp_path, "slow").get(case)
    assert results, f"{case} did not run in the interpreter subprocess"
    for status, text in results:
        assert status == "passed", text[-4000:]
