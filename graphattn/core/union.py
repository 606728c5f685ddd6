"""The union of edge sets: one explicit edge set keeping each edge's ``origin``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from graphattn.core.edgeset import BaseEdgeSet, EdgeSet
from graphattn.core.index import derived_edge_sets
from graphattn.core.origins import origin_code
from graphattn.memory import check_edges


def featured_rows(es: EdgeSet) -> Tensor | None:
    """The rows of ``es.edge_attr`` that may be non-zero, as a long index, when the edge set knows
    that the others are zeros filled in by :func:`union_edge_sets` (``None`` when it does not:
    every row counts). Reads a count on the host."""
    marks = getattr(es, "_featured", None)
    if es.edge_attr is None or marks is None:
        return None
    return marks.nonzero().view(-1)


@derived_edge_sets
def union_edge_sets(
    edge_sets: Sequence[BaseEdgeSet], num_nodes: int, *, coalesce: bool = False
) -> EdgeSet:
    """Union of edge sets as one explicit edge set, keeping each edge's ``origin``.

    All parts must share ``mode`` and ``num_heads``. Head-shared parts are expanded to per-head
    edges if any part is per-head. Missing ``bias`` / ``weight`` / ``edge_attr`` are filled with
    0 / 1 / 0, missing ``origin`` with ``"unknown"``. Virtual sources are concatenated and the source
    ids of later parts shifted accordingly. ``aux_loss`` values are summed and ``log_prob`` entries
    concatenated. With ``coalesce=True`` duplicate edges are dropped, the first part winning. The
    total edge count is checked against the memory budget (:mod:`graphattn.memory`) first.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        # a wrong count would shift real sources as if they were virtual (sources >= num_nodes)
        raise ValueError(f"'num_nodes' must be a non-negative int, got {num_nodes!r}")
    if isinstance(edge_sets, (BaseEdgeSet, Tensor)) or not isinstance(edge_sets, Sequence) or any(
            not isinstance(e, BaseEdgeSet) for e in edge_sets):
        raise ValueError(f"'edge_sets' must be a sequence of EdgeSets, got {edge_sets!r:.80}")
    parts = [e.to_explicit() for e in edge_sets]
    if not parts:
        raise ValueError("'edge_sets' must contain at least one EdgeSet")
    modes = {p.mode for p in parts}
    heads = {p.num_heads for p in parts}
    if len(modes) > 1:
        raise ValueError(f"cannot unite edge sets of different modes {sorted(modes)}")
    if len(heads) > 1:
        raise ValueError(f"cannot unite edge sets with different num_heads {sorted(heads)}")
    H = heads.pop()
    expand = any(p.per_head for p in parts) and H > 1
    # memory guard: the concatenated edges (head-shared parts expanded to every head)
    check_edges(sum(p.num_edges * (H if expand and not p.per_head else 1) for p in parts),
                what=f"the union of {len(parts)} edge sets", how_to_lower="use fewer or sparser parts",
                device=parts[0].device)
    if expand:
        parts = [p.expand_heads() for p in parts]
    per_head = parts[0].per_head
    dev = parts[0].device

    edge_attr_dims = {p.edge_attr.size(1) for p in parts if p.edge_attr is not None}
    if len(edge_attr_dims) > 1:
        raise ValueError(f"cannot unite edge sets with edge_attr widths {sorted(edge_attr_dims)}")
    want_2d = any(t is not None and t.dim() == 2 for p in parts for t in (p.bias, p.weight))

    def fill(p: EdgeSet, t: Tensor | None, value: float, ref: Tensor | None) -> Tensor:
        shape = (p.num_edges, H) if want_2d else (p.num_edges,)
        if t is None:
            dtype = ref.dtype if ref is not None else torch.get_default_dtype()
            return torch.full(shape, value, dtype=dtype, device=dev)
        if want_2d and t.dim() == 1:
            return t[:, None].expand(shape)
        return t

    def first(name: str) -> Tensor | None:
        return next((getattr(p, name) for p in parts if getattr(p, name) is not None), None)

    ref_bias, ref_weight, ref_attr = first("bias"), first("weight"), first("edge_attr")
    edge_index, vx, vb, offset = [], [], [], 0
    for p in parts:
        ei = p.edge_index
        if offset:  # shift this part's virtual sources past the earlier parts' (no host sync)
            src = ei[0]
            ei = torch.stack([torch.where(src >= num_nodes, src + offset, src), ei[1]])
        edge_index.append(ei)
        if p.virtual_x is not None:
            vx.append(p.virtual_x)
            vb.append(
                p.virtual_batch
                if p.virtual_batch is not None
                else torch.full((p.num_virtual,), -1, dtype=torch.long, device=dev)
            )
            offset += p.num_virtual
    if len({v.size(1) for v in vx}) > 1:
        raise ValueError("cannot unite edge sets whose virtual_x have different widths")
    aux = [p.aux_loss for p in parts if p.aux_loss is not None]
    lp = [p for p in parts if p.log_prob is not None]
    stats: dict[str, Any] = {}
    for i, p in enumerate(parts):
        for k, v in p.stats.items():
            stats[f"part{i}.{k}" if len(parts) > 1 else k] = v
    out = EdgeSet(
        torch.cat(edge_index, 1),
        head=torch.cat([p.head for p in parts]) if per_head else None,
        num_heads=H,
        mode=parts[0].mode,
        bias=None if ref_bias is None else torch.cat([fill(p, p.bias, 0.0, ref_bias) for p in parts]),
        weight=None
        if ref_weight is None
        else torch.cat([fill(p, p.weight, 1.0, ref_weight) for p in parts]),
        virtual_x=torch.cat(vx) if vx else None,
        virtual_batch=torch.cat(vb) if vb else None,
        origin=torch.cat(
            [
                p.origin
                if p.origin is not None
                else torch.full((p.num_edges,), origin_code("unknown"), dtype=torch.long, device=dev)
                for p in parts
            ]
        ),
        edge_attr=None
        if ref_attr is None
        else torch.cat(
            [
                p.edge_attr
                if p.edge_attr is not None
                else ref_attr.new_zeros(p.num_edges, ref_attr.size(1))
                for p in parts
            ]
        ),
        log_prob=torch.cat([p.log_prob for p in lp]) if lp else None,
        log_prob_graph=torch.cat([p.log_prob_graph for p in lp]) if lp else None,
        aux_loss=torch.stack([a.reshape(()) for a in aux]).sum() if aux else None,
        stats=stats,
    )
    if ref_attr is not None and any(p.edge_attr is None or p._featured is not None for p in parts):
        out._featured = torch.cat([
            p._featured if p.edge_attr is not None and p._featured is not None
            else torch.full((p.num_edges,), p.edge_attr is not None, dtype=torch.bool, device=dev)
            for p in parts
        ])
    return out.coalesce() if coalesce else out
