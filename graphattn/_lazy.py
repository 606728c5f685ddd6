"""Names a package imports on first use (PEP 562), so that ``import graphattn`` and the command
line's ``--help`` do not import torch until something needs it."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: Mapping[str, str],
                 submodules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a public name to the module
    defining it; ``submodules`` are imported as ``package.<name>``. A resolved name is cached in
    the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports, *submodules})

    return __getattr__, __dir__


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old import paths of moved modules, kept for one release: importing ``old`` (a key of
    ``moved``) warns with a :class:`DeprecationWarning` naming the new path and gives the module
    ``moved[old]`` itself (the same object, so ``isinstance`` checks and monkeypatches agree)."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> Any:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes in "
                      f"the next release)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: Any) -> None:
        """The module is the new one, already executed."""


def install_moved_modules(moved: Mapping[str, str]) -> None:
    """Registers ``moved`` (old → new module path) once per process (see :class:`MovedModules`)."""
    if not any(isinstance(f, MovedModules) and f.moved == dict(moved) for f in sys.meta_path):
        sys.meta_path.append(MovedModules(moved))
