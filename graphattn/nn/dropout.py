"""The models' dropout: :func:`graphattn.kernels.dropout` as a module."""

from __future__ import annotations

from torch import Tensor, nn

from graphattn.kernels.dropout import dropout


class Dropout(nn.Dropout):
    r""":class:`torch.nn.Dropout` (same arguments, same meaning: each element zeroed with probability
    :math:`p` in training, the others scaled by :math:`1/(1-p)`) whose CPU path is the counter-based
    kernel of :mod:`graphattn.kernels.dropout`, several times faster than torch's Bernoulli
    sampling; on other devices it is :func:`torch.nn.functional.dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
