r"""SAC's teacher forcing (:mod:`graphattn.producers.sac`): the run paths' actions that replay
sampled edges (:func:`forced_actions`) and the teacher-forced EdgeSet's ``log_prob`` back in the order
of the sampled edges (:func:`forced_log_prob`).
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

import torch
from torch import Tensor

from graphattn.producers.base import ProducerContext
from graphattn.producers.sac.assembly import SampledEdgeSet
from graphattn.producers.sac.config import SACOptions

#: teacher-forced actions: ``(origin [B, T], dest [B, T])`` local ids for the LSTM, destinations
#: ``[segments, B, W, A]`` per (head segment, graph, origin, draw) for the parallel policy
Actions: TypeAlias = tuple[Tensor, Tensor] | Tensor


class ForcedActions(NamedTuple):
    """Teacher forcing of sampled edges: the run paths' ``actions`` and ``order``, the permutation
    that sorts the edges by graph (stable; the LSTM's ``log_prob`` follows it)."""

    actions: Actions
    order: Tensor


def forced_actions(ctx: ProducerContext, opt: SACOptions, sampled_edge_index: Tensor,
                   sampled_head: Tensor | None) -> ForcedActions:
    """The run paths' actions that replay ``sampled_edge_index [2, A]`` (graph by graph, in decoding
    order; ``sampled_head [A]`` for a head-adaptive parallel policy)."""
    ptr = ctx.ptr
    if sampled_edge_index.dim() != 2 or sampled_edge_index.size(0) != 2:
        raise ValueError(f"'sampled_edge_index' must be [2, A], got {list(sampled_edge_index.shape)}")
    src, dst = sampled_edge_index
    g = ctx.batch[dst]
    if bool((ctx.batch[src] != g).any()):
        raise ValueError("'sampled_edge_index' joins two graphs")
    B = ctx.num_graphs
    W = int(ptr.diff().max()) if B and ctx.num_nodes else 0
    o_loc, d_loc = dst - ptr[g], src - ptr[g]
    order = torch.argsort(g, stable=True)
    counts = torch.bincount(g, minlength=B)
    pos = torch.arange(g.numel(), device=g.device) - (counts.cumsum(0) - counts)[g[order]]
    if opt.policy == "lstm":
        T = int(counts.max()) if g.numel() else 0
        ao = torch.zeros(B, T, dtype=torch.long, device=g.device)
        ad = torch.zeros(B, T, dtype=torch.long, device=g.device)
        ao[g[order], pos] = o_loc[order]
        ad[g[order], pos] = d_loc[order]
        return ForcedActions((ao, ad), order)
    segments = opt.segments
    m = torch.zeros_like(g) if sampled_head is None else sampled_head
    key = (g * segments + m) * max(W, 1) + o_loc
    rank_order = torch.argsort(key, stable=True)
    k_sorted = key[rank_order]
    first = torch.ones_like(k_sorted, dtype=torch.bool)
    first[1:] = k_sorted[1:] != k_sorted[:-1]
    grp_start = torch.cummax(torch.where(first, torch.arange(k_sorted.numel(), device=g.device), 0),
                             0).values
    rank = torch.empty_like(key)
    rank[rank_order] = torch.arange(k_sorted.numel(), device=g.device) - grp_start
    A = int(opt.alpha)
    forced = torch.zeros(segments, B, W, A, dtype=torch.long, device=g.device)
    forced[m, g, o_loc, rank] = d_loc
    return ForcedActions(forced, order)


def forced_log_prob(es: SampledEdgeSet, forcing: ForcedActions, opt: SACOptions, num_nodes: int,
                    sampled_edge_index: Tensor, sampled_head: Tensor | None) -> Tensor:
    """The ``log_prob`` of the teacher-forced ``es`` in the order of ``sampled_edge_index`` (the
    EdgeSet's entries follow (graph, decoding order)); a ``ValueError`` if ``es`` predicted other
    edges (the sampled ones are not a sequence this predictor can emit)."""
    assert es.log_prob is not None
    src, dst = sampled_edge_index
    se = es.sampled_edge_index
    if se.shape != sampled_edge_index.shape or not torch.equal(
            torch.sort(se[0] * max(num_nodes, 1) + se[1]).values,
            torch.sort(src * max(num_nodes, 1) + dst).values):
        raise ValueError("'sampled_edge_index' is not a sequence this predictor can emit (wrong "
                         "budget, order or origins)")
    if opt.policy == "lstm":
        out = torch.empty_like(es.log_prob)
        out[forcing.order] = es.log_prob
        return out
    return _match_order(es, sampled_edge_index, sampled_head, num_nodes)


def _match_order(es: SampledEdgeSet, edges: Tensor, head: Tensor | None, N: int) -> Tensor:
    """``es.log_prob`` reordered to follow ``edges`` (same multiset of (edge, head, occurrence))."""
    assert es.log_prob is not None
    se = es.sampled_edge_index
    sh = es.sampled_head if es.sampled_head is not None else torch.zeros_like(se[0])
    h = head if head is not None else torch.zeros_like(edges[0])
    n = max(N, 1)
    ka, kb = _occurrence_key(se, sh, n), _occurrence_key(edges, h, n)
    ia, ib = torch.argsort(ka), torch.argsort(kb)
    out = torch.empty_like(es.log_prob)
    out[ib] = es.log_prob[ia]
    return out


def _occurrence_key(ei: Tensor, hh: Tensor, n: int) -> Tensor:
    """A key per edge of ``ei`` (head ``hh``, ``n`` nodes) that sorts by (head, target, source) and
    then by occurrence: the ``r``-th copy of an edge gets ``r``, so equal multisets sort alike."""
    key = (hh * n + ei[1]) * n + ei[0]
    order = torch.argsort(key, stable=True)
    ks = key[order]
    first = torch.ones_like(ks, dtype=torch.bool)
    first[1:] = ks[1:] != ks[:-1]
    start = torch.cummax(torch.where(first, torch.arange(ks.numel(), device=ks.device), 0), 0).values
    occ = torch.empty_like(key)
    occ[order] = torch.arange(ks.numel(), device=ks.device) - start
    return key * (ks.numel() + 1) + occ
