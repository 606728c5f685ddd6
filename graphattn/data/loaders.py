"""Loaders: PyG transforms turning sequences, images and point clouds into graphs.

Node order is part of the contract, because order-dependent producers (sliding window,
Sliceformer, Converter) read it:

* **sequence** → one node per token in token order, ``pos = [index]``; an optional CLS node sits at
  local index 0 (the readout of sequence classification);
* **image** → pixels or non-overlapping patches in raster (row-major) order, ``pos = (row, col)``,
  4- or 8-neighbour grid edges; an optional CLS node at local index 0;
* **point cloud** → points, ``pos`` = coordinates, k-nearest-neighbour edges; optionally re-ordered
  along a Morton (Z-order) curve so that nearby points get nearby indices.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from graphattn.producers.knn import KNNEdges


def _band_edges(n: int, window: int, offset: int = 0) -> Tensor:
    """Edges ``j -> i`` with ``0 < |i - j| <= window`` among nodes ``offset .. offset+n-1``."""
    if n == 0 or window <= 0:
        return torch.empty(2, 0, dtype=torch.long)
    i = torch.arange(n)
    parts = []
    for d in range(1, window + 1):
        src = i[:-d] if d < n else i[:0]
        parts += [torch.stack([src, src + d]), torch.stack([src + d, src])]
    return torch.cat(parts, 1) + offset


class SequenceToGraph(BaseTransform):
    r"""Token sequence (``data.tokens`` ``[L]``, long) → graph with one node per token.

    ``x`` = token ids ``[N]`` (use ``GraphTransformer(node_encoder="embedding")``), ``pos`` =
    ``[N, 1]`` positions. Edges ``j \to i`` for ``0 < |i - j| \le`` ``window`` (none if ``window``
    is 0). With ``cls_token`` set, a CLS node (that id) is prepended at local index 0 with
    ``pos = -1``, connected both ways to every token when ``cls_edges``. ``pad_to`` with
    ``pad_token`` appends padding tokens as real nodes (parity with padded benchmarks).
    """

    def __init__(self, window: int = 0, cls_token: int | None = None, cls_edges: bool = True,
                 pad_to: int | None = None, pad_token: int = 0) -> None:
        if window < 0:
            raise ValueError(f"'window' must be >= 0, got {window}")
        self.window = window
        self.cls_token = cls_token
        self.cls_edges = cls_edges
        self.pad_to = pad_to
        self.pad_token = pad_token

    def forward(self, data: Data) -> Data:
        tokens = data.tokens if "tokens" in data else data.x
        if tokens is None or tokens.dim() != 1 or tokens.dtype != torch.long:
            raise ValueError("SequenceToGraph needs data.tokens as a 1-D long tensor")
        if self.pad_to is not None and tokens.numel() < self.pad_to:
            pad = tokens.new_full((self.pad_to - tokens.numel(),), self.pad_token)
            tokens = torch.cat([tokens, pad])
        L = tokens.numel()
        off = 0 if self.cls_token is None else 1
        edges = [_band_edges(L, self.window, off)]
        pos = torch.arange(L, dtype=torch.float)
        if self.cls_token is not None:
            tokens = torch.cat([tokens.new_tensor([self.cls_token]), tokens])
            pos = torch.cat([pos.new_tensor([-1.0]), pos])
            if self.cls_edges and L:
                t = torch.arange(1, L + 1)
                edges += [torch.stack([t, torch.zeros_like(t)]), torch.stack([torch.zeros_like(t), t])]
        out = Data(x=tokens, pos=pos[:, None], edge_index=torch.cat(edges, 1), num_nodes=tokens.numel())
        for key in data.keys():
            if key not in ("tokens", "x", "pos", "edge_index", "num_nodes"):
                out[key] = data[key]
        return out


def grid_edges(h: int, w: int, connectivity: int = 4) -> Tensor:
    """Both-direction edges of an ``h × w`` grid in raster order (4- or 8-neighbourhood)."""
    if connectivity not in (4, 8):
        raise ValueError(f"'connectivity' must be 4 or 8, got {connectivity}")
    idx = torch.arange(h * w).view(h, w)
    pairs = [(idx[:, :-1], idx[:, 1:]), (idx[:-1, :], idx[1:, :])]
    if connectivity == 8:
        pairs += [(idx[:-1, :-1], idx[1:, 1:]), (idx[:-1, 1:], idx[1:, :-1])]
    parts = []
    for a, b in pairs:
        a, b = a.reshape(-1), b.reshape(-1)
        parts += [torch.stack([a, b]), torch.stack([b, a])]
    return torch.cat(parts, 1)


class ImageToGraph(BaseTransform):
    r"""Image (``data.image`` ``[C, H, W]``) → graph of pixels (``patch_size=1``) or
    non-overlapping ``p × p`` patches in raster order.

    ``x`` = the flattened patch values ``[N, C·p²]``, ``pos`` = ``(row, col)`` of each patch,
    grid edges between 4- or 8-neighbouring patches. ``H`` and ``W`` must be multiples of ``p``.
    With ``cls=True`` a CLS node is prepended at local index 0 (``x`` gains an indicator column,
    ``pos = (-1, -1)``, connected both ways to every patch).
    """

    def __init__(self, patch_size: int = 1, connectivity: int = 4, cls: bool = False) -> None:
        if patch_size < 1:
            raise ValueError(f"'patch_size' must be >= 1, got {patch_size}")
        self.patch_size = patch_size
        self.connectivity = connectivity
        self.cls = cls

    def forward(self, data: Data) -> Data:
        img = data.image
        if img is None or img.dim() != 3:
            raise ValueError("ImageToGraph needs data.image as a [C, H, W] tensor")
        C, H, W = img.shape
        p = self.patch_size
        if H % p or W % p:
            raise ValueError(f"image {H}x{W} is not divisible into {p}x{p} patches")
        h, w = H // p, W // p
        x = img.float().reshape(C, h, p, w, p).permute(1, 3, 0, 2, 4).reshape(h * w, C * p * p)
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        pos = torch.stack([rows.reshape(-1), cols.reshape(-1)], 1).float()
        edge_index = grid_edges(h, w, self.connectivity)
        if self.cls:
            n = h * w
            x = torch.cat([torch.zeros(n, 1), x], 1)
            x = torch.cat([torch.cat([torch.ones(1, 1), torch.zeros(1, C * p * p)], 1), x])
            pos = torch.cat([pos.new_tensor([[-1.0, -1.0]]), pos])
            t = torch.arange(1, n + 1)
            edge_index = torch.cat([edge_index + 1, torch.stack([t, torch.zeros_like(t)]),
                                    torch.stack([torch.zeros_like(t), t])], 1)
        out = Data(x=x, pos=pos, edge_index=edge_index, num_nodes=x.size(0))
        for key in data.keys():
            if key not in ("image", "x", "pos", "edge_index", "num_nodes"):
                out[key] = data[key]
        return out


def morton_order(pos: Tensor, bits: int = 10) -> Tensor:
    """Permutation sorting points along a Morton (Z-order) curve: coordinates are quantised to
    ``bits`` bits per dimension over their bounding box and the bits interleaved."""
    if pos.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    lo = pos.min(0).values
    span = (pos.max(0).values - lo).clamp_min(1e-12)
    q = ((pos - lo) / span * (2**bits - 1)).round().long()
    d = pos.size(1)
    code = torch.zeros(pos.size(0), dtype=torch.long)
    for b in range(bits):
        for k in range(d):
            code |= ((q[:, k] >> b) & 1) << (b * d + k)
    return torch.argsort(code, stable=True)


class PointCloudToGraph(BaseTransform):
    r"""Point cloud (``data.pos`` ``[N, d]``) → graph with k-nearest-neighbour edges
    (:math:`j \to i` for the :math:`k` points nearest to :math:`i`), ``x`` = coordinates
    (concatenated with ``data.normal`` / ``data.x`` if present). With ``morton=True`` the points
    are first re-ordered along a Morton curve (for order-dependent producers)."""

    def __init__(self, k: int = 16, morton: bool = False, loop: bool = False) -> None:
        self.knn = KNNEdges(k, loop=loop)
        self.morton = morton

    def forward(self, data: Data) -> Data:
        pos = data.pos
        if pos is None or pos.dim() != 2:
            raise ValueError("PointCloudToGraph needs data.pos as an [N, d] tensor")
        pos = pos.float()
        feats = [pos]
        for key in ("normal", "x"):
            if key in data and data[key] is not None:
                feats.append(data[key].float().view(pos.size(0), -1))
        x = torch.cat(feats, 1)
        if self.morton:
            order = morton_order(pos)
            pos, x = pos[order], x[order]
        g = Data(pos=pos, num_nodes=pos.size(0))
        edge_index = self.knn(x, data=g).edge_index
        out = Data(x=x, pos=pos, edge_index=edge_index, num_nodes=pos.size(0))
        for key in data.keys():
            if key not in ("pos", "x", "normal", "face", "edge_index", "num_nodes"):
                out[key] = data[key]
        return out
