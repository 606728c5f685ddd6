r"""SAC's autoregressive edge predictor (used by :class:`graphattn.producers.sac.SAC` with
``policy="lstm"``; no attention arithmetic).

* :class:`LSTMEdgeDecoder` — the paper's predictor (SAC §4.1): a single-layer LSTM that alternates
  origin and destination predictions, batched in lock-step over the graphs of a batch, with sampling,
  greedy, teacher-forced and beam-search decoding. Its rollout is
  :mod:`~graphattn.producers.sac.rollout`, its beam search :mod:`~graphattn.producers.sac.beam`, the
  records they exchange (:class:`~graphattn.producers.sac.decoding.DecodePlan`, ...)
  :mod:`~graphattn.producers.sac.decoding`.

The distance buckets the plan hands in are :mod:`graphattn.producers.sac.distances`.

Everything works on the padded per-graph layout ``[B, W, ·]`` (``W`` = largest graph), local node ids
``0 .. n_b - 1``; padding is never a candidate. Rows are ``[B, K]`` (``K`` = beam width, 1 otherwise).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.sac.beam import BeamSearch
from graphattn.producers.sac.decoding import NEG_INF, DecodePlan, DecodeResult, Rollout, row_entropy
from graphattn.producers.sac.rollout import LSTMRollout


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
    def step_weights(self, emb: Tensor) -> dict[str, Any]:
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

    def cell(self, gx: Tensor, h: Tensor, c: Tensor, w_hh_t: Tensor) -> tuple[Tensor, Tensor]:
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
        masks for :meth:`score` (:class:`~graphattn.producers.sac.rollout.LSTMRollout`)."""
        return LSTMRollout(self, plan, mode, generator, actions).run(want_entropy)

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
        are always forbidden (scanning each hypothesis' history;
        :class:`~graphattn.producers.sac.beam.BeamSearch`)."""
        return BeamSearch(self, plan, K).run()
