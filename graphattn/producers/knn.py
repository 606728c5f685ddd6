"""k nearest neighbours in a coordinate space (point clouds, pixel positions, embeddings)."""

from __future__ import annotations

from collections.abc import Hashable

import torch
from torch_geometric.utils import to_dense_batch

from graphattn.edgeset import EdgeSet
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
        if B and N:  # one host read: the largest graph, and positions free of NaN/inf
            n_max, finite = torch.stack([counts.max(), torch.isfinite(pos).all().long()]).tolist()
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
        dense, mask = to_dense_batch(pos.detach(), ctx.batch, batch_size=B, max_num_nodes=n_max)
        srcs, dsts = [], []
        if k > 0:
            chunk = max(1, self.max_elements // max(B * n_max, 1))
            cols = torch.arange(n_max, device=dev)
            for s in range(0, n_max, chunk):
                rows = torch.arange(s, min(s + chunk, n_max), device=dev)
                d = torch.cdist(dense[:, rows], dense)  # [B, c, n_max]
                invalid = ~mask[:, None, :].expand_as(d)
                if not self.loop:
                    invalid = invalid | (rows[None, :, None] == cols[None, None, :])
                d = d.masked_fill(invalid, float("inf"))
                dist, idx = torch.topk(d, k, dim=-1, largest=False)  # [B, c, k]
                keep = torch.isfinite(dist) & mask[:, rows, None]
                g = torch.arange(B, device=dev)[:, None, None].expand_as(idx)
                dst = (ptr[:-1][:, None, None] + rows[None, :, None]).expand_as(idx)
                srcs.append((ptr[:-1][g] + idx)[keep])
                dsts.append(dst[keep])
        if srcs:
            src, dst = torch.cat(srcs), torch.cat(dsts)
            order = torch.argsort(dst, stable=True)  # target-major
            edge_index = torch.stack([src[order], dst[order]])
        else:
            edge_index = torch.empty(2, 0, dtype=torch.long, device=dev)
        return explicit_edge_set(edge_index, ctx, "knn")

    def extra_repr(self) -> str:
        return f"k={self.k}, loop={self.loop}, attr={self.attr!r}"
