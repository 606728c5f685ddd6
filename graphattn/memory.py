r"""The memory guard: refuse an edge set that cannot fit, before allocating it.

Every producer that enumerates edges, the structured edge sets' ``to_explicit()``, the union of edge
sets and :class:`~graphattn.EdgeAttention`'s reference path first estimate, from sizes they already
hold on the host (node and graph counts, ``k``, the degree, the window, ...), how many edges they are
about to build and how many bytes that takes. Above the **memory budget** they raise a
:class:`MemoryBudgetError` (a :class:`ValueError`) that names the edge count, the bytes, the budget
and the argument to lower, instead of growing until the process is killed or failing deep inside the
allocator::

    import graphattn as ga
    ga.set_memory_budget("8GiB")          # a fixed budget, process-wide
    with ga.memory_budget("off"):         # no guard inside the block
        ...
    ga.set_memory_budget(None)            # back to the default

The budget is, by precedence: the value given to :func:`set_memory_budget` (or the innermost
:func:`memory_budget` block), else the environment variable ``GRAPHATTN_MEMORY_BUDGET``, else
**half of the memory available** on the device the edges are built on. A budget is written as

* a number of bytes (``8_000_000_000``) or a string with a unit: ``"8GiB"``, ``"512MiB"``,
  ``"8G"`` (binary: ``K``, ``M``, ``G``, ``T``, ``P`` and ``KiB`` ... ``PiB``), ``"8GB"`` (decimal:
  ``kB`` ... ``PB``);
* a percentage of the available memory, ``"50%"`` (``"auto"`` is the default 50%);
* ``0``, ``"0"`` or ``"off"``: no guard.

The available memory is, on the CPU, ``MemAvailable`` of ``/proc/meminfo`` (``os.sysconf`` where
there is none), lowered to the room left under an address-space limit (``ulimit -v``); on a CUDA
device, the free device memory (:func:`torch.cuda.mem_get_info`) plus what PyTorch's caching
allocator holds unused. With a percentage budget, estimates under 64 MiB are accepted without
reading the free memory, so the guard costs nothing on ordinary sizes. The checks take Python
numbers and never read a device tensor (no host synchronisation); the callers derive them from
sizes already on the host.

What is counted (conservative figures, per edge):

* :data:`EDGE_BYTES` = 64 bytes for an enumerated edge: ``edge_index`` (16 B), ``origin`` (8 B), a
  ``head`` or a float ``bias`` / ``weight`` (8 B), and as much again for the copies made while it
  is built, selected and sorted. Producers whose construction holds more per edge say so (the
  expander's networkx adjacency, the SBM sampler's draws).
* :data:`DENSE_PAIR_BYTES` = 8 bytes per (query, source, head) triple of the dense shared-sources
  path (full attention, virtual nodes): an fp32 logit and an fp32 probability, what SDPA holds when
  it runs its math kernel (masks, CPU, or no fused kernel for the shape).
* The reference attention path (``EdgeAttention(kernel="reference")``, ``edge_attr``, complex
  weights, PyG hooks) gathers :math:`q_i, k_j, v_j` and the message for every edge: 4 × heads ×
  channels values per edge, plus the logits and coefficients.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "DENSE_PAIR_BYTES",
    "EDGE_BYTES",
    "ENV_VAR",
    "MemoryBudgetError",
    "available_memory",
    "check_edges",
    "get_memory_budget",
    "memory_budget",
    "set_memory_budget",
    "within_budget",
]

#: the environment variable read when no budget was set in the process
ENV_VAR = "GRAPHATTN_MEMORY_BUDGET"
#: bytes per enumerated edge, temporaries of its construction included (see the module docstring)
EDGE_BYTES = 64
#: bytes per (query, source, head) of the dense shared-sources path: an fp32 logit and probability
DENSE_PAIR_BYTES = 8
#: the default budget: this fraction of the available memory
DEFAULT_FRACTION = 0.5
#: with a fractional budget, estimates below this many bytes pass without reading the free memory
_FRACTION_FLOOR = 64 << 20

_UNSET = object()
_setting: Any = _UNSET  # the parsed value of set_memory_budget (_UNSET: the environment / default)


class MemoryBudgetError(ValueError):
    """An edge set (or the work on it) was estimated above the memory budget; raised before
    anything is allocated. A :class:`ValueError`, so callers catching bad arguments catch it."""


# ---------------------------------------------------------------------------------------- parsing
_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
    "p": 1 << 50, "pib": 1 << 50, "pb": 10**15,
}
_NUMBER = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)$")


def _parse(value: Any, source: str) -> tuple[str, float]:
    """``("off", 0)``, ``("bytes", n)`` or ``("fraction", f)`` from a budget as documented."""
    if isinstance(value, bool):
        raise ValueError(f"{source}: a memory budget must be bytes, a string such as '8GiB' or "
                         f"'50%', or 'off', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{source}: a memory budget in bytes must be >= 0, got {value}")
        return ("off", 0) if value == 0 else ("bytes", value)
    if isinstance(value, float):
        if math.isinf(value) and value > 0:
            return ("off", 0)
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"{source}: a memory budget in bytes must be a whole number >= 0 "
                             f"(for a share of the free memory write a percentage, '50%'), got "
                             f"{value!r}")
        return _parse(int(value), source)
    if not isinstance(value, str):
        raise ValueError(f"{source}: a memory budget must be bytes, a string such as '8GiB' or "
                         f"'50%', or 'off', got {type(value).__name__}")
    text = value.strip().lower().replace("_", "")
    if text in ("", "auto", "default"):
        return ("fraction", DEFAULT_FRACTION)
    if text in ("off", "none", "inf", "unlimited"):
        return ("off", 0)
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1.0
        if not 0 <= pct <= 100:
            raise ValueError(f"{source}: a memory budget percentage must lie in [0, 100], "
                             f"got {value!r}")
        return ("off", 0) if pct == 0 else ("fraction", pct / 100)
    m = _NUMBER.match(text)
    if m is None or m.group(2) not in _UNITS:
        raise ValueError(f"{source}: cannot read the memory budget {value!r}; write bytes "
                         f"('8000000000'), a size with a unit ('8GiB', '512M', '8GB'), a "
                         f"percentage of the free memory ('50%'), or 'off'")
    size = float(m.group(1)) * _UNITS[m.group(2)]
    return ("off", 0) if size == 0 else ("bytes", max(int(size), 1))


def _current() -> tuple[tuple[str, float], str]:
    """The budget in force and where it comes from (for the error message)."""
    if _setting is not _UNSET:
        return _setting, "set with graphattn.set_memory_budget"
    env = os.environ.get(ENV_VAR)
    if env is not None and env.strip():
        return _parse(env, ENV_VAR), f"from {ENV_VAR}={env.strip()}"
    return ("fraction", DEFAULT_FRACTION), "the default"


# --------------------------------------------------------------------------------------- the API
def set_memory_budget(budget: int | float | str | None) -> None:
    """Sets the process-wide memory budget of the guard (see the module docstring for the forms:
    bytes, ``"8GiB"``, ``"50%"``, ``"off"`` / ``0``). ``None`` restores the default: the
    environment variable ``GRAPHATTN_MEMORY_BUDGET`` if set, else half of the available memory."""
    global _setting
    _setting = _UNSET if budget is None else _parse(budget, "set_memory_budget")


@contextmanager
def memory_budget(budget: int | float | str | None) -> Iterator[None]:
    """The memory budget inside a ``with`` block (as :func:`set_memory_budget`; ``None``: the
    default), restored on exit. Process-wide, not per thread."""
    global _setting
    previous = _setting
    set_memory_budget(budget)
    try:
        yield
    finally:
        _setting = previous


def available_memory(device: Any = None) -> int | None:
    """Bytes available for new tensors on ``device`` (``None``: the CPU), or ``None`` if unknown.

    CPU: ``MemAvailable`` of ``/proc/meminfo`` (else ``os.sysconf``), at most the room left under
    an address-space limit (``ulimit -v``). CUDA: free device memory plus the caching allocator's
    unused reserve."""
    kind = "cpu" if device is None else getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "meta":
        return None
    if kind == "cuda":
        import torch

        dev = device if isinstance(device, torch.device) else torch.device(device)
        free, _total = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free) + max(int(cached), 0)
    return _host_available()


def _proc_kib(path: str, key: str) -> int | None:
    """The ``key:`` line of a ``/proc`` file (``... kB``) in bytes, or ``None``."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _host_available() -> int | None:
    avail = _proc_kib("/proc/meminfo", "MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            avail = None
    room = _address_space_room()
    if room is not None:
        avail = room if avail is None else min(avail, room)
    return avail


def _address_space_room() -> int | None:
    """Bytes left under ``RLIMIT_AS`` (``ulimit -v``), or ``None`` without a limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not a Unix
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = _proc_kib("/proc/self/status", "VmSize") or 0
    return max(int(soft) - used, 0)


def get_memory_budget(device: Any = None) -> int | None:
    """The budget in bytes the guard applies now on ``device`` (``None``: the CPU), or ``None``
    when the guard is off (or the available memory cannot be read)."""
    (kind, value), _ = _current()
    if kind == "off":
        return None
    if kind == "bytes":
        return int(value)
    avail = available_memory(device)
    return None if avail is None else int(value * avail)


def within_budget(num_bytes: float, device: Any = None) -> bool:
    """Whether an allocation of about ``num_bytes`` on ``device`` fits the budget."""
    (kind, _value), _ = _current()
    if kind == "off":
        return True
    if kind == "fraction" and num_bytes < _FRACTION_FLOOR:
        return True
    budget = get_memory_budget(device)
    return budget is None or num_bytes <= budget


def check_edges(
    num_edges: float,
    *,
    bytes_per_edge: float = EDGE_BYTES,
    what: str,
    how_to_lower: str,
    device: Any = None,
    num_bytes: float | None = None,
) -> None:
    """Raises :class:`MemoryBudgetError` if building ``num_edges`` edges (``num_bytes``, by default
    ``num_edges * bytes_per_edge``) on ``device`` would exceed the memory budget.

    Args:
        num_edges: the estimated edge count (a Python number computed from sizes on the host: this
            function never reads a device tensor).
        bytes_per_edge: bytes per edge (:data:`EDGE_BYTES` for an enumerated edge).
        what: what would be built, e.g. ``"KNNEdges(k=100000) on 200,000 nodes"``.
        how_to_lower: the advice, e.g. ``"lower k"``.
        device: where it would be allocated (``None``: the CPU).
        num_bytes: the byte estimate when it is not ``num_edges * bytes_per_edge`` (padding).
    """
    need = float(num_edges) * float(bytes_per_edge) if num_bytes is None else float(num_bytes)
    if within_budget(need, device):
        return
    (kind, value), source = _current()
    budget = get_memory_budget(device)
    assert budget is not None
    if kind == "fraction":
        where = str(device) if device is not None and str(device) != "cpu" else "the CPU"
        source = f"{value:.0%} of the memory available on {where}"
    raise MemoryBudgetError(
        f"{what} would need {format_count(num_edges)} edges (~{format_bytes(need)}), more than the "
        f"memory budget of {format_bytes(budget)} ({source}); {how_to_lower}, or raise the budget "
        f"with graphattn.set_memory_budget(...) or {ENV_VAR} ('off' disables the guard)"
    )


def format_count(n: float) -> str:
    """``1,234,567`` below 10^13, ``4.00e+13`` above."""
    return f"{n:,.0f}" if n < 1e13 else f"{n:.2e}"


def format_bytes(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 GiB``, ``29.1 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.1f} {unit}" if n < 1e4 else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover
