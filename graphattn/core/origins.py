"""Edge origins: small integer codes naming the producer that made each edge.

Every :class:`~graphattn.EdgeSet` may carry ``origin [E]``. The codes are used by the trace, the
statistics and the viewer (edges coloured by where they came from). Built-in producers use the names
below; a custom producer registers its own name with :func:`origin_code`, which assigns the next free
code the first time a name is seen.
"""

from __future__ import annotations

_BUILTIN = (
    "unknown",
    "input",
    "self_loop",
    "full",
    "window",
    "knn",
    "random",
    "expander",
    "virtual",
    "sampled",
    "sorted",
    "operator",
    "support",
    "exploration",
    "global",
)

_CODES: dict[str, int] = {name: i for i, name in enumerate(_BUILTIN)}
_NAMES: list[str] = list(_BUILTIN)


def origin_code(name: str) -> int:
    """Returns the integer code of origin ``name``, registering the name if it is new."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"origin name must be a non-empty string, got {name!r}")
    code = _CODES.get(name)
    if code is None:
        code = len(_NAMES)
        _CODES[name] = code
        _NAMES.append(name)
    return code


def origin_name(code: int) -> str:
    """Returns the name of origin ``code`` (``"unknown"`` for codes never registered)."""
    code = int(code)
    return _NAMES[code] if 0 <= code < len(_NAMES) else "unknown"


def origin_names() -> dict[int, str]:
    """All registered origins as ``{code: name}``."""
    return dict(enumerate(_NAMES))
