r"""SAC's autoregressive edge predictor (used by :class:`graphattn.producers.sac.SAC` with
``policy="lstm"``; no attention arithmetic).

* :class:`LSTMEdgeDecoder` — the paper's predictor (SAC §4.1): a single-layer LSTM that alternates
  origin and destination predictions, batched in lock-step over the graphs of a batch, with sampling,
  greedy, teacher-forced and beam-search decoding;
* :class:`DecodePlan` — what one decoding pass needs (built by
  :func:`graphattn.producers.sac_ops.run_lstm`); :class:`DecodeResult` — what it returns;
  :class:`Rollout` — a result plus the per-step masks and buckets of the scoring pass;
* :func:`row_entropy` and :data:`NEG_INF`, shared with :mod:`~graphattn.producers.sac_policy`.

The distance buckets the plan hands in are :mod:`graphattn.producers.sac_distances`.

Everything works on the padded per-graph layout ``[B, W, ·]`` (``W`` = largest graph), local node ids
``0 .. n_b - 1``; padding is never a candidate. Rows are ``[B, K]`` (``K`` = beam width, 1 otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from graphattn.producers.keyed_random import KeyedRandom

NEG_INF = float("-inf")


# ------------------------------------------------------------------------------------ the plan
@dataclass
class DecodePlan:
    """What one decoding pass needs (built by the producer per forward).

    Attributes:
        emb: ``[B, W, D]`` node vectors in the predictor's space (the tied output embeddings).
        n: ``[B]`` nodes per graph.
        budget: ``[B]`` edges per head segment (per graph).
        segments: number of head segments (``H`` when head-adaptive, else 1).
        forced_origins: ``[B, S]`` origin schedule per segment (all-nodes-connected) or ``None``
            (free origins).
        candidates: ``(origin [B, R]) -> [B, R, W]`` bool candidate mask of the destinations, or
            ``None`` when every node of the graph is a candidate.
        cand_count: ``[B, W]`` number of candidates of every origin (0 for padding).
        buckets: ``(origin [B, R], hist_o [B, R, e], hist_d [B, R, e]) -> list of [B, R, W]``
            distance buckets, one per distance table (empty: no distance encoding).
        no_repeat: forbid repeating an (origin, destination) pair within a head segment.
        needs_history: ``buckets`` reads the edges predicted so far.
        max_dense: the largest ``[B, W, W]`` bitmap of chosen pairs to keep (else scan the history).
    """

    emb: Tensor
    n: Tensor
    budget: Tensor
    segments: int
    forced_origins: Tensor | None
    candidates: Callable[[Tensor], Tensor] | None
    cand_count: Tensor
    buckets: Callable[[Tensor, Tensor, Tensor], list[Tensor]]
    no_repeat: bool
    needs_history: bool = False
    max_dense: int = 1 << 28


@dataclass
class DecodeResult:
    """Per graph and edge slot (``[B, T]``): local origin and destination, head segment, the edge's
    log-probability (origin step + destination step; 0 in unused slots), whether the slot is used,
    and (optionally) the summed entropy of the edge's two choices."""

    origin: Tensor
    dest: Tensor
    head: Tensor
    log_prob: Tensor
    active: Tensor
    entropy: Tensor | None = None


@dataclass
class Rollout(DecodeResult):
    """A :class:`DecodeResult` plus what the scoring pass needs: the masks of invalid candidates of
    every origin step (``[T, B, W]``, ``None`` with forced origins) and destination step, and the
    destination steps' distance buckets (``[T, B, W]`` bytes, one per table)."""

    invalid_origin: Tensor | None = None
    invalid_dest: Tensor | None = None
    buckets: list[Tensor] = field(default_factory=list)


def row_entropy(logp: Tensor) -> Tensor:
    """Entropy of the distributions whose log-probabilities are the last dimension of ``logp``
    (masked entries, :data:`NEG_INF`, contribute 0)."""
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


def _schedule_tables(plan: DecodePlan) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(segment [B, T], slot within segment [B, T], active [B, T], T)`` of every edge slot."""
    bud = plan.budget.clamp(min=1)
    total = plan.budget * plan.segments
    T = int(total.max()) if total.numel() else 0
    e = torch.arange(T, device=bud.device)[None]
    seg = torch.div(e, bud[:, None], rounding_mode="floor").clamp(max=plan.segments - 1)
    within = e - seg * bud[:, None]
    return seg, within, e < total[:, None], T


# ------------------------------------------------------------------------------- LSTM decoder
class LSTMEdgeDecoder(nn.Module):
    r"""The autoregressive edge predictor of SAC (§4.1, Fig. 1b), batched over graphs.

    With node vectors :math:`w_i` (tied output embeddings), LSTM state :math:`g_t`, and
    :math:`y_0 = \text{[SOS]}`:

    .. math::
        g_{t+1} = \operatorname{LSTM}\big([w_{y_t} \,\|\, c_{m}],\ g_t\big), \qquad
        p(y_{t+1} = i) = \operatorname{softmax}_{i \in \mathcal{C}_t}
            \frac{(W_o g_{t+1})^{\top}(w_i + [t+1 \text{ dest.}]\, \textstyle\sum_s u^{(s)}_{\delta_s(o, i)})}
                 {\sqrt{D}}

    Steps alternate origin, destination, origin, ... ; :math:`\mathcal{C}_t` is the candidate set
    (real nodes of the graph, the candidate pattern, minus repeated pairs; origins with no candidate
    left are masked), :math:`c_m` the head embedding of segment :math:`m` (head-adaptive only),
    :math:`o` the current origin and :math:`u^{(s)}_\delta` the learned distance embeddings. The
    :math:`1/\sqrt{D}` temperature is our choice (a near-uniform policy at initialisation). All graphs
    of a batch advance in lock-step; a graph whose budget is spent idles (its slots are dropped).

    Decoding runs in two passes. The **rollout** (:meth:`rollout`, no autograd) makes the choices
    step by step and records, per step, the mask of invalid candidates and the distance buckets.
    The **scoring** pass (:meth:`score`) recomputes the log-probabilities of the recorded choices
    with gradient: teacher forcing, i.e. one :class:`torch.nn.LSTM` call over the whole input
    sequence and batched logits, checkpointed over chunks of steps so memory stays
    :math:`O(\text{chunk}\cdot W)`. The ``log_prob`` of a sampled sequence is therefore by
    construction its teacher-forced log-probability.

    Args:
        embed_dim (int): :math:`D`, width of the node vectors.
        hidden (int): LSTM width.
        bucket_sizes (list[int]): number of buckets of every distance table.
        num_segments (int): head segments for head-adaptive prediction (0: off).
        head_dim (int): width of the head embedding appended to the LSTM input.
        score_chunk (int): edges per checkpointed chunk of the scoring pass.
    """

    def __init__(self, embed_dim: int, hidden: int, bucket_sizes: list[int], num_segments: int = 0,
                 head_dim: int = 16, score_chunk: int = 512) -> None:
        super().__init__()
        self.embed_dim, self.hidden = embed_dim, hidden
        self.head_dim = head_dim if num_segments else 0
        self.lstm = nn.LSTM(embed_dim + self.head_dim, hidden, num_layers=1)
        self.sos = nn.Parameter(torch.empty(embed_dim))
        self.out = nn.Linear(hidden, embed_dim, bias=False)
        self.dist = nn.ParameterList([nn.Parameter(torch.empty(b, embed_dim)) for b in bucket_sizes])
        self.head_emb = nn.Parameter(torch.empty(num_segments, head_dim)) if num_segments else None
        self.score_chunk = score_chunk
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lstm.reset_parameters()
        self.out.reset_parameters()
        nn.init.normal_(self.sos, std=1.0)
        for u in self.dist:
            nn.init.normal_(u, std=0.1)
        if self.head_emb is not None:
            nn.init.normal_(self.head_emb, std=1.0)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, hidden={self.hidden}, distance_tables={len(self.dist)}"

    # ---------------------------------------------------------------------------- helpers
    def _step_weights(self, emb: Tensor) -> dict[str, Any]:
        r"""Per-forward precomputations of the rollout: input projections :math:`W_{ih} w_i + b` of
        every node, the [SOS] and head projections, and the tied output matrix
        :math:`W_o^{\top} [w_1 \dots w_W] / \sqrt{D}` (so a step is a few matrix-vector products)."""
        B, W, D = emb.shape
        dt = emb.dtype
        w_ih = self.lstm.weight_ih_l0.to(dt)
        bias = (self.lstm.bias_ih_l0 + self.lstm.bias_hh_l0).to(dt)
        w_out = self.out.weight.to(dt).t() * (1.0 / math.sqrt(D))  # [hidden, D]
        return {
            "x_proj": torch.addmm(bias, emb.reshape(B * W, D), w_ih[:, :D].t()).view(B, W, -1),
            "sos": torch.addmm(bias[None], self.sos.to(dt)[None], w_ih[:, :D].t()),
            "head": None if self.head_emb is None else self.head_emb.to(dt) @ w_ih[:, D:].t(),
            "w_hh_t": self.lstm.weight_hh_l0.to(dt).t(),
            "tied": torch.matmul(w_out, emb.transpose(1, 2)),  # [B, hidden, W]
            "tied_dist": [w_out @ u.to(dt).t() for u in self.dist],  # [hidden, buckets]
        }

    def _cell(self, gx: Tensor, h: Tensor, c: Tensor, w_hh_t: Tensor) -> tuple[Tensor, Tensor]:
        """One LSTM step (the equations of :class:`torch.nn.LSTMCell`; ``gx`` = input projection)."""
        Hd = self.hidden
        gates = torch.addmm(gx, h, w_hh_t)
        sig = gates.sigmoid()
        c = torch.addcmul(sig[:, Hd:2 * Hd] * c, sig[:, :Hd], gates[:, 2 * Hd:3 * Hd].tanh())
        return sig[:, 3 * Hd:] * c.tanh(), c

    # ---------------------------------------------------------------------------- decoding
    def decode(self, plan: DecodePlan, mode: str, *, generator: torch.Generator | KeyedRandom | None = None,
               beam_size: int = 1, actions: tuple[Tensor, Tensor] | None = None,
               want_entropy: bool = False) -> DecodeResult:
        """Runs the predictor. ``mode``: ``"sample"``, ``"greedy"``, ``"beam"`` (``beam_size``
        hypotheses per graph, the best total log-probability kept) or ``"forced"`` (teacher forcing
        with ``actions = (origin [B, T], dest [B, T])`` local ids). With gradients enabled the
        returned ``log_prob`` (and ``entropy``) come from the differentiable scoring pass."""
        if mode not in ("sample", "greedy", "forced", "beam"):
            raise ValueError(f"unknown decoding mode {mode!r}")
        if mode == "forced" and actions is None:
            raise ValueError("mode='forced' needs 'actions'")
        with torch.no_grad():
            if mode == "beam":
                best = self.beam(plan, beam_size)
                roll = self.rollout(plan, "forced", None, (best.origin, best.dest), want_entropy)
            else:
                roll = self.rollout(plan, mode, generator, actions, want_entropy)
        needs_grad = plan.emb.requires_grad or any(p.requires_grad for p in self.parameters())
        if torch.is_grad_enabled() and needs_grad:
            lp, ent = self.score(plan, roll, want_entropy)
            return DecodeResult(roll.origin, roll.dest, roll.head, lp, roll.active, ent)
        return roll

    def rollout(self, plan: DecodePlan, mode: str, generator: torch.Generator | KeyedRandom | None,
                actions: tuple[Tensor, Tensor] | None, want_entropy: bool = False) -> Rollout:
        """The choices, step by step (call under :func:`torch.no_grad`): sampling (inverse CDF with
        pre-drawn uniforms, keyed by graph, step and origin/destination half — see
        :mod:`~graphattn.producers.keyed_random`), greedy or teacher-forced. Records the per-step
        masks for :meth:`score`."""
        emb, n = plan.emb, plan.n
        B, W, _ = emb.shape
        dev = emb.device
        seg_all, within_all, active_all, T = _schedule_tables(plan)
        free = plan.forced_origins is None
        if T == 0:
            z = torch.zeros(B, 0, dtype=torch.long, device=dev)
            empty = torch.zeros(0, B, W, dtype=torch.bool, device=dev)
            return Rollout(z, z, z, emb.new_zeros(B, 0), z.bool(), None, None if not free else empty,
                           empty, [])
        sw = self._step_weights(emb)
        bidx = torch.arange(B, device=dev)[:, None]
        multi = plan.segments > 1
        sched = None
        if not free:
            assert plan.forced_origins is not None
            sched = plan.forced_origins.gather(1, within_all.clamp(max=plan.forced_origins.size(1) - 1))
        if actions is not None:
            if actions[0].shape != (B, T) or actions[1].shape != (B, T):
                raise ValueError(f"teacher-forced actions must be [B, T] = [{B}, {T}] (the budget), got "
                                 f"{list(actions[0].shape)} and {list(actions[1].shape)}")
            if sched is not None and not bool((~active_all | (actions[0] == sched)).all()):
                raise ValueError("teacher-forced origins differ from the all-nodes-connected schedule")
        not_real = torch.arange(W, device=dev)[None] >= n[:, None]  # [B, W]
        bitmap = plan.no_repeat and B * W * W <= plan.max_dense
        chosen = torch.zeros(B, W, W, dtype=torch.bool, device=dev) if bitmap else None
        hist = plan.needs_history or (plan.no_repeat and not bitmap)
        hist_o = torch.full((B, T), W, dtype=torch.long, device=dev) if hist else None
        hist_d = torch.full((B, T), W, dtype=torch.long, device=dev) if hist else None
        used = torch.zeros(B, W, dtype=torch.long, device=dev) if (free and plan.no_repeat) else None
        unif = None
        if mode == "sample":
            rng = KeyedRandom.coerce(generator, dev)
            steps, halves = torch.arange(T, device=dev), torch.arange(2, device=dev)
            unif = rng.rows(steps[:, None, None], halves[None, :, None],
                            rng.graph_words(n)[None, None, :]).uniform()[..., None]  # [T, 2, B, 1]
            unif = unif * (1.0 - 1e-12)  # strictly below the total mass: never a zero-probability entry
        all_active = int(plan.budget.min()) * plan.segments if B else 0  # steps with no idle graph
        starts: set[int] = set()
        if multi:
            starts = set(((within_all == 0) & active_all).any(0).nonzero().view(-1).tolist())

        def choose(logp: Tensor, step: int, half: int, forced: Tensor | None) -> Tensor:
            if forced is not None:
                return forced
            if unif is None:
                return logp.argmax(-1, keepdim=True)
            c = torch.cumsum(logp.exp(), -1, dtype=torch.float64)
            return torch.searchsorted(c, unif[step, half] * c[:, -1:], right=True)

        def finite(invalid: Tensor, e: int) -> Tensor:
            if e >= all_active:  # idle graphs: keep their rows finite (never used)
                invalid = invalid & active_all[:, e:e + 1]
            return invalid

        hx = emb.new_zeros(B, self.hidden)
        cx = emb.new_zeros(B, self.hidden)
        gx = sw["sos"].expand(B, -1)
        tied, tied_dist, x_proj, w_hh_t = sw["tied"], sw["tied_dist"], sw["x_proj"], sw["w_hh_t"]
        rec_o, rec_d, rec_lo, rec_ld = [], [], [], []
        rec_io: list[Tensor] = []
        rec_id: list[Tensor] = []
        rec_b: list[list[Tensor]] = []
        hseg = None
        for e in range(T):
            if multi:
                hseg = sw["head"][seg_all[:, e]]
                if e in starts and e > 0:  # a new head segment: repeats are per segment
                    fresh = within_all[:, e] == 0
                    if chosen is not None:
                        chosen[fresh] = False
                    if used is not None:
                        used[fresh] = 0
            # ---------------------------------------------------------------- origin step
            hx, cx = self._cell(gx if hseg is None else gx + hseg, hx, cx, w_hh_t)
            if free:
                logits = torch.bmm(hx[:, None], tied)[:, 0]
                invalid = not_real if used is None else not_real | (used >= plan.cand_count)
                invalid = finite(invalid, e)
                logp = torch.log_softmax(logits.masked_fill(invalid, NEG_INF), -1)
                o = choose(logp, e, 0, None if actions is None else actions[0][:, e:e + 1])
                rec_lo.append(logp.gather(1, o))
                rec_io.append(invalid)
            else:
                assert sched is not None
                o = sched[:, e:e + 1]
            gx = x_proj[bidx, o][:, 0]
            # ----------------------------------------------------------- destination step
            hx, cx = self._cell(gx if hseg is None else gx + hseg, hx, cx, w_hh_t)
            logits = torch.bmm(hx[:, None], tied)[:, 0]
            if tied_dist:
                hb = (hist_o[:, None, :e], hist_d[:, None, :e]) if hist_o is not None and \
                    hist_d is not None else (o[..., :0], o[..., :0])
                bks = [bk[:, 0] for bk in plan.buckets(o, *hb)]
                for td, bk in zip(tied_dist, bks, strict=False):
                    logits = logits + torch.gather(hx @ td, 1, bk.long())
                rec_b.append([bk.to(torch.uint8) for bk in bks])
            invalid = not_real
            if plan.candidates is not None:
                invalid = invalid | ~plan.candidates(o)[:, 0]
            if chosen is not None:
                invalid = invalid | chosen[bidx, o][:, 0]
            elif plan.no_repeat:
                assert hist_o is not None and hist_d is not None
                same = hist_o[:, :e] == o
                if multi:
                    same &= seg_all[:, :e] == seg_all[:, e:e + 1]
                taken = torch.zeros(B, W + 1, dtype=torch.bool, device=dev)
                taken.scatter_(1, torch.where(same, hist_d[:, :e], W), True)
                invalid = invalid | taken[:, :W]
            invalid = finite(invalid, e)
            logp = torch.log_softmax(logits.masked_fill(invalid, NEG_INF), -1)
            d = choose(logp, e, 1, None if actions is None else actions[1][:, e:e + 1])
            rec_ld.append(logp.gather(1, d))
            rec_id.append(invalid)
            if chosen is not None:
                chosen[bidx, o, d] = True
            if used is not None:
                used[bidx, o] += 1
            if hist_o is not None and hist_d is not None:
                act = active_all[:, e:e + 1]
                hist_o[:, e:e + 1] = torch.where(act, o, W)
                hist_d[:, e:e + 1] = torch.where(act, d, W)
            gx = x_proj[bidx, d][:, 0]
            rec_o.append(o)
            rec_d.append(d)

        lp = torch.cat(rec_ld, 1)
        if rec_lo:
            lp = lp + torch.cat(rec_lo, 1)
        lp = torch.where(active_all, lp, torch.zeros_like(lp))
        buckets = [torch.stack([b[i] for b in rec_b]) for i in range(len(tied_dist))] if rec_b else []
        roll = Rollout(origin=torch.cat(rec_o, 1), dest=torch.cat(rec_d, 1), head=seg_all, log_prob=lp,
                       active=active_all, entropy=None,
                       invalid_origin=torch.stack(rec_io) if rec_io else None,
                       invalid_dest=torch.stack(rec_id), buckets=buckets)
        if want_entropy:
            roll.entropy = self.score(plan, roll, True)[1]
        return roll

    def score(self, plan: DecodePlan, roll: Rollout, want_entropy: bool = False
              ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced log-probabilities ``[B, T]`` of the rollout's choices (and entropies), with
        gradient to every predictor parameter and to the node vectors ``plan.emb``."""
        emb = plan.emb
        B, _, D = emb.shape
        T = roll.origin.size(1)
        if T == 0:
            return emb.new_zeros(B, 0), (emb.new_zeros(B, 0) if want_entropy else None)
        dt = emb.dtype
        bidx = torch.arange(B, device=emb.device)[:, None]
        # the input sequence: [SOS], w_o1, w_d1, w_o2, ..., w_oT (2T inputs for 2T predictions)
        wo, wd = emb[bidx, roll.origin], emb[bidx, roll.dest]  # [B, T, D]
        seq = torch.stack([wo, wd], 2).reshape(B, 2 * T, D)
        seq = torch.cat([self.sos.to(dt).expand(B, 1, D), seq[:, :-1]], 1)
        if self.head_emb is not None:
            hemb = self.head_emb.to(dt)[roll.head].repeat_interleave(2, 1)  # [B, 2T, head_dim]
            seq = torch.cat([seq, hemb], -1)
        out, _ = self.lstm(seq.transpose(0, 1).to(self.lstm.weight_ih_l0.dtype))  # [2T, B, hidden]
        q = self.out(out.to(dt)).transpose(0, 1) * (1.0 / math.sqrt(D))  # [B, 2T, D]
        q = q.view(B, T, 2, D)
        free = roll.invalid_origin is not None
        lps, ents = [], []
        C = max(1, self.score_chunk)
        for k0 in range(0, T, C):
            k1 = min(T, k0 + C)
            args = (q[:, k0:k1], emb, roll.origin[:, k0:k1], roll.dest[:, k0:k1],
                    None if not free else roll.invalid_origin[k0:k1],  # type: ignore[index]
                    roll.invalid_dest[k0:k1], [b[k0:k1] for b in roll.buckets], want_entropy)
            res = checkpoint(self._score_chunk, *args, use_reentrant=False) \
                if torch.is_grad_enabled() else self._score_chunk(*args)
            lps.append(res[0])
            if want_entropy:
                ents.append(res[1])
        lp = torch.where(roll.active, torch.cat(lps, 1), 0.0)
        ent = torch.where(roll.active, torch.cat(ents, 1), 0.0) if want_entropy else None
        return lp, ent

    def _score_chunk(self, q: Tensor, emb: Tensor, o: Tensor, d: Tensor, inv_o: Tensor | None,
                     inv_d: Tensor, buckets: list[Tensor], want_entropy: bool) -> tuple[Tensor, Tensor]:
        """Log-probabilities ``[B, C]`` of one chunk of edges: ``q [B, C, 2, D]`` queries of the
        origin and destination steps, masks ``[C, B, W]``."""
        embT = emb.transpose(1, 2)
        ent = q.new_zeros(o.shape)
        logits = torch.bmm(q[:, :, 1], embT)  # [B, C, W]
        for u, b in zip(self.dist, buckets, strict=False):
            logits = logits + torch.gather(q[:, :, 1] @ u.to(q.dtype).t(), -1, b.transpose(0, 1).long())
        logp = torch.log_softmax(logits.masked_fill(inv_d.transpose(0, 1), NEG_INF), -1)
        lp = logp.gather(-1, d[..., None])[..., 0]
        if want_entropy:
            ent = ent + row_entropy(logp)
        if inv_o is not None:
            logits = torch.bmm(q[:, :, 0], embT).masked_fill(inv_o.transpose(0, 1), NEG_INF)
            logp = torch.log_softmax(logits, -1)
            lp = lp + logp.gather(-1, o[..., None])[..., 0]
            if want_entropy:
                ent = ent + row_entropy(logp)
        return lp, ent

    @torch.no_grad()
    def beam(self, plan: DecodePlan, K: int) -> DecodeResult:
        """Beam search over the whole sequence of origin and destination choices: ``K`` hypotheses
        per graph, extended by every candidate and cut back to the ``K`` best total
        log-probabilities; the best final hypothesis is followed back through its parents. Repeats
        are always forbidden (scanning each hypothesis' history)."""
        emb, n = plan.emb, plan.n
        B, W, _ = emb.shape
        dev = emb.device
        seg_all, within_all, active_all, T = _schedule_tables(plan)
        if T == 0:
            z = torch.zeros(B, 0, dtype=torch.long, device=dev)
            return DecodeResult(z, z, z, emb.new_zeros(B, 0), z.bool())
        sw = self._step_weights(emb)
        x_proj, tied, tied_dist, w_hh_t = sw["x_proj"], sw["tied"], sw["tied_dist"], sw["w_hh_t"]
        bidx = torch.arange(B, device=dev)
        kidx = torch.arange(K, device=dev)
        real = (torch.arange(W, device=dev)[None] < n[:, None])[:, None]  # [B, 1, W]
        free = plan.forced_origins is None
        multi = plan.segments > 1
        sched = None
        if not free:
            assert plan.forced_origins is not None
            sched = plan.forced_origins.gather(1, within_all.clamp(max=plan.forced_origins.size(1) - 1))
        hx = emb.new_zeros(B * K, self.hidden)
        cx = emb.new_zeros(B * K, self.hidden)
        gx = sw["sos"].expand(B * K, -1)
        hist_o = torch.full((B, K, T), W, dtype=torch.long, device=dev)
        hist_d = torch.full((B, K, T), W, dtype=torch.long, device=dev)
        used = torch.zeros((B, K, W), dtype=torch.long, device=dev)
        score = torch.zeros(B, K, dtype=torch.float64, device=dev)
        score[:, 1:] = NEG_INF
        trail: list[tuple[Tensor, Tensor, Tensor]] = []  # (parent, action, log-prob) per half-step

        def masked_logp(logits: Tensor, valid: Tensor) -> Tensor:
            empty = ~valid.any(-1, keepdim=True)  # dead hypotheses only: keep them finite
            return torch.log_softmax(logits.masked_fill(~(valid | empty), NEG_INF), -1)

        def expand(logp: Tensor, active: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            nonlocal score
            cand = score[..., None] + logp.double()
            top, idx = cand.reshape(B, K * W).topk(K, -1)
            keep = kidx.expand(B, K)
            parent = torch.where(active[:, None], idx // W, keep)
            a = torch.where(active[:, None], idx % W, 0)
            score = torch.where(active[:, None], top, score)
            lp = torch.where(active[:, None], logp[bidx[:, None], parent, a], 0.0)
            return parent, a, lp

        def reorder(parent: Tensor) -> None:
            nonlocal hx, cx, hist_o, hist_d, used
            flat = (bidx[:, None] * K + parent).reshape(-1)
            hx, cx = hx[flat], cx[flat]
            hist_o = hist_o.gather(1, parent[..., None].expand_as(hist_o))
            hist_d = hist_d.gather(1, parent[..., None].expand_as(hist_d))
            used = used.gather(1, parent[..., None].expand_as(used))

        def logits_of(h: Tensor) -> Tensor:
            return torch.bmm(h.view(B, K, -1), tied)

        for e in range(T):
            active = active_all[:, e]
            hseg = sw["head"][seg_all[:, e]].repeat_interleave(K, 0) if multi else None
            if multi and e > 0:
                used = torch.where(((within_all[:, e] == 0) & active)[:, None, None], 0, used)
            # origin
            hx, cx = self._cell(gx if hseg is None else gx + hseg, hx, cx, w_hh_t)
            if free:
                valid = real & (used < plan.cand_count[:, None])
                parent, o, lp_o = expand(masked_logp(logits_of(hx), valid), active)
                reorder(parent)
            else:
                assert sched is not None
                parent, o = kidx.expand(B, K), torch.where(active, sched[:, e], 0)[:, None].expand(B, K)
                lp_o = emb.new_zeros(B, K)
            trail.append((parent, o, lp_o))
            gx = x_proj[bidx[:, None], o].reshape(B * K, -1)
            # destination
            hx, cx = self._cell(gx if hseg is None else gx + hseg, hx, cx, w_hh_t)
            logits = logits_of(hx)
            if tied_dist:
                hv = hx.view(B, K, -1)
                for td, bk in zip(tied_dist, plan.buckets(o, hist_o[..., :e], hist_d[..., :e]), strict=False):
                    logits = logits + torch.gather(hv @ td, -1, bk.long())
            valid = real
            if plan.candidates is not None:
                valid = valid & plan.candidates(o)
            same = hist_o[..., :e] == o[..., None]
            if multi:
                same &= (seg_all[:, :e] == seg_all[:, e, None])[:, None]
            taken = torch.zeros(B, K, W + 1, dtype=torch.bool, device=dev)
            taken.scatter_(-1, torch.where(same, hist_d[..., :e], W), True)
            parent, d, lp_d = expand(masked_logp(logits, valid & ~taken[..., :W]), active)
            reorder(parent)
            o = o.gather(1, parent)
            trail.append((parent, d, lp_d))
            act = active[:, None].expand(B, K)
            hist_o[..., e] = torch.where(act, o, W)
            hist_d[..., e] = torch.where(act, d, W)
            used.scatter_add_(-1, o[..., None], act[..., None].long())
            gx = x_proj[bidx[:, None], d].reshape(B * K, -1)

        k = score.argmax(-1)
        origin, dest, lp = [], [], []
        for e in range(T - 1, -1, -1):
            par_d, d, lp_d = trail[2 * e + 1]
            dest.append(d[bidx, k])
            ld = lp_d[bidx, k]
            k = par_d[bidx, k]
            par_o, o, lp_o = trail[2 * e]
            origin.append(o[bidx, k])
            lp.append(ld + lp_o[bidx, k])
            k = par_o[bidx, k]
        return DecodeResult(origin=torch.stack(origin[::-1], 1), dest=torch.stack(dest[::-1], 1),
                            head=seg_all, log_prob=torch.stack(lp[::-1], 1), active=active_all)

