r"""SAC's output (:mod:`graphattn.producers.sac`): the attention edge set of the predicted edges
(:func:`assemble` → :class:`SampledEdgeSet`: mirroring, unions, coalescing, the entropy bonus and the
statistics), the warm-start stage (:func:`warm_start_edges`) and the memory guard
(:func:`check_memory`).

Edges leave here with global ids (the run paths' :class:`~graphattn.producers.sac.layout.Decoded` holds
local ones).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.core.union import union_edge_sets
from graphattn.memory import EDGE_BYTES, check_edges
from graphattn.producers.base import ProducerContext
from graphattn.producers.input import InputEdges
from graphattn.producers.sac.config import SACOptions
from graphattn.producers.sac.layout import Decoded, SACLayout


class SampledEdgeSet(EdgeSet):
    """An explicit attention :class:`~graphattn.EdgeSet` plus the sampled actions behind it.

    Extra attributes: ``sampled_edge_index [2, A]`` and ``sampled_head [A]`` (or ``None``): one
    column per predicted edge, before mirroring, coalescing and unions, in the order that
    ``log_prob [A]`` / ``log_prob_graph [A]`` follow (graph by graph, in decoding order).
    """

    sampled_edge_index: Tensor
    sampled_head: Tensor | None


def input_edges(ctx: ProducerContext, *, self_loops: bool) -> EdgeSet:
    """The input graph's edges (plus a self-loop for every node without one): the ``input``
    producer, without edge features (predicted edges have none)."""
    return InputEdges(self_loops=self_loops, edge_attr=None).produce(ctx)


def warm_start_edges(ctx: ProducerContext) -> EdgeSet:
    """The warm-start stage: the input edges plus a self-loop per node (GAT-style)."""
    if ctx.data is None or getattr(ctx.data, "edge_index", None) is None:
        raise ValueError("warm_start needs the input edges data.edge_index")
    es = input_edges(ctx, self_loops=True)
    es.stats["warm_start"] = 1
    return es


def check_memory(ctx: ProducerContext, opt: SACOptions) -> None:
    r"""The memory guard (:mod:`graphattn.memory`), on a bound from the sizes: per head segment
    at most :math:`\alpha N + B` predicted edges (rounding, at least one per graph), twice with
    ``undirected``, plus the self-loops and input edges. Each predicted edge also keeps its
    actions and log-probabilities, hence twice the bytes of a plain edge."""
    N, B = ctx.num_nodes, ctx.num_graphs
    segments = opt.segments
    predicted = (opt.alpha * N + B) * segments
    edges = predicted * (2 if opt.undirected else 1) + (N if opt.self_loops else 0)
    if opt.union_input and ctx.data is not None and getattr(ctx.data, "edge_index", None) is not None:
        edges += int(ctx.data.edge_index.size(1))
    check_edges(edges, bytes_per_edge=2 * EDGE_BYTES,
                what=f"SAC(alpha={opt.alpha:g}) on {N:,} nodes", how_to_lower="lower alpha",
                device=ctx.device)


def assemble(ctx: ProducerContext, lay: SACLayout, opt: SACOptions, dec: Decoded) -> SampledEdgeSet:
    """The attention edges of the used slots of ``dec`` (global ids; mirrored with ``undirected``,
    united with the input edges / self-loops, coalesced), carrying one ``log_prob`` per predicted
    edge, the entropy bonus as ``aux_loss`` and the statistics."""
    ptr, B = lay.ptr, lay.num_graphs
    o, active, ent, hop = dec.origin, dec.active, dec.entropy, dec.hop
    g = torch.arange(B, device=ctx.device)[:, None].expand_as(o)
    g, o, d, m, lp = g[active], o[active], dec.dest[active], dec.head[active], dec.log_prob[active]
    src, dst = ptr[g] + d, ptr[g] + o
    sampled = torch.stack([src, dst])
    head = m if opt.head_adaptive else None
    ei, eh = sampled, head
    if opt.undirected:
        ei = torch.cat([sampled, sampled.flip(0)], 1)
        eh = None if head is None else torch.cat([head, head])
    code = origin_code("sampled")
    parts = [EdgeSet(ei, head=eh, num_heads=ctx.num_heads,
                     origin=torch.full((ei.size(1),), code, dtype=torch.long, device=ctx.device))]
    with_input = (opt.union_input and ctx.data is not None
                  and getattr(ctx.data, "edge_index", None) is not None)
    if with_input:
        parts.append(input_edges(ctx, self_loops=opt.self_loops))
    elif opt.self_loops:
        loop = torch.arange(ctx.num_nodes, device=ctx.device)
        parts.append(EdgeSet(torch.stack([loop, loop]), num_heads=ctx.num_heads, origin=torch.full(
            (ctx.num_nodes,), origin_code("self_loop"), dtype=torch.long, device=ctx.device)))
    es = parts[0] if len(parts) == 1 else union_edge_sets(parts, ctx.num_nodes)
    if opt.coalesce:
        es = es.coalesce()
    aux = None
    if ent is not None and opt.entropy_weight > 0:
        ent_mean = ent.sum() / max(int(active.sum()), 1)
        aux = -opt.entropy_weight * ent_mean
    A = lp.numel()
    stats: dict[str, Any] = {
        "edges_per_node": es.num_edges / max(ctx.num_nodes, 1),
        "predicted_edges": A,
        "unique_fraction": _unique_pairs(sampled, head, ctx.num_nodes) / max(A, 1),
        "self_fraction": float((src == dst).float().mean()) if A else 0.0,
        "neg_log_prob_per_edge": float(-lp.detach().mean()) if A else 0.0,
    }
    if hop is not None:
        h = hop[active]
        stats["input_edge_fraction"] = float((h == 1).float().mean()) if A else 0.0
        stats["unreachable_fraction"] = float((h == opt.max_distance + 2).float().mean()) if A else 0.0
    out = SampledEdgeSet(es.edge_index, head=es.head, num_heads=ctx.num_heads, origin=es.origin,
                         log_prob=lp, log_prob_graph=g, aux_loss=aux, stats=stats)
    out.sampled_edge_index = sampled
    out.sampled_head = head
    return out


def _unique_pairs(edges: Tensor, head: Tensor | None, N: int) -> int:
    key = edges[0] * max(N, 1) + edges[1]
    if head is not None:
        key = key * (int(head.max()) + 1 if head.numel() else 1) + head
    return int(torch.unique(key).numel())
