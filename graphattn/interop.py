r"""Interoperability: attention traces as networkx graphs, edge sets as sparse matrices.

**networkx** (:func:`record_to_networkx`, behind :meth:`graphattn.tracing.TraceRecord.to_networkx`
and :meth:`graphattn.tracing.AttentionTrace.to_networkx`): one traced attention call as a
:class:`networkx.DiGraph` whose edge :math:`j \to i` carries the coefficient
:math:`\alpha_{ij}^h` of :math:`v_j` in :math:`o_i^h` (softmax times weight, before dropout: the
``alpha`` of ``return_attention_weights``). **Every traced edge is one networkx edge; nothing is
merged.** When the selected edges hold a ``(source, target)`` pair more than once (a union with
duplicates, or per-head edges seen through the head mean), the result is a
:class:`networkx.MultiDiGraph` instead, one parallel edge per traced edge.

**Sparse matrices** (:func:`to_sparse_tensor`, :func:`from_sparse_tensor`, :func:`to_torch_sparse`,
:func:`from_torch_sparse`, behind the :class:`~graphattn.EdgeSet` methods of the same names). The
orientation is PyG's ``adj_t`` convention (what :meth:`MessagePassing.propagate` accepts): **row =
target** :math:`i`, **column = source** :math:`j`, shape ``[N, N + V]`` (``V`` virtual sources as
the last columns), so that for a ``"weighted"`` edge set with weights :math:`w`

.. math::
    (A^\top V)_i = \sum_{j \to i} w_{ji}\, v_j,

the layer's weighted-mode output. A matrix has one entry per ``(target, source)`` pair: duplicate
edges (a second softmax term each) cannot be stored as such, so converting an edge set with
duplicates raises a :class:`ValueError` unless ``duplicates="first"`` (keep the first occurrence,
:meth:`EdgeSet.coalesce`'s rule) or ``duplicates="sum"`` (add the values) is asked for. Entries are
sorted by target, then source (the order of :meth:`EdgeSet.coalesce`), so a round trip gives back
the coalesced edge set. The batch is in neither form: a batched graph's matrix is block-diagonal, and
the layer receives the same ``batch`` either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet, ExplicitOnlyError, first_occurrences, ptr_from_counts
from graphattn.core.origins import origin_name

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from graphattn.tracing import TraceRecord

#: per-edge fields a matrix value can come from / go to
VALUE_FIELDS = ("weight", "bias", "edge_attr", "origin")
DUPLICATES = ("error", "first", "sum")
LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


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
def _num_nodes(es: EdgeSet, num_nodes: int | None) -> int:
    """The real node count ``N`` (matrix rows); inferred only without virtual sources."""
    if num_nodes is None:
        if es.num_virtual:
            raise ValueError("'num_nodes' is needed for an edge set with virtual sources (the "
                             "real node count N: sources >= N are virtual)")
        return int(es.edge_index.max()) + 1 if es.num_edges else 0
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"'num_nodes' must be None or a non-negative int, got {num_nodes!r}")
    return num_nodes


def _values(es: EdgeSet, value: str | Tensor | None) -> Tensor | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value not in VALUE_FIELDS:
            raise ValueError(f"'value' must be None, a tensor or one of {VALUE_FIELDS}, got {value!r}")
        return getattr(es, value)
    if isinstance(value, Tensor):
        if value.dim() not in (1, 2) or value.size(0) != es.num_edges:
            raise ValueError(f"'value' must be a tensor [E] or [E, D] with E={es.num_edges} rows "
                             f"(one per edge), got shape {list(value.shape)}")
        return value
    raise ValueError(f"'value' must be None, a tensor or one of {VALUE_FIELDS}, "
                     f"got {type(value).__name__}")


def _matrix_entries(es: EdgeSet, value: str | Tensor | None, num_nodes: int | None,
                    duplicates: str) -> tuple[Tensor, Tensor, Tensor | None, tuple[int, int]]:
    """``(row, col, values, (N, N + V))``: entries sorted by (target, source), duplicates
    resolved by ``duplicates``."""
    if not isinstance(es, EdgeSet):
        raise ValueError(f"'es' must be an EdgeSet, got {type(es).__name__}")
    if es.structure != "explicit":
        raise ExplicitOnlyError(f"{type(es).__name__} to a sparse matrix needs enumerated edges, "
                                f"which a structured edge set does not hold; call "
                                f".to_explicit() first to materialise them on purpose")
    if es.per_head:
        raise ValueError("a sparse matrix holds head-shared edges; for per-head edges (head "
                         "given) convert one head at a time: es.select(es.head == h)"
                         ".replace(head=None)")
    if duplicates not in DUPLICATES:
        raise ValueError(f"'duplicates' must be one of {DUPLICATES}, got {duplicates!r}")
    N = _num_nodes(es, num_nodes)
    size = (N, N + es.num_virtual)
    vals = _values(es, value)
    src, dst = es.edge_index
    if es.num_edges and (int(dst.max()) >= N or int(src.max()) >= size[1]
                         or int(es.edge_index.min()) < 0):
        raise ValueError(f"'edge_index' holds an index out of range for num_nodes={N} and "
                         f"{es.num_virtual} virtual source(s)")
    row, col, vals = _sorted_entries(dst, src, vals, size, duplicates, "the edge set")
    return row, col, vals, size


def _sorted_entries(row: Tensor, col: Tensor, vals: Tensor | None, size: tuple[int, int],
                    duplicates: str, what: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """Entries sorted by (row, col); duplicates refused, first kept, or summed."""
    key = row * max(size[1], 1) + col
    first = first_occurrences(key)  # sorted by key
    if first.numel() == key.numel():
        order = first
    elif duplicates == "error":
        raise ValueError(f"{what} holds {key.numel() - first.numel()} duplicate (target, source) "
                         f"pair(s), which a sparse matrix cannot keep apart: coalesce first, or "
                         f"pass duplicates='first' (keep the first) or duplicates='sum'")
    elif duplicates == "first":
        order = first
    else:  # sum: add every copy's value into its first occurrence
        if vals is not None:
            if not (vals.is_floating_point() or vals.is_complex()):
                raise ValueError(f"duplicates='sum' needs floating-point values, got {vals.dtype}")
            inverse = torch.searchsorted(key[first], key)
            summed = vals.new_zeros((first.numel(), *vals.shape[1:])).index_add_(0, inverse, vals)
            return row[first], col[first], summed
        order = first
    return row[order], col[order], None if vals is None else vals[order]


def to_sparse_tensor(es: EdgeSet, value: str | Tensor | None = "weight", *,
                     num_nodes: int | None = None, duplicates: str = "error") -> Any:
    r"""The edge set as a :class:`torch_sparse.SparseTensor` ``adj_t`` (row = target, column =
    source, sizes ``(N, N + V)``); see the module doc.

    Args:
        value: the entries' values: a per-edge field (``"weight"``, ``"bias"``, ``"edge_attr"``,
            ``"origin"``; a field the edge set lacks gives a matrix without values), an ``[E]`` /
            ``[E, D]`` tensor in edge order (e.g. the ``alpha`` of ``return_attention_weights``), or
            ``None``.
        num_nodes: the real node count ``N`` (default: largest index + 1; required with virtual
            sources).
        duplicates: ``"error"``, ``"first"`` or ``"sum"`` (see the module doc).
    """
    try:
        from torch_sparse import SparseTensor
    except ImportError as e:  # pragma: no cover - torch_sparse is optional
        raise ImportError("EdgeSet.to_sparse_tensor needs the 'torch_sparse' package "
                          "(pip install torch-sparse); to_torch_sparse() needs only torch") from e
    row, col, vals, size = _matrix_entries(es, value, num_nodes, duplicates)
    return SparseTensor(row=row, col=col, value=vals, sparse_sizes=size, is_sorted=True,
                        trust_data=True)


def to_torch_sparse(es: EdgeSet, layout: torch.layout = torch.sparse_csr,
                    value: str | Tensor | None = "weight", *, num_nodes: int | None = None,
                    duplicates: str = "error") -> Tensor:
    r"""The edge set as a plain torch sparse tensor ``[N, N + V]`` (row = target, column = source)
    of ``layout`` ``torch.sparse_csr`` or ``torch.sparse_coo`` (coalesced); ``value``,
    ``num_nodes`` and ``duplicates`` as in :func:`to_sparse_tensor`. Torch stores a value for every
    entry: without values (``value=None`` or a missing field) the entries are ones of the default
    dtype. ``[E, D]`` values give a hybrid tensor ``[N, N + V, D]``."""
    if layout not in LAYOUTS:
        raise ValueError(f"'layout' must be torch.sparse_csr or torch.sparse_coo, got {layout!r}")
    row, col, vals, size = _matrix_entries(es, value, num_nodes, duplicates)
    if vals is None:
        vals = torch.ones(row.numel(), device=row.device)
    shape = (*size, *vals.shape[1:])
    if layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(torch.stack([row, col]), vals, shape, is_coalesced=True,
                                       check_invariants=False)
    crow = ptr_from_counts(torch.bincount(row, minlength=size[0]))
    return torch.sparse_csr_tensor(crow, col, vals, shape, check_invariants=False)


def _edge_set_from_entries(row: Tensor, col: Tensor, vals: Tensor | None, size: tuple[int, int],
                           value_as: str | None, duplicates: str, what: str,
                           fields: dict[str, Any]) -> EdgeSet:
    if value_as is not None and value_as not in VALUE_FIELDS:
        raise ValueError(f"'value_as' must be None or one of {VALUE_FIELDS}, got {value_as!r}")
    if duplicates not in DUPLICATES:
        raise ValueError(f"'duplicates' must be one of {DUPLICATES}, got {duplicates!r}")
    if "head" in fields or "edge_index" in fields:
        raise ValueError("'head' and 'edge_index' come from the matrix; pass other EdgeSet fields")
    if value_as is not None and value_as in fields:
        raise ValueError(f"'{value_as}' is given twice: as value_as and as a keyword")
    num_virtual = 0 if fields.get("virtual_x") is None else int(fields["virtual_x"].size(0))
    if size[1] > size[0] + num_virtual:
        raise ValueError(f"{what} has {size[1]} columns (sources) but {size[0]} rows (targets): "
                         f"columns >= {size[0]} are virtual sources, so pass virtual_x with "
                         f"{size[1] - size[0]} rows")
    row, col, vals = _sorted_entries(row, col, vals if value_as is not None else None, size,
                                     duplicates, what)
    if value_as is not None and vals is not None:
        if value_as == "origin":
            vals = vals.long()
        elif value_as == "edge_attr" and vals.dim() == 1:
            vals = vals[:, None]
        fields[value_as] = vals
    return EdgeSet(torch.stack([col, row]), **fields)


def from_sparse_tensor(adj_t: Any, *, value_as: str | None = "weight", duplicates: str = "error",
                       **fields: Any) -> EdgeSet:
    r"""An explicit :class:`~graphattn.EdgeSet` from a :class:`torch_sparse.SparseTensor` ``adj_t``
    (row = target, column = source; columns past the row count are virtual sources, whose
    ``virtual_x`` must be given). Edges come sorted by (target, source).

    Args:
        adj_t: the matrix.
        value_as: the field receiving the stored values (``"weight"``, ``"bias"``,
            ``"edge_attr"``, ``"origin"``), or ``None`` to drop them.
        duplicates: for a matrix with repeated entries: ``"error"``, ``"first"`` or ``"sum"``.
        **fields: other :class:`~graphattn.EdgeSet` arguments (``num_heads``, ``mode``,
            ``virtual_x``, ...).
    """
    try:
        from torch_sparse import SparseTensor
    except ImportError as e:  # pragma: no cover - torch_sparse is optional
        raise ImportError("EdgeSet.from_sparse_tensor needs the 'torch_sparse' package "
                          "(pip install torch-sparse)") from e
    if not isinstance(adj_t, SparseTensor):
        raise ValueError(f"'adj_t' must be a torch_sparse.SparseTensor, got {type(adj_t).__name__}")
    row, col, vals = adj_t.coo()
    size = (int(adj_t.sparse_size(0)), int(adj_t.sparse_size(1)))
    return _edge_set_from_entries(row, col, vals, size, value_as, duplicates, "'adj_t'",
                                  dict(fields))


def from_torch_sparse(t: Tensor, *, value_as: str | None = "weight", duplicates: str = "error",
                      **fields: Any) -> EdgeSet:
    r"""An explicit :class:`~graphattn.EdgeSet` from a torch sparse tensor ``t`` ``[N, S]`` or
    hybrid ``[N, S, D]`` (COO, coalesced or not, CSR or CSC; row = target, column = source).
    ``value_as``, ``duplicates`` and ``**fields`` as in :func:`from_sparse_tensor`; duplicate
    entries of an uncoalesced COO tensor are seen as duplicates (not summed by torch first)."""
    if not isinstance(t, Tensor) or t.layout not in (torch.sparse_coo, torch.sparse_csr,
                                                     torch.sparse_csc):
        got = t.layout if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"'t' must be a torch sparse tensor (COO, CSR or CSC), got {got}")
    if t.sparse_dim() != 2:
        raise ValueError(f"'t' must have 2 sparse dimensions (targets × sources), got "
                         f"{t.sparse_dim()}")
    if t.layout == torch.sparse_coo:
        (row, col), vals = t._indices(), t._values()
    elif t.layout == torch.sparse_csr:
        crow, col, vals = t.crow_indices(), t.col_indices(), t.values()
        row = torch.repeat_interleave(torch.arange(t.size(0), device=t.device), crow.diff())
    else:
        ccol, row, vals = t.ccol_indices(), t.row_indices(), t.values()
        col = torch.repeat_interleave(torch.arange(t.size(1), device=t.device), ccol.diff())
    size = (int(t.size(0)), int(t.size(1)))
    return _edge_set_from_entries(row.long(), col.long(), vals, size, value_as, duplicates, "'t'",
                                  dict(fields))


def is_sparse_matrix(edges: Any) -> bool:
    """Whether ``edges`` is a torch sparse tensor or a :class:`torch_sparse.SparseTensor`
    (checked without importing torch_sparse)."""
    if isinstance(edges, Tensor):
        return edges.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)
    return type(edges).__name__ == "SparseTensor" and type(edges).__module__.startswith("torch_sparse")


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
    if not isinstance(es, EdgeSet):
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
