r"""SAC's warm-start imitation (:mod:`graphattn.producers.sac`; a **deviation**): while the backbone
trains on the input edges, the LSTM predictor learns, by teacher forcing, to choose them.

The paper initialises SAC from a trained GAT, whose structure is the input graph; our warm start
trains the backbone on that graph, but the predictor gets no signal before the switch, so its first
predictions are uniform over the candidates (``docs/league.md``, "SAC on Cora"). With
``warm_start_imitation`` :math:`= \lambda > 0` every warm-start training pass adds

.. math::
    \mathcal{L}_{\text{imit}} = -\frac{\lambda}{|S|} \sum_{(b, t) \in S}
        \log p_\theta\big(d_{b,t} \mid o_{b,t}, (o, d)_{b, <t}\big)

to the loss: the exact log-likelihood of a forced sequence in which every origin :math:`o` of the
all-nodes-connected schedule (node order, :math:`a_o` slots) is given its input in-neighbours
:math:`j \to o` (valid candidates, self-loops excluded) in a fresh random order. When :math:`o` has
fewer in-neighbours than slots, the remaining slots are forced to other candidates (lowest index
first) and carry no weight; :math:`S` holds the neighbour slots only. The node vectors are those of
the policy (detached from the backbone unless ``pg_to_nodes``), so the loss trains the predictor and
its node projection only.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import Linear

from graphattn.producers.base import ProducerContext
from graphattn.producers.sac.candidates import candidate_counts, candidate_rows
from graphattn.producers.sac.config import SACOptions
from graphattn.producers.sac.distances import HopCache
from graphattn.producers.sac.layout import SACLayout, layout
from graphattn.producers.sac.lstm import LSTMEdgeDecoder
from graphattn.producers.sac.paths import hop_table, lstm_budget, origin_budget, run_lstm


def imitation_actions(ctx: ProducerContext, opt: SACOptions, lay: SACLayout, cache: HopCache
                      ) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """``((origin [B, T], dest [B, T]), weight [B, T])``: the forced sequence of the imitation loss
    (local ids; the all-nodes-connected schedule) and which of its slots are input in-neighbours
    (the others: padding and filler slots). The random order of each origin's neighbours is drawn
    from the call's generator (``ctx.generator``; the global RNG if ``None``). ``ctx.data.edge_index``
    must be validated already (the producer builds the warm start's input edges first)."""
    B, W, dev = lay.num_graphs, lay.width, lay.emb.device
    table = hop_table(ctx, lay, opt, cache)
    cand_count = candidate_counts(opt, lay.n, W, table)
    no_repeat = opt.no_repeat_in("forced")
    budget, sched = lstm_budget(opt, lay.n, cand_count, no_repeat, W)
    assert sched is not None  # all_nodes
    T = int(budget.max()) if B else 0
    origin = sched[:, :T]
    active = torch.arange(T, device=dev)[None] < budget[:, None]
    # [B, W, W]: valid candidates and input in-neighbours (o ← j) of every origin
    o_all = torch.arange(W, device=dev)[None].expand(B, -1)
    real = torch.arange(W, device=dev)[None, None] < lay.n[:, None, None]
    rows = candidate_rows(opt, o_all, W, table)
    cand = (real if rows is None else rows & real).expand(B, W, W)
    src, dst = ctx.data.edge_index  # validated by the warm start's input edges (InputEdges)
    g = ctx.batch[dst]
    neigh = torch.zeros(B, W, W, dtype=torch.bool, device=dev)
    loop = src == dst
    neigh[g[~loop], (dst - lay.ptr[g])[~loop], (src - lay.ptr[g])[~loop]] = True
    neigh &= cand
    # neighbours first in a random order (keys in [0, 1)), then the other candidates by index
    # (keys in [1, 2)), non-candidates last; the k-th slot of an origin takes its k-th key
    A = int(opt.alpha)
    if W == 0 or A == 0:
        return (origin, torch.zeros_like(origin)), torch.zeros(origin.shape, dtype=torch.bool, device=dev)
    gen = ctx.generator
    u = torch.rand(B, W, W, generator=gen, device=dev if gen is None else gen.device).to(dev)
    by_index = 1.0 + torch.arange(W, device=dev, dtype=u.dtype) / W
    key = torch.where(neigh, u, torch.where(cand, by_index.expand_as(u), torch.full_like(u, 3.0)))
    order = key.topk(min(A, W), dim=-1, largest=False).indices  # [B, W, min(A, W)]
    slot_is_neigh = neigh.gather(-1, order)
    # without no_repeat an origin keeps α slots even with fewer candidates: repeat its first one
    slot_is_cand = cand.gather(-1, order)
    order = torch.where(slot_is_cand, order, order[..., :1])
    # the k-th occurrence of an origin in the schedule takes its k-th slot
    a = origin_budget(opt, cand_count, no_repeat)
    start = a.cumsum(-1) - a  # [B, W] first slot of every origin
    k = torch.arange(T, device=dev)[None] - start.gather(1, origin)
    k = torch.where(active, k, 0).clamp(max=order.size(-1) - 1)
    bidx = torch.arange(B, device=dev)[:, None]
    dest = torch.where(active, order[bidx, origin, k], 0)
    weight = active & slot_is_neigh[bidx, origin, k]
    return (torch.where(active, origin, 0), dest), weight


def imitation_loss(ctx: ProducerContext, opt: SACOptions, node_proj: Linear, decoder: LSTMEdgeDecoder,
                   cache: HopCache) -> Tensor:
    r""":math:`-\frac{1}{|S|}\sum_S \log p_\theta` of the forced sequence of
    :func:`imitation_actions` (0, still differentiable, when no origin has an input neighbour)."""
    lay = layout(ctx, node_proj, opt)
    actions, weight = imitation_actions(ctx, opt, lay, cache)
    dec = run_lstm(ctx, lay, opt, decoder, cache, actions)
    w = weight.to(dec.log_prob.dtype)
    return -(dec.log_prob * w).sum() / w.sum().clamp(min=1.0)
