r"""Static figures (matplotlib) of an :class:`~graphattn.viz.AttentionView`.

* :func:`draw_attention` — one layer and head drawn in the data's own layout, edges coloured by
  origin (or by weight), opacity and width :math:`\propto |\alpha| / \max |\alpha|` over the drawn
  edges (fainter and thinner when many), arrows towards the target (the query that attends) when
  few enough to read. Defaults scale with the view: each target's strongest in-edges
  (:func:`~graphattn.viz.view.auto_top_k`), at most :data:`~graphattn.viz.view.MAX_DRAWN` edges,
  node markers sized by node count and spacing, self-loops as node outlines, long sequences flat;
* :func:`draw_heads` — small multiples: layers × (heads + head mean);
* :func:`draw_heatmap` — the attention matrix (targets × sources) of one layer and head, the natural
  view of a sequence (tokens on both axes; virtual sources as extra columns);
* :func:`draw_summary` — per-layer edges per node, density, attention entropy (nats, and / log d),
  and shares of edges and of attention mass by origin.

Every function takes the same pruning arguments as :meth:`AttentionView.edges`. PNGs are written
at least 1,200 pixels wide (:func:`save_figure`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import PowerNorm, to_rgba
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch
from matplotlib.path import Path as MPath

from graphattn.core.origins import origin_code, origin_name
from graphattn.viz.view import MAX_DRAWN, AttentionView, EdgeList, prune, resolve_top_k

# One colour per origin, shared with the HTML viewer. Okabe–Ito and Paul Tol hues, chosen so
# that every pair of built-in origins differs clearly (CIE ΔE > 20) and the origins that are drawn
# together (input / expander / virtual, window / full, knn / full, sampled / support) stay apart for
# colour-blind readers too. Self-loops are drawn as node outlines, not as edges.
ORIGIN_COLORS = {
    "unknown": "#7f7f7f",     # grey
    "input": "#0072b2",       # blue
    "self_loop": "#222222",   # near black (outline)
    "full": "#d55e00",        # vermillion
    "window": "#56b4e9",      # sky blue
    "knn": "#009e73",         # bluish green
    "random": "#882255",      # wine
    "expander": "#e69f00",    # orange
    "virtual": "#cc79a7",     # reddish purple
    "sampled": "#332288",     # indigo
    "sorted": "#999933",      # olive
    "operator": "#a6761d",    # ochre
    "support": "#ee6677",     # rose
    "exploration": "#c0b000",  # mustard
    "global": "#661100",      # brown
}
_EXTRA = ["#66ccee", "#aa4499", "#117733", "#ddaa33", "#4477aa", "#bb5566", "#aaaa00", "#004488"]

# CPK-like colours for atoms of molecule views
ATOM_COLORS = {"C": "#909090", "N": "#3050f8", "O": "#ff0d0d", "S": "#e6c229", "P": "#ff8000",
               "F": "#90e050", "Cl": "#1ff01f", "Br": "#a62929", "I": "#940094", "H": "#dddddd"}
OTHER_ATOM = "#c0a0ff"  # an element without a colour above

ARROW_LIMIT = 150  # edges drawn as individual arrows; above this, one line collection
LONG_SEQUENCE = 60  # longer sequences are drawn flat (arcs scaled to the width, no arrows)


def origin_color(origin: str | int) -> str:
    """The colour of an origin (name or code), the same in every figure and in the HTML viewer."""
    name = origin_name(origin) if isinstance(origin, (int, np.integer)) else str(origin)
    if name in ORIGIN_COLORS:
        return ORIGIN_COLORS[name]
    return _EXTRA[origin_code(name) % len(_EXTRA)]


def short_layer_name(name: str) -> str:
    """``"layers.2.attn"`` → ``"layer 2"``; other names unchanged."""
    m = re.fullmatch(r"layers\.(\d+)\.attn", name)
    return f"layer {m.group(1)}" if m else name


def _head_label(head: int | None) -> str:
    return "mean over heads" if head is None else f"head {head}"


def node_categories(view: AttentionView) -> dict[str, Any] | None:
    """Colours of node label categories (class names of a node task, ...) when the real nodes
    of a graph or point view carry 2 to 10 distinct, repeated labels; else ``None``."""
    n = view.num_nodes
    if view.kind not in ("graph", "points"):
        return None
    uniq = sorted(set(view.labels[:n]))
    if not (1 < len(uniq) <= 10 and len(uniq) < n):
        return None
    cmap = plt.get_cmap("tab10")
    return {u: cmap(i) for i, u in enumerate(uniq)}


def legend_categories(view: AttentionView) -> tuple[dict[str, Any] | None, str]:
    """The node colours a figure's legend explains, with its title: the elements of a molecule view
    (their CPK-like colours, ``"atom"``), else :func:`node_categories` (``"node label"``)."""
    if view.kind == "molecule":
        present = sorted(set(view.labels[:view.num_nodes]))
        return ({a: ATOM_COLORS.get(a, OTHER_ATOM) for a in present} or None), "atom"
    return node_categories(view), "node label"


def _node_colors(view: AttentionView) -> list[Any]:
    n, V = view.num_nodes, view.num_virtual
    total = n + V
    colors: list[Any] = ["#f2f2f2"] * total
    if view.kind == "molecule":
        colors[:n] = [ATOM_COLORS.get(lab, OTHER_ATOM) for lab in view.labels[:n]]
    else:
        cats = node_categories(view)
        if cats is not None:
            colors[:n] = [cats[lab] for lab in view.labels[:n]]
    for v in range(n, total):
        colors[v] = "#ffe0f0"
    return colors


def _node_style(view: AttentionView) -> tuple[list[Any], float]:
    """Node colours and the default marker area (pt², for a 9-inch drawing) of the view."""
    return _node_colors(view), count_node_size(view.num_nodes + view.num_virtual) ** 2


def count_node_size(total: int) -> float:
    """The largest node diameter (points) for a view of ``total`` nodes: 80/√total, within
    [1.5, 14] (14 pt up to 32 nodes, 5 pt at 256, 2.5 pt at 1,000)."""
    return float(np.clip(80.0 / np.sqrt(max(total, 1)), 1.5, 14.0))


def node_spacing(xy: np.ndarray) -> float:
    """The median distance from a node to its nearest other node (drawing units; 0 if < 2)."""
    pts = np.unique(np.asarray(xy, dtype=np.float64), axis=0)
    if pts.shape[0] < 2:
        return 0.0
    from scipy.spatial import cKDTree

    d, _ = cKDTree(pts).query(pts, k=2)
    return float(np.median(d[:, 1]))


def _points_per_unit(ax: Axes, xlim: tuple[float, float], ylim: tuple[float, float], equal: bool) -> float:
    """Display points per drawing unit along x once the limits (and equal aspect) apply."""
    w_in, h_in = ax.figure.get_size_inches()
    box = ax.get_position()
    sx = box.width * w_in * 72 / max(xlim[1] - xlim[0], 1e-12)
    sy = box.height * h_in * 72 / max(ylim[1] - ylim[0], 1e-12)
    return min(sx, sy) if equal else sx


def auto_node_size(view: AttentionView, points_per_unit: float) -> float:
    """Marker area (pt²): the diameter is the smaller of :func:`count_node_size` and 55 % of the
    typical spacing between nodes (so markers, and the self-loop outlines on them, do not overlap)."""
    diameter = count_node_size(view.num_nodes + view.num_virtual)
    spacing = node_spacing(view.pos)
    if spacing > 0 and points_per_unit > 0:
        diameter = min(diameter, 0.55 * spacing * points_per_unit)
    return float(max(diameter, 1.5)) ** 2


def _draw_nodes(ax: Axes, view: AttentionView, labels: bool | None, size: float) -> float:
    colors = _node_colors(view)
    n, total = view.num_nodes, view.num_nodes + view.num_virtual
    xy = view.pos
    kinds = np.zeros(total, dtype=int)  # 0 node, 1 cls, 2 virtual
    kinds[view.is_cls] = 1
    kinds[n:] = 2
    face_alpha = 0.55 if view.background is not None else 1.0
    lw = 0.5 if size >= 16 else 0.25
    for k, marker in ((0, "o"), (1, "D"), (2, "s")):
        idx = np.nonzero(kinds == k)[0]
        if idx.size:
            ax.scatter(xy[idx, 0], xy[idx, 1], s=size if k == 0 else max(1.6 * size, 12.0), marker=marker,
                       c=[colors[i] for i in idx], edgecolors="#333333", linewidths=lw,
                       alpha=face_alpha, zorder=3, gid=("nodes", "cls", "virtual-nodes")[k])
    if view.focus is not None:
        f = view.focus
        ax.scatter([xy[f, 0]], [xy[f, 1]], s=size * 3.2, marker="o", facecolors="none",
                   edgecolors="#000000", linewidths=1.4, zorder=4, gid="focus")
        ax.annotate(view.labels[f], xy[f], xytext=(0, 0.75 * np.sqrt(size * 3.2) + 2),
                    textcoords="offset points", fontsize=8, fontweight="bold", ha="center",
                    va="bottom", zorder=6, annotation_clip=False, gid="focus-label")
    if labels is None:  # node colours already name the categories: no text unless few nodes
        short = np.mean([len(s) for s in view.labels]) <= 8 if total else True
        labels = (view.kind != "image" and total <= 80 and short
                  and (node_categories(view) is None or total <= 20))
    if labels:
        fs = float(np.clip(300.0 / max(total, 1), 5.0, 9.0))
        for i in range(total):
            ax.annotate(view.labels[i], xy[i], fontsize=fs, ha="center", va="center", zorder=5,
                        annotation_clip=False)
    return size


def _edge_rgba(el: EdgeList, color_by: str, wmax: float) -> tuple[np.ndarray, np.ndarray]:
    rel = np.abs(el.weight) / wmax if wmax > 0 else np.zeros(len(el))
    if color_by == "origin":
        codes, inv = np.unique(el.origin, return_inverse=True)
        table = np.array([to_rgba(origin_color(int(c))) for c in codes]).reshape(-1, 4)
        rgba = table[inv.reshape(-1)] if len(el) else np.zeros((0, 4))
    elif color_by == "weight":
        rgba = plt.get_cmap("viridis")(rel).reshape(-1, 4)
    else:
        raise ValueError(f"'color_by' must be 'origin' or 'weight', got {color_by!r}")
    rgba = np.array(rgba, dtype=np.float64)
    # fainter when many edges overlap: full opacity up to 100 edges, down to 0.3 at 1,100 and more
    rgba[:, 3] = (0.12 + 0.88 * rel) * float(np.clip(np.sqrt(100.0 / max(len(el), 1)), 0.3, 1.0))
    return rgba, rel


def _auto_prune(view: AttentionView, el: EdgeList, max_edges: int | None) -> tuple[EdgeList, str]:
    """Over ``max_edges`` edges: each target keeps its ``max_edges // n`` strongest, then the
    strongest ``max_edges`` overall."""
    if max_edges is None or len(el) <= max_edges:
        return el, ""
    from graphattn.viz.view import prune, strongest

    k = max_edges // max(view.num_nodes, 1)
    if k >= 1:
        el = prune(el, top_k=k)
        note = f", drawn: top-{k} per target"
        if len(el) <= max_edges:
            return el, note
    return strongest(el, max_edges), f", drawn: the {max_edges} strongest"


def _graph_figsize(view: AttentionView) -> tuple[float, float]:
    n = view.num_nodes + view.num_virtual
    if view.kind == "sequence" and view.focus is None:
        return (min(max(8.5, 0.3 * n), 18.0), 6.0 if n > LONG_SEQUENCE else 4.5)
    return (9.0, 8.0)


def draw_attention(
    view: AttentionView,
    layer: int | str = -1,
    head: int | None = None,
    *,
    top_k: int | str | None = "auto",
    threshold: float = 0.0,
    origins: Sequence[str] | None = None,
    color_by: str = "origin",
    ax: Axes | None = None,
    labels: bool | None = None,
    node_size: float | None = None,
    arrows: bool | None = None,
    max_edges: int | None = MAX_DRAWN,
    show_input: bool = False,
    legend: bool = True,
    title: str | None = None,
) -> Axes:
    """Draws the edges of ``layer``/``head`` (``head=None``: mean over heads) on the view's layout.

    Args:
        top_k: each target's ``k`` strongest in-edges; ``"auto"`` (default) picks ``k`` by the
            view's node count (:func:`~graphattn.viz.view.auto_top_k`: all edges up to 24 nodes,
            3 up to 80, 2 up to 200, else 1); ``None`` or ``0`` draws every edge.
        threshold, origins: pruning, as :meth:`AttentionView.edges`.
        color_by: ``"origin"`` (producer of each edge) or ``"weight"`` (viridis).
        labels: draw node labels (default: when at most 80 nodes and not an image).
        node_size: marker area in pt² (default: by node count and spacing, :func:`auto_node_size`).
        arrows: arrows towards each target (default: when at most 150 edges are drawn and the
            drawing is not a long sequence).
        max_edges: if more edges remain after pruning, each target keeps its strongest
            ``max_edges // n``, then the strongest ``max_edges`` stay (said in the title).
        show_input: draw the data's own edges faintly underneath.

    Self-loops (a node attending to itself) are drawn as the node's outline, coloured by origin,
    thicker and more opaque with the weight.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=_graph_figsize(view))
    lay = view.layer(layer)
    k = resolve_top_k(top_k, view.num_nodes)
    el = view.edges(layer, head, threshold=threshold, origins=origins)
    total = len(el)
    if k is not None:
        el = prune(el, top_k=k)
    el, note = _auto_prune(view, el, max_edges)
    if k is not None and len(el) < total and not note:
        note = f", top-{k} in-edges per node"
    order = np.argsort(np.abs(el.weight), kind="stable")  # strongest on top
    el = el.select(order)
    wmax = float(np.abs(el.weight).max()) if len(el) else 0.0
    rgba, rel = _edge_rgba(el, color_by, wmax)
    thin = float(np.clip(np.sqrt(60.0 / max(len(el), 1)), 0.3, 1.0))  # thinner lines when many
    widths = (0.3 + 2.2 * rel) * thin
    xy = view.pos
    seq = view.kind == "sequence" and view.focus is None
    flat = seq and view.num_nodes > LONG_SEQUENCE  # long sequence: arcs flattened to fit the width

    loop = el.src == el.dst
    rest = np.nonzero(~loop)[0]
    arc = seq & (el.src[rest] < view.num_nodes)
    if arrows is None:
        arrows = rest.size <= ARROW_LIMIT and not flat

    # limits first: node sizes depend on the drawing scale
    xlim = ylim = (0.0, 1.0)
    if xy.size:
        lo, hi = xy.min(0), xy.max(0)
        pad = 0.06 * max(float((hi - lo).max()), 1.0)
        ylo, yhi = lo[1] - pad, hi[1] + pad
        if seq:  # room for the highest drawn arc (half its span), at least one token step
            arcs = rest[arc]
            reach = 0.5 * float(np.abs(xy[el.src[arcs], 0] - xy[el.dst[arcs], 0]).max()) if arcs.size else 0
            half = max(reach, 1.0) + 0.5
            ylo, yhi = min(ylo, -half), max(yhi, half)
            if view.num_virtual == 0:
                ylo = -half
        xlim, ylim = (lo[0] - pad, hi[0] + pad), (ylo, yhi)
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
    ax.set_aspect("auto" if flat else "equal")  # arcs (display space when drawn as arrows) keep their shape
    size = node_size if node_size is not None else auto_node_size(
        view, _points_per_unit(ax, xlim, ylim, equal=not flat))

    if view.background is not None:
        img, extent = view.background
        ax.imshow(img, cmap="gray_r", extent=extent, origin="upper", alpha=0.85, zorder=0,
                  interpolation="nearest")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
    if show_input and view.input_edges is not None and view.input_edges.size:
        segs = np.stack([xy[view.input_edges[0]], xy[view.input_edges[1]]], 1)
        ax.add_collection(LineCollection(segs, colors="#000000", linewidths=0.4, alpha=0.15, zorder=1))

    _draw_nodes(ax, view, labels, size)
    if loop.any():  # self-loops: the node's outline, by origin colour and weight
        ax.scatter(xy[el.dst[loop], 0], xy[el.dst[loop], 1], s=size, marker="o", facecolors="none",
                   edgecolors=rgba[loop], linewidths=0.5 + 1.5 * rel[loop] * min(1.0, np.sqrt(size) / 6),
                   zorder=3.5, gid="edge-loops")
    if arrows:
        shrink = float(np.sqrt(size)) / 2 + 1
        for e, is_arc in zip(rest.tolist(), arc.tolist(), strict=True):
            s, d = int(el.src[e]), int(el.dst[e])
            # arc3 puts the control point at mid + rad * (dy, -dx): rad = -1 lifts an arc from an
            # earlier (left) source half its span above the line, and drops one from a later source
            rad = -1.0 if is_arc else 0.0
            ax.add_patch(FancyArrowPatch(
                xy[s], xy[d], arrowstyle="-|>", mutation_scale=6 + 6 * rel[e],
                connectionstyle=f"arc3,rad={rad}", color=rgba[e], linewidth=widths[e],
                shrinkA=shrink, shrinkB=shrink, zorder=2, gid="edge"))
    else:
        straight = rest[~arc]
        if straight.size:
            segs = np.stack([xy[el.src[straight]], xy[el.dst[straight]]], 1)
            ax.add_collection(LineCollection(segs, colors=rgba[straight], linewidths=widths[straight],
                                             zorder=2, gid="edge-lines"))
        curved = rest[arc]
        if curved.size:
            codes = [MPath.MOVETO, MPath.CURVE3, MPath.CURVE3]
            p0, p1 = xy[el.src[curved]], xy[el.dst[curved]]
            ctrl = np.stack([(p0[:, 0] + p1[:, 0]) / 2, (p0[:, 1] + p1[:, 1]) / 2 + (p1[:, 0] - p0[:, 0])], 1)
            verts = np.stack([p0, ctrl, p1], 1)  # as arc3 with rad = -1
            paths = [MPath(v, codes) for v in verts]
            ax.add_collection(PathCollection(paths, facecolors="none", edgecolors=rgba[curved],
                                             linewidths=widths[curved], zorder=2, gid="edge-arcs"))
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    if flat:
        ax.axhline(0.0, color="#999999", lw=0.4, zorder=1)
    if title is None:
        title = f"{short_layer_name(lay.name)} · {_head_label(head)}\n{len(el)} of {total} edges{note}"
    ax.set_title(title, fontsize=9)
    if legend and color_by == "origin" and len(el):
        codes_, counts = np.unique(el.origin, return_counts=True)
        handles = [Line2D([0], [0], color=origin_color(int(c)), lw=2,
                          label=f"{origin_name(int(c))} ({int(k_)})")
                   for c, k_ in zip(codes_, counts, strict=True)]
        if loop.any():
            handles.append(Line2D([0], [0], marker="o", lw=0, markerfacecolor="none",
                                  markeredgecolor="#333333", markeredgewidth=1.5,
                                  label=f"outline: self-loop ({int(loop.sum())})"))
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                  frameon=False, title="edge origin", title_fontsize=8)
    elif color_by == "weight" and len(el):
        sm = plt.cm.ScalarMappable(cmap="viridis", norm=plt.Normalize(0, wmax))
        ax.figure.colorbar(sm, ax=ax, fraction=0.04, label="|α|")
    cats, cats_title = legend_categories(view)
    if legend and cats is not None:
        handles = [Line2D([0], [0], marker="o", lw=0, markerfacecolor=c, markeredgecolor="#333333",
                          label=name) for name, c in cats.items()]
        cat_legend = Legend(ax, handles, [h.get_label() for h in handles], fontsize=8, loc="lower left",
                            bbox_to_anchor=(1.0, 0.0), frameon=False, title=cats_title, title_fontsize=8)
        ax.add_artist(cat_legend)
        cat_legend.set_clip_on(False)  # outside the axes: unclipped, so tight bounding boxes keep it
    return ax


def draw_heads(view: AttentionView, layers: Sequence[int | str] | None = None, *,
               include_mean: bool = True, top_k: int | str | None = "auto", threshold: float = 0.0,
               origins: Sequence[str] | None = None, color_by: str = "origin",
               panel_size: float = 3.2, **kwargs: Any) -> Figure:
    """Small multiples: one row per layer, one panel per head (and the head mean); ``top_k`` as
    :func:`draw_attention`."""
    chosen = list(range(view.num_layers)) if layers is None else list(layers)
    if not chosen:
        raise ValueError("the view has no layer to draw")
    H = max(view.layer(lay).num_heads for lay in chosen)
    cols = H + int(include_mean)
    aspect = 2.2 if view.kind == "sequence" and view.focus is None else 1.0
    fig, axes = plt.subplots(len(chosen), cols, squeeze=False,
                             figsize=(panel_size * aspect * cols, panel_size * len(chosen)))
    for r, lay in enumerate(chosen):
        L = view.layer(lay)
        heads: list[int | None] = [*range(L.num_heads), *([None] if include_mean else [])]
        for c in range(cols):
            ax = axes[r, c]
            if c >= len(heads):
                ax.axis("off")
                continue
            el = view.edges(lay, heads[c], top_k=top_k, threshold=threshold, origins=origins)
            long_seq = view.kind == "sequence" and view.focus is None and view.num_nodes > LONG_SEQUENCE
            opts = {"arrows": len(el) <= 120 and not long_seq, "legend": False, "labels": False, **kwargs}
            draw_attention(view, lay, heads[c], top_k=top_k, threshold=threshold, origins=origins,
                           color_by=color_by, ax=ax, **opts)
            ax.set_title(f"{short_layer_name(L.name)}\n{_head_label(heads[c])} ({len(el)} edges)", fontsize=7)
    _origin_legend(fig, view)
    if view.title:
        fig.suptitle(view.title, fontsize=10)
    fig.tight_layout()
    return fig


def _origin_legend(fig: Figure, view: AttentionView) -> None:
    names = view.origin_names()
    if names:
        handles = [Line2D([0], [0], color=origin_color(nm), lw=2, label=nm) for nm in names]
        fig.legend(handles=handles, loc="lower center", ncol=min(len(names), 6), fontsize=8,
                   frameon=False, bbox_to_anchor=(0.5, 0.0))
        fig.subplots_adjust(bottom=0.08)


def attention_matrix(view: AttentionView, layer: int | str = -1, head: int | None = None, *,
                     top_k: int | None = None, threshold: float = 0.0) -> np.ndarray:
    """Dense ``[n, n + V]`` matrix of the coefficients (duplicates summed) of one layer and head."""
    el = view.edges(layer, head, top_k=top_k, threshold=threshold)
    M = np.zeros((view.num_nodes, view.num_nodes + view.num_virtual))
    np.add.at(M, (el.dst, el.src), el.weight)
    return M


def heatmap_tick_labels(view: AttentionView) -> list[str]:
    """The heatmap's axis labels: each node's own label where labels name nodes (tokens, atoms);
    where they are repeated categories (a node task's class names) the node's id in the traced data,
    then its category (``"1701\\nRule_Learning"``); virtual nodes keep their labels."""
    n = view.num_nodes
    if node_categories(view) is None:
        return list(view.labels)
    return [f"{int(view.node_index[i])}\n{view.labels[i]}" for i in range(n)] + list(view.labels[n:])


def draw_heatmap(view: AttentionView, layer: int | str = -1, head: int | None = None, *,
                 top_k: int | None = None, threshold: float = 0.0, ax: Axes | None = None,
                 gamma: float = 0.5, max_ticks: int = 64) -> Axes:
    """The attention matrix: row ``i`` = target (query), column ``j`` = source (key), colour
    :math:`|\\alpha_{ij}|` on a power scale (``gamma``) from the weakest to the strongest drawn
    edge (pairs without an edge stay white); labels on the axes when short
    (:func:`heatmap_tick_labels`)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 7.5))
    lay = view.layer(layer)
    M = np.abs(attention_matrix(view, layer, head, top_k=top_k, threshold=threshold))
    el = view.edges(layer, head, top_k=top_k, threshold=threshold)
    present = np.zeros(M.shape, dtype=bool)
    present[el.dst, el.src] = True
    vals = M[present]
    vmax = float(vals.max()) if vals.size and vals.max() > 0 else 1.0
    vmin = float(vals.min()) if vals.size and vals.min() < vmax else 0.0
    cmap = plt.get_cmap("magma_r").with_extremes(bad="white")
    im = ax.imshow(np.ma.masked_array(M, ~present), cmap=cmap,
                   norm=PowerNorm(gamma, vmin=vmin, vmax=vmax), aspect="auto", interpolation="nearest")
    n, V = view.num_nodes, view.num_virtual
    if V:
        ax.axvline(n - 0.5, color="#1f77b4", lw=0.8)
    if n + V <= max_ticks:
        ticks = heatmap_tick_labels(view)
        ax.set_xticks(range(n + V))
        ax.set_xticklabels(ticks, rotation=90, fontsize=6)
        ax.set_yticks(range(n))
        ax.set_yticklabels(ticks[:n], fontsize=6)
    ax.set_xlabel("source j (key / value)" + (" | virtual" if V else ""))
    ax.set_ylabel("target i (query)")
    thinned = " (thinned view)" if lay.pruned_from else ""
    ax.set_title(f"{short_layer_name(lay.name)} · {_head_label(head)}{thinned}", fontsize=9)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, label="|α| (white: no edge)")
    return ax


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def draw_summary(view: AttentionView) -> Figure:
    """Per layer (:func:`graphattn.attention_stats.layer_statistics`, over the whole graph): edges
    per node and head, density, mean attention entropy in nats (bars) with the entropy normalised by
    the log in-degree and the mean largest weight (lines), and the share of edges and of attention
    mass by origin."""
    stats = view.stats
    if not stats:
        raise ValueError("the view holds no layer statistics (empty trace?)")
    L = len(stats)
    x = np.arange(L)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    names = [short_layer_name(s["layer"]) for s in stats]
    names = [f"{i}:{nm}" if len(set(names)) < L else nm for i, nm in enumerate(names)]
    axes[0].bar(x, [s["edges_per_node_head"] for s in stats], color="#4477aa")
    axes[0].set_title("edges per node and head", fontsize=9)
    axes[1].bar(x, [s["density"] for s in stats], color="#228833")
    axes[1].set_title("density (edges / n(n+V))", fontsize=9)
    axes[1].set_ylim(0, max(1e-9, max(s["density"] for s in stats)) * 1.15)
    axes[2].bar(x, [_or_nan(s["entropy_nats"]) for s in stats], color="#ee7733", label="entropy (nats)")
    ax2 = axes[2].twinx()
    ax2.plot(x, [s["max_weight"] for s in stats], "k.-", label="mean max |α|")
    ax2.plot(x, [_or_nan(s["entropy_normalized"]) for s in stats], "^--", color="#994400",
             label="entropy / log d")
    ax2.set_ylim(0, 1.05)
    axes[2].set_title("entropy (nats, bars); entropy / log d, mean max |α| (lines)", fontsize=9)
    origins = sorted({o for s in stats for key in ("origin_share", "mass_share") for o in s[key]},
                     key=origin_code)
    w = 0.38
    for side, key, hatch in ((-1, "origin_share", ""), (1, "mass_share", "//")):
        bottom = np.zeros(L)
        for o in origins:
            vals = np.array([s[key].get(o, 0.0) for s in stats])
            axes[3].bar(x + side * w / 2, vals, w, bottom=bottom, color=origin_color(o), hatch=hatch,
                        edgecolor="white", linewidth=0.3, label=o if side < 0 else None)
            bottom += vals
    axes[3].set_title("share by origin: edges | attention mass (//)", fontsize=9)
    axes[3].set_ylim(0, 1.0)
    axes[3].legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
    if view.title:
        fig.suptitle(view.title, fontsize=10)
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str | Path, dpi: int = 150, min_width: int = 1200) -> Path:
    """Saves ``fig`` (format from the suffix: png, pdf, svg) and closes it; a raster image gets at
    least ``min_width`` pixels across (the resolution is raised if ``dpi`` gives fewer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if min_width and path.suffix.lower() not in (".pdf", ".svg"):
        width = fig.get_tightbbox(fig.canvas.get_renderer()).width + 0.2  # inches, with the 0.1" pad
        dpi = max(dpi, int(np.ceil(1.03 * min_width / max(width, 1e-3))))  # 3 % for text extents
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
