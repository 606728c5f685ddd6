r"""SAMSA's sampling algorithm: Gumbel noise, the pairwise-sigmoid relaxation of top-:math:`k`
sampling without replacement (soft and hard slots with their custom gradients) and the selection
record. The producer (:class:`~graphattn.producers.samsa.producer.SAMSA`) runs them; see its docstring and
``docs/samsa.md`` for the math.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from graphattn.producers._util import rand

#: the official code's constants: ``-log(-log(U + 1e-20) + 1e-20)`` Gumbel noise
GUMBEL_EPS = 1e-20
#: the largest sigmoid slope: the clamp rescales per head so that ``max s' <= 0.25``
SLOPE_CAP = 0.25



def gumbel_noise(shape: tuple[int, ...], *, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> Tensor:
    r"""Standard Gumbel noise :math:`g = -\log(-\log(U + 10^{-20}) + 10^{-20})`,
    :math:`U \sim \mathcal{U}[0, 1)` (mean :math:`\gamma \approx 0.5772`, variance
    :math:`\pi^2/6`). The noise is never scaled by the temperature."""
    return gumbel_from_uniform(rand(shape, generator, dtype=dtype, device=device))


def gumbel_from_uniform(u: Tensor) -> Tensor:
    """Gumbel(0, 1) noise from uniform ``u`` (the official code's epsilons)."""
    return -torch.log(-torch.log(u + GUMBEL_EPS) + GUMBEL_EPS)


#: first key words of the nodes' and the support slots' noise (:meth:`SAMSA._draw_noise`)
NODE_TAG, SUPPORT_TAG = 0x90DE, 0x5EB


def _slope(z_top: Tensor, z_bot: Tensor, pair_valid: Tensor, tau: float, clamp: bool,
           eps: float) -> tuple[Tensor, Tensor]:
    r"""``(p, s')`` of the pairwise proxy: :math:`p_{ij} = \sigma((z_{T_i} - z_{R_j})/\tau)` (1 for
    a missing competitor) and its slope :math:`s'_{ij} = p_{ij}(1-p_{ij})/\tau` (0 for a missing
    pair), rescaled per head by :math:`\min(m_h, 1/4)/\max(m_h, \epsilon)`, :math:`m_h = \max s'`
    over every graph and pair of head :math:`h`, if ``clamp`` (a no-op for :math:`\tau \ge 1`)."""
    p = torch.sigmoid((z_top.unsqueeze(-1) - z_bot.unsqueeze(-2)) / tau)
    p = torch.where(pair_valid, p, torch.ones_like(p))
    s = p * (1 - p) / tau  # 0 where p == 1
    if clamp and s.numel():
        m = s.amax(dim=(0, 2, 3), keepdim=True)  # per head, over the whole batch (official)
        s = s * (m.clamp(max=SLOPE_CAP) / m.clamp(min=eps))
    return p, s


class _PairSigmoid(torch.autograd.Function):
    """``p`` of :func:`_slope` with the (optionally clamped) slope as its derivative."""

    @staticmethod
    def forward(ctx: Any, z_top: Tensor, z_bot: Tensor, pair_valid: Tensor, tau: float,
                clamp: bool, eps: float) -> Tensor:
        p, s = _slope(z_top, z_bot, pair_valid, tau, clamp, eps)
        ctx.save_for_backward(s)
        return p

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (s,) = ctx.saved_tensors
        g = grad * s  # d p_ij / d (z_T_i - z_R_j)
        return g.sum(-1), -g.sum(-2), None, None, None, None


class _HardSlots(torch.autograd.Function):
    r"""Hard slots with the straight-through proxy gradient (the official ``HardChooseDenseGrad``).

    Forward: ``x_top`` exactly. Backward, with :math:`G_i` the incoming gradient of slot :math:`i`
    and :math:`a_{ij} = G_i \cdot (x_{T_i} - x_{R_j})`:
    :math:`\partial x_{T_i} = G_i`, :math:`\partial x_{R_j} = 0`,
    :math:`\partial z_{T_i} = \frac1k \sum_j s'_{ij} a_{ij}`,
    :math:`\partial z_{R_j} = -\frac1k \sum_i s'_{ij} a_{ij}` — the gradient of the soft proxy
    :math:`\bar p_i x_{T_i} + \frac1k\sum_j (1-p_{ij}) x_{R_j}` with respect to the scores only.
    """

    @staticmethod
    def forward(ctx: Any, x_top: Tensor, x_bot: Tensor, z_top: Tensor, z_bot: Tensor,
                pair_valid: Tensor, tau: float, clamp: bool, eps: float) -> Tensor:
        ctx.save_for_backward(x_top, x_bot, z_top, z_bot, pair_valid)
        ctx.tau, ctx.clamp, ctx.eps = tau, clamp, eps
        return x_top.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x_top, x_bot, z_top, z_bot, pair_valid = ctx.saved_tensors
        dz_top = dz_bot = None
        if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
            _, s = _slope(z_top, z_bot, pair_valid, ctx.tau, ctx.clamp, ctx.eps)
            g = grad.to(s.dtype)
            a = (g * x_top.to(s.dtype)).sum(-1, keepdim=True) - g @ x_bot.to(s.dtype).transpose(-1, -2)
            w = s * a / max(x_top.size(-2), 1)
            dz_top, dz_bot = w.sum(-1), -w.sum(-2)
        dx_top = grad if ctx.needs_input_grad[0] else None
        return dx_top, None, dz_top, dz_bot, None, None, None, None


def hard_slots(x_top: Tensor, x_bot: Tensor, z_top: Tensor, z_bot: Tensor,
               pair_valid: Tensor | None = None, *, tau: float = 1.0, clamp: bool = True,
               eps: float = 1e-12) -> Tensor:
    """Hard slot features ``[..., k, F]`` (forward ``x_top``) with the proxy's score gradient.

    ``x_top [..., k, F]``, ``x_bot [..., k, F]``, ``z_top``, ``z_bot [..., k]``; ``pair_valid
    [..., k, k]`` marks existing (top, bottom) pairs. Leading dims are ``[B, H]`` (the clamp's max
    runs over dims 0, 2, 3 per head, dim 1)."""
    if pair_valid is None:
        pair_valid = torch.ones(z_top.shape + z_bot.shape[-1:], dtype=torch.bool,
                                device=z_top.device)
    return _HardSlots.apply(x_top, x_bot, z_top, z_bot, pair_valid, tau, clamp, eps)


def soft_slots(x_top: Tensor, x_bot: Tensor, z_top: Tensor, z_bot: Tensor,
               pair_valid: Tensor | None = None, *, tau: float = 1.0, clamp: bool = True,
               eps: float = 1e-12) -> Tensor:
    r"""Soft slot features :math:`\bar p_i x_{T_i} + \frac1k \sum_j (1 - p_{ij}) x_{R_j}`
    (convex weights), exact autograd except for the optional slope clamp."""
    if pair_valid is None:
        pair_valid = torch.ones(z_top.shape + z_bot.shape[-1:], dtype=torch.bool,
                                device=z_top.device)
    p = _PairSigmoid.apply(z_top, z_bot, pair_valid, tau, clamp, eps)
    k = max(x_top.size(-2), 1)
    w_top = (p.sum(-1, keepdim=True) / k).to(x_top.dtype)
    w_bot = ((1 - p) / k).to(x_top.dtype)
    return w_top * x_top + w_bot @ x_bot


# --------------------------------------------------------------------------------- selection
@dataclass
class SamsaSelection:
    """The sampler's decisions for a batch of ``B`` graphs, ``H`` heads and ``k`` slots.

    Attributes:
        top, bottom: ``[B, H, k]`` candidate ids of the selected (top-:math:`k`) and the competing
            (next :math:`k`) candidates: real nodes ``0..N-1``, support token ``s`` of head ``h`` as
            ``N + h·S + s``, ``-1`` for a missing candidate.
        top_valid, bottom_valid: ``[B, H, k]`` whether the candidate exists.
        z_top, z_bottom: ``[B, H, k]`` their (noisy) scores, differentiable.
        num_nodes, num_support: ``N`` and ``S``.
    """

    top: Tensor
    bottom: Tensor
    top_valid: Tensor
    bottom_valid: Tensor
    z_top: Tensor
    z_bottom: Tensor
    num_nodes: int
    num_support: int

    @property
    def k(self) -> int:
        return int(self.top.size(-1))

    @property
    def top_is_support(self) -> Tensor:
        return self.top >= self.num_nodes

    @property
    def pair_valid(self) -> Tensor:
        return self.top_valid.unsqueeze(-1) & self.bottom_valid.unsqueeze(-2)
