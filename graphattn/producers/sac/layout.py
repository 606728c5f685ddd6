r"""SAC's padded per-graph layout (:mod:`graphattn.producers.sac`): the node vectors of the
predictor per graph (:func:`layout`, :class:`SACLayout`) and the predicted edges per graph and edge slot
(:class:`Decoded`, what every run path of :mod:`~graphattn.producers.sac.paths` returns).

Local node ids are ``0 .. n_b - 1`` of the padded layout ``[B, W, ·]`` (``W`` = largest graph).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch_geometric.nn import Linear
from torch_geometric.utils import to_dense_batch

from graphattn.producers.base import ProducerContext
from graphattn.producers.sac.config import SACOptions


class SACLayout(NamedTuple):
    """The padded per-graph layout of a batch: ``emb [B, W, D]`` node vectors of the predictor
    (``W`` = largest graph), ``w [N, D]`` the same per node, ``n [B]`` nodes per graph, ``ptr [B + 1]``,
    ``num_graphs`` = ``B`` and ``width`` = ``W``."""

    emb: Tensor
    w: Tensor
    n: Tensor
    ptr: Tensor
    num_graphs: int
    width: int


class Decoded(NamedTuple):
    """The predicted edges per graph and edge slot (``[B, T]``, local ids): origin (the query) and
    destination, head segment, the edge's log-probability (0 in unused slots), whether the slot is
    used, the entropy of its choices (``None`` without the entropy bonus) and its input-graph hop
    bucket (``None`` when not computed; feeds the statistics only)."""

    origin: Tensor
    dest: Tensor
    head: Tensor
    log_prob: Tensor
    active: Tensor
    entropy: Tensor | None
    hop: Tensor | None

    @staticmethod
    def empty(num_graphs: int, device: torch.device, like: Tensor) -> Decoded:
        """No edge slot (``log_prob`` of ``like``'s dtype)."""
        z = torch.zeros(num_graphs, 0, dtype=torch.long, device=device)
        return Decoded(z, z, z, like.new_zeros(num_graphs, 0), z.bool(), None, None)


def layout(ctx: ProducerContext, node_proj: Linear, opt: SACOptions) -> SACLayout:
    """Padded node vectors and per-graph sizes: ``emb [B, W, D]``, ``n [B]``, ``ptr``."""
    if opt.head_adaptive and ctx.num_heads != opt.heads:
        raise ValueError(f"head_adaptive SAC was built for heads={opt.heads}, but the layer has "
                         f"num_heads={ctx.num_heads}")
    ptr = ctx.ptr  # raises a ValueError for an unsorted batch
    n = ptr.diff()
    B = ctx.num_graphs
    W = int(n.max()) if B and ctx.num_nodes else 0
    h = ctx.x if opt.pg_to_nodes else ctx.x.detach()
    if h.size(-1) != node_proj.in_channels:
        raise ValueError(f"SAC was built for inputs of width {node_proj.in_channels}, but this "
                         f"layer's input has width {h.size(-1)} (a producer shared by layers of "
                         f"different input widths needs share_structure=True: only the first "
                         f"layer predicts)")
    w = node_proj(h.to(node_proj.weight.dtype))
    emb, _ = to_dense_batch(w, ctx.batch, batch_size=B, max_num_nodes=max(W, 1))
    return SACLayout(emb=emb[:, :W], w=w, n=n, ptr=ptr, num_graphs=B, width=W)
