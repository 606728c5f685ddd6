"""The layer's inputs: its positional arguments in TransformerConv's order
(:func:`forward_arguments`), a graph's tensors checked in one device-to-host transfer
(:func:`check_graph_inputs`, :func:`check_bipartite_indices`) and whatever a user passes as edges
turned into an edge set (:func:`as_edge_set`)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from graphattn.core.checks import all_finite
from graphattn.core.edgeset import BaseEdgeSet, EdgeSet
from graphattn.core.index import need_long, need_tensor, shape_str
from graphattn.core.sparse import from_sparse_tensor, from_torch_sparse, is_sparse_matrix


def check_graph_inputs(
    edge_index: Tensor | None,
    num_nodes: int,
    batch: Tensor | None = None,
    *,
    finite: Mapping[str, Tensor | None] | None = None,
    num_graphs: int | None = None,
) -> None:
    """Checks a graph's inputs with one device-to-host transfer (:meth:`EdgeSet.validate`'s):
    ``edge_index`` (``[2, E]`` long, indices in ``[0, num_nodes)``, no edge joining two graphs of
    ``batch``), ``batch`` (graph ids non-negative and, given ``num_graphs``, below it) and every
    floating-point tensor of ``finite`` (name → tensor) free of NaN/inf. Raises a
    :class:`ValueError` naming the argument. ``edge_index=None``: no edges to check."""
    if batch is not None:
        need_long("batch", need_tensor("batch", batch, dims=1))
        if batch.numel() != num_nodes:
            raise ValueError(f"'batch' must have shape [{num_nodes}] (one graph id per node), "
                             f"got {shape_str(batch)}")
    checks = [(all_finite(t), f"'{name}' contains NaN or infinite values")
              for name, t in (finite or {}).items()
              if isinstance(t, Tensor) and t.numel() and (t.is_floating_point() or t.is_complex())]
    if edge_index is None:  # on the device of what is checked (the flags are read together)
        device = batch.device if batch is not None else (checks[0][0].device if checks else None)
        edge_index = torch.empty(2, 0, dtype=torch.long, device=device)
    es = EdgeSet(edge_index)
    if num_graphs is not None and batch is not None and batch.numel():
        checks.append((batch.max() < num_graphs,
                       f"'batch' holds a graph id >= num_graphs={num_graphs}"))
    es._validate_indices(num_nodes, batch, checks)


def as_edge_set(edges: BaseEdgeSet | Tensor | Any, *, num_heads: int, mode: str = "attention",
                edge_attr: Tensor | None = None) -> BaseEdgeSet:
    """Accepts an EdgeSet, a plain ``edge_index`` tensor (an explicit attention edge set), or a
    sparse ``adj_t`` matrix (a :class:`torch_sparse.SparseTensor` or a torch sparse tensor; row =
    target, column = source, values → ``weight``, edges sorted by (target, source), duplicate
    entries refused: :func:`~graphattn.interop.from_sparse_tensor`,
    :func:`~graphattn.interop.from_torch_sparse`)."""
    if isinstance(edges, BaseEdgeSet):
        if edge_attr is not None:
            if edges.structure != "explicit":
                raise ValueError("'edge_attr' can only be given with explicit edges")
            edges = edges.replace(edge_attr=edge_attr)
        return edges
    if isinstance(edges, Tensor) and edges.layout == torch.strided:
        return EdgeSet(edges, num_heads=num_heads, mode=mode, edge_attr=edge_attr)
    if is_sparse_matrix(edges):
        if edge_attr is not None:
            raise ValueError("'edge_attr' cannot be given with a sparse adjacency matrix (its rows "
                             "could not be matched to the matrix entries): store the features as "
                             "the matrix values, graphattn.interop.from_sparse_tensor(adj_t, "
                             "value_as='edge_attr')")
        convert = from_torch_sparse if isinstance(edges, Tensor) else from_sparse_tensor
        return convert(edges, num_heads=num_heads, mode=mode)
    raise ValueError(
        f"'edges' must be an EdgeSet, an edge_index tensor [2, E], a sparse adj_t matrix or an "
        f"EdgeProducer, got {type(edges).__name__}"
    )


def is_batch_vector(value: Any) -> bool:
    """An integer vector: a graph id per node (``batch``), never edge features."""
    return isinstance(value, Tensor) and value.dim() == 1 and not value.is_floating_point() \
        and not value.is_complex()


def forward_arguments(args: tuple[Any, ...], **given: Any) -> tuple[Any, Any, Tensor | None]:
    """``(edge_attr, return_attention_weights, batch)`` from the positional arguments after
    ``edges`` and the keywords ``given``: the current order ``(edge_attr,
    return_attention_weights)``, or the earlier ``(batch, edge_attr, return_attention_weights)``
    (recognised by an integer vector, ``None`` before a tensor, or any vector beside a keyword
    ``edge_attr``, in third place; a :class:`FutureWarning`)."""
    if args and (is_batch_vector(args[0]) or (
            args[0] is None and len(args) > 1 and isinstance(args[1], Tensor)) or (
            # a vector in third place beside a keyword edge_attr: the earlier order's batch
            given["edge_attr"] is not None and isinstance(args[0], Tensor) and args[0].dim() == 1)):
        names: tuple[str, ...] = ("batch", "edge_attr", "return_attention_weights")
        warnings.warn("EdgeAttention.forward(x, edges, batch, edge_attr) is the earlier order; "
                      "the third positional argument is now 'edge_attr' (as in TransformerConv / "
                      "GATConv): pass batch=... by keyword", FutureWarning, stacklevel=5)
    else:
        names = ("edge_attr", "return_attention_weights")
    if len(args) > len(names):
        raise TypeError(f"EdgeAttention.forward takes at most 4 positional arguments (x, edges, "
                        f"edge_attr, return_attention_weights), got {2 + len(args)}")
    for name, value in zip(names, args, strict=False):
        if given[name] is not None:
            raise TypeError(f"EdgeAttention.forward got '{name}' twice: positionally and by "
                            f"keyword")
        given[name] = value
    return given["edge_attr"], given["return_attention_weights"], given["batch"]


def check_bipartite_indices(es: EdgeSet, num_sources: int, num_targets: int) -> None:
    """Sources of a bipartite edge set in ``[0, num_sources)``, targets in ``[0, num_targets)``
    (one host read); no virtual sources."""
    if es.virtual_x is not None:
        raise ValueError("bipartite input takes no virtual sources ('virtual_x')")
    ei = es.edge_index
    if not ei.numel():
        return
    head = es.head if es.head is not None else ei.new_zeros(1)
    lo_s, hi_s, lo_t, hi_t, lo_h, hi_h = torch.stack([ei[0].min(), ei[0].max(), ei[1].min(),
                                                      ei[1].max(), head.min(), head.max()]).tolist()
    if lo_h < 0 or hi_h >= es.num_heads:
        raise ValueError(f"'head' must lie in [0, {es.num_heads}), got [{lo_h}, {hi_h}]")
    if lo_s < 0 or hi_s >= num_sources:
        raise ValueError(f"'edge_index' sources must lie in [0, {num_sources}) (rows of x_src), "
                         f"got [{lo_s}, {hi_s}]")
    if lo_t < 0 or hi_t >= num_targets:
        raise ValueError(f"'edge_index' targets must lie in [0, {num_targets}) (rows of x_dst), "
                         f"got [{lo_t}, {hi_t}]")
