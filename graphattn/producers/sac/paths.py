r"""SAC's run paths (:mod:`graphattn.producers.sac`): one prediction as plain functions of the options
(:class:`~graphattn.producers.sac.config.SACOptions`), the predictor and the
:class:`~graphattn.producers.ProducerContext`, each returning the edges per graph and slot as
:class:`~graphattn.producers.sac.layout.Decoded`:

* :func:`run_lstm` — the paper's LSTM (:class:`~graphattn.producers.sac.lstm.LSTMEdgeDecoder`):
  budgets, the origin schedule, candidate masks and distance buckets as a
  :class:`~graphattn.producers.sac.decoding.DecodePlan`;
* :func:`run_parallel` — the per-origin policy over all nodes
  (:class:`~graphattn.producers.sac.parallel.ParallelEdgePolicy`), chunked over origins;
* :func:`run_sparse` — the same over sampled candidate lists (``num_candidates > 0``);
* :func:`predict` — layout + run path + assembly (:mod:`~graphattn.producers.sac.assembly`).

Local node ids are ``0 .. n_b - 1`` of the padded layout.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import Linear

from graphattn.producers.base import ProducerContext
from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.sac.assembly import SampledEdgeSet, assemble
from graphattn.producers.sac.candidates import (
    candidate_counts,
    candidate_rows,
    hop_distances,
    origin_schedule,
)
from graphattn.producers.sac.config import SACOptions
from graphattn.producers.sac.decoding import DecodePlan
from graphattn.producers.sac.distances import (
    HopCache,
    HopDistances,
    clipped_offsets,
    predicted_so_far_buckets,
    sequence_buckets,
)
from graphattn.producers.sac.forcing import Actions
from graphattn.producers.sac.layout import Decoded, SACLayout, layout
from graphattn.producers.sac.lstm import LSTMEdgeDecoder
from graphattn.producers.sac.parallel import ParallelEdgePolicy

#: first key words of SAC's keyed draws (candidate lists; the parallel policy's choices)
_TAG_CANDIDATES, _TAG_DRAWS = 0xCA4D, 0xD4A3


def predict(ctx: ProducerContext, opt: SACOptions, node_proj: Linear,
            predictor: LSTMEdgeDecoder | ParallelEdgePolicy, cache: HopCache,
            actions: Actions | None = None) -> SampledEdgeSet:
    """One prediction: the layout, the policy's run path (teacher-forced with ``actions``) and the
    assembled :class:`~graphattn.producers.sac.assembly.SampledEdgeSet`."""
    lay = layout(ctx, node_proj, opt)
    if isinstance(predictor, LSTMEdgeDecoder):
        assert actions is None or isinstance(actions, tuple)
        dec = run_lstm(ctx, lay, opt, predictor, cache, actions)
    else:
        assert actions is None or isinstance(actions, Tensor)
        dec = run_parallel(ctx, lay, opt, predictor, cache, actions)
    return assemble(ctx, lay, opt, dec)


# ------------------------------------------------------------------------------------ the LSTM
class OriginPatterns:
    """The LSTM plan's per-origin callables (:class:`~graphattn.producers.sac.decoding.DecodePlan`):
    the candidate masks (:meth:`candidates`) and the distance buckets (:meth:`buckets`) of origins
    ``o [B, R]``, read from the input graph's ``[B, W, W]`` hop ``table`` where needed."""

    def __init__(self, opt: SACOptions, table: Tensor | None, num_graphs: int, width: int,
                 device: torch.device) -> None:
        self.opt, self.table, self.width = opt, table, width
        self.bidx = torch.arange(num_graphs, device=device)

    def hop_rows(self, o: Tensor) -> Tensor:
        """``[B, R, W]`` hop buckets from the origins ``o``."""
        assert self.table is not None
        return self.table[self.bidx[:, None], o]

    def candidates(self, o: Tensor) -> Tensor:
        """``[B, R, W]`` candidate destinations of the origins ``o``."""
        hop = self.hop_rows(o) if self.opt.candidates == "hops" else None
        rows = candidate_rows(self.opt, o, self.width, hop)
        assert rows is not None
        return rows

    def buckets(self, o: Tensor, hist_o: Tensor, hist_d: Tensor) -> list[Tensor]:
        """The ``[B, R, W]`` distance buckets of every distance table (``hist_o`` / ``hist_d``: the
        edges predicted so far)."""
        distance, W, K = self.opt.distance, self.width, self.opt.max_distance
        out = []
        if distance in ("input_graph", "both"):
            out.append(self.hop_rows(o))
        if distance == "sequence":
            out.append(sequence_buckets(o, W, K))
        if distance in ("predicted_so_far", "both"):
            out.append(predicted_so_far_buckets(o, hist_o, hist_d, W, K))
        return out


def origin_budget(opt: SACOptions, cand_count: Tensor, no_repeat: bool) -> Tensor:
    r"""``[B, W]`` edges of every origin in the all-nodes-connected variant: :math:`\alpha`, clamped
    to its candidates with ``no_repeat`` (0 for an origin without candidates)."""
    A = int(opt.alpha)
    return cand_count.clamp(max=A) if no_repeat else torch.where(cand_count > 0, A, 0)


def lstm_budget(opt: SACOptions, n: Tensor, cand_count: Tensor, no_repeat: bool, W: int
                ) -> tuple[Tensor, Tensor | None]:
    r"""``(budget [B], forced origins [B, S] or None)``: :math:`\operatorname{round}(\alpha n)` edges
    per graph (at least one; at most the candidate pairs with ``no_repeat``), or with ``all_nodes``
    every node :math:`\alpha` times (clamped to its candidates with ``no_repeat``) as the origins."""
    if opt.all_nodes:
        a = origin_budget(opt, cand_count, no_repeat)
        return a.sum(-1), origin_schedule(a, W)
    budget = torch.floor(opt.alpha * n.double() + 0.5).long()
    budget = torch.where(n > 0, budget.clamp(min=1), 0)
    if no_repeat:
        budget = torch.minimum(budget, cand_count.sum(-1))
    return budget, None


def hop_table(ctx: ProducerContext, lay: SACLayout, opt: SACOptions, cache: HopCache) -> Tensor | None:
    """The ``[B, W, W]`` input-graph hop buckets the options read (``None`` when none does)."""
    B, W = lay.num_graphs, lay.width
    if not (opt.needs_hops and B and W):
        return None
    return cache.table(hop_distances(ctx, lay.ptr, cache, opt.max_distance), B, W, opt.max_dense)


def run_lstm(ctx: ProducerContext, lay: SACLayout, opt: SACOptions, decoder: LSTMEdgeDecoder,
             cache: HopCache, actions: tuple[Tensor, Tensor] | None) -> Decoded:
    """The paper's sequential predictor: budgets, origin schedule, candidate masks and distance
    buckets as a :class:`~graphattn.producers.sac.decoding.DecodePlan`, decoded by ``decoder``."""
    emb, n, B, W = lay.emb, lay.n, lay.num_graphs, lay.width
    table = hop_table(ctx, lay, opt, cache)
    cand_count = candidate_counts(opt, n, W, table)
    mode = "forced" if actions is not None else opt.mode(ctx)
    no_repeat = opt.no_repeat_in(mode)
    budget, forced = lstm_budget(opt, n, cand_count, no_repeat, W)
    patterns = OriginPatterns(opt, table, B, W, ctx.device)
    plan = DecodePlan(emb=emb, n=n, budget=budget, segments=opt.segments, forced_origins=forced,
                      candidates=None if opt.candidates == "all" else patterns.candidates,
                      cand_count=cand_count, buckets=patterns.buckets, no_repeat=no_repeat,
                      needs_history=opt.distance in ("predicted_so_far", "both"),
                      max_dense=opt.max_dense)
    gen = KeyedRandom.for_context(ctx, opt.seed) if mode == "sample" else None
    res = decoder.decode(plan, mode, generator=gen, beam_size=opt.beam_size,
                         actions=actions, want_entropy=opt.entropy_weight > 0)
    hop_edge = None
    if table is not None and res.origin.numel():
        hop_edge = table[patterns.bidx[:, None], res.origin, res.dest]
    return Decoded(res.origin, res.dest, res.head, res.log_prob, res.active, res.entropy, hop_edge)


# ------------------------------------------------------------------------- the parallel policy
def chunk_masks(o: Tensor, *, lay: SACLayout, opt: SACOptions, hops: HopDistances | None,
                real: Tensor, no_repeat: bool) -> tuple[Tensor, list[Tensor], Tensor]:
    """For a chunk of origins ``o [B, C]`` over all nodes: the candidates ``valid [B, C, W]``, the
    distance buckets and the draws per origin ``[B, C]`` (``real [1, 1, W]``-broadcast: the real
    nodes of each graph). Called again when the chunk is recomputed in the backward pass."""
    n, ptr, B, W = lay.n, lay.ptr, lay.num_graphs, lay.width
    K, A = opt.max_distance, int(opt.alpha)
    row_real = o < n[:, None]
    rows = None
    if hops is not None:
        glob = (ptr[:-1, None] + o)[row_real]
        rows = torch.full((B, o.size(1), W), K + 2, dtype=torch.uint8, device=o.device)
        rows[row_real] = hops.rows(glob, W)
    buckets = []
    if opt.distance == "input_graph":
        buckets.append(rows)
    elif opt.distance == "sequence":
        buckets.append(sequence_buckets(o, W, K))
    valid = real & row_real[..., None]
    cand = candidate_rows(opt, o, W, rows)
    if cand is not None:
        valid = valid & cand
    count = valid.sum(-1)
    a = count.clamp(max=A) if no_repeat else torch.where(count > 0, A, 0)
    return valid, buckets, a


def run_parallel(ctx: ProducerContext, lay: SACLayout, opt: SACOptions, pol: ParallelEdgePolicy,
                 cache: HopCache, actions: Tensor | None) -> Decoded:
    """The parallel policy over all nodes of each graph, chunked over origins (teacher-forced with
    ``actions [segments, B, W, A]``); ``num_candidates > 0`` goes to :func:`run_sparse`."""
    if opt.num_candidates:
        if actions is not None:
            raise ValueError("teacher forcing is not available with num_candidates > 0 (the "
                             "candidate sets are random)")
        return run_sparse(ctx, lay, opt, pol, cache)
    emb, n, ptr, B, W = lay.emb, lay.n, lay.ptr, lay.num_graphs, lay.width
    A = int(opt.alpha)
    hops = hop_distances(ctx, ptr, cache, opt.max_distance) if opt.needs_hops and B and W else None
    mode = "forced" if actions is not None else opt.mode(ctx)
    no_repeat = opt.no_repeat_in(mode)
    rng = KeyedRandom.for_context(ctx, opt.seed) if mode == "sample" else None
    gw = rng.graph_words(n) if rng is not None else None
    C = max(1, opt.chunk_size // max(B * W, 1))
    segments = opt.segments
    starts = list(range(0, W, C))
    grad = torch.is_grad_enabled()
    cols = torch.arange(W, device=ctx.device)
    real = cols[None, None] < n[:, None, None]
    outs: list[tuple[Tensor, ...]] = []
    for m in range(segments):
        for c0 in starts:
            c1 = min(W, c0 + C)
            o = torch.arange(c0, c1, device=ctx.device)[None].expand(B, -1)
            masks = partial(chunk_masks, o, lay=lay, opt=opt, hops=hops, real=real, no_repeat=no_repeat)
            q = pol.query(emb[:, c0:c1])
            if pol.head_q is not None:
                q = q + pol.head_q[m].to(q.dtype)
            forced = None if actions is None else actions[m][:, c0:c1]
            keys = None if rng is None or gw is None else rng.rows(_TAG_DRAWS, gw[:, None], m, o).keys
            draws, lp, slot, ent, hop = pol.run_chunk(
                q, emb, masks=masks, num_draws=A, mode=mode, no_repeat=no_repeat, keys=keys,
                forced=forced, grad=grad)
            head = torch.full_like(draws, m)
            outs.append((o[..., None].expand_as(draws), draws, head, lp, slot, ent, hop))
    if not outs:
        return Decoded.empty(B, ctx.device, emb)
    # per graph: head-major, then origin, then draw (the decoding order of teacher forcing)
    o, d, m, lp, slot, ent, hop = (torch.cat([x[i].reshape(B, -1) for x in outs], 1) for i in range(7))
    ent_out = ent if opt.entropy_weight > 0 else None
    return Decoded(o, d, m, lp, slot, ent_out, hop if opt.distance == "input_graph" else None)


def run_sparse(ctx: ProducerContext, lay: SACLayout, opt: SACOptions, pol: ParallelEdgePolicy,
               cache: HopCache) -> Decoded:
    """The parallel policy over sampled candidate lists (``num_candidates > 0``)."""
    from graphattn.producers.random import sample_without_replacement

    w, n, ptr, B = lay.w, lay.n, lay.ptr, lay.num_graphs
    N, A, M = ctx.num_nodes, int(opt.alpha), opt.num_candidates
    mode = opt.mode(ctx)
    no_repeat = opt.no_repeat_in(mode)
    # keyed draws (graphattn.producers.keyed_random): fresh candidates and draws every training
    # pass, fixed ones (``seed``) in evaluation; in a seeded call a graph's draws depend on it only
    rng = KeyedRandom.for_context(ctx, opt.seed)
    hops = hop_distances(ctx, ptr, cache, opt.max_distance)
    node = torch.arange(N, device=ctx.device)
    g = ctx.batch
    gw = rng.graph_words(n)[g]
    local = node - ptr[g]
    # candidates: the node itself, its input neighbours, M uniform nodes of its graph (no repeats)
    nptr, ncol = hops.neighbours()
    deg = nptr.diff()
    rnd = sample_without_replacement(n[g], M, rng.rows(_TAG_CANDIDATES, gw, local))
    rnd = torch.where(rnd >= 0, rnd + ptr[g][:, None], -1)
    bk_rnd = hops.pair_buckets(node[:, None].expand_as(rnd), rnd.clamp(min=0))
    rnd = torch.where((rnd >= 0) & (bk_rnd > 1), rnd, -1)  # self / neighbours are listed already
    segments = opt.segments
    # origins in order of degree, so that a chunk's neighbour lists pad to a similar length
    perm = torch.argsort(deg, stable=True)
    C = max(1, opt.chunk_size // max((M + 32) * opt.embed_dim, 1))
    starts = list(range(0, N, C))
    grad = torch.is_grad_enabled()
    K = opt.max_distance
    outs = []
    for c0 in starts:
        rows = perm[c0:c0 + C]
        Dm = int(deg[rows].max())
        slot = torch.arange(Dm, device=ctx.device)
        at = (nptr[rows, None] + slot).clamp(max=max(ncol.numel() - 1, 0))
        nb = torch.where(slot < deg[rows, None], ncol[at] if ncol.numel() else at, -1)
        cand = torch.cat([rows[:, None], nb, rnd[rows]], 1)
        bk = torch.cat([torch.zeros(rows.numel(), 1, dtype=torch.uint8, device=ctx.device),
                        torch.ones(rows.numel(), Dm, dtype=torch.uint8, device=ctx.device),
                        bk_rnd[rows]], 1)
        count = (cand >= 0).sum(1)
        per_origin = count.clamp(max=A) if no_repeat else torch.where(count > 0, A, 0)
        buckets = []
        if opt.distance == "input_graph":
            buckets = [bk]
        elif opt.distance == "sequence":  # offsets of the candidates in the node order
            buckets = [clipped_offsets(cand.clamp(min=0) - rows[:, None], K)]
        for m in range(segments):
            q = pol.query(w[rows])
            if pol.head_q is not None:
                q = q + pol.head_q[m].to(q.dtype)
            keys = rng.rows(_TAG_DRAWS, gw[rows], m, local[rows]).keys[None] if mode == "sample" else None
            pos, lp, used, ent, _ = pol.run_chunk(
                q, w, cand, buckets, per_origin, num_draws=A, mode=mode, no_repeat=no_repeat,
                keys=keys, grad=grad, sparse=True)
            dest = cand.gather(1, pos[0])
            outs.append((rows[:, None].expand_as(dest), dest, torch.full_like(dest, m), lp[0],
                         used[0], ent[0], bk.gather(1, pos[0]).long()))
    if not outs:
        return Decoded.empty(B, ctx.device, w)
    o, d, mm, lp, used, ent, hop = (torch.cat([x[i] for x in outs]) for i in range(7))
    # back to the per-graph layout [B, T] the assembly expects (local ids): graph, head, origin
    gi = g[o]
    key = ((gi * segments + mm) * max(N, 1) + o) * A + torch.arange(A, device=o.device)
    order = torch.argsort(key.view(-1))
    flat = [t.reshape(-1)[order] for t in (o, d, mm, lp, used, ent, hop)]
    gf = gi.reshape(-1)[order]
    counts = torch.bincount(gf, minlength=B)
    T = int(counts.max()) if gf.numel() else 0
    pos_in = torch.arange(gf.numel(), device=o.device) - (counts.cumsum(0) - counts)[gf]
    grid = partial(_to_grid, at=(gf, pos_in), shape=(B, T))
    o_l = grid(flat[0] - ptr[gf], 0)
    d_l = grid(flat[1] - ptr[gf], 0)
    return Decoded(o_l, d_l, grid(flat[2], 0), grid(flat[3], 0.0), grid(flat[4], False),
                   grid(flat[5], 0.0) if opt.entropy_weight > 0 else None, grid(flat[6], 0))


def _to_grid(t: Tensor, fill: Any, *, at: tuple[Tensor, Tensor], shape: tuple[int, int]) -> Tensor:
    """``t`` placed at the (graph, slot) positions ``at`` of a ``shape = [B, T]`` grid of ``fill``."""
    out = torch.full(shape, fill, dtype=t.dtype, device=t.device)
    return out.index_put(at, t)
