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


def test_no_import_cycle_among_the_package_modules():
    import networkx as nx

    mods = _module_files()
    graph = nx.DiGraph()
    for name, path in mods.items():
        graph.add_node(name)
        graph.add_edges_from((name, m) for m in runtime_imports(name, path, mods))
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, cycles


def test_the_package_has_few_top_level_modules_and_no_long_files():
    """A reader finds the room from its name: at most 10 modules at ``graphattn/``'s top level
    (the rest in subpackages) and no source file over 700 lines."""
    top = sorted(p.name for p in (ROOT / "graphattn").glob("*.py"))
    assert len(top) <= 10, top
    long = {p.relative_to(ROOT).as_posix(): n for base in ("graphattn", "kernels")
            for p in (ROOT / base).rglob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert not long, long


def test_every_package_is_installed():
    """``pyproject.toml`` lists the packages explicitly: every folder of the source tree with an
    ``__init__.py`` is one of them (a missing one installs without its modules)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("graphattn", *p.parent.relative_to(ROOT / "graphattn").parts))
             for p in (ROOT / "graphattn").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_no_model_lists_the_options_it_ignores():
    """Models declare the options they accept; none lists the ones it ignores (``UNUSED_ARGS``)."""
    hits = [p.relative_to(ROOT).as_posix() for p in (ROOT / "graphattn").rglob("*.py")
            if "UNUSED_ARGS" in p.read_text()]
    assert not hits, hits


def test_old_module_paths_import_with_a_deprecation_warning():
    """The modules moved into :mod:`graphattn.core` (and the presets beside their mechanisms) keep
    their old import paths for one release."""
    import importlib
    import sys

    import graphattn
    import graphattn.nn

    for old, new in {**graphattn.MOVED_MODULES, **graphattn.nn.MOVED_MODULES}.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
            module = importlib.import_module(old)
        assert module is importlib.import_module(new)
    from graphattn.edgeset import EdgeSet, union_edge_sets  # noqa: F401  the old names resolve


def test_the_api_page_lists_the_current_public_names():
    """``docs/api.md`` is what ``python docs/make_api.py`` writes from the modules' ``__all__``."""
    import runpy

    make = runpy.run_path(str(ROOT / "docs" / "make_api.py"), run_name="make_api")
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == make["page"](), \
        "docs/api.md is stale: python docs/make_api.py > docs/api.md"
