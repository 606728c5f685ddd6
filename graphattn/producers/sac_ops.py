r"""The algorithm the SAC producer (:class:`graphattn.producers.sac.SAC`) runs, as plain functions of
its arguments (:class:`SACOptions`), its modules and the :class:`~graphattn.producers.ProducerContext`:

* :func:`layout` — the padded per-graph node vectors ``emb [B, W, D]`` and sizes (:class:`SACLayout`);
* :func:`candidate_rows` / :func:`candidate_counts` — the candidate patterns (``all``, ``causal``,
  ``window``, ``segment``, ``hops``) and :func:`hop_distances` (the input graph's, cached);
* the run paths, each returning the edges per graph and slot as :class:`Decoded`:
  :func:`run_lstm` (the paper's LSTM, :class:`~graphattn.producers.sac_decoder.LSTMEdgeDecoder`),
  :func:`run_parallel` (the per-origin policy over all nodes,
  :class:`~graphattn.producers.sac_policy.ParallelEdgePolicy`) and :func:`run_sparse` (the same over
  sampled candidate lists, ``num_candidates > 0``);
* :func:`assemble` — the attention :class:`SampledEdgeSet` (mirroring, unions, coalescing, the
  entropy bonus and the statistics); :func:`predict` = layout + run path + assembly;
* :func:`check_memory` (the memory guard) and :func:`warm_start_edges` (the warm-start stage);
* teacher forcing: :func:`forced_actions` (sampled edges → the run paths' actions) and
  :func:`forced_log_prob` (the EdgeSet's ``log_prob`` back in the order of the sampled edges).

Local node ids are ``0 .. n_b - 1`` of the padded layout; edges leave here with global ids.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeAlias

import torch
from torch import Tensor
from torch_geometric.nn import Linear
from torch_geometric.utils import to_dense_batch

from graphattn.core.edgeset import EdgeSet, union_edge_sets
from graphattn.core.origins import origin_code
from graphattn.memory import EDGE_BYTES, check_edges
from graphattn.producers.base import ProducerContext
from graphattn.producers.input import InputEdges
from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.sac_decoder import DecodePlan, LSTMEdgeDecoder
from graphattn.producers.sac_distances import (
    HopCache,
    HopDistances,
    clipped_offsets,
    predicted_so_far_buckets,
    sequence_buckets,
)
from graphattn.producers.sac_policy import ParallelEdgePolicy

#: first key words of SAC's keyed draws (candidate lists; the parallel policy's choices)
_TAG_CANDIDATES, _TAG_DRAWS = 0xCA4D, 0xD4A3

#: teacher-forced actions: ``(origin [B, T], dest [B, T])`` local ids for the LSTM, destinations
#: ``[segments, B, W, A]`` per (head segment, graph, origin, draw) for the parallel policy
Actions: TypeAlias = tuple[Tensor, Tensor] | Tensor


class SACOptions(NamedTuple):
    """The producer's (validated) arguments the algorithm reads, see :class:`~graphattn.producers.sac.SAC`;
    ``training`` is the producer's own mode (teacher forcing replays its decoding)."""

    alpha: float
    policy: str
    embed_dim: int
    all_nodes: bool
    head_adaptive: bool
    heads: int
    distance: str
    max_distance: int
    candidates: str
    window: int
    no_repeat: bool
    decode: str
    beam_size: int
    undirected: bool
    coalesce: bool
    union_input: bool
    self_loops: bool
    pg_to_nodes: bool
    entropy_weight: float
    num_candidates: int
    chunk_size: int
    max_dense: int
    seed: int
    training: bool

    @property
    def segments(self) -> int:
        """Head segments of the prediction (``heads`` when head-adaptive, else 1)."""
        return self.heads if self.head_adaptive else 1

    @property
    def needs_hops(self) -> bool:
        """Whether the input graph's hop distances are read (distance encoding or candidates)."""
        return self.distance in ("input_graph", "both") or self.candidates == "hops"

    def mode(self, ctx: ProducerContext) -> str:
        """The decoding mode of a forward pass: sampling in training, ``decode`` in evaluation."""
        return "sample" if ctx.training else self.decode

    def no_repeat_in(self, mode: str) -> bool:
        """Greedy and beam decoding always forbid repeats (else they repeat the argmax)."""
        if mode == "forced":
            return self.no_repeat or (not self.training and self.decode in ("greedy", "beam"))
        return self.no_repeat or mode in ("greedy", "beam")


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


class SampledEdgeSet(EdgeSet):
    """An explicit attention :class:`~graphattn.EdgeSet` plus the sampled actions behind it.

    Extra attributes: ``sampled_edge_index [2, A]`` and ``sampled_head [A]`` (or ``None``): one
    column per predicted edge, before mirroring, coalescing and unions, in the order that
    ``log_prob [A]`` / ``log_prob_graph [A]`` follow (graph by graph, in decoding order).
    """

    sampled_edge_index: Tensor
    sampled_head: Tensor | None


class ForcedActions(NamedTuple):
    """Teacher forcing of sampled edges: the run paths' ``actions`` and ``order``, the permutation
    that sorts the edges by graph (stable; the LSTM's ``log_prob`` follows it)."""

    actions: Actions
    order: Tensor


# ------------------------------------------------------------------------------------ the layout
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


def _schedule(a: Tensor, W: int) -> Tensor:
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


# ----------------------------------------------------------------------------------- predicting
def predict(ctx: ProducerContext, opt: SACOptions, node_proj: Linear,
            predictor: LSTMEdgeDecoder | ParallelEdgePolicy, cache: HopCache,
            actions: Actions | None = None) -> SampledEdgeSet:
    """One prediction: the layout, the policy's run path (teacher-forced with ``actions``) and the
    assembled :class:`SampledEdgeSet`."""
    lay = layout(ctx, node_proj, opt)
    if isinstance(predictor, LSTMEdgeDecoder):
        assert actions is None or isinstance(actions, tuple)
        dec = run_lstm(ctx, lay, opt, predictor, cache, actions)
    else:
        assert actions is None or isinstance(actions, Tensor)
        dec = run_parallel(ctx, lay, opt, predictor, cache, actions)
    return assemble(ctx, lay, opt, dec)


def run_lstm(ctx: ProducerContext, lay: SACLayout, opt: SACOptions, decoder: LSTMEdgeDecoder,
             cache: HopCache, actions: tuple[Tensor, Tensor] | None) -> Decoded:
    """The paper's sequential predictor: budgets, origin schedule, candidate masks and distance
    buckets as a :class:`~graphattn.producers.sac_decoder.DecodePlan`, decoded by ``decoder``."""
    emb, n, B, W = lay.emb, lay.n, lay.num_graphs, lay.width
    K = opt.max_distance
    table = None
    if opt.needs_hops and B and W:
        table = cache.table(hop_distances(ctx, lay.ptr, cache, K), B, W, opt.max_dense)
    cand_count = candidate_counts(opt, n, W, table)
    segments = opt.segments
    mode = "forced" if actions is not None else opt.mode(ctx)
    no_repeat = opt.no_repeat_in(mode)
    forced = None
    if opt.all_nodes:
        a = cand_count.clamp(max=int(opt.alpha)) if no_repeat else \
            torch.where(cand_count > 0, int(opt.alpha), 0)
        budget = a.sum(-1)
        forced = _schedule(a, W)
    else:
        budget = torch.floor(opt.alpha * n.double() + 0.5).long()
        budget = torch.where(n > 0, budget.clamp(min=1), 0)
        if no_repeat:
            budget = torch.minimum(budget, cand_count.sum(-1))
    bidx = torch.arange(B, device=ctx.device)

    def hop_rows(o: Tensor) -> Tensor:
        assert table is not None
        return table[bidx[:, None], o]

    def candidates(o: Tensor) -> Tensor:
        rows = candidate_rows(opt, o, W, hop_rows(o) if opt.candidates == "hops" else None)
        assert rows is not None
        return rows

    def buckets(o: Tensor, hist_o: Tensor, hist_d: Tensor) -> list[Tensor]:
        out = []
        if opt.distance in ("input_graph", "both"):
            out.append(hop_rows(o))
        if opt.distance == "sequence":
            out.append(sequence_buckets(o, W, K))
        if opt.distance in ("predicted_so_far", "both"):
            out.append(predicted_so_far_buckets(o, hist_o, hist_d, W, K))
        return out

    plan = DecodePlan(emb=emb, n=n, budget=budget, segments=segments, forced_origins=forced,
                      candidates=None if opt.candidates == "all" else candidates,
                      cand_count=cand_count, buckets=buckets, no_repeat=no_repeat,
                      needs_history=opt.distance in ("predicted_so_far", "both"),
                      max_dense=opt.max_dense)
    gen = KeyedRandom.for_context(ctx, opt.seed) if mode == "sample" else None
    res = decoder.decode(plan, mode, generator=gen, beam_size=opt.beam_size,
                         actions=actions, want_entropy=opt.entropy_weight > 0)
    hop_edge = None
    if table is not None and res.origin.numel():
        hop_edge = table[bidx[:, None], res.origin, res.dest]
    return Decoded(res.origin, res.dest, res.head, res.log_prob, res.active, res.entropy, hop_edge)


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

    def grid(t: Tensor, fill: Any) -> Tensor:
        out = torch.full((B, T), fill, dtype=t.dtype, device=t.device)
        return out.index_put((gf, pos_in), t)

    o_l = grid(flat[0] - ptr[gf], 0)
    d_l = grid(flat[1] - ptr[gf], 0)
    return Decoded(o_l, d_l, grid(flat[2], 0), grid(flat[3], 0.0), grid(flat[4], False),
                   grid(flat[5], 0.0) if opt.entropy_weight > 0 else None, grid(flat[6], 0))


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
    K, A = opt.max_distance, int(opt.alpha)
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

            def masks(o: Tensor = o) -> tuple[Tensor, list[Tensor], Tensor]:
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


# --------------------------------------------------------------------------------------- output
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


# ------------------------------------------------------------------------------ teacher forcing
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

    def occurrence_key(ei: Tensor, hh: Tensor) -> Tensor:
        key = (hh * n + ei[1]) * n + ei[0]
        order = torch.argsort(key, stable=True)
        ks = key[order]
        first = torch.ones_like(ks, dtype=torch.bool)
        first[1:] = ks[1:] != ks[:-1]
        start = torch.cummax(torch.where(first, torch.arange(ks.numel(), device=ks.device), 0), 0).values
        occ = torch.empty_like(key)
        occ[order] = torch.arange(ks.numel(), device=ks.device) - start
        return key * (ks.numel() + 1) + occ

    ka, kb = occurrence_key(se, sh), occurrence_key(edges, h)
    ia, ib = torch.argsort(ka), torch.argsort(kb)
    out = torch.empty_like(es.log_prob)
    out[ib] = es.log_prob[ia]
    return out
