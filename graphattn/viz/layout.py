"""Drawing coordinates from the data's own positions.

* **sequence**: ``x`` = token index (``data.pos``), ``y = 0``; a CLS node (``pos = -1``) sits at
  ``x = -1``. Edges between tokens are drawn as arcs (see :mod:`graphattn.viz.static`).
* **image**: ``x`` = column, ``y = -row`` of ``data.pos = (row, col)``; a CLS node at ``(-1, -1)``
  lands above the top-left corner.
* **points**: 2-D coordinates as they are; 3-D (or higher) ones rotated onto their principal axes
  (PCA) and drawn in a fixed oblique view (30° azimuth, 20° elevation, orthographic), so a solid
  keeps its depth; a flat cloud (third principal axis under 5 % of the first) is drawn face on.
* **graph / molecule** (no ``pos``): networkx Kamada–Kawai on the data's edges, per connected
  component (spring layout with a fixed seed above 400 nodes), components packed in rows; for a
  focus view, shells around the focus node by attention hop, strongest sources first.

Virtual sources get a row of their own above (below, for sequences) the drawing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

if TYPE_CHECKING:  # annotations only: view imports this module's layouts
    from graphattn.viz.view import LayerAttention


def _pos_array(data: Any, nodes: np.ndarray) -> np.ndarray | None:
    pos = getattr(data, "pos", None)
    if pos is None:
        return None
    p = pos.detach().cpu().double().numpy()
    return p.reshape(p.shape[0], -1)[nodes]


def _pca2(p: np.ndarray, azimuth: float = 30.0, elevation: float = 20.0) -> np.ndarray:
    """2-D drawing coordinates of points: as they are in 2-D; else the principal axes, seen in an
    oblique orthographic view (first axis across, second up, third in depth)."""
    if p.shape[1] <= 2:
        return np.pad(p, ((0, 0), (0, 2 - p.shape[1])))
    c = p - p.mean(0, keepdims=True)
    if c.shape[0] < 3:
        return c[:, :2]
    _, sv, vt = np.linalg.svd(c, full_matrices=False)
    q = c @ vt[:3].T
    q *= np.where(q[np.abs(q).argmax(0), range(3)] < 0, -1.0, 1.0)  # deterministic axis signs
    if sv[2] < 0.05 * sv[0]:
        return q[:, :2]
    a, e = np.deg2rad(azimuth), np.deg2rad(elevation)
    across, up, depth = q[:, 0], q[:, 1], q[:, 2]
    x = across * np.cos(a) + depth * np.sin(a)
    toward = -across * np.sin(a) + depth * np.cos(a)
    y = up * np.cos(e) - toward * np.sin(e)
    return np.stack([x, y], 1)


def _graph_layout(n: int, edges: np.ndarray | None, layers: list[LayerAttention], seed: int) -> np.ndarray:
    G = nx.Graph()
    G.add_nodes_from(range(n))
    if edges is not None and edges.size:
        G.add_edges_from((int(a), int(b)) for a, b in edges.T if a != b)
    if G.number_of_edges() == 0:  # no input structure: lay out along the strongest attention edges
        for lay in layers:
            real = (lay.src < n) & (lay.src != lay.dst)
            if real.any():
                w = np.abs(lay.alpha[real]).max(1)
                top = np.argsort(-w, kind="stable")[: 3 * n]
                G.add_edges_from((int(a), int(b)) for a, b in zip(lay.src[real][top], lay.dst[real][top],
                                                                  strict=True))
    if n == 0:
        return np.zeros((0, 2))
    return _pack_components(G, seed)


def _pack_components(G: nx.Graph, seed: int) -> np.ndarray:
    """Each connected component laid out on its own (Kamada–Kawai up to 400 nodes, else spring),
    scaled to a square of side ∝ √size, and the squares packed in rows, largest first."""
    comps = sorted(nx.connected_components(G), key=lambda c: (-len(c), min(c)))
    out = np.zeros((G.number_of_nodes(), 2))
    total = sum(len(c) for c in comps)
    row_width = 1.3 * np.sqrt(total)
    x = y = row_h = 0.0
    for comp in comps:
        nodes = sorted(comp)
        side = np.sqrt(len(nodes))
        if len(nodes) == 1:
            xy = np.zeros((1, 2))
        else:
            sub = G.subgraph(nodes)
            lay = (nx.kamada_kawai_layout(sub) if len(nodes) <= 400
                   else nx.spring_layout(sub, seed=seed, iterations=100))
            xy = np.array([lay[i] for i in nodes], dtype=np.float64)
            xy -= xy.min(0)
            xy *= side / max(float(xy.max()), 1e-12)
        if x > 0 and x + side > row_width:  # next row (downwards)
            x, y, row_h = 0.0, y - row_h - 1.0, 0.0
        out[nodes] = xy + np.array([x, y - side])
        x += side + 1.0
        row_h = max(row_h, side)
    return out


def _shell_layout(hop: np.ndarray, n: int) -> np.ndarray:
    """Focus node at the centre, hop ``h`` on the circle of radius ``h`` (in view order)."""
    out = np.zeros((n, 2))
    for h in sorted(set(hop[:n].tolist())):
        idx = np.nonzero(hop[:n] == h)[0]
        if h <= 0:
            continue
        phase = 0.5 * np.pi + (0.5 * np.pi / max(idx.size, 1)) * (h - 1)
        ang = phase + 2 * np.pi * np.arange(idx.size) / idx.size
        out[idx] = h * np.stack([np.cos(ang), np.sin(ang)], 1)
    return out


def _virtual_row(pos: np.ndarray, V: int, below: bool) -> np.ndarray:
    if V == 0:
        return np.zeros((0, 2))
    if pos.size:
        lo, hi = pos.min(0), pos.max(0)
    else:
        lo, hi = np.zeros(2), np.ones(2)
    span = max(float(hi[0] - lo[0]), float(hi[1] - lo[1]), 1.0)
    xs = (lo[0] + hi[0]) / 2 + (np.arange(V) - (V - 1) / 2) * span / max(V + 1, 4)
    y = (lo[1] - 0.25 * span) if below else (hi[1] + 0.2 * span)
    return np.stack([xs, np.full(V, y)], 1)


def node_positions(data: Any, nodes: np.ndarray, kind: str, *, num_virtual: int = 0,
                   edges: np.ndarray | None = None, layers: list[LayerAttention] | None = None,
                   hop: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """``[n + num_virtual, 2]`` coordinates for the view nodes ``nodes`` (ids in ``data``)."""
    n = nodes.size
    layers = layers or []
    p = _pos_array(data, nodes)
    if hop is not None:
        xy = _shell_layout(hop, n)
    elif kind == "sequence" and p is not None:
        xy = np.stack([p[:, 0], np.zeros(n)], 1)
    elif kind == "image" and p is not None and p.shape[1] >= 2:
        xy = np.stack([p[:, 1], -p[:, 0]], 1)
    elif kind == "points" and p is not None:
        xy = _pca2(p)
    else:
        xy = _graph_layout(n, edges, layers, seed)
    if kind == "sequence" and hop is None:
        # arcs rise to half their span above and below the line; virtual sources go further down
        span = float(xy[:, 0].max() - xy[:, 0].min()) if n else 1.0
        V = num_virtual
        xs = (xy[:, 0].min() if n else 0.0) + (np.arange(V) + 1) * span / (V + 1)
        virt = np.stack([xs, np.full(V, -0.6 * max(span, 1.0))], 1)
    else:
        virt = _virtual_row(xy, num_virtual, below=False)
    return np.concatenate([xy, virt]).astype(np.float64)


def image_background(data: Any,
                     nodes: np.ndarray) -> tuple[np.ndarray, tuple[float, float, float, float]] | None:
    """The image behind an image view, rebuilt from patch features when they are one channel of
    ``p × p`` pixels per patch (``x [N, p²]``, or ``[N, p² + 1]`` with a CLS indicator column), with
    its extent in view coordinates; ``None`` when the features are not pixels."""
    x, pos = getattr(data, "x", None), getattr(data, "pos", None)
    if x is None or pos is None or x.dim() != 2 or not x.is_floating_point() or pos.size(-1) < 2:
        return None
    P = pos.detach().cpu().numpy()[nodes]
    X = x.detach().cpu().double().numpy()[nodes]
    grid = (P >= 0).all(1)
    if not grid.any():
        return None
    F = X.shape[1]
    p = round(np.sqrt(F))
    offset = 0
    if p * p != F:
        p = round(np.sqrt(F - 1))
        offset = 1
        if p * p != F - 1:
            return None
    rows, cols = P[grid, 0].astype(int), P[grid, 1].astype(int)
    h, w = rows.max() + 1, cols.max() + 1
    img = np.full((h * p, w * p), np.nan)
    for r, c, v in zip(rows, cols, X[grid, offset:], strict=True):
        img[r * p:(r + 1) * p, c * p:(c + 1) * p] = v.reshape(p, p)
    # patch (r, c) is drawn at x = c, y = -r: its p x p pixels cover [c - 0.5, c + 0.5] x [-r - 0.5, -r + 0.5]
    return img, (-0.5, w - 0.5, -(h - 0.5), 0.5)
