"""Writes ``docs/api.md``: the public names of graphattn, each with the first sentence of its
docstring (``python docs/make_api.py > docs/api.md``; ``tests/test_layout.py`` checks the page is
current)."""

from __future__ import annotations

import importlib
import inspect

MODULES = ("graphattn", "graphattn.core", "graphattn.interop", "graphattn.producers", "graphattn.nn",
           "graphattn.data", "graphattn.runner", "graphattn.viz")


def summary(obj: object) -> str:
    """The first sentence of ``obj``'s docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    end = first.find(". ")
    return (first[:end + 1] if end >= 0 else first).replace("|", "\\|")


def page() -> str:
    lines = ["# API reference", "",
             "The public names of each module (its `__all__`), with the first sentence of their "
             "docstrings; `help(name)` gives the rest (the math, every argument). Written by "
             "`python docs/make_api.py > docs/api.md`.", ""]
    for name in MODULES:
        module = importlib.import_module(name)
        lines += [f"## `{name}`", "", summary(module), "", "| name | what |", "|---|---|"]
        for attr in sorted(getattr(module, "__all__", [])):
            obj = getattr(module, attr)
            what = summary(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)
                                    or inspect.ismodule(obj)) else f"`{type(obj).__name__}`"
            lines.append(f"| `{attr}` | {what} |")
        lines.append("")
    from graphattn.producers import PRODUCERS

    lines += ["## Producers by registry name", "",
              "`build_producer(name or {\"name\": ..., **kwargs})`, `--producer` on the command line.",
              "", "| name | class | what |", "|---|---|---|"]
    for key in sorted(PRODUCERS):
        cls = PRODUCERS[key]
        if not cls.__module__.startswith("graphattn."):  # registered by user code, not the package
            continue
        lines.append(f"| `{key}` | `{cls.__module__}.{cls.__name__}` | {summary(cls)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(page(), end="")
