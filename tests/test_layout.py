"""The package's dependency rules: the attention layer, the dispatch, the edge-set structures and
the kernels never import a producer module (producers depend on them, not the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = [ROOT / "graphattn" / f for f in ("attention.py", "dispatch.py", "structured.py",
                                         "operators.py", "edgeset.py", "contract.py", "checks.py",
                                         "signals.py")]
KERNELS = sorted((ROOT / "kernels").glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", CORE + KERNELS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_core_and_kernels_import_no_producer(path):
    assert path.exists()
    bad = sorted(m for m in imported_modules(path) if m.startswith("graphattn.producers"))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_layer_has_no_type_ignore_and_a_short_forward():
    src = (ROOT / "graphattn" / "attention.py").read_text()
    assert "type: ignore" not in src
    (forward,) = [n for n in ast.walk(ast.parse(src))
                  if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    code_start = forward.body[1].lineno  # after the docstring
    assert forward.end_lineno - code_start + 1 <= 50
