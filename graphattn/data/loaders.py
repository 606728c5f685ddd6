"""Loaders: PyG transforms turning sequences, images and point clouds into graphs.

Node order is part of the contract, because order-dependent producers (sliding window,
Sliceformer, Converter) read it:

* **sequence** → one node per token in token order, ``pos = [index]``; an optional CLS node sits at
  local index 0 (the readout of sequence classification). A real-valued series (a time series,
  ``[L]`` or ``[L, C]``) gives one node per time step, or per non-overlapping patch of
  ``patch_size`` steps, in time order, with the same CLS convention;
* **image** → pixels or non-overlapping patches in raster (row-major) order, ``pos = (row, col)``,
  4- or 8-neighbour grid edges; an optional CLS node at local index 0;
* **point cloud** → points, ``pos`` = coordinates, k-nearest-neighbour edges; optionally re-ordered
  along a Morton (Z-order) curve so that nearby points get nearby indices.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from graphattn.core.checks import all_finite
from graphattn.memory import check_edges
from graphattn.producers.base import check_positive_int
from graphattn.producers.knn import KNNEdges

#: the bits of a Morton code: an int64 without its sign bit, less one so that the quantised
#: coordinates (``2**bits - 1`` at most) stay exact in the conversion from float
MORTON_CODE_BITS = 62


def _describe(value: Any) -> str:
    """What a malformed input is, for an error message: a tensor's dtype and shape, or its type."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _check_finite(name: str, value: Tensor) -> None:
    if value.numel() and not bool(all_finite(value)):
        raise ValueError(f"'{name}' contains NaN or infinite values")


def _check_connectivity(connectivity: Any) -> int:
    if isinstance(connectivity, bool) or not isinstance(connectivity, int) \
            or connectivity not in (4, 8):
        raise ValueError(f"'connectivity' must be 4 or 8, got {connectivity!r}")
    return connectivity


def _band_edge_count(n: int, window: int) -> int:
    """The number of edges :func:`_band_edges` builds."""
    w = max(min(window, n - 1), 0)
    return w * (2 * n - w - 1)


def _band_edges(n: int, window: int, offset: int = 0) -> Tensor:
    """Edges ``j -> i`` with ``0 < |i - j| <= window`` among nodes ``offset .. offset+n-1`` (a
    window wider than the sequence connects every pair)."""
    window = min(window, n - 1)
    if window <= 0:
        return torch.empty(2, 0, dtype=torch.long)
    i = torch.arange(n)
    parts = []
    for d in range(1, window + 1):
        src = i[:-d]
        parts += [torch.stack([src, src + d]), torch.stack([src + d, src])]
    return torch.cat(parts, 1) + offset


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"'{name}' must be True or False, got {value!r}")
    return value


def zscore(x: Tensor) -> Tensor:
    r"""Per-channel z-score of a series ``x`` ``[L, C]`` over its time steps.

    :math:`\hat x_{tc} = (x_{tc} - \mu_c) / \sigma_c` with :math:`\mu_c = \frac1L \sum_t x_{tc}`
    and :math:`\sigma_c = \sqrt{\frac1L \sum_t (x_{tc} - \mu_c)^2}` (the population standard
    deviation); a constant channel (:math:`\sigma_c = 0`) becomes all zeros. Computed in float64 and
    returned in ``x``'s dtype; an empty series is returned as it is."""
    if x.size(0) == 0:
        return x
    xd = x.double()
    mu = xd.mean(0, keepdim=True)
    centred = xd - mu
    sigma = centred.pow(2).mean(0, keepdim=True).sqrt()
    return torch.where(sigma > 0, centred / torch.where(sigma > 0, sigma, 1.0), 0.0).to(x.dtype)


def patch_series(x: Tensor, patch_size: int) -> tuple[Tensor, Tensor]:
    r"""Non-overlapping patches of a series ``x`` ``[L, C]``: ``(values [n, p·C], valid [n])``.

    With :math:`p` = ``patch_size`` and :math:`n = \lceil L / p \rceil`, patch :math:`k` holds the
    steps :math:`kp, \dots, kp + p - 1` flattened time-major (row :math:`k` is
    :math:`x_{kp,1..C}, x_{kp+1,1..C}, \dots`). A ragged tail (:math:`L \bmod p \ne 0`) is padded
    with zeros after the last real step, so no value is dropped; ``valid[k]`` =
    :math:`(\min(L, (k+1)p) - kp) / p` is the fraction of the patch's steps that are real (1 except
    for a ragged last patch), which locates the padding exactly since it always ends the patch."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"patch_series needs the series 'x' as a real [L, C] tensor, got "
                         f"{_describe(x)}")
    p = check_positive_int("patch_size", patch_size)
    L, C = x.shape
    n = -(-L // p)
    pad = n * p - L
    if pad:
        x = torch.cat([x, x.new_zeros(pad, C)])
    values = x.reshape(n, p * C)
    real = (torch.clamp(L - torch.arange(n, device=x.device) * p, max=p)).to(x.dtype)
    return values, real / p


class SequenceToGraph(BaseTransform):
    r"""Sequence → graph with one node per token, time step or patch, in sequence order.

    **Tokens** (``data.tokens`` ``[L]``, or an integer ``data.x`` without it): ``x`` = token ids
    ``[N]`` (use ``GraphTransformer(node_encoder="embedding")``), ``pos`` = ``[N, 1]`` positions.
    With ``cls_token`` set, a CLS node (that id) is prepended at local index 0 with ``pos = -1``.
    ``pad_to`` with ``pad_token`` appends padding tokens as real nodes (parity with padded
    benchmarks). ``window``, ``pad_to``, ``cls_token`` and ``pad_token`` are non-negative ints (token
    ids are indices into an embedding). The tokens may have any integer dtype (they become
    ``long``); negative ids are refused.

    **Real-valued series** (a floating-point ``data.x`` of shape ``[L]`` or ``[L, C]``; ``[L]`` is
    read as ``[L, 1]``): ``x`` = float32 features ``[N, F]`` (use ``node_encoder="linear"``).
    Optionally each channel is first z-scored over time (``normalize=True``, see :func:`zscore`).
    With ``patch_size`` :math:`p > 1` the steps are grouped into :math:`N = \lceil L/p \rceil`
    non-overlapping patches (:func:`patch_series`): a ragged tail is zero-padded, never dropped,
    and a last feature column holds the fraction of real steps in each patch (1, except for a
    ragged last patch). With ``cls=True`` a CLS node is prepended at local index 0: ``x`` gains a
    first indicator column (1 on the CLS node, 0 elsewhere) and the CLS row is otherwise zero,
    ``pos = -1``. The features of node :math:`k` are thus

    .. math:: [\,\mathbb 1_{\text{cls}}\,]\;\Vert\;\mathrm{vec}(x_{kp:(k+1)p,\,1:C})\;\Vert\;
              [\,\text{valid}_k\,]

    (bracketed parts only with ``cls=True`` / :math:`p > 1`), so ``F = p·C + cls + (p > 1)``,
    independent of ``L`` (series of different lengths batch together). ``pos`` is the patch
    (or step) index. NaN or infinite values are refused; ``cls_token`` and ``pad_to`` apply to
    tokens only, and ``cls``, ``patch_size > 1`` and ``normalize`` to series only (a mismatch is
    refused, naming the option).

    Edges (both kinds): ``j \to i`` for ``0 < |i - j| \le`` ``window`` among the token / patch
    nodes (none if ``window`` is 0; a window wider than the sequence connects every pair), and with
    a CLS node and ``cls_edges`` both ways between it and every other node.
    """

    def __init__(self, window: int = 0, cls_token: int | None = None, cls_edges: bool = True,
                 pad_to: int | None = None, pad_token: int = 0, *, patch_size: int = 1,
                 cls: bool = False, normalize: bool = False) -> None:
        self.window = check_positive_int("window", window, allow_zero=True)
        self.cls_token = None if cls_token is None else check_positive_int(
            "cls_token", cls_token, allow_zero=True)
        self.cls_edges = cls_edges
        self.pad_to = None if pad_to is None else check_positive_int("pad_to", pad_to,
                                                                     allow_zero=True)
        self.pad_token = check_positive_int("pad_token", pad_token, allow_zero=True)
        self.patch_size = check_positive_int("patch_size", patch_size)
        self.cls = _check_bool("cls", cls)
        self.normalize = _check_bool("normalize", normalize)
        if self.cls and self.cls_token is not None:
            raise ValueError("'cls' (a CLS node for real-valued series) and 'cls_token' (the CLS id "
                             "of token sequences) exclude each other; set one")

    def forward(self, data: Data) -> Data:
        key = "tokens" if "tokens" in data else "x"
        seq = data[key] if key in data else None
        if key == "x" and isinstance(seq, Tensor) and seq.dim() in (1, 2) \
                and seq.is_floating_point():
            x, pos, num_cls = self._series(seq)
        else:
            x, pos, num_cls = self._tokens(seq, key)
        n = x.size(0) - num_cls
        edges = [_band_edges(n, self.window, num_cls)]
        if num_cls and self.cls_edges and n:
            t = torch.arange(1, n + 1)
            edges += [torch.stack([t, torch.zeros_like(t)]), torch.stack([torch.zeros_like(t), t])]
        out = Data(x=x, pos=pos[:, None], edge_index=torch.cat(edges, 1), num_nodes=x.size(0))
        for k in data.keys():
            if k not in ("tokens", "x", "pos", "edge_index", "num_nodes"):
                out[k] = data[k]
        return out

    def _check_edges(self, n: int, cls: bool, what: str, device: torch.device) -> None:
        cls_edges = 2 * n if cls and self.cls_edges else 0
        check_edges(_band_edge_count(n, self.window) + cls_edges,
                    what=f"SequenceToGraph(window={self.window}) on {n:,} {what}",
                    how_to_lower="lower window (or pad_to)" if what == "tokens"
                    else "lower window (or a larger patch_size)", device=device)

    def _tokens(self, tokens: Any, key: str) -> tuple[Tensor, Tensor, int]:
        """Token ids (with CLS and padding), positions and the number of CLS nodes (0 or 1)."""
        if not isinstance(tokens, Tensor) or tokens.dim() != 1 or tokens.is_floating_point() \
                or tokens.is_complex() or tokens.dtype == torch.bool:
            if key == "x" and tokens is not None:
                raise ValueError(f"SequenceToGraph needs 'x' (data.x) as a real-valued series "
                                 f"([L] or [L, C]) or as 1-D integer 'tokens' (token ids), got "
                                 f"{_describe(tokens)}")
            hint = ""
            if isinstance(tokens, Tensor) and tokens.is_floating_point():
                hint = "; put a real-valued series in data.x instead"
            raise ValueError(f"SequenceToGraph needs 'tokens' (data.tokens, or data.x without it) "
                             f"as a 1-D integer tensor of token ids{hint}, got {_describe(tokens)}"
                             + ("" if tokens is None else f" in data.{key}"))
        for name, bad in (("cls", self.cls), ("patch_size", self.patch_size > 1),
                          ("normalize", self.normalize)):
            if bad:
                raise ValueError(f"'{name}' applies to real-valued series, but data.{key} holds "
                                 f"integer 'tokens'" + (" (token sequences take cls_token)"
                                                        if name == "cls" else ""))
        tokens = tokens.long()
        if tokens.numel() and int(tokens.min()) < 0:
            raise ValueError(f"'tokens' (data.{key}) holds a negative token id "
                             f"({int(tokens.min())})")
        n = max(tokens.numel(), self.pad_to or 0)
        self._check_edges(n, self.cls_token is not None, "tokens", tokens.device)
        if n > tokens.numel():
            pad = tokens.new_full((n - tokens.numel(),), self.pad_token)
            tokens = torch.cat([tokens, pad])
        pos = torch.arange(n, dtype=torch.float)
        if self.cls_token is None:
            return tokens, pos, 0
        tokens = torch.cat([tokens.new_tensor([self.cls_token]), tokens])
        return tokens, torch.cat([pos.new_tensor([-1.0]), pos]), 1

    def _series(self, series: Tensor) -> tuple[Tensor, Tensor, int]:
        """Patch features (with the CLS row), positions and the number of CLS nodes (0 or 1)."""
        for name, value in (("cls_token", self.cls_token), ("pad_to", self.pad_to)):
            if value is not None:
                raise ValueError(f"'{name}' applies to token sequences, but data.x holds a "
                                 f"real-valued series 'x' ({_describe(series)})"
                                 + ("; use cls=True for a CLS node" if name == "cls_token" else ""))
        x = series.float()
        if x.dim() == 1:
            x = x[:, None]
        L, C = x.shape
        if C == 0:
            raise ValueError(f"the series 'x' (data.x) has no channels: shape {list(series.shape)}")
        _check_finite("x", x)
        p = self.patch_size
        n = -(-L // p)
        self._check_edges(n, self.cls, "patches" if p > 1 else "steps", x.device)
        if self.normalize:
            x = zscore(x)
        values, valid = patch_series(x, p)
        feats = [values] + ([valid[:, None]] if p > 1 else [])
        pos = torch.arange(n, dtype=torch.float)
        if self.cls:
            feats.insert(0, values.new_zeros(n, 1))
        x = torch.cat(feats, 1)
        if not self.cls:
            return x, pos, 0
        head = x.new_zeros(1, x.size(1))
        head[0, 0] = 1.0
        return torch.cat([head, x]), torch.cat([pos.new_tensor([-1.0]), pos]), 1


def grid_edges(h: int, w: int, connectivity: int = 4) -> Tensor:
    """Both-direction edges of an ``h × w`` grid in raster order (4- or 8-neighbourhood)."""
    h = check_positive_int("h", h, allow_zero=True)
    w = check_positive_int("w", w, allow_zero=True)
    connectivity = _check_connectivity(connectivity)
    diagonal = 2 * max(h - 1, 0) * max(w - 1, 0) if connectivity == 8 else 0
    check_edges(2 * (h * max(w - 1, 0) + max(h - 1, 0) * w + diagonal),
                what=f"grid_edges({h:,}, {w:,}, connectivity={connectivity})",
                how_to_lower="lower h and w (a larger patch_size)")
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
    ``pos = (-1, -1)``, connected both ways to every patch). The image may have any real dtype
    (``x`` is float32); NaN or infinite pixels are refused.
    """

    def __init__(self, patch_size: int = 1, connectivity: int = 4, cls: bool = False) -> None:
        self.patch_size = check_positive_int("patch_size", patch_size)
        self.connectivity = _check_connectivity(connectivity)
        self.cls = cls

    def forward(self, data: Data) -> Data:
        img = data.image if "image" in data else None
        if not isinstance(img, Tensor) or img.dim() != 3 or img.is_complex():
            raise ValueError(f"ImageToGraph needs 'image' (data.image) as a real [C, H, W] tensor, "
                             f"got {_describe(img)}")
        C, H, W = img.shape
        if C == 0:
            raise ValueError(f"'image' (data.image) has no channels: shape {list(img.shape)}")
        p = self.patch_size
        if H % p or W % p:
            raise ValueError(f"'patch_size' {p} does not divide the 'image' size {H}x{W} "
                             f"(data.image is [C, H, W])")
        h, w = H // p, W // p
        img = img.float()
        _check_finite("image", img)
        x = img.reshape(C, h, p, w, p).permute(1, 3, 0, 2, 4).reshape(h * w, C * p * p)
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
    ``bits`` bits per dimension over their bounding box and the bits interleaved.

    ``pos`` is an ``[N, d]`` real tensor of finite coordinates; the code is an int64, so
    ``bits * d`` may be at most :data:`MORTON_CODE_BITS` (62)."""
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.is_complex():
        raise ValueError(f"morton_order needs 'pos' as an [N, d] real tensor of coordinates, got "
                         f"{_describe(pos)}")
    bits = check_positive_int("bits", bits)
    N, d = pos.shape
    if bits * d > MORTON_CODE_BITS:
        raise ValueError(f"'bits' ({bits}) times the {d} coordinates of 'pos' exceeds the "
                         f"{MORTON_CODE_BITS} bits of a Morton code; lower bits")
    pos = pos.double()
    _check_finite("pos", pos)
    if N == 0:
        return torch.empty(0, dtype=torch.long, device=pos.device)
    lo = pos.min(0).values
    span = pos.max(0).values - lo
    span = torch.where(span > 0, span, torch.ones_like(span))  # one value along a dimension: 0
    top = 2**bits - 1
    q = ((pos - lo) / span * top).round().long().clamp_(0, top)
    code = torch.zeros(N, dtype=torch.long, device=pos.device)
    for b in range(bits):
        for k in range(d):
            code |= ((q[:, k] >> b) & 1) << (b * d + k)
    return torch.argsort(code, stable=True)


class PointCloudToGraph(BaseTransform):
    r"""Point cloud (``data.pos`` ``[N, d]``) → graph with k-nearest-neighbour edges
    (:math:`j \to i` for the :math:`k` points nearest to :math:`i`), ``x`` = coordinates
    (concatenated with ``data.normal`` / ``data.x`` if present). With ``morton=True`` the points
    are first re-ordered along a Morton curve (for order-dependent producers), and so are the other
    per-point attributes of ``data`` (e.g. per-point labels ``y``).

    ``data.pos`` must hold finite coordinates (``d >= 1``); ``data.normal`` and ``data.x``, where
    present, one row (or one value) per point."""

    def __init__(self, k: int = 16, morton: bool = False, loop: bool = False) -> None:
        self.knn = KNNEdges(k, loop=loop)
        self.morton = morton

    def forward(self, data: Data) -> Data:
        pos = data.pos if "pos" in data else None
        if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.size(1) == 0 or pos.is_complex():
            raise ValueError(f"PointCloudToGraph needs 'pos' (data.pos) as a real [N, d] tensor of "
                             f"coordinates (d >= 1), got {_describe(pos)}")
        pos = pos.float()
        _check_finite("pos", pos)
        N = pos.size(0)
        feats = [pos]
        for key in ("normal", "x"):
            value = data[key] if key in data else None
            if value is None:
                continue
            if not isinstance(value, Tensor) or value.dim() not in (1, 2) or value.size(0) != N \
                    or value.is_complex():
                raise ValueError(f"'{key}' (data.{key}) must be a real tensor with one row per "
                                 f"point ([{N}] or [{N}, F]), got {_describe(value)}")
            value = value.float()
            _check_finite(key, value)
            feats.append(value if value.dim() == 2 else value[:, None])
        x = torch.cat(feats, 1)
        order = None
        if self.morton:
            d = pos.size(1)
            if d > MORTON_CODE_BITS:
                raise ValueError(f"morton=True orders points of at most {MORTON_CODE_BITS} "
                                 f"coordinates, 'pos' has {d}")
            order = morton_order(pos, bits=min(10, MORTON_CODE_BITS // d))
            pos, x = pos[order], x[order]
        g = Data(pos=pos, num_nodes=N)
        edge_index = self.knn(x, data=g).edge_index
        out = Data(x=x, pos=pos, edge_index=edge_index, num_nodes=N)
        for key in data.keys():
            if key in ("pos", "x", "normal", "face", "edge_index", "num_nodes"):
                continue
            value = data[key]
            if order is not None and data.is_node_attr(key):  # per-point: follows its point
                if isinstance(value, Tensor):
                    value = value.index_select(data.__cat_dim__(key, value), order.to(value.device))
                else:
                    value = [value[i] for i in order.tolist()]
            out[key] = value
        return out
