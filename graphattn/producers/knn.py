"""k nearest neighbours in a coordinate space (point clouds, pixel positions, embeddings)."""

from __future__ import annotations

from collections.abc import Hashable

import torch

from graphattn.core.checks import all_finite
from graphattn.core.edgeset import EdgeSet
from graphattn.kernels.dense import padding_classes
from graphattn.memory import check_edges
from graphattn.producers._util import explicit_edge_set
from graphattn.producers.base import EdgeProducer, ProducerContext, check_positive_int
from graphattn.producers.registry import register_producer


@register_producer("knn")
class KNNEdges(EdgeProducer):
    r"""Each node attends to its :math:`k` nearest nodes of the same graph:
    :math:`\mathcal{N}(i) = \operatorname{argmin}^{(k)}_{j \ne i,\ \text{batch}_j = \text{batch}_i}
    \lVert p_i - p_j \rVert_2`, with :math:`p` = ``data.pos`` (or ``x`` when ``attr="x"``).

    In-degree is exactly :math:`\min(k, n_b - 1)` (:math:`\min(k, n_b)` with ``loop=True``, where
    :math:`i` itself is a candidate). Computed per graph on padded coordinates, chunked over queries
    so memory stays :math:`O(B \cdot \text{chunk} \cdot n_{max})`. Needs a sorted ``batch``. The
    :math:`N \min(k, n_{max})` edges are checked against the memory budget (:mod:`graphattn.memory`)
    before anything is computed.

    Args:
        k (int): neighbours per node.
        loop (bool): allow :math:`j = i`.
        attr (str): ``"pos"`` (data attribute) or ``"x"`` (the layer input).
        max_elements (int): distance-matrix elements computed at once.
    """

    def __init__(self, k: int = 16, loop: bool = False, attr: str = "pos",
                 max_elements: int = 1 << 24) -> None:
        super().__init__()
        self.k = check_positive_int("k", k)
        self.loop = bool(loop)
        self.attr = attr
        self.max_elements = check_positive_int("max_elements", max_elements)

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        if self.attr == "x":  # neighbours in the layer's input: different in every layer
            return None
        return ("knn", self.k, self.loop, self.attr, self.max_elements)

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        pos = ctx.x if self.attr == "x" else ctx.attr(self.attr)
        if not (isinstance(pos, torch.Tensor) and pos.dim() == 2 and pos.size(0) == ctx.num_nodes
                and pos.is_floating_point()):
            raise ValueError(f"KNNEdges needs '{self.attr}' as a float tensor [N={ctx.num_nodes}, d],"
                             f" got {getattr(pos, 'shape', type(pos).__name__)}")
        ptr = ctx.ptr
        counts = ptr[1:] - ptr[:-1]
        B = counts.numel()
        N = ctx.num_nodes
        dev = ctx.device
        n_max = 0
        if B and N:  # one host read: the graph sizes, and positions free of NaN/inf
            *sizes, finite = torch.cat([counts, all_finite(pos).long()[None]]).tolist()
            n_max = max(sizes)
            if not finite:
                raise ValueError(f"'{self.attr}' contains NaN or infinite values (a node without a "
                                 f"position has no nearest neighbours)")
        if N == 0 or n_max == 0:
            empty = torch.empty(2, 0, dtype=torch.long, device=dev)
            return EdgeSet(empty, num_heads=ctx.num_heads,
                           origin=torch.empty(0, dtype=torch.long, device=dev))
        k = min(self.k, n_max if self.loop else n_max - 1)
        check_edges(N * k, what=f"KNNEdges(k={self.k:,}) on {N:,} nodes (graphs of up to {n_max:,})",
                    how_to_lower="lower k", device=dev)
        srcs, dsts = [], []
        pos = pos.detach()
        for graphs, n_b in padding_classes(sizes, dev, B * n_max * n_max) if k > 0 else ():
            # the graphs of one size class, padded to the class's largest (not the batch's)
            g = torch.tensor(graphs, dtype=torch.long).to(dev)
            start = ptr[:-1][g]
            slot = torch.arange(n_b, device=dev)
            mask = slot[None, :] < counts[g][:, None]  # [G, n_b]
            node = torch.where(mask, start[:, None] + slot[None, :], 0)
            dense = pos[node] * mask[..., None]
            k_b = min(k, n_b if self.loop else n_b - 1)
            if k_b > 0:
                src, dst = self._nearest(dense, mask, start, k_b)
                srcs.append(src)
                dsts.append(dst)
        if srcs:
            pairs = torch.stack([torch.cat(srcs), torch.cat(dsts)])
            src, dst = pairs[:, pairs[0] >= 0]
            order = torch.argsort(dst, stable=True)  # target-major
            edge_index = torch.stack([src[order], dst[order]])
        else:
            edge_index = torch.empty(2, 0, dtype=torch.long, device=dev)
        return explicit_edge_set(edge_index, ctx, "knn")

    def _nearest(self, dense: torch.Tensor, mask: torch.Tensor, start: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` nearest valid slots of every valid slot of ``dense`` ``[G, n, d]`` (padded
        graphs, ``mask`` ``[G, n]``), as global ``(src, dst)`` (slot + the graph's ``start``);
        chunked over query rows so at most ``max_elements`` distances exist at once."""
        G, n = mask.shape
        dev = dense.device
        chunk = max(1, self.max_elements // max(G * n, 1))
        cols = torch.arange(n, device=dev)
        srcs, dsts = [], []
        for s in range(0, n, chunk):
            rows = torch.arange(s, min(s + chunk, n), device=dev)
            d = torch.cdist(dense[:, rows], dense)  # [G, c, n]
            invalid = ~mask[:, None, :].expand_as(d)
            if not self.loop:
                invalid = invalid | (rows[None, :, None] == cols[None, None, :])
            d = d.masked_fill(invalid, float("inf"))
            dist, idx = torch.topk(d, k, dim=-1, largest=False)  # [G, c, k]
            keep = torch.isfinite(dist) & mask[:, rows, None]
            base = start[:, None, None]
            # the padded pairs are marked -1 and dropped once at the end (one host sync per pass)
            srcs.append(torch.where(keep, base + idx, -1).view(-1))
            dsts.append(torch.where(keep, base + rows[None, :, None], -1).view(-1))
        return torch.cat(srcs), torch.cat(dsts)

    def extra_repr(self) -> str:
        return f"k={self.k}, loop={self.loop}, attr={self.attr!r}"

