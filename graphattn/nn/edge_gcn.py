"""GCN+'s edge-aware graph convolution (no normalisation, ReLU on node + edge messages)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import Linear, MessagePassing

from graphattn.producers.base import check_channels


class EdgeGCNConv(MessagePassing):
    r"""GCN+'s edge-aware graph convolution:

    .. math::
        x'_i = b + \sum_{j \to i} \operatorname{ReLU}\big(W x_j + W_E\, e_{ji}\big)

    (:math:`W_E` is the identity when ``edge_dim`` is ``None`` or equals ``out_channels``; without
    edge features the message is :math:`\operatorname{ReLU}(W x_j)`). The sum is not
    degree-normalised and adds no self-loops, as in the authors' implementation.

    Args:
        in_channels (int): input width (``-1``: lazy).
        out_channels (int): output width.
        edge_dim (int, optional): edge feature width; a projection :math:`W_E` is learned when it
            differs from ``out_channels``.
        bias (bool): the additive bias :math:`b`.
    """

    def __init__(self, in_channels: int, out_channels: int, edge_dim: int | None = None,
                 bias: bool = True) -> None:
        super().__init__(aggr="add")
        check_channels("in_channels", in_channels)
        check_channels("out_channels", out_channels, lazy=False)
        check_channels("edge_dim", edge_dim, optional=True)
        self.in_channels, self.out_channels, self.edge_dim = in_channels, out_channels, edge_dim
        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        self.lin_edge = (Linear(edge_dim, out_channels, bias=False, weight_initializer="glorot")
                         if edge_dim is not None and edge_dim != out_channels else None)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.lin.reset_parameters()
        if self.lin_edge is not None:
            self.lin_edge.reset_parameters()
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        """``x`` ``[N, in_channels]``, ``edge_index`` ``[2, E]`` (source, target), ``edge_attr``
        ``[E, edge_dim]`` or ``None`` → ``[N, out_channels]``."""
        if edge_attr is not None:
            if edge_attr.dim() != 2 or edge_attr.size(0) != edge_index.size(1):
                raise ValueError(f"'edge_attr' must be [E={edge_index.size(1)}, F_e], got shape "
                                 f"{list(edge_attr.shape)}")
            width = self.out_channels if self.edge_dim is None else self.edge_dim
            if edge_attr.size(1) != width:
                raise ValueError(f"'edge_attr' must have {width} channels ("
                                 f"{'edge_dim' if self.edge_dim is not None else 'out_channels'}), "
                                 f"got {edge_attr.size(1)}")
            if self.lin_edge is not None:
                edge_attr = self.lin_edge(edge_attr)
        out = self.propagate(edge_index, x=self.lin(x), edge_attr=edge_attr)
        return out if self.bias is None else out + self.bias

    def message(self, x_j: Tensor, edge_attr: Tensor | None) -> Tensor:
        return (x_j if edge_attr is None else x_j + edge_attr).relu()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
                f"edge_dim={self.edge_dim})")
