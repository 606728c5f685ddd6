"""Building blocks resolved by name: normalisations, local message-passing convs, input encoders."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn import (
    GATConv,
    GCNConv,
    GINConv,
    GINEConv,
    Linear,
    MessagePassing,
    ResGatedGraphConv,
    SAGEConv,
)
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver

from graphattn.nn.edge_gcn import EdgeGCNConv

CONVS = ("gcn", "gcne", "gin", "gine", "gat", "sage", "resgated")


def activation(act: Any) -> nn.Module:
    """The activation module named ``act`` (a PyG activation name such as ``"relu"``, ``"elu"``,
    ``"gelu"``, or a module instance); anything else is a :class:`ValueError` naming ``act``."""
    if isinstance(act, nn.Module):
        return act
    if not isinstance(act, str):
        raise ValueError(f"'act' must be an activation name (e.g. 'relu', 'elu', 'gelu') or an "
                         f"nn.Module, got {act!r}")
    try:
        return activation_resolver(act)
    except ValueError:
        raise ValueError(f"'act' must be an activation name (e.g. 'relu', 'elu', 'gelu'), got "
                         f"{act!r}") from None


def make_norm(name: str | None, channels: int) -> tuple[nn.Module | None, bool]:
    """``(module, takes_batch)``. ``"layer_norm"`` and ``"batch_norm"`` are the node-wise
    :class:`torch.nn.LayerNorm` / :class:`torch.nn.BatchNorm1d`; other names resolve through PyG
    (``"graph_norm"``, ``"instance_norm"``, ...), which take ``batch``. Anything else is a
    :class:`ValueError` naming ``norm``."""
    if name is None or name == "none":
        return None, False
    if not isinstance(name, str):
        raise ValueError(f"'norm' must be a normalisation name ('layer_norm', 'batch_norm', a PyG "
                         f"norm such as 'graph_norm') or None, got {name!r}")
    if name == "layer_norm":
        return nn.LayerNorm(channels), False
    if name == "batch_norm":
        return nn.BatchNorm1d(channels), False
    try:
        norm = normalization_resolver(name, channels)
    except ValueError:
        raise ValueError(f"'norm' must be 'layer_norm', 'batch_norm', a PyG norm name (e.g. "
                         f"'graph_norm', 'instance_norm') or None, got {name!r}") from None
    takes_batch = "batch" in inspect.signature(norm.forward).parameters
    return norm, takes_batch


def apply_norm(norm: nn.Module | None, takes_batch: bool, x: Tensor, batch: Tensor | None) -> Tensor:
    if norm is None:
        return x
    return norm(x, batch=batch) if takes_batch else norm(x)


def make_skip(residual: bool, in_channels: int, channels: int) -> nn.Module | None:
    r"""The residual path of a block from width ``in_channels`` to ``channels``: ``None`` without
    ``residual``; the identity where the widths agree; else a learned projection
    :math:`W_{\text{res}} x` (no bias), as :class:`~torch_geometric.nn.conv.GATConv` with
    ``residual=True`` does. A residual the user asked for is never dropped. ``in_channels=-1``
    (lazy) always gets the projection: the width is unknown until the first call."""
    if not residual:
        return None
    if in_channels == channels:
        return nn.Identity()
    return Linear(in_channels, channels, bias=False, weight_initializer="glorot")


def _mlp(channels: int, in_channels: int | None = None, act: str = "relu") -> nn.Sequential:
    i = channels if in_channels is None else in_channels
    return nn.Sequential(Linear(i, channels), activation(act), Linear(channels, channels))


def make_conv(conv: str | MessagePassing | None, channels: int, *, heads: int = 1,
              edge_dim: int | None = None, in_channels: int | None = None,
              output: bool = False) -> MessagePassing | None:
    """A local message-passing layer ``in_channels -> channels`` by name (see :data:`CONVS`);
    ``in_channels`` defaults to ``channels`` (``-1``: lazy)."""
    if conv is None or isinstance(conv, MessagePassing):
        return conv
    if conv == "none":
        return None
    i = channels if in_channels is None else in_channels
    if conv == "gcn":
        return GCNConv(i, channels)
    if conv == "gcne":  # GCN+'s edge-aware convolution
        return EdgeGCNConv(i, channels, edge_dim=edge_dim)
    if conv == "gin":
        return GINConv(_mlp(channels, i))
    if conv == "gine":
        if i != channels:
            raise ValueError("'gine' needs in_channels == channels (edge features are added)")
        return GINEConv(_mlp(channels), edge_dim=edge_dim)
    if conv == "gat" and output:  # an output layer averages full-width heads
        return GATConv(i, channels, heads=heads, concat=False, edge_dim=edge_dim)
    if conv == "gat":
        if channels % heads:
            raise ValueError(f"'gat' needs channels ({channels}) divisible by heads ({heads})")
        return GATConv(i, channels // heads, heads=heads, edge_dim=edge_dim)
    if conv == "sage":
        return SAGEConv(i, channels)
    if conv == "resgated":
        return ResGatedGraphConv(i, channels, edge_dim=edge_dim)
    raise ValueError(f"unknown conv {conv!r}; use one of {CONVS}, None or a MessagePassing module")


def conv_takes_edge_attr(conv: nn.Module) -> bool:
    return "edge_attr" in inspect.signature(conv.forward).parameters


class NodeEncoder(nn.Module):
    """Input features → ``channels``: ``"linear"`` (lazy :class:`~torch_geometric.nn.Linear` on
    float features) or ``"atom"`` (ogb :class:`~ogb.graphproppred.mol_encoder.AtomEncoder` on the
    9 integer atom features of ``smiles2graph``); ``"embedding"`` for a single integer token id
    per node (sequences) with ``num_embeddings`` ids."""

    def __init__(self, kind: str, channels: int, num_embeddings: int | None = None) -> None:
        super().__init__()
        self.kind = kind
        if kind == "linear":
            self.enc: nn.Module = Linear(-1, channels)
        elif kind == "atom":
            from ogb.graphproppred.mol_encoder import AtomEncoder

            self.enc = AtomEncoder(channels)
        elif kind == "embedding":
            if not num_embeddings:
                raise ValueError("node_encoder='embedding' needs 'num_embeddings'")
            self.enc = nn.Embedding(num_embeddings, channels)
        else:
            raise ValueError(f"'node_encoder' must be 'linear', 'atom', 'embedding' or None, got {kind!r}")

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "linear":  # integer features: cast to the encoder's dtype
            return self.enc(x if x.is_floating_point() else x.to(self.enc.weight.dtype))
        if self.kind == "embedding":
            return self.enc(x.view(-1).long())
        return self.enc(x.long())


class EdgeEncoder(nn.Module):
    """Edge features → ``channels``: ``"linear"`` (lazy) or ``"bond"`` (ogb BondEncoder)."""

    def __init__(self, kind: str, channels: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "linear":
            self.enc: nn.Module = Linear(-1, channels)
        elif kind == "bond":
            from ogb.graphproppred.mol_encoder import BondEncoder

            self.enc = BondEncoder(channels)
        else:
            raise ValueError(f"'edge_encoder' must be 'linear', 'bond' or None, got {kind!r}")

    def forward(self, edge_attr: Tensor) -> Tensor:
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.unsqueeze(-1)
        if self.kind == "linear":
            return self.enc(edge_attr.to(self.enc.weight.dtype))
        return self.enc(edge_attr.long())


class DataView:
    """The data object with some attributes overridden (e.g. encoded ``edge_attr``), no copy."""

    def __init__(self, data: Any, **overrides: Any) -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name: str) -> Any:
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_data"), name)


def random_sign_flip(pe: Tensor, training: bool) -> Tensor:
    """Laplacian eigenvectors are defined up to sign: flip each column at random in training."""
    if not training:
        return pe
    sign = torch.randint(0, 2, (1, pe.size(1)), device=pe.device).to(pe.dtype) * 2 - 1
    return pe * sign
