r"""SAC's candidate sets (:mod:`graphattn.producers.sac`): which destinations an origin may choose
(:func:`candidate_rows`, :func:`candidate_counts`: the patterns ``all``, ``causal``, ``window``,
``segment`` and ``hops``), the input graph's hop distances they and the distance encoding read
(:func:`hop_distances`, cached), and the origins of the all-nodes-connected variant
(:func:`origin_schedule`).

Local node ids are ``0 .. n_b - 1`` of the padded per-graph layout ``[B, W, ·]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.producers.base import ProducerContext
from graphattn.producers.sac.config import SACOptions
from graphattn.producers.sac.distances import HopCache, HopDistances


def hop_distances(ctx: ProducerContext, ptr: Tensor, cache: HopCache, max_distance: int) -> HopDistances:
    """The hop distances of the input graph ``ctx.data.edge_index`` (validated; none: no edges),
    from ``cache`` while the graph is unchanged."""
    ei = getattr(ctx.data, "edge_index", None) if ctx.data is not None else None
    if ei is None:
        ei = torch.empty(2, 0, dtype=torch.long, device=ctx.device)
    else:
        EdgeSet(ei, num_heads=1).validate(ctx.num_nodes, ctx.batch)
    return cache.distances(ei, ctx.num_nodes, ptr, max_distance)


def candidate_rows(opt: SACOptions, o: Tensor, W: int, hop_rows: Tensor | None) -> Tensor | None:
    """``[B, R, W]`` candidate destinations of the origins ``o [B, R]`` (``None``: all); ``hop_rows``
    = their hop buckets (``candidates="hops"`` only)."""
    j = torch.arange(W, device=o.device)
    kind, w = opt.candidates, opt.window
    if kind == "all":
        return None
    if kind == "causal":
        return j <= o[..., None]
    if kind == "window":
        return (j - o[..., None]).abs() <= w
    if kind == "segment":
        return torch.div(j, w, rounding_mode="floor") == torch.div(o, w, rounding_mode="floor")[..., None]
    assert hop_rows is not None
    return hop_rows.long() <= opt.max_distance


def candidate_counts(opt: SACOptions, n: Tensor, W: int, table: Tensor | None) -> Tensor:
    """``[B, W]`` number of candidate destinations of every origin (0 for padding); ``table`` = the
    ``[B, W, W]`` hop buckets (``candidates="hops"`` only)."""
    o = torch.arange(W, device=n.device)[None]
    nn_ = n[:, None]
    kind, w = opt.candidates, opt.window
    if kind == "all":
        c = nn_.expand(-1, W)
    elif kind == "causal":
        c = o + 1
    elif kind == "window":
        c = torch.minimum(o + w, nn_ - 1) - (o - w).clamp(min=0) + 1
    elif kind == "segment":
        s = torch.div(o, w, rounding_mode="floor") * w
        c = torch.minimum(s + w, nn_) - s
    else:
        assert table is not None
        real = torch.arange(W, device=n.device)[None, None] < nn_[..., None]
        c = ((table.long() <= opt.max_distance) & real).sum(-1)
    return torch.where(o < nn_, c, 0)


def origin_schedule(a: Tensor, W: int) -> Tensor:
    """``[B, S]`` forced origins: node ``i`` of graph ``b`` repeated ``a[b, i]`` times, in node order."""
    B = a.size(0)
    S = int(a.sum(-1).max()) if B and a.numel() else 0
    out = torch.zeros(B, max(S, 1), dtype=torch.long, device=a.device)
    if S == 0:
        return out
    flat = a.reshape(-1)
    node = torch.arange(B * W, device=a.device).repeat_interleave(flat)
    g, i = node // W, node % W
    counts = a.sum(-1)
    pos = torch.arange(node.numel(), device=a.device) - (counts.cumsum(0) - counts)[g]
    out[g, pos] = i
    return out
