"""Index and pointer helpers shared by the edge sets and the kernels: argument checks that name
the argument (:func:`need_tensor`, ...), CSR pointers (:func:`ptr_from_batch`, :func:`sort_rows`),
tensor identities for caches (:func:`tensor_version`, :func:`known_ptr`, :func:`tensor_ids`) and
de-duplication (:func:`first_occurrences`). The lowest module of the core: it imports no edge set."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

from graphattn.core.checks import all_finite

F = TypeVar("F", bound=Callable[..., Any])


def shape_str(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def need_tensor(name: str, value: Any, *, dims: int | tuple[int, ...] | None = None) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(f"'{name}' must be a torch.Tensor, got {type(value).__name__}")
    if dims is not None:
        allowed = (dims,) if isinstance(dims, int) else dims
        if value.dim() not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"'{name}' must be {want}, got shape {shape_str(value)}")
    return value


def need_long(name: str, value: Tensor) -> Tensor:
    if value.dtype != torch.long:
        raise ValueError(f"'{name}' must have dtype torch.long, got {value.dtype}")
    return value


def need_float(name: str, value: Tensor, *, complex_ok: bool = False) -> Tensor:
    if not (value.is_floating_point() or (complex_ok and value.is_complex())):
        kind = "floating-point or complex" if complex_ok else "floating-point"
        raise ValueError(f"'{name}' must be a {kind} tensor, got {value.dtype}")
    return value


_DERIVED = threading.local()


def derived_edge_sets(fn: F) -> F:
    """Marks ``fn`` as building edge sets from already checked ones (a conversion, a union, a
    selection): inside it, the NaN/inf scan of float fields (one device-to-host transfer per field)
    is skipped; every shape, dtype and index check still runs. Edge sets a user or a producer builds
    from new values are scanned as before."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_DERIVED, "depth", 0)
        _DERIVED.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DERIVED.depth = depth

    return wrapper  # type: ignore[return-value]


def need_finite(name: str, value: Tensor) -> Tensor:
    if getattr(_DERIVED, "depth", 0):
        return value
    if value.numel() and not bool(all_finite(value)):
        raise ValueError(f"'{name}' contains NaN or infinite values")
    return value


def default_batch(batch: Tensor | None, num_nodes: int, device: torch.device | str) -> Tensor:
    """``batch`` (the graph of each node), or, where there is none, ``[num_nodes]`` zeros: one
    graph."""
    if batch is not None:
        return batch
    return torch.zeros(num_nodes, dtype=torch.long, device=device)


def ptr_from_batch(batch: Tensor, num_graphs: int | None = None) -> Tensor:
    """CSR pointer ``[B + 1]`` of a sorted ``batch`` vector."""
    if num_graphs is None:
        num_graphs = int(batch.max()) + 1 if batch.numel() else 0
    return ptr_from_counts(torch.bincount(batch, minlength=num_graphs))


def ptr_from_counts(counts: Tensor) -> Tensor:
    """CSR pointer ``[R + 1]`` (exclusive prefix sum with the total) of ``counts [R]``."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def sort_rows(rows: Tensor, num_rows: int) -> tuple[Tensor, Tensor]:
    """``(perm, ptr)``: the stable permutation sorting ``rows [E]`` and the CSR pointer
    ``[num_rows + 1]`` of the sorted order (the layout of :meth:`EdgeSet.csr` and of the fused
    kernel's graphs)."""
    perm = torch.argsort(rows, stable=True)
    try:
        counts = torch.bincount(rows, minlength=num_rows)
    except RuntimeError as e:  # the counts are computed anyway: naming a bad index costs nothing
        raise ValueError(f"'edge_index' holds a negative node index (expected indices in "
                         f"[0, {num_rows})): {str(e).splitlines()[0]}") from None
    if counts.numel() > num_rows:
        raise ValueError(f"'edge_index' holds node index {counts.numel() - 1}, out of range "
                         f"[0, {num_rows})")
    return perm, ptr_from_counts(counts)


def tensor_version(t: Tensor) -> int | None:
    """The in-place version counter of ``t``, or ``None`` for a tensor made under
    :func:`torch.inference_mode` (such tensors keep no counter: reading it raises). Cache keys
    holding ``None`` are never reused across calls (see :func:`cacheable`)."""
    return None if t.is_inference() else t._version


#: graph pointers the library built from a sorted batch: id -> (weak reference, in-place version)
_KNOWN_PTRS: dict[int, tuple[weakref.ref, int | None]] = {}


def known_ptr(ptr: Tensor) -> Tensor:
    """Marks ``ptr`` (built by the library from a sorted batch, e.g. :attr:`ProducerContext.ptr`)
    as a valid graph pointer, so that an edge set built on this very tensor skips checking it
    again (:func:`is_known_ptr`). The mark dies with the tensor and with any in-place change of it
    (an inference tensor keeps no version counter: the mark is then that object's identity)."""
    key = id(ptr)

    def forget(ref: weakref.ref, key: int = key) -> None:
        entry = _KNOWN_PTRS.get(key)
        if entry is not None and entry[0] is ref:
            _KNOWN_PTRS.pop(key, None)

    _KNOWN_PTRS[key] = (weakref.ref(ptr, forget), tensor_version(ptr))
    return ptr


def is_known_ptr(ptr: Tensor) -> bool:
    """Whether ``ptr`` is, unchanged, a pointer marked by :func:`known_ptr`."""
    entry = _KNOWN_PTRS.get(id(ptr))
    return entry is not None and entry[0]() is ptr and entry[1] == tensor_version(ptr)


def cacheable(*tensors: Tensor | None) -> bool:
    """Whether results derived from these tensors may be cached across calls: not when one is an
    inference tensor, whose in-place changes no version counter records."""
    return not any(t is not None and t.is_inference() for t in tensors)


def tensor_ids(*tensors: Tensor | None) -> tuple[Any, ...]:
    """Identity and version of each tensor (``None`` stays ``None``): a cache key that changes when
    a tensor is replaced or modified in place (an inference tensor's version is ``None``: within one
    forward pass, where these keys live, it is not modified)."""
    return tuple(None if t is None else (id(t), tensor_version(t)) for t in tensors)


#: on the CPU, :func:`first_occurrences` of at least this many keys runs the compiled radix sort
#: (``kernels/csrc/unique_first.cpp``) when the extension is available; ``None`` never does (the
#: same positions from torch's stable argsort)
NATIVE_UNIQUE_MIN: int | None = 1 << 12


def first_occurrences(key: Tensor) -> Tensor:
    """Positions of the first occurrence of every distinct value of ``key [E]``, in increasing
    ``key`` order (the de-duplication of :meth:`EdgeSet.coalesce` and of sampled multi-edges).

    Equals ``order[first]`` for ``order = argsort(key, stable=True)`` and ``first`` the start of
    each run of equal sorted keys. Large int64 keys on the CPU go through a compiled LSD radix
    sort over the bits that vary (:data:`NATIVE_UNIQUE_MIN`); the result is the same."""
    return unique_first(key)[0]


def unique_first(key: Tensor) -> tuple[Tensor, Tensor]:
    """``(positions, values)``: :func:`first_occurrences` of ``key`` and the distinct values
    themselves, ``key[positions]`` (sorted), without a gather on the compiled path."""
    if (NATIVE_UNIQUE_MIN is not None and key.device.type == "cpu" and key.dtype == torch.long
            and key.dim() == 1 and key.numel() >= NATIVE_UNIQUE_MIN):
        from graphattn.kernels.cpu_extension import cpu_ops

        ops = cpu_ops(warn=False)
        if ops is not None and hasattr(ops, "unique_first"):
            return ops.unique_first(key)
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    first = torch.ones_like(sorted_key, dtype=torch.bool)
    first[1:] = sorted_key[1:] != sorted_key[:-1]
    runs = first.nonzero().view(-1)  # one host read for both results
    return order[runs], sorted_key[runs]
