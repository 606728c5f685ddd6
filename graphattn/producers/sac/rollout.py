r"""The rollout of SAC's LSTM predictor (:meth:`~graphattn.producers.sac.lstm.LSTMEdgeDecoder.rollout`):
the choices, step by step, without autograd, recording per step the masks of invalid candidates and
the distance buckets that the scoring pass (:meth:`~graphattn.producers.sac.lstm.LSTMEdgeDecoder.score`)
replays with gradient.

One :class:`LSTMRollout` is one pass: every edge step :math:`e` is an origin step
(:meth:`~LSTMRollout.origin_step`; forced with all-nodes-connected) and a destination step
(:meth:`~LSTMRollout.destination_step`), then :meth:`~LSTMRollout.record` updates the repeat masks and
the history of predicted edges. All graphs of the batch advance in lock-step; a graph whose budget is
spent idles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.sac.decoding import NEG_INF, DecodePlan, Rollout, schedule_tables

if TYPE_CHECKING:
    from graphattn.producers.sac.lstm import LSTMEdgeDecoder


class LSTMRollout:
    """One rollout of ``decoder`` over ``plan`` (see :meth:`run`): ``mode`` ``"sample"`` (inverse CDF
    with pre-drawn uniforms, keyed by graph, step and origin/destination half — see
    :mod:`~graphattn.producers.keyed_random`), ``"greedy"`` or ``"forced"`` (``actions = (origin
    [B, T], dest [B, T])``). Rows are ``[B, ·]``, local node ids."""

    def __init__(self, decoder: LSTMEdgeDecoder, plan: DecodePlan, mode: str,
                 generator: torch.Generator | KeyedRandom | None,
                 actions: tuple[Tensor, Tensor] | None) -> None:
        self.decoder, self.plan, self.mode, self.generator, self.actions = \
            decoder, plan, mode, generator, actions
        self.B, self.W, _ = plan.emb.shape
        self.dev = plan.emb.device
        self.seg, self.within, self.active, self.T = schedule_tables(plan)
        self.free = plan.forced_origins is None  # origins are chosen (not the all-nodes schedule)
        self.multi = plan.segments > 1

    def run(self, want_entropy: bool = False) -> Rollout:
        """The choices of every step as a :class:`~graphattn.producers.sac.decoding.Rollout` (with the
        entropy of the choices if ``want_entropy``). Call under :func:`torch.no_grad`."""
        if self.T == 0:
            return self.empty()
        self.prepare()
        for e in range(self.T):
            self.start_step(e)
            o = self.origin_step(e)
            d = self.destination_step(e, o)
            self.record(e, o, d)
        roll = self.result()
        if want_entropy:
            roll.entropy = self.decoder.score(self.plan, roll, True)[1]
        return roll

    def empty(self) -> Rollout:
        """The rollout of a plan without edge steps."""
        B, W, dev = self.B, self.W, self.dev
        z = torch.zeros(B, 0, dtype=torch.long, device=dev)
        empty = torch.zeros(0, B, W, dtype=torch.bool, device=dev)
        return Rollout(z, z, z, self.plan.emb.new_zeros(B, 0), z.bool(), None,
                       None if not self.free else empty, empty, [])

    # ------------------------------------------------------------------------------ set-up
    def prepare(self) -> None:
        """The per-pass tables and state: the step weights, the origin schedule, the teacher-forced
        actions' checks, the masks of padding and of chosen pairs, the history of predicted edges,
        the uniforms of sampling and the LSTM state."""
        plan, B, W, T, dev = self.plan, self.B, self.W, self.T, self.dev
        self.sw = self.decoder.step_weights(plan.emb)
        self.bidx = torch.arange(B, device=dev)[:, None]
        self.sched = None
        if not self.free:
            assert plan.forced_origins is not None
            self.sched = plan.forced_origins.gather(
                1, self.within.clamp(max=plan.forced_origins.size(1) - 1))
        self.check_actions()
        self.not_real = torch.arange(W, device=dev)[None] >= plan.n[:, None]  # [B, W]
        bitmap = plan.no_repeat and B * W * W <= plan.max_dense
        self.chosen = torch.zeros(B, W, W, dtype=torch.bool, device=dev) if bitmap else None
        hist = plan.needs_history or (plan.no_repeat and not bitmap)
        self.hist_o = torch.full((B, T), W, dtype=torch.long, device=dev) if hist else None
        self.hist_d = torch.full((B, T), W, dtype=torch.long, device=dev) if hist else None
        self.used = torch.zeros(B, W, dtype=torch.long, device=dev) if (self.free and plan.no_repeat) \
            else None
        self.unif = self.uniforms() if self.mode == "sample" else None
        self.all_active = int(plan.budget.min()) * plan.segments if B else 0  # steps with no idle graph
        self.starts: set[int] = set()
        if self.multi:
            self.starts = set(((self.within == 0) & self.active).any(0).nonzero().view(-1).tolist())
        self.hx = plan.emb.new_zeros(B, self.decoder.hidden)
        self.cx = plan.emb.new_zeros(B, self.decoder.hidden)
        self.gx = self.sw["sos"].expand(B, -1)
        self.hseg: Tensor | None = None
        self.rec_o: list[Tensor] = []
        self.rec_d: list[Tensor] = []
        self.rec_lo: list[Tensor] = []
        self.rec_ld: list[Tensor] = []
        self.rec_io: list[Tensor] = []
        self.rec_id: list[Tensor] = []
        self.rec_b: list[list[Tensor]] = []

    def check_actions(self) -> None:
        """Teacher-forced actions must cover the budget and follow the all-nodes-connected schedule."""
        actions, B, T = self.actions, self.B, self.T
        if actions is None:
            return
        if actions[0].shape != (B, T) or actions[1].shape != (B, T):
            raise ValueError(f"teacher-forced actions must be [B, T] = [{B}, {T}] (the budget), got "
                             f"{list(actions[0].shape)} and {list(actions[1].shape)}")
        if self.sched is not None and not bool((~self.active | (actions[0] == self.sched)).all()):
            raise ValueError("teacher-forced origins differ from the all-nodes-connected schedule")

    def uniforms(self) -> Tensor:
        """``[T, 2, B, 1]`` uniforms of sampling, keyed by step, half (origin, destination) and graph."""
        rng = KeyedRandom.coerce(self.generator, self.dev)
        steps, halves = torch.arange(self.T, device=self.dev), torch.arange(2, device=self.dev)
        unif = rng.rows(steps[:, None, None], halves[None, :, None],
                        rng.graph_words(self.plan.n)[None, None, :]).uniform()[..., None]
        return unif * (1.0 - 1e-12)  # strictly below the total mass: never a zero-probability entry

    # ------------------------------------------------------------------------------- steps
    def start_step(self, e: int) -> None:
        """The head embedding of step ``e``; a new head segment clears the repeat masks (repeats are
        per segment)."""
        if not self.multi:
            return
        self.hseg = self.sw["head"][self.seg[:, e]]
        if e in self.starts and e > 0:
            fresh = self.within[:, e] == 0
            if self.chosen is not None:
                self.chosen[fresh] = False
            if self.used is not None:
                self.used[fresh] = 0

    def advance(self) -> None:
        """One LSTM step on the current input projection (plus the segment's head embedding)."""
        gx = self.gx if self.hseg is None else self.gx + self.hseg
        self.hx, self.cx = self.decoder.cell(gx, self.hx, self.cx, self.sw["w_hh_t"])

    def origin_step(self, e: int) -> Tensor:
        """``o [B, 1]``: the origin of step ``e`` (chosen among the nodes with candidates left, or the
        schedule's)."""
        self.advance()
        if self.free:
            logits = torch.bmm(self.hx[:, None], self.sw["tied"])[:, 0]
            invalid = self.not_real
            if self.used is not None:  # origins whose candidates are all taken
                invalid = invalid | (self.used >= self.plan.cand_count)
            invalid = self.finite(invalid, e)
            logp = torch.log_softmax(logits.masked_fill(invalid, NEG_INF), -1)
            o = self.choose(logp, e, 0, None if self.actions is None else self.actions[0][:, e:e + 1])
            self.rec_lo.append(logp.gather(1, o))
            self.rec_io.append(invalid)
        else:
            assert self.sched is not None
            o = self.sched[:, e:e + 1]
        self.gx = self.sw["x_proj"][self.bidx, o][:, 0]
        return o

    def destination_step(self, e: int, o: Tensor) -> Tensor:
        """``d [B, 1]``: the destination of step ``e`` from the origins ``o``, over the logits plus the
        distance embeddings, among the valid candidates."""
        self.advance()
        logits = self.destination_logits(e, o)
        invalid = self.finite(self.destination_invalid(e, o), e)
        logp = torch.log_softmax(logits.masked_fill(invalid, NEG_INF), -1)
        d = self.choose(logp, e, 1, None if self.actions is None else self.actions[1][:, e:e + 1])
        self.rec_ld.append(logp.gather(1, d))
        self.rec_id.append(invalid)
        return d

    def destination_logits(self, e: int, o: Tensor) -> Tensor:
        """``[B, W]`` logits of the destination step: the tied output embeddings plus the learned
        distance embeddings of the origins' buckets (recorded for the scoring pass)."""
        logits = torch.bmm(self.hx[:, None], self.sw["tied"])[:, 0]
        tied_dist = self.sw["tied_dist"]
        if tied_dist:
            hist_o, hist_d = self.hist_o, self.hist_d
            hb = (hist_o[:, None, :e], hist_d[:, None, :e]) if hist_o is not None and \
                hist_d is not None else (o[..., :0], o[..., :0])
            bks = [bk[:, 0] for bk in self.plan.buckets(o, *hb)]
            for td, bk in zip(tied_dist, bks, strict=False):
                logits = logits + torch.gather(self.hx @ td, 1, bk.long())
            self.rec_b.append([bk.to(torch.uint8) for bk in bks])
        return logits

    def destination_invalid(self, e: int, o: Tensor) -> Tensor:
        """``[B, W]`` invalid destinations of the origins ``o``: padding, outside the candidate
        pattern, and (``no_repeat``) the pairs already predicted in this head segment."""
        plan, bidx = self.plan, self.bidx
        invalid = self.not_real
        if plan.candidates is not None:
            invalid = invalid | ~plan.candidates(o)[:, 0]
        if self.chosen is not None:
            invalid = invalid | self.chosen[bidx, o][:, 0]
        elif plan.no_repeat:
            assert self.hist_o is not None and self.hist_d is not None
            same = self.hist_o[:, :e] == o
            if self.multi:
                same &= self.seg[:, :e] == self.seg[:, e:e + 1]
            taken = torch.zeros(self.B, self.W + 1, dtype=torch.bool, device=self.dev)
            taken.scatter_(1, torch.where(same, self.hist_d[:, :e], self.W), True)
            invalid = invalid | taken[:, :self.W]
        return invalid

    def record(self, e: int, o: Tensor, d: Tensor) -> None:
        """Marks the pair ``(o, d)`` of step ``e`` as chosen, appends it to the history and feeds the
        destination to the next step."""
        if self.chosen is not None:
            self.chosen[self.bidx, o, d] = True
        if self.used is not None:
            self.used[self.bidx, o] += 1
        if self.hist_o is not None and self.hist_d is not None:
            act = self.active[:, e:e + 1]
            self.hist_o[:, e:e + 1] = torch.where(act, o, self.W)
            self.hist_d[:, e:e + 1] = torch.where(act, d, self.W)
        self.gx = self.sw["x_proj"][self.bidx, d][:, 0]
        self.rec_o.append(o)
        self.rec_d.append(d)

    def choose(self, logp: Tensor, step: int, half: int, forced: Tensor | None) -> Tensor:
        """``[B, 1]`` choices from the log-probabilities ``logp [B, W]``: ``forced``, the argmax, or
        the inverse CDF at the pre-drawn uniform of (``step``, ``half``)."""
        if forced is not None:
            return forced
        if self.unif is None:
            return logp.argmax(-1, keepdim=True)
        c = torch.cumsum(logp.exp(), -1, dtype=torch.float64)
        return torch.searchsorted(c, self.unif[step, half] * c[:, -1:], right=True)

    def finite(self, invalid: Tensor, e: int) -> Tensor:
        """``invalid`` with the rows of idle graphs (budget spent at step ``e``) left finite (their
        choices are never used)."""
        if e >= self.all_active:
            invalid = invalid & self.active[:, e:e + 1]
        return invalid

    # ------------------------------------------------------------------------------ result
    def result(self) -> Rollout:
        """The recorded choices, their log-probabilities (0 in unused slots), masks and buckets."""
        lp = torch.cat(self.rec_ld, 1)
        if self.rec_lo:
            lp = lp + torch.cat(self.rec_lo, 1)
        lp = torch.where(self.active, lp, torch.zeros_like(lp))
        rec_b = self.rec_b
        buckets = [torch.stack([b[i] for b in rec_b]) for i in range(len(self.sw["tied_dist"]))] \
            if rec_b else []
        return Rollout(origin=torch.cat(self.rec_o, 1), dest=torch.cat(self.rec_d, 1), head=self.seg,
                       log_prob=lp, active=self.active, entropy=None,
                       invalid_origin=torch.stack(self.rec_io) if self.rec_io else None,
                       invalid_dest=torch.stack(self.rec_id), buckets=buckets)
