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

The sorting itself, for any tensor, lives beside the producer:
:func:`~graphattn.producers.sliceformer.sorting.slice_sort_src` (:mod:`~graphattn.producers.sliceformer.
sorting`), :func:`~graphattn.producers.sliceformer.max_exchange.max_exchange_src` and the order-interleave
rule :func:`~graphattn.producers.sliceformer.interleave.interleave_descending`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.core.structured import PermutationEdgeSet
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer
from graphattn.producers.sliceformer.checks import check_choice
from graphattn.producers.sliceformer.interleave import DIRECTIONS, RULES, SCOPES, TAILS, interleave_descending
from graphattn.producers.sliceformer.max_exchange import max_exchange_src
from graphattn.producers.sliceformer.sorting import sort_src

ORDERS = ("ascend", "descend", "interleave", "max_exchange")
GROUPS = (None, "head")


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
    # node-permutation equivariance tests on purpose; its tests check invariance instead. A node
    # task refuses it (the slot's output says nothing about the node there).
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
        self.order = check_choice("order", order, ORDERS)
        self.group = check_choice("group", group, GROUPS)
        self.rule = check_choice("rule", rule, RULES)
        self.tail = check_choice("tail", tail, TAILS)
        self.scope = check_choice("scope", scope, SCOPES)
        self.direction = check_choice("direction", direction, DIRECTIONS)
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
            # the layer validated x and the batch: sort without checking them again; the compiled
            # CPU sort reads the graphs from the context's (shared) pointer
            one, ordered = ctx.num_graphs == 1, ctx.is_sorted
            ptr = ctx.ptr if ordered and not one and key.device.type == "cpu" else None
            src = sort_src(key, ctx.batch, self.descending(H, key.device), method="auto",
                           single_graph=one, is_sorted=ordered, ptr=ptr)
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
