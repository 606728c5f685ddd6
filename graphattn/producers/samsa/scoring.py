r"""SAMSA's importance-score network (:class:`ImportanceScore`) and the normalisation it uses
(:class:`RMSNorm`, also the ``samsa`` model preset's norm): one learned score per node and head, which
the Gumbel top-:math:`k` sampling of :mod:`graphattn.producers.samsa.sampling` perturbs and ranks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphattn.producers.base import check_positive_int


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation as in the SAMSA code:
    :math:`y = g \odot x / (\lVert x \rVert_2 / \sqrt{d} + \epsilon)` (the :math:`\epsilon` outside
    the root, no bias, :math:`g` initialised to 1).

    Args:
        channels (int): :math:`d`.
        eps (float): :math:`\epsilon`.
    """

    def __init__(self, channels: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.channels = check_positive_int("channels", channels)
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(channels))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        rms = x.norm(dim=-1, keepdim=True) / math.sqrt(x.size(-1))
        # one reciprocal per row, then a product: cheaper than an [N, d] division and its backward
        return self.weight * (x * (rms + self.eps).reciprocal())

    def extra_repr(self) -> str:
        return f"{self.channels}, eps={self.eps}"


class ImportanceScore(nn.Module):
    r"""The per-head importance-score network of SAMSA:

    .. math::
        s(x) = W_o\big(x + \operatorname{RMSNorm}(W_2\,\operatorname{GELU}(W_1 x + b_1) + b_2)\big)
            + b_o \in \mathbb{R}^H

    (one score per head: every head samples its own sources, the paper's "mixture of attention
    experts").

    Args:
        channels (int): input width :math:`d`.
        num_heads (int): :math:`H`.
    """

    def __init__(self, channels: int, num_heads: int) -> None:
        super().__init__()
        self.lin1 = nn.Linear(channels, channels)
        self.lin2 = nn.Linear(channels, channels)
        self.norm = RMSNorm(channels)
        self.out = nn.Linear(channels, num_heads)

    def reset_parameters(self) -> None:
        for m in (self.lin1, self.lin2, self.norm, self.out):
            m.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        return self.out(x + self.norm(self.lin2(F.gelu(self.lin1(x)))))
