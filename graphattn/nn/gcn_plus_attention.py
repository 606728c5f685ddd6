r"""GCN+ with a global attention branch: the GCN+ anchor (:mod:`graphattn.nn.gcn_plus`) whose
layers also attend over any producer's edge set. Registered as ``--model gcnplus_attention``.

**Layer** :math:`\ell` (with a branch; the others are GCN+'s):

.. math::
    m_i = \underbrace{b + \sum_{j \to i} \operatorname{ReLU}\big(W h_j + e_{ji}\big)}_{\text{GCN+'s
    edge-aware convolution}} \;+\; W_O\,\big\Vert_{h=1}^{H} \sum_{j \in \mathcal{E}(i)}
    \alpha^h_{ij}\, W^h_V h_j, \qquad
    h_i' = \operatorname{Drop}\big(\operatorname{act}(\operatorname{Norm}(m_i))\big)

with :math:`\alpha^h_{ij} = \operatorname{softmax}_{j \in \mathcal{E}(i)}
\big(\langle W^h_Q h_i, W^h_K h_j \rangle / \sqrt{C}\big)` over the in-edges
:math:`\mathcal{E}(i)` of the producer's edge set (:class:`~graphattn.EdgeAttention`; e.g. ``full``:
every node of the graph, ``union(input, virtual)``: the bonds and a virtual node per graph).
The attention works at its own width ``attn_channels`` (:math:`H \cdot C`), below the
convolution's, so that the branch costs :math:`4 \cdot d \cdot` ``attn_channels`` parameters per
layer instead of :math:`4d^2`.

:math:`W_O` starts at zero: at initialisation the model computes exactly GCN+ (the same
encoders, layers, norms, read-out and head; a GCN+ checkpoint loads into it with
``strict=False``, the branches keeping their initialisation), and the branch
grows from the gradient :math:`\partial L / \partial W_O`. The sum before the norm keeps GCN+'s
layer shape (the norm sees both terms); GraphGPS's layer (:class:`~graphattn.HybridLayer`) instead
normalises each branch after its own dropout and residual.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.nn import Linear

from graphattn.core.signals import TrainingSignals
from graphattn.nn.base import check_model_args, layer_pass
from graphattn.nn.blocks import DataView
from graphattn.nn.gcn_plus import GCNPlus
from graphattn.nn.hybrid import AttentionBranch, attention_branch
from graphattn.nn.registry import register_model
from graphattn.producers.base import check_positive_int


class GlobalBranch(AttentionBranch, nn.Module):
    r"""A global branch as :class:`~graphattn.HybridLayer`'s (:func:`~graphattn.nn.hybrid.
    attention_branch`: the producer and :class:`~graphattn.EdgeAttention`) at width
    ``attn_channels``, projected back to ``channels`` by :math:`W_O` (bias-free, zero at
    initialisation and after :meth:`reset_parameters`)."""

    def __init__(self, channels: int, attn_channels: int, heads: int, producer: Any,
                 attn_dropout: float, edge_dim: int | None,
                 producer_kwargs: dict[str, Any] | None,
                 attn_kwargs: dict[str, Any] | None) -> None:
        super().__init__()
        self.producer, self.attn = attention_branch(
            channels, attn_channels, heads, producer, attn_dropout=attn_dropout, edge_dim=edge_dim,
            attn_kwargs=attn_kwargs, producer_kwargs=producer_kwargs)
        self.out = Linear(attn_channels, channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in (self.producer, self.attn):
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        nn.init.zeros_(self.out.weight)

    def forward(self, h: Tensor, batch: Tensor, data: Any, generator: torch.Generator | None,
                signals: TrainingSignals, edge_cache: dict[Hashable, Any]) -> Tensor:
        return self.out(self.attend(h, batch, data, generator, signals, edge_cache))


@register_model("gcnplus_attention")
class GCNPlusAttention(GCNPlus):
    r"""GCN+ plus a global attention branch in some of its layers (see the module docstring for
    the math). Takes :class:`~graphattn.nn.gcn_plus.GCNPlus`'s arguments and:

    Args:
        producer: the branch's producer (a name, ``{"name": ..., **kwargs}`` or an
            :class:`~graphattn.EdgeProducer`); one instance per branch unless an instance is given.
        heads (int): attention heads; ``attn_channels`` must be divisible by them.
        attn_channels (int): the attention's width :math:`H \cdot C` (queries, keys and values).
        attn_layers (sequence of int, optional): the layers (0-based) with a branch; ``None``: all.
        attn_dropout (float): dropout on the attention coefficients.
        attn_edge_features (bool): the attention adds :math:`W_E e_{ji}` to the keys and values
            of edges that carry the encoded bond features (the ``input`` producer's);
            ``False``: the producers are given no edge features.
        producer_kwargs (dict, optional): defaults for building the producer.
        attn_kwargs (dict, optional): extra :class:`~graphattn.EdgeAttention` arguments.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = (
        *GCNPlus.OPTIONS, "producer", "heads", "attn_channels", "attn_layers", "attn_dropout",
        "attn_edge_features", "producer_kwargs", "attn_kwargs",
    )

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 3, *,
                 producer: Any = "full", heads: int = 4, attn_channels: int = 64,
                 attn_layers: Sequence[int] | None = None, attn_dropout: float = 0.0,
                 attn_edge_features: bool = False, producer_kwargs: dict[str, Any] | None = None,
                 attn_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(hidden_channels, out_channels, num_layers, **kwargs)
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         heads=heads, attn_dropout=attn_dropout)
        check_positive_int("attn_channels", attn_channels)
        if attn_channels % heads:
            raise ValueError(f"'attn_channels' ({attn_channels}) must be divisible by 'heads' "
                             f"({heads})")
        if producer is None:
            raise ValueError("'producer' must name the attention's edge set (use --model "
                             "gcnplus for GCN+ without attention)")
        layers = range(num_layers) if attn_layers is None else list(attn_layers)
        if (not layers or any(not isinstance(i, int) or isinstance(i, bool)
                              or not 0 <= i < num_layers for i in layers)
                or len(set(layers)) != len(layers)):
            raise ValueError(f"'attn_layers' must be distinct layer indices in [0, {num_layers}), "
                             f"at least one, got {attn_layers!r}")
        if not isinstance(attn_edge_features, bool):
            raise ValueError(f"'attn_edge_features' must be a bool, got {attn_edge_features!r}")
        if attn_edge_features and self.edge_encoder is None:
            raise ValueError("'attn_edge_features' needs an 'edge_encoder'")
        self.attn_layers = sorted(layers)
        self.attn_edge_features = attn_edge_features
        edge_dim = hidden_channels if attn_edge_features else None
        for i in self.attn_layers:
            self.layers[i].branch = GlobalBranch(hidden_channels, attn_channels, heads, producer,
                                                 attn_dropout, edge_dim, producer_kwargs,
                                                 attn_kwargs)

    def branches(self) -> list[GlobalBranch]:
        """The global branches, in layer order."""
        return [self.layers[i].branch for i in self.attn_layers]

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for branch in self.branches():
            branch.reset_parameters()  # W_O back to zero (the modules walk re-drew it)

    def propagate_layers(self, h: Tensor, edge_attr: Tensor | None, batch: Tensor, data: Any, *,
                         generator: torch.Generator | None, signals: TrainingSignals,
                         num_graphs: int | None) -> Tensor:
        edge_index = data.edge_index
        view = DataView(data, edge_attr=edge_attr if self.attn_edge_features else None)
        with layer_pass(self.branches()) as edge_cache:
            for layer in self.layers:
                extra = (None if layer.branch is None else
                         layer.branch(h, batch, view, generator, signals, edge_cache))
                h = layer(h, edge_index, edge_attr, batch, extra)
        return h

    def __repr__(self) -> str:
        base = super().__repr__()[:-1]
        branch = self.branches()[0]
        prod = branch.producer.name or type(branch.producer).__name__
        return (f"{base}, producer={prod!r}, attn_layers={self.attn_layers}, "
                f"attn_channels={branch.attn.heads * branch.attn.out_channels}, "
                f"heads={branch.attn.heads})")
