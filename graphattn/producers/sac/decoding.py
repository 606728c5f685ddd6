r"""The records of SAC's LSTM decoding (:mod:`graphattn.producers.sac`), shared by the predictor
(:mod:`~graphattn.producers.sac.lstm`), its rollout (:mod:`~graphattn.producers.sac.rollout`) and beam
search (:mod:`~graphattn.producers.sac.beam`):

* :class:`DecodePlan` — what one decoding pass needs (built by
  :func:`graphattn.producers.sac.paths.run_lstm`); :class:`DecodeResult` — what it returns;
  :class:`Rollout` — a result plus the per-step masks and buckets of the scoring pass;
* :func:`schedule_tables` — the head segment and slot of every edge step;
* :func:`row_entropy` and :data:`NEG_INF`, shared with :mod:`~graphattn.producers.sac.parallel`.

Everything works on the padded per-graph layout ``[B, W, ·]`` (``W`` = largest graph), local node ids
``0 .. n_b - 1``; padding is never a candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

NEG_INF = float("-inf")


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


def schedule_tables(plan: DecodePlan) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(segment [B, T], slot within segment [B, T], active [B, T], T)`` of every edge slot."""
    bud = plan.budget.clamp(min=1)
    total = plan.budget * plan.segments
    T = int(total.max()) if total.numel() else 0
    e = torch.arange(T, device=bud.device)[None]
    seg = torch.div(e, bud[:, None], rounding_mode="floor").clamp(max=plan.segments - 1)
    within = e - seg * bud[:, None]
    return seg, within, e < total[:, None], T
