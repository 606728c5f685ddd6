r"""Beam search of SAC's LSTM predictor (:meth:`~graphattn.producers.sac.lstm.LSTMEdgeDecoder.beam`,
the paper's test-time decoding): ``K`` hypotheses per graph, extended by every candidate and cut back to
the ``K`` best total log-probabilities; the best final hypothesis is followed back through its parents.
Repeats are always forbidden (scanning each hypothesis' history).

One :class:`BeamSearch` is one pass: every edge step is an origin half-step (:meth:`~BeamSearch.origin`)
and a destination half-step (:meth:`~BeamSearch.destination`), each an :meth:`~BeamSearch.expand` of the
hypotheses and a :meth:`~BeamSearch.reorder` of their state; :meth:`~BeamSearch.backtrack` reads the
best sequence off the trail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from graphattn.producers.sac.decoding import NEG_INF, DecodePlan, DecodeResult, schedule_tables

if TYPE_CHECKING:
    from graphattn.producers.sac.lstm import LSTMEdgeDecoder


class BeamSearch:
    """Beam search with ``K`` hypotheses of ``decoder`` over ``plan`` (see :meth:`run`). Hypothesis
    rows are ``[B, K, ·]`` (the LSTM state ``[B·K, hidden]``), local node ids."""

    def __init__(self, decoder: LSTMEdgeDecoder, plan: DecodePlan, K: int) -> None:
        self.decoder, self.plan, self.K = decoder, plan, K
        self.B, self.W, _ = plan.emb.shape
        self.dev = plan.emb.device
        self.seg, self.within, self.active, self.T = schedule_tables(plan)
        self.free = plan.forced_origins is None
        self.multi = plan.segments > 1

    def run(self) -> DecodeResult:
        """The best sequence of origin and destination choices per graph. Call under
        :func:`torch.no_grad`."""
        B, T = self.B, self.T
        if T == 0:
            z = torch.zeros(B, 0, dtype=torch.long, device=self.dev)
            return DecodeResult(z, z, z, self.plan.emb.new_zeros(B, 0), z.bool())
        self.prepare()
        for e in range(T):
            active = self.active[:, e]
            hseg = self.sw["head"][self.seg[:, e]].repeat_interleave(self.K, 0) if self.multi else None
            if self.multi and e > 0:
                self.used = torch.where(((self.within[:, e] == 0) & active)[:, None, None], 0, self.used)
            o = self.origin(e, active, hseg)
            self.destination(e, o, active, hseg)
        return self.backtrack()

    def prepare(self) -> None:
        """The step weights, the origin schedule and the hypotheses' state: LSTM state, history of
        predicted edges, origin use counts, total scores (one live hypothesis per graph) and the
        trail of (parent, action, log-probability) per half-step."""
        plan, B, W, T, K, dev = self.plan, self.B, self.W, self.T, self.K, self.dev
        self.sw = self.decoder.step_weights(plan.emb)
        self.bidx = torch.arange(B, device=dev)
        self.kidx = torch.arange(K, device=dev)
        self.real = (torch.arange(W, device=dev)[None] < plan.n[:, None])[:, None]  # [B, 1, W]
        self.sched = None
        if not self.free:
            assert plan.forced_origins is not None
            self.sched = plan.forced_origins.gather(
                1, self.within.clamp(max=plan.forced_origins.size(1) - 1))
        self.hx = plan.emb.new_zeros(B * K, self.decoder.hidden)
        self.cx = plan.emb.new_zeros(B * K, self.decoder.hidden)
        self.gx = self.sw["sos"].expand(B * K, -1)
        self.hist_o = torch.full((B, K, T), W, dtype=torch.long, device=dev)
        self.hist_d = torch.full((B, K, T), W, dtype=torch.long, device=dev)
        self.used = torch.zeros((B, K, W), dtype=torch.long, device=dev)
        self.score = torch.zeros(B, K, dtype=torch.float64, device=dev)
        self.score[:, 1:] = NEG_INF
        self.trail: list[tuple[Tensor, Tensor, Tensor]] = []  # (parent, action, log-prob) per half-step

    # ------------------------------------------------------------------------------ half-steps
    def origin(self, e: int, active: Tensor, hseg: Tensor | None) -> Tensor:
        """``o [B, K]``: the origins of step ``e`` (expanded over the nodes with candidates left, or
        the schedule's)."""
        B, K = self.B, self.K
        self.advance(hseg)
        if self.free:
            valid = self.real & (self.used < self.plan.cand_count[:, None])
            parent, o, lp_o = self.expand(self.masked_logp(self.logits(self.hx), valid), active)
            self.reorder(parent)
        else:
            assert self.sched is not None
            parent, o = self.kidx.expand(B, K), torch.where(active, self.sched[:, e], 0)[:, None].expand(B, K)
            lp_o = self.plan.emb.new_zeros(B, K)
        self.trail.append((parent, o, lp_o))
        self.gx = self.sw["x_proj"][self.bidx[:, None], o].reshape(B * K, -1)
        return o

    def destination(self, e: int, o: Tensor, active: Tensor, hseg: Tensor | None) -> None:
        """The destinations of step ``e`` from the origins ``o``, never repeating a pair of the
        hypothesis' head segment; updates the history and the origin use counts."""
        B, K, W, plan = self.B, self.K, self.W, self.plan
        self.advance(hseg)
        logits = self.logits(self.hx)
        tied_dist = self.sw["tied_dist"]
        if tied_dist:
            hv = self.hx.view(B, K, -1)
            buckets = plan.buckets(o, self.hist_o[..., :e], self.hist_d[..., :e])
            for td, bk in zip(tied_dist, buckets, strict=False):
                logits = logits + torch.gather(hv @ td, -1, bk.long())
        valid = self.real
        if plan.candidates is not None:
            valid = valid & plan.candidates(o)
        same = self.hist_o[..., :e] == o[..., None]
        if self.multi:
            same &= (self.seg[:, :e] == self.seg[:, e, None])[:, None]
        taken = torch.zeros(B, K, W + 1, dtype=torch.bool, device=self.dev)
        taken.scatter_(-1, torch.where(same, self.hist_d[..., :e], W), True)
        parent, d, lp_d = self.expand(self.masked_logp(logits, valid & ~taken[..., :W]), active)
        self.reorder(parent)
        o = o.gather(1, parent)
        self.trail.append((parent, d, lp_d))
        act = active[:, None].expand(B, K)
        self.hist_o[..., e] = torch.where(act, o, W)
        self.hist_d[..., e] = torch.where(act, d, W)
        self.used.scatter_add_(-1, o[..., None], act[..., None].long())
        self.gx = self.sw["x_proj"][self.bidx[:, None], d].reshape(B * K, -1)

    def advance(self, hseg: Tensor | None) -> None:
        """One LSTM step of every hypothesis (plus the segment's head embedding)."""
        gx = self.gx if hseg is None else self.gx + hseg
        self.hx, self.cx = self.decoder.cell(gx, self.hx, self.cx, self.sw["w_hh_t"])

    def logits(self, h: Tensor) -> Tensor:
        """``[B, K, W]`` logits of the tied output embeddings."""
        return torch.bmm(h.view(self.B, self.K, -1), self.sw["tied"])

    @staticmethod
    def masked_logp(logits: Tensor, valid: Tensor) -> Tensor:
        """Log-softmax over the ``valid`` entries (a dead hypothesis, with none, stays finite)."""
        empty = ~valid.any(-1, keepdim=True)  # dead hypotheses only: keep them finite
        return torch.log_softmax(logits.masked_fill(~(valid | empty), NEG_INF), -1)

    def expand(self, logp: Tensor, active: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(parent, action, log-prob)`` ``[B, K]`` of the ``K`` best extensions of the hypotheses
        by one choice (graphs whose budget is spent keep their hypotheses); updates the scores."""
        B, K, W = self.B, self.K, self.W
        cand = self.score[..., None] + logp.double()
        top, idx = cand.reshape(B, K * W).topk(K, -1)
        keep = self.kidx.expand(B, K)
        parent = torch.where(active[:, None], idx // W, keep)
        a = torch.where(active[:, None], idx % W, 0)
        self.score = torch.where(active[:, None], top, self.score)
        lp = torch.where(active[:, None], logp[self.bidx[:, None], parent, a], 0.0)
        return parent, a, lp

    def reorder(self, parent: Tensor) -> None:
        """The hypotheses' state taken from their ``parent`` hypotheses."""
        flat = (self.bidx[:, None] * self.K + parent).reshape(-1)
        self.hx, self.cx = self.hx[flat], self.cx[flat]
        self.hist_o = self.hist_o.gather(1, parent[..., None].expand_as(self.hist_o))
        self.hist_d = self.hist_d.gather(1, parent[..., None].expand_as(self.hist_d))
        self.used = self.used.gather(1, parent[..., None].expand_as(self.used))

    def backtrack(self) -> DecodeResult:
        """The best final hypothesis of every graph, followed back through the trail."""
        bidx = self.bidx
        k = self.score.argmax(-1)
        origin, dest, lp = [], [], []
        for e in range(self.T - 1, -1, -1):
            par_d, d, lp_d = self.trail[2 * e + 1]
            dest.append(d[bidx, k])
            ld = lp_d[bidx, k]
            k = par_d[bidx, k]
            par_o, o, lp_o = self.trail[2 * e]
            origin.append(o[bidx, k])
            lp.append(ld + lp_o[bidx, k])
            k = par_o[bidx, k]
        return DecodeResult(origin=torch.stack(origin[::-1], 1), dest=torch.stack(dest[::-1], 1),
                            head=self.seg, log_prob=torch.stack(lp[::-1], 1), active=self.active)
