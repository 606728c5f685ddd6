r"""Edge sets as sparse matrices and back.

:func:`to_sparse_tensor`, :func:`from_sparse_tensor`, :func:`to_torch_sparse`,
:func:`from_torch_sparse`). The
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

from typing import Any

import torch
from torch import Tensor

from graphattn.core.edgeset import BaseEdgeSet, EdgeSet, ExplicitOnlyError
from graphattn.core.index import first_occurrences, ptr_from_counts

#: per-edge fields a matrix value can come from / go to
VALUE_FIELDS = ("weight", "bias", "edge_attr", "origin")
DUPLICATES = ("error", "first", "sum")
LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


def num_real_nodes(es: EdgeSet, num_nodes: int | None) -> int:
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
    if not isinstance(es, BaseEdgeSet):
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
    N = num_real_nodes(es, num_nodes)
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
        raise ImportError("to_sparse_tensor needs the 'torch_sparse' package "
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
        raise ImportError("from_sparse_tensor needs the 'torch_sparse' package "
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
