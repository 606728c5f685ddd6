r"""The sorting of Sliceformer (:mod:`graphattn.producers.sliceformer`) for any ``[N, C]`` tensor.

* :func:`slice_sort_src` — the per-graph stable sorting permutation of every column, as gather
  sources ``src [N, C]`` (``values.gather(0, src)`` sorts every column within every graph), by a
  two-pass stable lexicographic sort (:func:`_lexsort`) or a padded segmented sort
  (:func:`_segmented_sort`); :func:`sort_src` is the same on inputs the caller already checked.
* :func:`max_exchange_src` — the max-exchange permutation (Sliceformer_max): each column's first
  node of a graph swapped with its argmax, :math:`O(NC)`, no sort.
* :func:`interleave_descending` — which channels of a layer sort descending under
  Sliceformer_interleave (paper eqs. 5–6, in integer arithmetic).

Plus the input checks shared with the producer (:func:`check_choice`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from graphattn.core.edgeset import ptr_from_batch
from graphattn.producers.base import check_positive_int

RULES = ("block", "paper_exact")
TAILS = ("code", "block")
SCOPES = ("global", "head")
DIRECTIONS = ("paper", "lra_code")
METHODS = ("auto", "lexsort", "segmented", "compiled")
#: ``method="auto"`` may use the compiled sort (tests switch it off to compare the torch paths)
NATIVE_SORT = True


# ---------------------------------------------------------------------------------------- checks
def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """``value`` if it is one of ``allowed``, else a ``ValueError`` naming ``name``."""
    if value not in allowed:
        raise ValueError(f"'{name}' must be one of {allowed}, got {value!r}")
    return value


def _check_values(values: Any) -> Tensor:
    if not isinstance(values, Tensor) or values.dim() != 2:
        shape = list(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"'values' must be a 2-D tensor [N, C] (one column per slice), got {shape}")
    if not values.is_floating_point():
        raise ValueError(f"'values' must be a floating-point tensor, got {values.dtype}")
    if values.numel() and bool(torch.isnan(values).any()):
        raise ValueError("'values' contains NaN: a sort of NaN has no meaningful order")
    return values


def _check_batch(batch: Any, num_nodes: int) -> Tensor | None:
    if batch is None:
        return None
    if not isinstance(batch, Tensor) or batch.dim() != 1 or batch.numel() != num_nodes:
        shape = list(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
        raise ValueError(f"'batch' must be 1-D with one graph id per node [{num_nodes}], got {shape}")
    if batch.dtype != torch.long:
        raise ValueError(f"'batch' must have dtype torch.long, got {batch.dtype}")
    if num_nodes and int(batch.min()) < 0:
        raise ValueError("'batch' must hold non-negative graph ids")
    return batch


def _is_sorted(batch: Tensor) -> bool:
    return batch.numel() < 2 or bool((batch[1:] >= batch[:-1]).all())


def _single_graph(batch: Tensor) -> bool:
    return batch.numel() < 2 or bool((batch == batch[0]).all())


# --------------------------------------------------------------------------------------- sorting
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
    values = _check_values(values).detach()
    N, C = values.shape
    batch = _check_batch(batch, N)
    check_choice("method", method, METHODS)
    if isinstance(descending, Tensor) and (descending.dtype != torch.bool or descending.shape != (C,)):
        raise ValueError(f"'descending' must be a BoolTensor of shape [{C}] (one flag per "
                         f"column) or a bool, got {descending.dtype} {list(descending.shape)}")
    single = batch is None or _single_graph(batch)
    return sort_src(values, batch, descending, method=method, single_graph=single,
                     is_sorted=single or _is_sorted(batch))


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


def max_exchange_src(values: Tensor, batch: Tensor | None = None) -> Tensor:
    r"""Max-exchange permutation (Sliceformer_max) of every column, as gather sources.

    Per graph :math:`g` and column :math:`c`: with :math:`f` the first node of :math:`g` (lowest
    node index) and :math:`m` the node of its maximum (lowest index among ties), the transposition
    :math:`(f\ m)`: ``src[f, c] = m``, ``src[m, c] = f`` and ``src[t, c] = t`` otherwise (the
    identity when :math:`m = f`). :math:`O(NC)` time, no sort.

    Args:
        values (Tensor): ``[N, C]`` floating point, no NaN.
        batch (LongTensor, optional): ``[N]`` graph of each node (any order).

    Returns:
        LongTensor ``[N, C]``.
    """
    values = _check_values(values).detach()
    N, C = values.shape
    batch = _check_batch(batch, N)
    dev = values.device
    node = torch.arange(N, device=dev)
    src = node[:, None].expand(N, C).clone()
    if N == 0:
        return src
    if batch is None:
        batch = torch.zeros(N, dtype=torch.long, device=dev)
    B = int(batch.max()) + 1
    gid = batch[:, None].expand(N, C)
    vmax = values.new_full((B, C), float("-inf")).scatter_reduce(0, gid, values, "amax")
    cand = torch.where(values == vmax[batch], node[:, None], N)
    argmax = src.new_full((B, C), N).scatter_reduce(0, gid, cand, "amin")
    first = node.new_full((B,), N).scatter_reduce(0, batch, node, "amin")
    present = first < N  # graphs with nodes
    first, argmax = first[present], argmax[present]  # [B'], [B', C]
    src[first] = argmax
    src.scatter_(0, argmax, first[:, None].expand_as(argmax).contiguous())
    return src


# -------------------------------------------------------------------------------- interleave
def interleave_descending(
    channels: int,
    layer: int,
    num_layers: int,
    *,
    rule: str = "block",
    tail: str = "code",
    scope: str = "global",
    scope_heads: int | None = None,
    direction: str = "paper",
) -> Tensor:
    r"""Which channels of layer ``layer`` sort descending under Sliceformer_interleave.

    The paper (eqs. 5–6) sorts channel :math:`i \in 1..C` of layer :math:`n \in 1..L` ascending iff
    :math:`\psi_n(i) = \sin(2^{L-n}\pi i / C) \ge 0`. With 0-based ``layer`` :math:`\ell = n - 1`,
    0-based channel :math:`c = i - 1` and frequency exponent :math:`k` (``direction="paper"``:
    :math:`k = L - 1 - \ell`, the last layer all ascending; ``"lra_code"``: :math:`k = \ell`, the
    reversed direction of the LRA and Graphormer code, the first layer all ascending), everything is
    integer arithmetic (float ``sin`` is rounding noise at its zero crossings):

    * ``rule="block"`` (default): descending iff :math:`\lfloor c / b \rfloor` is odd, with block
      :math:`b = \max(1, \lfloor C / 2^k \rfloor)`. With ``tail="code"`` and :math:`k \ge 1`, the
      channels past the last complete (ascending, descending) block pair, :math:`c \ge 2b\lfloor C /
      2b\rfloor`, also descend (as the authors' ``Haar_wavelet_basis``); ``tail="block"`` keeps the
      block rule there. Both agree when :math:`2^k` divides :math:`C`.
    * ``rule="paper_exact"``: :math:`\psi \ge 0` evaluated exactly: ascending iff
      :math:`2^k (c + 1) \bmod 2C \le C` (so :math:`\sin = 0` is ascending and block ends differ
      from the block rule, e.g. :math:`C = 8, k = 1` descends on {4, 5, 6}).

    ``scope="global"`` indexes all :math:`C` channels (paper); ``scope="head"`` applies the rule to
    the index within each of ``scope_heads`` consecutive groups of :math:`C / \text{scope\_heads}`
    channels (the code's per-head index, blocks ``scope_heads`` times shorter).

    Returns:
        BoolTensor ``[channels]``, ``True`` = descending.
    """
    channels = check_positive_int("channels", channels)
    num_layers = check_positive_int("num_layers", num_layers)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"'layer' must be an int in [0, num_layers={num_layers}), got {layer!r}")
    check_choice("rule", rule, RULES)
    check_choice("tail", tail, TAILS)
    check_choice("scope", scope, SCOPES)
    check_choice("direction", direction, DIRECTIONS)
    k = num_layers - 1 - layer if direction == "paper" else layer
    c = torch.arange(channels)
    size = channels
    if scope == "head":
        if scope_heads is None:
            raise ValueError("scope='head' needs 'scope_heads' (the heads of the original MHA code)")
        scope_heads = check_positive_int("scope_heads", scope_heads)
        if channels % scope_heads:
            raise ValueError(f"'scope_heads' ({scope_heads}) must divide the channels ({channels})")
        size = channels // scope_heads
        c = c % size
    if rule == "paper_exact":
        return (2**k * (c + 1)) % (2 * size) > size
    b = max(1, size // 2**k)
    desc = (c // b) % 2 == 1
    if tail == "code" and k >= 1:
        desc |= c >= 2 * b * (size // (2 * b))
    return desc
