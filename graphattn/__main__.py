"""``graphattn`` / ``python -m graphattn``: the command line.

Sub-commands live in their own modules; only the chosen one is imported (``graphattn --help`` stays
fast because it imports neither torch nor PyG):

* ``run``  — train and evaluate (``graphattn.runner.cli``);
* ``viz``  — draw the attention a trained model uses (``graphattn.viz.cli``);
* ``table`` — a results table from finished runs (``graphattn.runner.table``);
* ``league`` — every mechanism and baseline under one protocol (``graphattn.runner.league``).

Errors are printed as one line (``graphattn run: error: ...``) with exit status 2; ``--debug``
(before or after the sub-command) shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

# name -> (module with ``add_arguments(parser)`` and ``main(args) -> int``, one-line help)
SUBCOMMANDS = {
    "run": ("graphattn.runner.cli", "train and evaluate a model on a benchmark task "
                                    "(default: Cora with a GCN + attention hybrid)"),
    "viz": ("graphattn.viz.cli", "draw the attention a trained model uses on one sample "
                                 "(HTML viewer or PNG/PDF/SVG figures)"),
    "table": ("graphattn.runner.table", "one results table (mean ± std over seeds, parameters, "
                                        "epochs, time, command) from finished run folders, or "
                                        "with --against each run against a reference (Welch's "
                                        "t-test)"),
    "league": ("graphattn.runner.league", "the paper mechanisms and the static baselines under "
                                          "one protocol per task: trains what is missing, writes "
                                          "the league table"),
}

DESCRIPTION = ("graphattn: efficient attention on graphs, sequences, images and point clouds. "
               "Without a sub-command it runs the main job ('graphattn run').")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; sub-command options are added for ``only`` (all sub-commands when ``None``)."""
    parser = _Parser(prog="graphattn", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter
                           if name == "viz" else argparse.HelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks on errors")
        if only is None or only == name:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(_main=mod.main)
    return parser


def _subcommand(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if arg in SUBCOMMANDS:
            return arg
        if not arg.startswith("-"):
            return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not [a for a in argv if a != "--debug"]:
        argv = [*argv, "run"]  # the main job: the embedded default experiment
    name = _subcommand(argv)
    parser = build_parser(only=name or "")
    args = parser.parse_args(argv)
    args._argv = [a for a in argv if a != "--debug"]  # what the run records as its command
    if getattr(args, "_main", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except BrokenPipeError:  # the reader went away (e.g. '| head'): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"graphattn {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"graphattn {name}: error: {describe_error(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, (ValueError, TypeError, OSError)) else 1


def describe_error(exc: BaseException) -> str:
    """One line for the user: the message of the errors the library raises on bad input (they
    name the argument), the type as well for anything else, plus a pointer to ``--debug``."""
    msg = str(exc).strip() or type(exc).__name__
    if isinstance(exc, (ValueError, TypeError, FileNotFoundError)):
        return msg
    return f"{type(exc).__name__}: {msg} (run again with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
