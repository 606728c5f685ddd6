"""The package's dependency rules: the attention layer, the dispatch, the edge-set structures and
the kernels never import a producer module (producers depend on them, not the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted((ROOT / "graphattn" / "core").glob("*.py"))
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
    src = (ROOT / "graphattn" / "core" / "attention.py").read_text()
    assert "type: ignore" not in src
    (forward,) = [n for n in ast.walk(ast.parse(src))
                  if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    code_start = forward.body[1].lineno  # after the docstring
    assert forward.end_lineno - code_start + 1 <= 50


def _module_files() -> dict[str, Path]:
    """Every module of the package (``kernels/`` is installed as ``graphattn.kernels``)."""
    mods = {}
    for base, pkg in ((ROOT / "graphattn", "graphattn"), (ROOT / "kernels", "graphattn.kernels")):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


def runtime_imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports at run time, at any depth of the file (imports inside
    functions count; those under ``if TYPE_CHECKING:`` do not). ``from pkg import sub`` imports
    the submodule ``pkg.sub``, not ``pkg``'s other submodules."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            targets = subs if len(subs) == len(node.names) else [base, *subs]
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


#: import cycles not broken yet, each named with why (empty is the goal)
KNOWN_CYCLES = {
    frozenset({"graphattn.core.edgeset", "graphattn.interop"}):
        "EdgeSet's sparse-matrix methods call graphattn.interop, which builds EdgeSets",
}


def test_no_import_cycle_among_the_package_modules():
    import networkx as nx

    mods = _module_files()
    graph = nx.DiGraph()
    for name, path in mods.items():
        graph.add_node(name)
        graph.add_edges_from((name, m) for m in runtime_imports(name, path, mods))
    cycles = [frozenset(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert set(cycles) <= set(KNOWN_CYCLES), sorted(sorted(c) for c in cycles)
    assert set(KNOWN_CYCLES) <= set(cycles), "a known cycle is gone: remove it from KNOWN_CYCLES"


def test_the_api_page_lists_the_current_public_names():
    """``docs/api.md`` is what ``python docs/make_api.py`` writes from the modules' ``__all__``."""
    import runpy

    make = runpy.run_path(str(ROOT / "docs" / "make_api.py"), run_name="make_api")
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == make["page"](), \
        "docs/api.md is stale: python docs/make_api.py > docs/api.md"
