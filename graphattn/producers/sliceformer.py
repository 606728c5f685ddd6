r"""Sliceformer (Yuan & Xu, arXiv 2310.17683): slicing-sorting attention as permutation edge sets.

Every channel ("slice") :math:`c` of the layer's value projection :math:`V = X W_V` is sorted within
its graph; the sort is the permutation matrix :math:`P_c` and the output is

.. math::
    \operatorname{SliceSort}(X) = \operatorname{Concat}_c\big(P_c\, v_c\big), \qquad
    o[r, c] = V[\pi_c(r), c],

where :math:`r` is a *slot* (the :math:`r`-th node of the graph in node-index order) and
:math:`\pi_c` the per-graph stable argsort of channel :math:`c`. As an edge set: channel :math:`c`
is head :math:`c` (head size 1), target :math:`r` has exactly one in-edge, from
:math:`\pi_c(r)`, with weight 1 (``"weighted"`` mode: no query, no key, no softmax). The
:class:`~graphattn.PermutationEdgeSet` carries ``src [N, C]`` and the layer gathers; its
``to_explicit()`` edges are ``π_c(r) → r`` in head ``c``.

The module also exposes the sorting itself for any tensor: :func:`slice_sort_src`,
:func:`max_exchange_src` and the order-interleave rule :func:`interleave_descending`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from graphattn.edgeset import EdgeSet
from graphattn.origins import origin_code
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer
from graphattn.structured import PermutationEdgeSet

ORDERS = ("ascend", "descend", "interleave", "max_exchange")
GROUPS = (None, "head")
RULES = ("block", "paper_exact")
TAILS = ("code", "block")
SCOPES = ("global", "head")
DIRECTIONS = ("paper", "lra_code")


# --------------------------------------------------------------------------------------- sorting
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
    * ``"auto"``: ``"segmented"`` when ``batch`` is sorted and the padding at most doubles the rows
      (:math:`B \cdot n_{max} \le 2N`), else ``"lexsort"``; a single graph needs one sort either way.

    Args:
        values (Tensor): ``[N, C]`` floating point, no NaN (signed zeros tie).
        batch (LongTensor, optional): ``[N]`` graph of each node (default: one graph).
        descending (bool or BoolTensor, optional): ``True`` for all columns, or ``[C]`` per column.
        method (str): ``"auto"``, ``"lexsort"`` or ``"segmented"``.

    Returns:
        LongTensor ``[N, C]``: ``src`` with ``batch[src[t, c]] == batch[t]``.
    """
    values = _check_values(values).detach()
    N, C = values.shape
    batch = _check_batch(batch, N)
    _check_choice("method", method, ("auto", "lexsort", "segmented"))
    if isinstance(descending, Tensor) and (descending.dtype != torch.bool or descending.shape != (C,)):
        raise ValueError(f"'descending' must be a BoolTensor of shape [{C}] (one flag per "
                         f"column) or a bool, got {descending.dtype} {list(descending.shape)}")
    single = batch is None or _single_graph(batch)
    return _sort_src(values, batch, descending, method=method, single_graph=single,
                     is_sorted=single or _is_sorted(batch))


def _sort_src(values: Tensor, batch: Tensor | None, descending: bool | Tensor | None, *,
              method: str, single_graph: bool, is_sorted: bool) -> Tensor:
    """:func:`slice_sort_src` on checked inputs (the producer passes what the layer already
    checked and what its context knows: one graph, a sorted batch)."""
    N = values.size(0)
    key = values.detach()
    if isinstance(descending, Tensor):
        key = torch.where(descending.to(values.device), -key, key)
    elif descending:
        key = -key
    if batch is None or single_graph or N == 0:  # no nodes (a batch of empty graphs): no sort
        return torch.argsort(key, dim=0, stable=True)
    if method == "segmented" and not is_sorted:
        raise ValueError("method='segmented' needs 'batch' sorted by graph (as in a PyG Batch)")
    counts = torch.bincount(batch)
    if method == "auto":
        padded = counts.numel() * int(counts.max())
        method = "segmented" if is_sorted and padded <= 2 * N else "lexsort"
    if method == "segmented":
        return _segmented_sort(key, batch, counts)
    return _lexsort(key, batch, is_sorted)


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
    _check_choice("rule", rule, RULES)
    _check_choice("tail", tail, TAILS)
    _check_choice("scope", scope, SCOPES)
    _check_choice("direction", direction, DIRECTIONS)
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


def _check_choice(name: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise ValueError(f"'{name}' must be one of {allowed}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------- producer
@register_producer("sliceformer")
class SliceSortEdges(EdgeProducer):
    r"""Sliceformer's slicing-sorting attention: one sorting permutation per channel and graph.

    .. math::
        o[r, c] = \sum_{j \to r \text{ in head } c} 1 \cdot v_j^c = V[\pi_c(r), c], \qquad
        \pi_c = \operatorname{argsort}_{\text{stable}}\big(\pm V_g[:, c]\big)

    per graph :math:`g`, with :math:`V = X W_V` the consuming layer's value projection
    (:meth:`ProducerContext.value`). The map :math:`P_c` is sparse (:math:`N` non-zeros), full rank
    and doubly stochastic. Each channel is its own head (paper §3.2, C heads): the producer declares
    ``head_size = 1`` and :class:`~graphattn.HybridLayer` builds its
    :class:`~graphattn.EdgeAttention` with ``heads = channels`` of size 1 and, since
    ``mode = "weighted"``, without :math:`W_Q, W_K` (only :math:`W_V` and the block's :math:`W_O`).
    Edges: :class:`~graphattn.PermutationEdgeSet` with ``src [N, C]`` (a gather,
    :math:`O(NC)` memory; ``to_explicit()`` gives ``π_c(r) → r``, head ``c``, weight 1,
    origin ``"sorted"``). The gradient reaches :math:`V` through the gathered values only
    (:math:`\partial L / \partial V_{:,c} = P_c^\top \partial L / \partial o_{:,c}`), exactly as
    ``torch.sort(...).values``.

    **Order-dependent.** Slot :math:`r` receives the :math:`r`-th order statistic whatever node sits
    there: permuting the nodes of a graph leaves the output unchanged (permutation-*invariant* per
    slot, not equivariant). The node order of the loader is part of the model: CLS at local index
    0 for sequence classification (it receives the per-channel min, or max for descending
    channels), raster order for images, a Morton order for point clouds (see ``docs/sliceformer.md``).

    Args:
        order (str): ``"ascend"``, ``"descend"``, ``"interleave"`` (per-layer ascending/descending
            pattern, :func:`interleave_descending`) or ``"max_exchange"`` (swap each channel's
            first node with its argmax, :func:`max_exchange_src`).
        layer (int, optional): 0-based index of the consuming layer (GraphTransformer passes it);
            needed by ``"interleave"``.
        num_layers (int, optional): number of layers :math:`L` (GraphTransformer passes it).
        group (str, optional): ``None`` (paper: every channel its own permutation, head size 1) or
            ``"head"`` (the authors' code-only ``SWD10`` "multi-head" variant, not in the paper:
            sort by the sum of each head's channels and share that permutation within the head;
            uses the model's heads).
        rule, tail, scope, scope_heads, direction: interleave flags, see
            :func:`interleave_descending` (defaults: the paper's rule in integer arithmetic).
    """

    mode: ClassVar[str] = "weighted"
    #: the consuming attention's head size: 1 = one head per channel (``None``: the model's heads)
    head_size: int | None = 1
    # Not permutation-equivariant (the output is slot-indexed): this producer is excluded from
    # node-permutation equivariance tests on purpose; its tests check invariance instead.
    permutation_equivariant: ClassVar[bool] = False

    def __init__(
        self,
        order: str = "ascend",
        layer: int | None = None,
        num_layers: int | None = None,
        group: str | None = None,
        rule: str = "block",
        tail: str = "code",
        scope: str = "global",
        scope_heads: int | None = None,
        direction: str = "paper",
    ) -> None:
        super().__init__()
        self.order = _check_choice("order", order, ORDERS)
        self.group = _check_choice("group", group, GROUPS)
        self.rule = _check_choice("rule", rule, RULES)
        self.tail = _check_choice("tail", tail, TAILS)
        self.scope = _check_choice("scope", scope, SCOPES)
        self.direction = _check_choice("direction", direction, DIRECTIONS)
        self.scope_heads = None if scope_heads is None else check_positive_int("scope_heads",
                                                                                scope_heads)
        if num_layers is not None:
            num_layers = check_positive_int("num_layers", num_layers)
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)
                                  or layer < 0 or (num_layers is not None and layer >= num_layers)):
            raise ValueError(f"'layer' must be an int in [0, num_layers={num_layers}), got {layer!r}")
        if order == "interleave" and (layer is None or num_layers is None):
            raise ValueError("order='interleave' needs 'layer' (0-based) and 'num_layers' "
                             "(GraphTransformer passes both)")
        if scope == "head" and scope_heads is None:
            raise ValueError("scope='head' needs 'scope_heads' (the heads of the original MHA code)")
        self.layer = layer
        self.num_layers = num_layers
        self.head_size = 1 if group is None else None
        self._masks: dict[tuple[int, torch.device], Tensor] = {}

    def descending(self, channels: int, device: torch.device | None = None) -> Tensor | bool:
        """The descending flags of this layer's ``channels`` slices (a bool for uniform orders)."""
        if self.order != "interleave":
            return self.order == "descend"
        key = (channels, torch.device(device or "cpu"))
        if key not in self._masks:
            assert self.layer is not None and self.num_layers is not None
            self._masks[key] = interleave_descending(
                channels, self.layer, self.num_layers, rule=self.rule, tail=self.tail,
                scope=self.scope, scope_heads=self.scope_heads, direction=self.direction,
            ).to(key[1])
        return self._masks[key]

    def sort_key(self, ctx: ProducerContext) -> Tensor:
        """``[N, H]``: the values sorted in each head (head size 1, or the head-sum for ``group``)."""
        v = ctx.value()
        if self.group == "head":
            return v.detach().sum(-1)
        if v.size(-1) != 1:
            raise ValueError(
                f"sliceformer sorts every channel separately, so its EdgeAttention needs heads of "
                f"size 1 (heads = channels), got value heads of size {v.size(-1)}; HybridLayer "
                f"does this from the producer's head_size, or pass group='head'"
            )
        return v.detach()[..., 0]

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        key = self.sort_key(ctx)  # [N, H]
        N, H = key.shape
        if self.order == "max_exchange":
            src = max_exchange_src(key, ctx.batch)
        else:
            # the layer validated x and the batch: sort without checking them again
            src = _sort_src(key, ctx.batch, self.descending(H, key.device), method="auto",
                            single_graph=ctx.num_graphs == 1, is_sorted=ctx.is_sorted)
        origin = torch.full((1, 1), origin_code("sorted"), dtype=torch.long, device=src.device)
        return PermutationEdgeSet(
            src, num_heads=ctx.num_heads, mode="weighted", origin=origin.expand(N, H),
            stats={"edges_per_node": float(H)},
        )

    def extra_repr(self) -> str:
        parts = [f"order={self.order!r}"]
        if self.layer is not None:
            parts.append(f"layer={self.layer}/{self.num_layers}")
        if self.group is not None:
            parts.append(f"group={self.group!r}")
        if self.order == "interleave":
            parts.append(f"rule={self.rule!r}, tail={self.tail!r}, scope={self.scope!r}, "
                         f"direction={self.direction!r}")
        return ", ".join(parts)
