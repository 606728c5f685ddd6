"""``graphattn`` / ``python -m graphattn``: the command line.

Sub-commands live in their own modules and register here:

* ``run``  — train and evaluate (``graphattn.runner.cli``);
* ``viz``  — draw the attention a trained model uses (``graphattn.viz.cli``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> module with ``add_arguments(parser)`` and ``main(args) -> int``
SUBCOMMANDS = {
    "run": "graphattn.runner.cli",
    "viz": "graphattn.viz.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphattn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    for name, module in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a sub-command not installed in this build
            if exc.name is not None and module.startswith(exc.name):
                continue
            raise
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["run"]  # the main job: the embedded default experiment
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_main", None) is None:
        parser.print_help()
        return 2
    return int(args._main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
