r"""SAC's parallel edge policy (a **deviation** for large graphs; used by
:class:`graphattn.producers.sac.SAC` with ``policy="parallel"``; no attention arithmetic).

* :class:`ParallelEdgePolicy` — every origin draws its destinations independently of the other
  origins (no recurrence), over all nodes of its graph (:meth:`~ParallelEdgePolicy.chunk`, padded
  layout ``[B, W, ·]``) or over explicit candidate lists (:meth:`~ParallelEdgePolicy.sparse_chunk`),
  chunked over origins with recomputation in the backward pass.

The producer's side (chunking the origins, candidate masks, distance buckets, the per-graph layout of
the draws) is :func:`graphattn.producers.sac.paths.run_parallel`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from graphattn.producers.keyed_random import KeyedRows
from graphattn.producers.sac.decoding import NEG_INF, row_entropy

#: key word of the parallel policy's draws with replacement (:meth:`ParallelEdgePolicy._draw`)
_WITH_REPLACEMENT = 0x3A7


class ParallelEdgePolicy(nn.Module):
    r"""**Deviation** (not in the paper): the per-origin policy for graphs too large for the
    sequential predictor. Every origin :math:`i` draws :math:`a_i` destinations independently of the
    other origins:

    .. math::
        p(j \mid i) = \operatorname{softmax}_{j \in \mathcal{C}(i)}
            \frac{(W_q w_i + c_m)^{\top}\big(w_j + \textstyle\sum_s u^{(s)}_{\delta_s(i, j)}\big)}{\sqrt{D}},

    with replacement (i.i.d. draws, ``no_repeat=False``) or without (sequential draws with the chosen
    destinations removed, i.e. Gumbel-top-:math:`a_i`; the log-probability of the ordered draws is the
    Plackett–Luce product). Greedy decoding takes the :math:`a_i` most likely destinations (the exact
    most likely ordered draw without replacement). Origins are processed in chunks whose logits are
    recomputed in the backward pass (activation checkpointing), so memory stays
    :math:`O(\text{chunk}\cdot W)` instead of :math:`O(N^2)`.

    Args:
        embed_dim (int): :math:`D`.
        bucket_sizes (list[int]): buckets of every distance table.
        num_segments (int): per-head query offsets :math:`c_m` (head-adaptive; 0: off).
    """

    def __init__(self, embed_dim: int, bucket_sizes: list[int], num_segments: int = 0) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.query = nn.Linear(embed_dim, embed_dim, bias=False)
        self.dist = nn.ParameterList([nn.Parameter(torch.empty(b, embed_dim)) for b in bucket_sizes])
        self.head_q = nn.Parameter(torch.empty(num_segments, embed_dim)) if num_segments else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.query.reset_parameters()
        for u in self.dist:
            nn.init.normal_(u, std=0.1)
        if self.head_q is not None:
            nn.init.normal_(self.head_q, std=0.1)

    def _dist_logits(self, logits: Tensor, q: Tensor, buckets: list[Tensor]) -> Tensor:
        for u, b in zip(self.dist, buckets, strict=False):
            logits = logits + torch.gather(q @ u.t().to(q.dtype), -1, b.long())
        return logits / math.sqrt(self.embed_dim)

    def chunk(self, q: Tensor, emb: Tensor, *, masks: Callable[[], tuple[Tensor, list[Tensor], Tensor]],
              num_draws: int, mode: str, no_repeat: bool, keys: Tensor | None, forced: Tensor | None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Draws for one chunk of ``C`` origins with queries ``q [B, C, D]`` over all ``W`` nodes of
        their graph. ``masks()`` gives the candidates ``valid [B, C, W]``, the distance buckets and
        the draws per origin ``[B, C]`` (it is called again when the chunk is recomputed in the
        backward pass). Returns ``[B, C, A]`` tensors (``A = num_draws``): destinations, their
        log-probabilities (0 in unused slots), the used-slot mask, the entropy of the origin's
        distribution, and the first distance bucket of each draw (0 without distance encoding).
        ``keys [B, C]``: the origins' keys for sampling (:class:`~graphattn.producers.keyed_random.
        KeyedRows`; the uniforms of origin ``(b, c)`` depend on its key only)."""
        valid, buckets, per_origin = masks()
        logits = self._dist_logits(torch.bmm(q, emb.transpose(1, 2)), q, buckets)
        return self._draw(logits, valid, buckets, per_origin, num_draws, mode, no_repeat, keys, forced)

    def sparse_chunk(self, q: Tensor, nodes: Tensor, cand: Tensor, buckets: list[Tensor], per_origin: Tensor,
                     *, num_draws: int, mode: str, no_repeat: bool, keys: Tensor | None
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """As :meth:`chunk` for explicit candidate lists: origins with queries ``q [C, D]``, candidates
        ``cand [C, M]`` (global ids into ``nodes [N, D]``, ``-1`` = none) and their buckets; the draws
        are positions in the list; ``keys [1, C]``. Returns ``[1, C, A]`` tensors."""
        valid = cand >= 0
        kv = nodes.index_select(0, cand.clamp(min=0).view(-1)).view(*cand.shape, -1)  # [C, M, D]
        logits = self._dist_logits(torch.einsum("cd,cmd->cm", q, kv), q, buckets)
        return self._draw(logits[None], valid[None], [b[None] for b in buckets], per_origin[None],
                          num_draws, mode, no_repeat, keys, None)

    def _draw(self, logits: Tensor, valid: Tensor, buckets: list[Tensor], per_origin: Tensor, A: int,
              mode: str, no_repeat: bool, keys: Tensor | None, forced: Tensor | None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        B, C, W = logits.shape
        dev = logits.device
        empty = ~valid.any(-1, keepdim=True)
        first = torch.zeros_like(valid)
        first[..., 0] = True
        valid = valid | (empty & first)
        masked = logits.masked_fill(~valid, NEG_INF)
        slot = torch.arange(A, device=dev) < per_origin[..., None]  # [B, C, A]
        with torch.no_grad():
            if forced is not None:
                draws = forced
            elif mode == "greedy":
                draws = masked.topk(min(A, W), -1).indices
            elif mode == "sample":
                if keys is None:
                    raise ValueError("sampling needs the origins' 'keys'")
                rows = KeyedRows(keys[..., None])
                if no_repeat:  # Gumbel top-A: A draws without replacement
                    u = rows.uniform(torch.arange(W, device=dev), dtype=masked.dtype)
                    gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
                    draws = (masked + gumbel).topk(min(A, W), -1).indices
                else:  # A inverse-CDF draws with replacement
                    c = torch.softmax(masked, -1).to(torch.float64).cumsum(-1)
                    u = rows.uniform(_WITH_REPLACEMENT, torch.arange(A, device=dev)) * (1.0 - 1e-12)
                    draws = torch.searchsorted(c, u * c[..., -1:], right=True).clamp_(max=W - 1)
            else:
                raise ValueError(f"unknown decoding mode {mode!r} for the parallel policy")
            if draws.size(-1) < A:
                draws = torch.cat([draws, draws.new_zeros(B, C, A - draws.size(-1))], -1)
            draws = torch.where(slot, draws, 0)
        if no_repeat:
            lps = []
            removed = torch.zeros_like(valid)
            for k in range(A):
                rem = valid & ~removed
                # rows with nothing left only occur in unused slots: keep them finite (no NaN grads)
                cur = torch.where(rem.any(-1, keepdim=True), masked.masked_fill(~rem, NEG_INF), logits)
                lps.append(cur.gather(-1, draws[..., k:k + 1]).squeeze(-1) - torch.logsumexp(cur, -1))
                removed = removed | (F.one_hot(draws[..., k], W).bool() & slot[..., k:k + 1])
            lp = torch.stack(lps, -1)
        else:
            lp = torch.log_softmax(masked, -1).gather(-1, draws)
        lp = torch.where(slot, lp, torch.zeros_like(lp))
        ent = row_entropy(torch.log_softmax(masked, -1))[..., None].expand(B, C, A)
        ent = torch.where(slot, ent, torch.zeros_like(ent))
        hop = buckets[0].gather(-1, draws).long() if buckets else torch.zeros_like(draws)
        return draws, lp, slot, ent, hop

    def run_chunk(self, *args: Any, grad: bool, sparse: bool = False, **kwargs: Any) -> tuple[Tensor, ...]:
        """:meth:`chunk` (or :meth:`sparse_chunk`), checkpointed when gradients are needed."""
        fn = self.sparse_chunk if sparse else self.chunk
        if grad:
            return checkpoint(fn, *args, use_reentrant=False, **kwargs)
        return fn(*args, **kwargs)
