r"""The per-graph stable sort of Sliceformer (:mod:`graphattn.producers.sliceformer`) for any
``[N, C]`` tensor: :func:`slice_sort_src`, the sorting permutation of every column as gather sources
``src [N, C]`` (``values.gather(0, src)`` sorts every column within every graph), by a two-pass stable
lexicographic sort (:func:`_lexsort`), a padded segmented sort (:func:`_segmented_sort`) or the
compiled CPU sort; :func:`sort_src` is the same on inputs the caller already checked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from graphattn.core.index import ptr_from_batch
from graphattn.producers.sliceformer.checks import (
    batch_is_sorted,
    check_batch,
    check_choice,
    check_values,
    is_single_graph,
)

METHODS = ("auto", "lexsort", "segmented", "compiled")
#: ``method="auto"`` may use the compiled sort (tests switch it off to compare the torch paths)
NATIVE_SORT = True


def slice_sort_src(
    values: Tensor,
    batch: Tensor | None = None,
    descending: bool | Tensor | None = None,
    *,
    method: str = "auto",
) -> Tensor:
    r"""Per-graph sorting permutation of every column of ``values``, as gather sources.

    For node :math:`t` at slot :math:`r` of graph :math:`g` (the :math:`r`-th node of :math:`g` in
    node-index order), ``src[t, c]`` is the node of :math:`g` holding :math:`g`'s :math:`r`-th
    smallest value of column :math:`c` (largest if ``descending[c]``), so
    ``values.gather(0, src)`` sorts every column within every graph. Ties keep node-index order
    (stable); descending sorts the negated values, which keeps the same tie order as
    ``torch.sort(..., descending=True, stable=True)``.

    Two exact implementations of the stable lexicographic sort on ``(graph, value, node index)``;
    neither forms a composite key such as ``value + graph * BIG`` (which loses precision and breaks
    ties):

    * ``"lexsort"``: a stable argsort by value, then a stable argsort of the graph ids in that
      order (two passes over all :math:`N` rows). Any ``batch``, also unsorted / non-contiguous.
    * ``"segmented"``: for a sorted ``batch`` (a PyG ``Batch``), each graph's rows are laid out in
      a ``[B, C, n_max]`` block padded with ``+inf`` after the real rows and sorted stably along the
      last axis (real ``+inf`` values precede the padding, so the first :math:`n_g` positions are
      exactly the stable order of graph :math:`g`). Shorter sorts and one pass.
    * ``"compiled"``: the CPU extension's ``segmented_argsort`` (float32/float64 values on the
      CPU, one graph or a sorted ``batch``): every (graph, column) sorted on its own, by an LSD
      radix sort of order-preserving integer keys (a comparison sort of short graphs), ties in
      node order. The same permutation, several times faster than torch's comparison sort.
    * ``"auto"``: ``"compiled"`` where it applies and the extension is available; otherwise
      ``"segmented"`` when ``batch`` is sorted and the padding at most doubles the rows
      (:math:`B \cdot n_{max} \le 2N`), else ``"lexsort"``; a single graph needs one sort either way.

    Args:
        values (Tensor): ``[N, C]`` floating point, no NaN (signed zeros tie).
        batch (LongTensor, optional): ``[N]`` graph of each node (default: one graph).
        descending (bool or BoolTensor, optional): ``True`` for all columns, or ``[C]`` per column.
        method (str): ``"auto"``, ``"lexsort"``, ``"segmented"`` or ``"compiled"``.

    Returns:
        LongTensor ``[N, C]``: ``src`` with ``batch[src[t, c]] == batch[t]``.
    """
    values = check_values(values).detach()
    N, C = values.shape
    batch = check_batch(batch, N)
    check_choice("method", method, METHODS)
    if isinstance(descending, Tensor) and (descending.dtype != torch.bool or descending.shape != (C,)):
        raise ValueError(f"'descending' must be a BoolTensor of shape [{C}] (one flag per "
                         f"column) or a bool, got {descending.dtype} {list(descending.shape)}")
    single = batch is None or is_single_graph(batch)
    return sort_src(values, batch, descending, method=method, single_graph=single,
                     is_sorted=single or batch_is_sorted(batch))


def sort_src(values: Tensor, batch: Tensor | None, descending: bool | Tensor | None, *,
              method: str, single_graph: bool, is_sorted: bool, ptr: Tensor | None = None) -> Tensor:
    """:func:`slice_sort_src` on checked inputs (the producer passes what the layer already
    checked and what its context knows: one graph, a sorted batch and its graph pointer)."""
    N = values.size(0)
    key = values.detach()
    if isinstance(descending, Tensor):
        key = torch.where(descending.to(values.device), -key, key)
    elif descending:
        key = -key
    one = batch is None or single_graph or N == 0  # no nodes (a batch of empty graphs): no sort
    if method in ("segmented", "compiled") and not (one or is_sorted):
        raise ValueError(f"method={method!r} needs 'batch' sorted by graph (as in a PyG Batch)")
    if method in ("auto", "compiled") and (one or is_sorted):
        ops = _compiled_sort_ops(key, required=method == "compiled")
        if ops is not None:
            if one:
                ptr = torch.tensor([0, N])
            elif ptr is None:
                ptr = ptr_from_batch(batch)
            return ops.segmented_argsort(key.contiguous(), ptr)
    if one:
        return torch.argsort(key, dim=0, stable=True)
    counts = torch.bincount(batch)
    if method == "auto":
        padded = counts.numel() * int(counts.max())
        method = "segmented" if is_sorted and padded <= 2 * N else "lexsort"
    if method == "segmented":
        return _segmented_sort(key, batch, counts)
    return _lexsort(key, batch, is_sorted)


def _compiled_sort_ops(key: Tensor, required: bool) -> Any | None:
    """The CPU extension's ops if ``segmented_argsort`` applies to ``key`` (else ``None``, or an
    error naming what is missing when ``method="compiled"`` was asked for)."""
    applies = key.device.type == "cpu" and key.dtype in (torch.float32, torch.float64)
    ops = None
    if applies and (NATIVE_SORT or required):
        from graphattn.kernels.cpu_extension import cpu_ops

        ops = cpu_ops(warn=False)
        if ops is not None and not hasattr(ops, "segmented_argsort"):
            ops = None
    if required and ops is None:
        raise ValueError("method='compiled' needs float32/float64 'values' on the CPU and the "
                         "compiled CPU extension (graphattn.kernels.cpu_extension), got "
                         f"{key.dtype} on {key.device}")
    return ops


def _lexsort(key: Tensor, batch: Tensor, is_sorted: bool) -> Tensor:
    p = torch.argsort(key, dim=0, stable=True)  # pass 1: by value, per column
    # pass 2: stable by graph -> lexicographic order (graph, value, node index)
    p = p.gather(0, torch.argsort(batch.take(p), dim=0, stable=True))
    if is_sorted:
        return p  # slot r of the graph-major order is node r
    slots = torch.argsort(batch, stable=True)  # node of every slot: graph-major, node order
    src = torch.empty_like(p)
    src[slots] = p
    return src


def _segmented_sort(key: Tensor, batch: Tensor, counts: Tensor) -> Tensor:
    N, C = key.shape
    start = torch.cumsum(counts, 0) - counts
    local = torch.arange(N, device=key.device) - start[batch]
    dense = key.new_full((counts.numel(), C, int(counts.max())), float("inf"))
    dense[batch, :, local] = key
    p = torch.argsort(dense, dim=2, stable=True)  # [B, C, n_max]; padding sorts last
    return p[batch, :, local] + start[batch][:, None]
