"""Tables kept in documents between HTML comment markers, which ``graphattn table --update-docs``
(``<!-- results-table: RUN_DIR ... -->`` … ``<!-- /results-table -->``) and ``graphattn league
--update-docs`` (``<!-- league-table: ... -->`` … ``<!-- /league-table -->``) rewrite.

A block is an opening line that starts with the opening marker and ends with ``-->``, then the
lines up to the next line that starts with the closing marker; what lies between is the table.
The two marker lines are kept as they are."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One marked block: ``args``, what its opening line holds between the opening marker and its
    closing ``-->`` (e.g. the run folders); ``body``, the lines between the two marker lines."""

    args: str
    body: str


def _lines(text: str) -> list[str]:
    """``text`` cut after every ``\\n`` (each line keeps it)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _spans(lines: list[str], start: str, end: str) -> list[tuple[int, int]]:
    """``(opening, closing)`` line indices of every block; a :class:`ValueError` for an opening
    line with no closing one after it."""
    spans = []
    i = 0
    while i < len(lines):
        line = lines[i].removesuffix("\n")
        if line.startswith(start) and line.endswith("-->") and lines[i].endswith("\n"):
            close = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(end)), None)
            if close is None:
                raise ValueError(f"the '{start} ... -->' marker on line {i + 1} has no '{end}' line "
                                 f"after it")
            spans.append((i, close))
            i = close
        i += 1
    return spans


def _opening_args(line: str, start: str) -> str:
    return line.removesuffix("\n")[len(start):-len("-->")]


def find_blocks(text: str, start: str, end: str) -> list[Block]:
    """Every block of ``text`` between the markers ``start`` and ``end``, in order."""
    lines = _lines(text)
    return [Block(_opening_args(lines[i], start), "".join(lines[i + 1:j]))
            for i, j in _spans(lines, start, end)]


def replace_blocks(text: str, start: str, end: str, table: Callable[[Block], str]) -> str:
    """``text`` with the body of every block between the markers ``start`` and ``end`` replaced by
    ``table(block)``; a :class:`ValueError` when there is no block."""
    lines = _lines(text)
    spans = _spans(lines, start, end)
    if not spans:
        raise ValueError(f"no '{start} ... -->' / '{end}' markers to put a table between")
    out, done = [], 0
    for i, j in spans:
        out += [*lines[done:i + 1], table(Block(_opening_args(lines[i], start),
                                                "".join(lines[i + 1:j])))]
        done = j
    return "".join([*out, *lines[done:]])
