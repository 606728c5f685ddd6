r"""Counting host synchronisations: the operations that make the host wait for the device.

On a GPU every such call stalls the Python thread until the device has finished all queued work,
so the next kernels cannot be queued while the current ones run. They are:

* reading a value: ``Tensor.item()``, ``int(t)``, ``float(t)``, ``bool(t)`` (all dispatch
  ``aten::_local_scalar_dense``), ``Tensor.tolist()`` and ``Tensor.numpy()``;
* operations whose output size depends on the data: ``nonzero`` (also behind boolean-mask
  indexing ``x[mask]``), ``masked_select``, ``unique`` / ``unique_consecutive``, ``bincount``,
  ``repeat_interleave`` without ``output_size``.

:func:`count_host_syncs` counts them inside a ``with`` block, on any device (on the CPU they
cost nothing, but the count is the one a GPU would see, which is what the tests pin). Reads of
``torch.optim``'s step counters are not counted: they stay on the CPU on every device::

    with count_host_syncs() as syncs:
        trainer.train_step(batch)
    print(syncs.total, syncs.by_op)
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncs", "count_host_syncs", "cpu_only"]

_state = threading.local()

_SYNC_OPS = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::unique_dim_consecutive",
    "aten::bincount",
}


class HostSyncs:
    """The counts of a :func:`count_host_syncs` block: :attr:`total` and :attr:`by_op`
    (operator name → count), and :attr:`by_site` where they happen."""

    def __init__(self, sites: bool = False) -> None:
        self.by_op: Counter[str] = Counter()
        #: ``"file:line"`` of graphattn's code (the innermost frame in the package) → count, when
        #: counted with ``sites=True``
        self.by_site: Counter[str] = Counter()
        self._sites = sites

    def add(self, op: str) -> None:
        self.by_op[op] += 1
        if self._sites:
            self.by_site[_site()] += 1

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __repr__(self) -> str:
        return f"HostSyncs(total={self.total}, by_op={dict(self.by_op)})"


class _Counter(TorchDispatchMode):
    def __init__(self, counts: HostSyncs) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if getattr(_state, "cpu_only", 0):
            pass
        elif name in _SYNC_OPS:
            if not (name == "aten::_local_scalar_dense" and _in_optimizer()):
                self.counts.add(name)
        elif name == "aten::repeat_interleave" and kwargs.get("output_size") is None:
            self.counts.add(name)
        elif name in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
                self.counts.add(name + " (boolean mask)")
        return func(*args, **kwargs)


def _in_optimizer() -> bool:
    """Whether the call comes from ``torch.optim``: its step counters live on the CPU on every
    device (Adam's ``state["step"]`` unless ``capturable``), so reading them is no device sync."""
    return any("/torch/optim/" in f.filename for f in traceback.extract_stack(limit=12))


def _site() -> str:
    """The innermost frame outside torch and this module: ``path:line (function)``."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        f = frame.filename
        if "/torch/" in f or f.endswith("syncs.py") or "/contextlib.py" in f:
            continue
        short = f.split("/graphattn/")[-1] if "/graphattn/" in f else f.rsplit("/", 1)[-1]
        return f"{short}:{frame.lineno} ({frame.name})"
    return "?"


@contextmanager
def cpu_only() -> Iterator[None]:
    """Marks a block that runs only for CPU tensors (a branch a GPU never takes, where reading a
    value costs nothing): :func:`count_host_syncs` does not count inside it, so the count stays
    the one a GPU would see."""
    _state.cpu_only = getattr(_state, "cpu_only", 0) + 1
    try:
        yield
    finally:
        _state.cpu_only -= 1


@contextmanager
def count_host_syncs(sites: bool = False) -> Iterator[HostSyncs]:
    """Counts the host synchronisations (see the module) of the code run inside the block;
    ``sites=True`` also records where in graphattn (or the caller's code) each one happens."""
    counts = HostSyncs(sites)
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}

    def wrap(name: str) -> Any:
        original = originals[name]

        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts.add(f"Tensor.{name}")
            return original(self, *args, **kwargs)

        return counted

    for name in originals:
        setattr(torch.Tensor, name, wrap(name))
    try:
        with _Counter(counts):
            yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
