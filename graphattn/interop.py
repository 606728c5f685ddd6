r"""Interoperability: attention traces as networkx graphs, edge sets as sparse matrices and DGL graphs.

**networkx** (:func:`record_to_networkx`, behind :meth:`graphattn.tracing.TraceRecord.to_networkx`
and :meth:`graphattn.tracing.AttentionTrace.to_networkx`): one traced attention call as a
:class:`networkx.DiGraph` whose edge :math:`j \to i` carries the coefficient
:math:`\alpha_{ij}^h` of :math:`v_j` in :math:`o_i^h` (softmax times weight, before dropout: the
``alpha`` of ``return_attention_weights``). **Every traced edge is one networkx edge; nothing is
merged.** When the selected edges hold a ``(source, target)`` pair more than once (a union with
duplicates, or per-head edges seen through the head mean), the result is a
:class:`networkx.MultiDiGraph` instead, one parallel edge per traced edge.

**Sparse matrices** (:func:`to_sparse_tensor`, :func:`from_sparse_tensor`, :func:`to_torch_sparse`,
:func:`from_torch_sparse`; defined in :mod:`graphattn.core.sparse`, since the layer accepts a sparse
``adj_t`` as its edges): PyG's ``adj_t`` orientation, row = target, column = source.

**DGL** (:func:`to_dgl`, :func:`from_dgl`) where DGL imports.

This module depends on :mod:`graphattn.core`, never the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from graphattn.core.edgeset import BaseEdgeSet, EdgeSet, ExplicitOnlyError
from graphattn.core.origins import origin_name
from graphattn.core.sparse import (  # noqa: F401  re-exported: the sparse-matrix conversions
    VALUE_FIELDS,
    from_sparse_tensor,
    from_torch_sparse,
    is_sparse_matrix,
    to_sparse_tensor,
    to_torch_sparse,
)
from graphattn.core.sparse import num_real_nodes as _num_nodes

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from graphattn.tracing import TraceRecord



__all__ = ["from_dgl", "from_sparse_tensor", "from_torch_sparse", "is_sparse_matrix", "record_to_networkx",
           "to_dgl", "to_sparse_tensor", "to_torch_sparse"]


# ------------------------------------------------------------------------------------- networkx
def _check_index(name: str, value: Any, size: int, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"'{name}' must be None or an int in [0, {size}) ({what}), got {value!r}")
    return value


def _py(value: Tensor) -> float | complex:
    return complex(value) if value.is_complex() else float(value)


def record_to_networkx(rec: TraceRecord, head: int | None = None,
                       graph: int | None = None) -> nx.DiGraph | nx.MultiDiGraph:
    r"""One traced attention call as a networkx graph.

    Edges: one per traced edge :math:`j \to i` (of head ``head`` when given), with attributes

    * ``weight``: :math:`\alpha_{ij}^h` for ``head=h``; for ``head=None`` the mean over heads
      :math:`\frac1H \sum_h \alpha_{ij}^h` of the traced row (for per-head edges, whose other heads'
      entries are 0, that is :math:`\alpha_{ij}^{h_e}/H`: the parallel edges of a pair then sum to
      the head mean). Complex coefficients (operator edge sets) stay complex;
    * ``origin``: the producer's name (``"input"``, ``"expander"``, ``"virtual"``, ...), when the
      edge set has origins;
    * ``head``: the edge's head, for per-head edge sets;
    * ``edge_id``: the edge's position in the traced edge set (the row of ``alpha``).

    Nodes: the real nodes (isolated ones too), then the virtual sources, with attributes ``index``
    (the id in the traced batch; virtual source ``k`` is ``N + k``), ``graph`` (graph id; ``-1``
    for a graph-agnostic virtual source) and ``virtual``. With ``graph=None`` node ids are the
    traced ids; with ``graph=g`` only the edges into graph ``g``'s nodes are kept and nodes are
    relabelled: ``g``'s real nodes ``0 .. n-1`` in their traced order, then the virtual sources of
    ``g`` (its own or graph-agnostic ones with an edge into ``g``) ``n, n+1, ...``.

    Returns a :class:`networkx.DiGraph`, or a :class:`networkx.MultiDiGraph` when a
    ``(source, target)`` pair occurs more than once among the kept edges (see the module doc).
    """
    import networkx as nx

    es, alpha, batch = rec.edges, rec.alpha, rec.batch
    H = int(alpha.size(1))
    N = int(batch.numel())
    num_graphs = int(batch.max()) + 1 if N else 0
    head = _check_index("head", head, H, f"the layer has {H} head(s)")
    graph = _check_index("graph", graph, num_graphs, f"the traced batch has {num_graphs} graph(s)")
    src, dst = es.edge_index
    keep = torch.ones(es.num_edges, dtype=torch.bool)
    if head is not None and es.per_head:
        keep &= es.head == head
    if graph is not None:
        keep &= batch[dst] == graph
    ids = keep.nonzero().view(-1)
    weight = alpha[:, head] if head is not None else alpha.mean(dim=1)

    V = es.num_virtual
    vbatch = es.virtual_batch if es.virtual_batch is not None else torch.full((V,), -1)
    if graph is None:
        real = torch.arange(N)
        virtual = torch.arange(V)
    else:
        real = (batch == graph).nonzero().view(-1)
        used = src[ids][src[ids] >= N] - N
        own = (vbatch == graph).nonzero().view(-1)
        virtual = torch.unique(torch.cat([used, own]))  # sorted: traced order
    # traced id -> node id of the result
    new_id = torch.full((N + V,), -1, dtype=torch.long)
    new_id[real] = torch.arange(real.numel())
    new_id[N + virtual] = real.numel() + torch.arange(virtual.numel())

    pairs = torch.stack([new_id[src[ids]], new_id[dst[ids]]])
    multi = bool(ids.numel()) and torch.unique(pairs, dim=1).size(1) < ids.numel()
    G = nx.MultiDiGraph() if multi else nx.DiGraph()
    G.graph.update(layer=rec.layer, index=rec.index, head=head, num_heads=H,
                   graph=graph, mode=es.mode)
    for i in real.tolist():
        G.add_node(int(new_id[i]), index=i, graph=int(batch[i]), virtual=False)
    for k in virtual.tolist():
        G.add_node(int(new_id[N + k]), index=N + k, graph=int(vbatch[k]), virtual=True)
    for e, u, v in zip(ids.tolist(), pairs[0].tolist(), pairs[1].tolist(), strict=True):
        attrs: dict[str, Any] = {"weight": _py(weight[e]), "edge_id": e}
        if es.origin is not None:
            attrs["origin"] = origin_name(int(es.origin[e]))
        if es.per_head:
            attrs["head"] = int(es.head[e])  # type: ignore[index]
        G.add_edge(u, v, **attrs)
    return G


# ---------------------------------------------------------------------------------- sparse forms
def _import_dgl() -> Any:
    try:
        import dgl
    except ImportError as e:  # pragma: no cover - DGL is optional and absent from torch >= 2.5
        raise ImportError("the DGL conversion needs the 'dgl' package (pip install dgl); no DGL "
                          "release installs with torch >= 2.5, so it runs with an older torch") from e
    return dgl


def to_dgl(es: EdgeSet, num_nodes: int | None = None) -> Any:
    r"""An explicit edge set as a :class:`dgl.DGLGraph` on ``N + V`` nodes (virtual sources last):
    DGL edge ``k`` is edge ``k`` of ``es`` (source :math:`j`, destination :math:`i`, the same
    direction as DGL's message passing), and every per-edge field (``weight``, ``bias``,
    ``origin``, ``edge_attr``, ``head``) is copied into ``g.edata`` under its own name; duplicate
    edges stay duplicate edges (DGL graphs are multigraphs), so nothing is merged. A batch stays
    one block-diagonal graph: pass the same ``batch`` to the layer either way.
    ``num_nodes`` (the real node count ``N``) is needed with virtual sources."""
    dgl = _import_dgl()
    if not isinstance(es, BaseEdgeSet):
        raise ValueError(f"'es' must be an EdgeSet, got {type(es).__name__}")
    if es.structure != "explicit":
        raise ExplicitOnlyError(f"{type(es).__name__} to DGL needs enumerated edges; call "
                                f".to_explicit() first to materialise them on purpose")
    n = _num_nodes(es, num_nodes) + es.num_virtual
    src, dst = es.edge_index
    g = dgl.graph((src, dst), num_nodes=n, idtype=torch.int64, device=src.device)
    for name in DGL_FIELDS:
        value = getattr(es, name)
        if value is not None:
            g.edata[name] = value
    return g


def from_dgl(g: Any, num_virtual: int = 0, **fields: Any) -> EdgeSet:
    r"""An explicit edge set from a :class:`dgl.DGLGraph`: its edges in DGL's edge-id order,
    source :math:`j` to destination :math:`i`, with every ``g.edata`` entry named like an
    :class:`~graphattn.EdgeSet` per-edge field (``weight``, ``bias``, ``origin``, ``edge_attr``,
    ``head``) taken over; other ``edata`` entries are refused, not dropped (pass the ones you want
    as keyword fields yourself). ``num_virtual``: how many of the graph's last nodes are virtual
    sources (their ``virtual_x`` must then be given in ``fields``)."""
    dgl = _import_dgl()
    if not isinstance(g, dgl.DGLGraph):
        raise ValueError(f"'g' must be a dgl.DGLGraph, got {type(g).__name__}")
    unknown = sorted(set(g.edata.keys()) - set(DGL_FIELDS))
    if unknown:
        raise ValueError(f"'g' has edge data {unknown} that an EdgeSet has no field for (known: "
                         f"{list(DGL_FIELDS)}); remove them or pass them as keyword fields")
    taken = {name: g.edata[name] for name in DGL_FIELDS if name in g.edata}
    both = sorted(set(taken) & set(fields))
    if both:
        raise ValueError(f"{both} given twice: in g.edata and as keyword fields")
    vx = fields.get("virtual_x")
    if num_virtual != (0 if vx is None else int(vx.size(0))):
        raise ValueError(f"'num_virtual' is {num_virtual} but virtual_x has "
                         f"{0 if vx is None else int(vx.size(0))} rows: the graph's last "
                         f"num_virtual nodes are the virtual sources, one virtual_x row each")
    if g.num_nodes() < num_virtual:
        raise ValueError(f"'num_virtual' is {num_virtual} but 'g' has {g.num_nodes()} nodes")
    src, dst = g.edges(order="eid")
    return EdgeSet(torch.stack([src.long(), dst.long()]), **taken, **fields)


#: the per-edge EdgeSet fields that travel as DGL edge data
DGL_FIELDS = ("weight", "bias", "origin", "edge_attr", "head")
