r"""Converter's node networks (:mod:`graphattn.producers.converter`): :class:`ScaleNorm` (also the
``converter`` model preset's norm) and the two-layer :class:`Siren` that maps node features to the
Givens angles and eigen-phases.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from graphattn.producers._util import rand
from graphattn.producers.base import check_positive_int


def _dropout(x: Tensor, p: float, training: bool, generator: torch.Generator | None) -> Tensor:
    """Inverted dropout drawing its mask from ``generator`` (``None``: the global RNG)."""
    if not training or p == 0.0:
        return x
    keep = rand(tuple(x.shape), generator, device=x.device, dtype=x.dtype) >= p
    return x * keep / (1.0 - p)


class ScaleNorm(nn.Module):
    r"""ScaleNorm with a per-feature gain (Nguyen & Salazar use a scalar; Converter's code a vector):

    .. math::
        \operatorname{ScaleNorm}(x) = g \odot \frac{x}{\lVert x \rVert_2 + \epsilon},\qquad
        \lVert x \rVert_2 = \sqrt{\textstyle\sum_d |x_d|^2}

    over the last axis, for real or complex :math:`x` (real :math:`g`). ``affine=False`` gives
    FixNorm (:math:`g = 1`, no parameter).

    Args:
        channels (int): size of the last axis.
        eps (float): :math:`\epsilon`.
        affine (bool): learn :math:`g` (initialised to 1).
    """

    def __init__(self, channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(channels)) if affine else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        out = x / (norm + self.eps)
        return out if self.weight is None else out * self.weight.to(norm.dtype)

    def extra_repr(self) -> str:
        return f"{self.channels}, eps={self.eps}, affine={self.weight is not None}"


class Siren(nn.Module):
    r"""Converter's two-layer SIREN, applied per node (:math:`\omega_0 = 1`):

    .. math::
        \operatorname{SIREN}(x) = \sin\!\big(W_2\, \operatorname{Drop}(\operatorname{ScaleNorm}(
            \sin(W_1 x + b_1))) + b_2\big)

    with :math:`W_{1,2} \sim U(\pm\sqrt{6/D})` and zero biases.

    Args:
        channels (int): :math:`D` (input = hidden = output width).
        dropout (float): dropout rate after the ScaleNorm.
    """

    def __init__(self, channels: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.lin1 = nn.Linear(channels, channels)
        self.norm = ScaleNorm(channels)
        self.lin2 = nn.Linear(channels, channels)
        self.dropout = float(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = math.sqrt(6.0 / self.lin1.in_features)
        for lin in (self.lin1, self.lin2):
            nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.zeros_(lin.bias)
        self.norm.reset_parameters()

    def forward(self, x: Tensor, training: bool = False,
                generator: torch.Generator | None = None) -> Tensor:
        h = self.norm(torch.sin(self.lin1(x)))
        h = _dropout(h, self.dropout, training, generator)
        return torch.sin(self.lin2(h))

    def extra_repr(self) -> str:
        return f"{self.lin1.in_features}, dropout={self.dropout}"
