r"""What the viewer draws: one sample's attention graph per layer, in view-local node ids.

A :class:`AttentionView` is built from an :class:`~graphattn.AttentionTrace` and the traced data.
For every traced layer it holds the explicit edges the layer really used, the coefficients
:math:`\alpha_{ij}^h` (the weight of :math:`v_j` in :math:`o_i` in head :math:`h`, ``[E, H]``) and
each edge's producer (``origin``), restricted to one graph of the batch (``graph=``) or, for node
tasks, to the attention neighbourhood of one node (``focus=``).

Node ids: real nodes of the view are ``0 .. n-1`` (``node_index`` maps them back to the traced data);
virtual sources follow as ``n .. n+V-1``. Virtual sources are per layer: the ``k``-th virtual source of
the graph in a layer is drawn in slot ``n + k`` (slot ``k`` of different layers are different sources).

Edge lists per (layer, head) follow two rules that the static figures and the HTML viewer share:

* **one head** ``h``: the edges of head ``h`` exactly as traced (head-shared edges, or per-head
  edges with ``head == h``), weight :math:`\alpha^h_{ij}`; duplicates stay separate;
* **mean over heads** (``head=None``): one edge per distinct ``(source, target)`` with weight
  :math:`\frac1H \sum_h \sum_{\text{copies}} \alpha^h_{ij}`, origin of its first copy.

Pruning (:meth:`AttentionView.edges`): ``threshold`` keeps :math:`|\alpha| \ge` threshold, then
``top_k`` keeps each target's ``k`` largest :math:`|\alpha|` (ties: earlier edge first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphattn.attention_stats import layer_statistics
from graphattn.core.origins import origin_name
from graphattn.tracing import AttentionTrace, TraceRecord

KINDS = ("graph", "molecule", "sequence", "image", "points")


@dataclass
class EdgeList:
    """Edges of one (layer, head) view: ``src``/``dst`` view ids, ``weight`` and ``origin`` codes."""

    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    origin: np.ndarray

    def __len__(self) -> int:
        return int(self.src.size)

    def select(self, keep: np.ndarray) -> EdgeList:
        return EdgeList(self.src[keep], self.dst[keep], self.weight[keep], self.origin[keep])


@dataclass
class LayerAttention:
    """One traced attention call restricted to the view.

    ``src``, ``dst``: ``[E]`` view ids; ``head``: ``[E]`` or ``None`` (every edge in every head);
    ``alpha``: ``[E, H]`` real coefficients (magnitudes when the layer's coefficients are complex,
    then ``complex=True``); ``origin``: ``[E]`` producer codes; ``num_virtual``: virtual slots used.
    ``pruned_from``: the number of edges per head before the view was thinned for size, or ``None``.
    """

    name: str
    num_heads: int
    src: np.ndarray
    dst: np.ndarray
    head: np.ndarray | None
    alpha: np.ndarray
    origin: np.ndarray
    num_virtual: int = 0
    complex: bool = False
    pruned_from: list[int] | None = None

    @property
    def num_edges(self) -> int:
        return int(self.src.size)

    def head_mask(self, h: int) -> np.ndarray:
        if not 0 <= h < self.num_heads:
            raise ValueError(f"'head' must lie in [0, {self.num_heads}) for layer {self.name!r}, got {h}")
        if self.head is None:
            return np.ones(self.num_edges, dtype=bool)
        return self.head == h

    def count(self, h: int | None) -> int:
        """Edges drawn for head ``h`` (``None``: distinct pairs of the head mean) before pruning."""
        return len(self.edges(h))

    def edges(self, h: int | None) -> EdgeList:
        """The edge list of head ``h`` or of the mean over heads (``None``); see the module doc."""
        if h is not None:
            m = self.head_mask(int(h))
            return EdgeList(self.src[m], self.dst[m], self.alpha[m, int(h)], self.origin[m])
        if self.num_edges == 0:
            return EdgeList(self.src, self.dst, self.alpha.sum(1), self.origin)
        M = int(max(self.src.max(), self.dst.max())) + 1
        key = self.dst.astype(np.int64) * M + self.src
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        w = np.zeros(uniq.size, dtype=np.float64)
        np.add.at(w, inv, self.alpha.sum(1))
        order = np.argsort(first, kind="stable")  # keep the trace's order of first occurrence
        first = first[order]
        return EdgeList(self.src[first], self.dst[first], (w[order] / self.num_heads), self.origin[first])


# Size-based defaults shared by the static figures and the HTML viewer: each target keeps its
# ``auto_top_k(n)`` strongest in-edges, and no figure draws more than ``MAX_DRAWN`` edges.
AUTO_TOP_K = ((24, None), (80, 3), (200, 2))  # (at most this many real nodes, k); larger: k = 1
MAX_DRAWN = 1500


def auto_top_k(num_nodes: int) -> int | None:
    """The default number of in-edges drawn per target for a view of ``num_nodes`` real nodes:
    every edge up to 24 nodes, 3 up to 80, 2 up to 200, else 1 (``None`` = all)."""
    for limit, k in AUTO_TOP_K:
        if num_nodes <= limit:
            return k
    return 1


def resolve_top_k(top_k: int | str | None, num_nodes: int) -> int | None:
    """``"auto"`` → :func:`auto_top_k`; ``None`` or ``0`` → every edge; else ``top_k``."""
    if isinstance(top_k, str):
        if top_k != "auto":
            raise ValueError(f"'top_k' must be a positive int, 0/None (all) or 'auto', got {top_k!r}")
        return auto_top_k(num_nodes)
    if top_k is None or (not isinstance(top_k, bool) and int(top_k) == 0):
        return None
    return top_k


def strongest(edges: EdgeList, max_edges: int | None) -> EdgeList:
    """At most ``max_edges`` edges: the strongest by :math:`|w|` (stable ties), in their order."""
    if max_edges is None or len(edges) <= max_edges:
        return edges
    keep = np.sort(np.argsort(-np.abs(edges.weight), kind="stable")[:max_edges])
    return edges.select(keep)


def prune(edges: EdgeList, top_k: int | None = None, threshold: float = 0.0) -> EdgeList:
    """``threshold`` on :math:`|w|`, then each target's ``top_k`` largest :math:`|w|` (stable ties)."""
    if threshold < 0:
        raise ValueError(f"'threshold' must be >= 0, got {threshold}")
    if top_k is not None and (isinstance(top_k, bool) or int(top_k) < 1):
        raise ValueError(f"'top_k' must be a positive int or None, got {top_k!r}")
    keep = np.abs(edges.weight) >= threshold if threshold > 0 else np.ones(len(edges), dtype=bool)
    if top_k is not None and len(edges):
        idx = np.nonzero(keep)[0]
        order = np.lexsort((idx, -np.abs(edges.weight[idx]), edges.dst[idx]))
        idx = idx[order]
        d = edges.dst[idx]
        start = np.r_[0, np.nonzero(d[1:] != d[:-1])[0] + 1]
        rank = np.arange(idx.size) - np.repeat(start, np.diff(np.r_[start, idx.size]))
        keep = np.zeros(len(edges), dtype=bool)
        keep[idx[rank < int(top_k)]] = True
    return edges.select(keep)


@dataclass
class AttentionView:
    """One sample's attention graphs, ready to draw (see the module docstring for the id rules).

    Attributes:
        layers: one :class:`LayerAttention` per traced attention call.
        num_nodes: real nodes ``n`` in the view.
        node_index: ``[n]`` id of each view node in the traced data.
        labels: ``n + V`` display labels (plain strings; the HTML writer escapes them).
        pos: ``[n + V, 2]`` drawing coordinates (:mod:`graphattn.viz.layout`).
        kind: ``"graph"``, ``"molecule"``, ``"sequence"``, ``"image"`` or ``"points"``.
        is_cls: ``[n + V]`` CLS nodes (sequence/image read-out tokens).
        focus: view id of the focus node (node tasks) or ``None``.
        hop: ``[n + V]`` attention hops from the focus node (``-1`` when not focused).
        input_edges: ``[2, E_in]`` the data's own edges inside the view (context only).
        background: ``(image [h, w], extent)`` drawn under image views, or ``None``.
        stats: per-layer statistics over the whole selected graph (:func:`layer_stats`).
        title: figure title.
        notes: remarks shown with the figures (e.g. how the view was thinned).
    """

    layers: list[LayerAttention]
    num_nodes: int
    node_index: np.ndarray
    labels: list[str]
    pos: np.ndarray
    kind: str
    is_cls: np.ndarray
    focus: int | None = None
    hop: np.ndarray | None = None
    input_edges: np.ndarray | None = None
    background: tuple[np.ndarray, tuple[float, float, float, float]] | None = None
    stats: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""
    notes: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------- queries
    @property
    def num_virtual(self) -> int:
        return max((layer.num_virtual for layer in self.layers), default=0)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_virtual(self) -> np.ndarray:
        out = np.zeros(self.num_nodes + self.num_virtual, dtype=bool)
        out[self.num_nodes:] = True
        return out

    def layer(self, layer: int | str) -> LayerAttention:
        """A layer by position (negative counts from the end) or by name."""
        if isinstance(layer, str):
            for rec in self.layers:
                if rec.name == layer:
                    return rec
            raise ValueError(f"no traced layer named {layer!r}; traced: {[r.name for r in self.layers]}")
        if not self.layers:
            raise ValueError("the trace holds no attention layer (did the model run with a producer?)")
        if not -len(self.layers) <= int(layer) < len(self.layers):
            raise ValueError(f"'layer' must lie in [-{len(self.layers)}, {len(self.layers)}), got {layer}")
        return self.layers[int(layer)]

    def edges(self, layer: int | str = -1, head: int | None = None, *, top_k: int | str | None = None,
              threshold: float = 0.0, origins: Sequence[str] | None = None) -> EdgeList:
        """The edges of ``layer`` in ``head`` (``None`` = mean over heads), optionally restricted to
        some ``origins`` (names) and pruned (:func:`prune`; ``top_k="auto"``: :func:`auto_top_k` of
        the view's node count, ``None`` or ``0``: every edge)."""
        top_k = resolve_top_k(top_k, self.num_nodes)
        el = self.layer(layer).edges(head)
        if origins is not None:
            wanted = set(origins)
            el = el.select(np.array([origin_name(int(c)) in wanted for c in el.origin], dtype=bool))
        return prune(el, top_k, threshold)

    def to_networkx(self, layer: int | str = -1, head: int | None = None, *,
                    top_k: int | str | None = None, threshold: float = 0.0,
                    origins: Sequence[str] | None = None) -> Any:
        """The edges :meth:`edges` gives (the viewer's rules: ``head=None`` is one edge per pair
        with the head-mean weight; one head keeps duplicates) as a :class:`networkx.DiGraph`, or a
        :class:`networkx.MultiDiGraph` when a pair occurs twice. Nodes are the view ids
        ``0 .. n+V-1`` with ``label``, ``virtual`` and, for real nodes, ``index`` (the id in the
        traced data); edges carry ``weight`` (magnitudes for complex layers) and ``origin``
        (name). :meth:`graphattn.tracing.TraceRecord.to_networkx` gives the unpruned trace."""
        import networkx as nx

        el = self.edges(layer, head, top_k=top_k, threshold=threshold, origins=origins)
        pairs = set(zip(el.src.tolist(), el.dst.tolist(), strict=True))
        G = nx.MultiDiGraph() if len(pairs) < len(el) else nx.DiGraph()
        G.graph.update(layer=self.layer(layer).name, head=head)
        for i, label in enumerate(self.labels):
            attrs: dict[str, Any] = {"label": label, "virtual": i >= self.num_nodes}
            if i < self.num_nodes:
                attrs["index"] = int(self.node_index[i])
            G.add_node(i, **attrs)
        for u, v, w, o in zip(el.src.tolist(), el.dst.tolist(), el.weight.tolist(),
                              el.origin.tolist(), strict=True):
            G.add_edge(u, v, weight=w, origin=origin_name(o))
        return G

    def origin_names(self) -> list[str]:
        """Names of the origins present in any layer, in code order."""
        codes = sorted({int(c) for layer in self.layers for c in np.unique(layer.origin)})
        return [origin_name(c) for c in codes]


# ------------------------------------------------------------------------------------ building
def _as_numpy(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _real_alpha(alpha: Tensor) -> tuple[np.ndarray, bool]:
    if alpha.is_complex():
        return _as_numpy(alpha.abs()).astype(np.float64), True
    return _as_numpy(alpha).astype(np.float64), False


@dataclass
class _Selected:
    """A record restricted to one graph, in traced-data ids (sources ≥ N are virtual)."""

    rec: TraceRecord
    src: np.ndarray
    dst: np.ndarray
    head: np.ndarray | None
    alpha: np.ndarray
    origin: np.ndarray
    complex: bool


def _select_graph(rec: TraceRecord, graph: int) -> _Selected:
    es = rec.edges
    ei = _as_numpy(es.edge_index)
    batch = _as_numpy(rec.batch)
    N = batch.size
    keep = batch[ei[1]] == graph if ei.shape[1] else np.zeros(0, dtype=bool)
    alpha, is_complex = _real_alpha(rec.alpha)
    origin = (_as_numpy(es.origin) if es.origin is not None
              else np.zeros(ei.shape[1], dtype=np.int64))
    head = _as_numpy(es.head)[keep] if es.head is not None else None
    src, dst = ei[0][keep], ei[1][keep]
    if N and src.size and bool((src < N).any()):
        real = src < N
        if bool((batch[src[real]] != graph).any()):  # the EdgeSet invariant, re-checked for safety
            raise ValueError(f"layer {rec.layer!r}: an edge joins graph {graph} to another graph")
    return _Selected(rec, src, dst, head, alpha[keep], origin[keep], is_complex)


def _focus_nodes(selected: list[_Selected], focus: int, nodes: np.ndarray, hops: int, focus_k: int,
                 max_nodes: int, input_edges: np.ndarray | None) -> tuple[list[int], dict[int, int]]:
    """The focus node, its ``focus_k`` strongest attention sources per hop (max |α| over layers and
    heads), and its input-graph neighbours, up to ``max_nodes``. Returns nodes and their hop."""
    n_total = nodes.size
    in_graph = np.zeros(int(nodes.max()) + 1 if n_total else 0, dtype=bool)
    in_graph[nodes] = True
    # strongest in-edge score per (target, source) over all layers and heads, built lazily per target
    by_dst = []
    for s in selected:
        real = s.src < in_graph.size
        real[real] = in_graph[s.src[real]]
        src, dst = s.src[real], s.dst[real]
        score = np.abs(s.alpha[real]).max(1) if s.alpha.size else np.zeros(src.size)
        order = np.argsort(dst, kind="stable")
        by_dst.append((src[order], dst[order], score[order]))

    def sources_of(t: int) -> list[int]:
        best: dict[int, float] = {}
        for src, dst, score in by_dst:
            lo, hi = np.searchsorted(dst, t, "left"), np.searchsorted(dst, t, "right")
            for j, w in zip(src[lo:hi].tolist(), score[lo:hi].tolist(), strict=True):
                if j != t and w > best.get(j, -1.0):
                    best[j] = w
        ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))
        return [j for j, _ in ranked[:focus_k]]

    hop = {focus: 0}
    order = [focus]
    frontier = [focus]
    for h in range(1, hops + 1):
        nxt = []
        for t in frontier:
            for j in sources_of(t):
                if j not in hop and len(order) < max_nodes:
                    hop[j] = h
                    order.append(j)
                    nxt.append(j)
        if h == 1 and input_edges is not None and input_edges.size:
            nb = input_edges[0][input_edges[1] == focus].tolist() + input_edges[1][
                input_edges[0] == focus].tolist()
            for j in sorted(set(nb))[:focus_k]:
                if j not in hop and len(order) < max_nodes:
                    hop[j] = 1
                    order.append(j)
        frontier = nxt
    return order, hop


def layer_stats(layer: LayerAttention, num_targets: int) -> dict[str, Any]:
    r"""Statistics of one layer over its ``num_targets`` real targets (view ids ``0 .. n-1``; a
    source ``>= n`` is a virtual slot): :func:`graphattn.attention_stats.layer_statistics`, the
    function :meth:`graphattn.AttentionTrace.summary` uses, so a one-graph trace and its view give
    the same numbers. Keys include ``entropy_nats`` (mean over targets and heads of
    :math:`-\sum_j p_{ij}^h \log p_{ij}^h`, :math:`p_{ij}^h` the share of source :math:`j` in target
    :math:`i`'s :math:`\sum |\alpha|`, copies of an edge merged), ``entropy_normalized`` (the same
    divided by :math:`\log d_i^h`, :math:`d_i^h` distinct sources, over targets with
    :math:`d_i^h \ge 2`), ``edges_per_node_head``, ``density``, ``max_weight``, ``origin_share`` and
    ``mass_share``."""
    return layer_statistics(layer.src, layer.dst, layer.alpha, num_targets=num_targets, head=layer.head,
                            origin=layer.origin, name=layer.name)


def _infer_kind(data: Any) -> str:
    pos = getattr(data, "pos", None)
    if pos is None:
        return "graph"
    if pos.dim() == 1 or pos.size(-1) == 1:
        return "sequence"
    return "points"


def _cls_mask(data: Any, kind: str, nodes: np.ndarray) -> np.ndarray:
    pos = getattr(data, "pos", None)
    if pos is None or kind not in ("sequence", "image"):
        return np.zeros(nodes.size, dtype=bool)
    p = _as_numpy(pos).reshape(pos.size(0), -1)[nodes]
    return (p < 0).all(1)


def build_view(
    trace: AttentionTrace | Sequence[TraceRecord],
    data: Any,
    *,
    graph: int = 0,
    focus: int | None = None,
    kind: str | None = None,
    labels: Sequence[str] | None = None,
    hops: int | None = None,
    focus_k: int = 8,
    max_nodes: int = 60,
    max_edges: int | None = None,
    title: str = "",
    layout_seed: int = 0,
) -> AttentionView:
    """Builds the :class:`AttentionView` of graph ``graph`` of the traced ``data``.

    Args:
        trace: the trace of one forward pass over ``data``.
        data: the traced PyG ``Data``/``Batch`` (for ``pos``, ``edge_index``, ``batch``).
        graph: which graph of a batch to show.
        focus: a node id of ``data`` to centre on (node tasks): the view keeps the node, its
            strongest attention sources over ``hops`` hops (``focus_k`` per node, max |α| over layers
            and heads), its input-graph neighbours, at most ``max_nodes`` nodes, and the traced edges
            among them (weights as traced, not renormalised).
        kind: ``"graph"``, ``"molecule"``, ``"sequence"``, ``"image"`` or ``"points"`` (default:
            inferred from ``data.pos``: none → graph, 1-D → sequence, else points).
        labels: one label per node of ``data`` (token strings, atom symbols, class names).
        hops: attention hops around ``focus`` (default ``min(num_layers, 2)``).
        max_edges: per layer, if edges × heads exceed this, each target keeps only its strongest
            in-edges per head so the view fits (recorded in ``notes`` and ``pruned_from``); ``None``
            keeps every edge (the HTML writer thins its own copy, see :func:`thin_layer`).
        title: figure title.
        layout_seed: seed of force-directed layouts.
    """
    from graphattn.viz.layout import image_background, node_positions

    records = list(trace.records if isinstance(trace, AttentionTrace) else trace)
    kind = kind or _infer_kind(data)
    if kind not in KINDS:
        raise ValueError(f"'kind' must be one of {KINDS}, got {kind!r}")
    if focus_k < 1 or max_nodes < 1:
        raise ValueError(f"'focus_k' and 'max_nodes' must be >= 1, got {focus_k}, {max_nodes}")
    num_nodes_data = int(data.num_nodes)
    batch_t = getattr(data, "batch", None)
    if records:
        batch_t = records[0].batch
    batch = (_as_numpy(batch_t) if batch_t is not None
             else np.zeros(num_nodes_data, dtype=np.int64))
    if batch.size != num_nodes_data:
        raise ValueError(f"the trace covers {batch.size} nodes but data has {num_nodes_data}; "
                         f"trace the same data you pass here")
    num_graphs = int(batch.max()) + 1 if batch.size else 0
    if not 0 <= graph < max(num_graphs, 1):
        raise ValueError(f"'graph' must lie in [0, {num_graphs}), got {graph}")
    if labels is not None and len(labels) != num_nodes_data:
        raise ValueError(f"'labels' must have one entry per node ({num_nodes_data}), got {len(labels)}")
    nodes = np.nonzero(batch == graph)[0]
    ei_t = getattr(data, "edge_index", None)
    input_edges = _as_numpy(ei_t) if ei_t is not None else None

    selected = [_select_graph(rec, graph) for rec in records]
    notes: list[str] = []

    # statistics over the whole selected graph, before any focus or thinning
    to_local_all = np.full(num_nodes_data, -1, dtype=np.int64)
    to_local_all[nodes] = np.arange(nodes.size)
    stats = []
    for s in selected:
        lay = _localise(s, to_local_all, num_nodes_data, nodes.size)
        stats.append(layer_stats(lay, nodes.size))

    hop_of: dict[int, int] | None = None
    if focus is not None:
        if not 0 <= int(focus) < num_nodes_data or batch[int(focus)] != graph:
            raise ValueError(f"'focus' must be a node of graph {graph} in [0, {num_nodes_data}), got {focus}")
        hops = min(len(records), 2) if hops is None else int(hops)
        order, hop_of = _focus_nodes(selected, int(focus), nodes, max(hops, 1), focus_k, max_nodes,
                                     input_edges)
        nodes = np.asarray(order, dtype=np.int64)
        notes.append(f"attention neighbourhood of node {int(focus)}: {nodes.size} nodes "
                     f"({max(hops, 1)} hops, {focus_k} strongest sources per node, at most {max_nodes})")

    n = nodes.size
    to_local = np.full(num_nodes_data, -1, dtype=np.int64)
    to_local[nodes] = np.arange(n)
    layers = [_localise(s, to_local, num_nodes_data, n) for s in selected]
    if max_edges is not None:
        thinned = [thin_layer(lay, max_edges, n) for lay in layers]
        layers = [lay for lay, _ in thinned]
        notes += [note for _, note in thinned if note]

    V = max((lay.num_virtual for lay in layers), default=0)
    in_view = None
    if input_edges is not None and input_edges.size:
        src_l, dst_l = to_local[input_edges[0]], to_local[input_edges[1]]
        ok = (src_l >= 0) & (dst_l >= 0)
        in_view = np.stack([src_l[ok], dst_l[ok]])
    is_cls = np.r_[_cls_mask(data, kind, nodes), np.zeros(V, dtype=bool)]
    names = [str(labels[i]) for i in nodes] if labels is not None else [str(i) for i in nodes]
    names += [f"v{k}" for k in range(V)]
    hop = None
    if hop_of is not None:
        hop = np.r_[np.array([hop_of[int(i)] for i in nodes], dtype=np.int64), np.full(V, -1)]
    pos = node_positions(data, nodes, kind, num_virtual=V, edges=in_view, layers=layers, hop=hop,
                         seed=layout_seed)
    return AttentionView(
        layers=layers, num_nodes=n, node_index=nodes, labels=names, pos=pos, kind=kind,
        is_cls=is_cls, focus=0 if focus is not None else None, hop=hop, input_edges=in_view,
        background=image_background(data, nodes) if kind == "image" else None,
        stats=stats, title=title, notes=notes,
    )


def _localise(s: _Selected, to_local: np.ndarray, N: int, n: int) -> LayerAttention:
    """Maps a selected record to view ids; virtual sources get slots ``n + k`` in id order."""
    virt = s.src >= N
    src_l = np.where(virt, -1, to_local[np.minimum(s.src, max(N - 1, 0))] if N else -1)
    keep = (to_local[s.dst] >= 0) & (virt | (src_l >= 0)) if s.dst.size else np.zeros(0, dtype=bool)
    vids = np.unique(s.src[virt & keep])
    slot = np.searchsorted(vids, s.src)
    src_l = np.where(virt, n + slot, src_l)
    return LayerAttention(
        name=s.rec.layer,
        num_heads=int(s.alpha.shape[1]) if s.alpha.ndim == 2 else s.rec.num_heads,
        src=src_l[keep].astype(np.int64),
        dst=to_local[s.dst[keep]].astype(np.int64),
        head=None if s.head is None else s.head[keep].astype(np.int64),
        alpha=s.alpha[keep],
        origin=s.origin[keep].astype(np.int64),
        num_virtual=int(vids.size),
        complex=s.complex,
    )


def thin_layer(lay: LayerAttention, max_edges: int, n: int) -> tuple[LayerAttention, str]:
    """A copy of ``lay`` in which each target keeps its ``k`` strongest in-edges per head, ``k``
    chosen so that edges × heads ≤ ``max_edges`` (an edge shared by all heads stays if it is among
    the strongest in any head), and a note saying so; ``lay`` itself when it already fits."""
    H = lay.num_heads
    entries = lay.num_edges * (1 if lay.head is not None else H)
    if entries <= max_edges or n == 0:
        return lay, ""
    k = max(1, max_edges // (n * H))
    keep = np.zeros(lay.num_edges, dtype=bool)
    before = []
    for h in range(H):
        m = np.nonzero(lay.head_mask(h))[0]
        before.append(int(m.size))
        # prune an edge list whose "origin" carries the edge ids, to read back which edges stayed
        ids = EdgeList(lay.src[m], lay.dst[m], lay.alpha[m, h], m)
        keep[prune(ids, top_k=k).origin] = True
    out = replace(lay, src=lay.src[keep], dst=lay.dst[keep], alpha=lay.alpha[keep], origin=lay.origin[keep],
                  head=None if lay.head is None else lay.head[keep], pruned_from=before)
    note = (f"{lay.name}: {entries} edge-head pairs thinned to the {k} strongest in-edges per target "
            f"and head ({out.num_edges} edges kept) to fit max_edges={max_edges}")
    return out, note


def trace_sample(model: torch.nn.Module, data: Any, **forward_kwargs: Any) -> AttentionTrace:
    """Runs ``model(data)`` in eval mode without gradients and returns its trace."""
    return trace_and_predict(model, data, **forward_kwargs)[0]


def trace_and_predict(model: torch.nn.Module, data: Any,
                      **forward_kwargs: Any) -> tuple[AttentionTrace, Any]:
    """As :func:`trace_sample`, and also returns the model's output (for the prediction)."""
    from graphattn.tracing import trace

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), trace(model) as t:
            out = model(data, **forward_kwargs)
    finally:
        model.train(was_training)
    return t, out
