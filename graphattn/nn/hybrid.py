"""HybridLayer: local message passing + producer-driven sparse global attention + FFN."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn import Linear, MessagePassing

from graphattn.core.attention import EdgeAttention
from graphattn.core.checks import check_data_attributes, inputs_are_checked
from graphattn.core.edgeset import EdgeSet
from graphattn.core.inputs import check_graph_inputs
from graphattn.core.signals import TrainingSignals
from graphattn.kernels.dropout import dropout as fast_dropout
from graphattn.nn.blocks import activation, apply_norm, conv_takes_edge_attr, make_conv, make_norm, make_skip
from graphattn.nn.dropout import Dropout
from graphattn.producers.base import (
    EdgeProducer,
    check_channels,
    check_node_features,
    check_positive_int,
    check_rate,
)
from graphattn.producers.registry import build_producer


def producer_defaults(channels: int, heads: int,
                      overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments every producer built for an attention layer receives: the width of the
    layer's input and its heads (``heads`` / ``num_heads``); ``overrides`` (the user's
    ``producer_kwargs``) win."""
    return {"channels": channels, "heads": heads, "num_heads": heads, **(overrides or {})}


def attention_branch(in_channels: int, channels: int, heads: int, producer: Any, *,
                     attn_dropout: float = 0.0, edge_dim: int | None = None,
                     attn_kwargs: Mapping[str, Any] | None = None,
                     producer_kwargs: Mapping[str, Any] | None = None,
                     output_layer: bool = False) -> tuple[EdgeProducer, EdgeAttention]:
    """A global branch's producer (built from the spec ``producer`` with :func:`producer_defaults`
    for an input of width ``in_channels``) and the :class:`~graphattn.EdgeAttention` over its edge
    sets: ``heads`` heads concatenated to width ``channels``, unless the producer fixes the head
    size (``producer.head_size``: ``channels / head_size`` heads, e.g. Sliceformer's one channel
    per head); in an ``output_layer`` (and without a fixed head size), ``heads`` heads of the full
    width ``channels``, averaged (GAT's output layer)."""
    built = build_producer(producer, **producer_defaults(in_channels, heads, producer_kwargs))
    attn_heads = heads
    head_size = getattr(built, "head_size", None)
    if head_size is not None:
        if channels % head_size:
            raise ValueError(f"'channels' ({channels}) must be divisible by the producer's "
                             f"head_size ({head_size})")
        attn_heads = channels // head_size
    concat = not output_layer or head_size is not None
    attn = EdgeAttention(
        in_channels,
        channels // attn_heads if concat else channels,
        heads=attn_heads,
        concat=concat,
        dropout=attn_dropout,
        edge_dim=edge_dim,
        mode=built.mode,
        **(attn_kwargs or {}),
    )
    return built, attn


class AttentionBranch:
    """A module with a global branch: ``producer`` and the ``attn`` over its edge sets (both
    ``None`` without a branch; :func:`attention_branch` builds them)."""

    producer: EdgeProducer | None
    attn: EdgeAttention | None

    @property
    def last_edges(self) -> EdgeSet | None:
        """The edge set the last forward attended over (read from the attention layer)."""
        return None if self.attn is None else self.attn.last_edges

    def attend(self, x: Tensor, batch: Tensor | None, data: Any, generator: torch.Generator | None,
               signals: TrainingSignals | None, edge_cache: dict[Hashable, Any] | None) -> Tensor:
        """The attention over the producer's edge set for ``x`` (``signals`` receives the edge
        set; ``edge_cache`` shares batch-only edge sets between the layers of one pass)."""
        assert self.attn is not None and self.producer is not None
        return self.attn(x, self.producer, batch=batch, data=data, generator=generator,
                         signals=signals, edge_cache=edge_cache)


class HybridLayer(AttentionBranch, nn.Module):
    r"""A GPS-style layer whose global branch is an edge-set producer plus
    :class:`~graphattn.EdgeAttention` (no padding, no quadratic memory unless the producer asks
    for it):

    .. math::
        h^{\text{loc}} = \operatorname{Norm}_1\big(x + \operatorname{Drop}(\operatorname{MPNN}(x, E))\big),
        \qquad
        h^{\text{glob}} = \operatorname{Norm}_2\big(x + \operatorname{Drop}(W_O\,
            \operatorname{EdgeAttention}(x, \operatorname{producer}(x)))\big)

        h = h^{\text{loc}} + h^{\text{glob}}, \qquad
        \text{out} = \operatorname{Norm}_3\big(h + \operatorname{FFN}(h)\big)

    (post-norm, as :class:`~torch_geometric.nn.conv.GPSConv`). With ``norm_first=True`` the norms
    move in front of each branch (pre-norm): :math:`h^{\text{glob}} = x +
    \operatorname{Drop}(W_O\,\operatorname{Attn}(\operatorname{Norm}_2 x))`, :math:`\text{out} = h +
    \operatorname{FFN}(\operatorname{Norm}_3 h)`.

    Args:
        channels (int): width of :math:`x`.
        conv (str or MessagePassing, optional): the local MPNN (``"gcn"``, ``"gin"``, ``"gine"``,
            ``"gat"``, ``"sage"``, ``"resgated"``) or ``None``.
        producer: the global branch's producer (a name, ``{"name": ..., **kwargs}`` or an
            :class:`EdgeProducer`), or ``None`` for no global branch.
        heads (int): attention heads; the head size is ``channels // heads``, unless the producer
            fixes its head size (``producer.head_size``, e.g. 1 for Sliceformer's one permutation
            per channel: ``channels`` heads of size 1).
        dropout (float): dropout on each branch's output and in the FFN.
        attn_dropout (float): dropout on the attention coefficients.
        act (str): FFN activation.
        norm (str, optional): ``"layer_norm"``, ``"batch_norm"``, a PyG norm name, or ``None``.
        norm_first (bool): pre-norm instead of post-norm.
        ffn_ratio (int): FFN hidden width = ``ffn_ratio * channels``.
        edge_dim (int, optional): edge feature width for the conv and the attention.
        attn_kwargs (dict, optional): extra :class:`EdgeAttention` arguments (e.g. ``kernel``).
        producer_kwargs (dict, optional): model-supplied defaults for building the producer.
        residual (bool): the ``x +`` skip around each branch (GPS default). Without it the
            branches are :math:`\operatorname{Norm}(\operatorname{Drop}(\cdot))` only, which suits
            strongly homophilous node tasks (citation graphs), where the raw-feature skip acts
            like an MLP term. Where the input width differs from ``channels`` (or in an output
            layer) the skip is a learned projection :math:`W_{\text{res}} x` instead of :math:`x`
            (:func:`~graphattn.nn.blocks.make_skip`, as ``GATConv(residual=True)``); it is never
            dropped.
        in_channels (int, optional): input width if it differs from ``channels`` (``-1``: lazy).
        output_layer (bool): the layer produces the model's output (e.g. class logits, as the last
            layer of GCN / GAT): no dropout, activation, norm, output projection or FFN; with
            ``residual`` the projected input is added once to the branches' sum
            (:math:`\text{out} = h^{\text{loc}} + h^{\text{glob}} + W_{\text{res}} x`);
            the attention heads are averaged (each of width ``channels``), or, for a producer
            that fixes the head size (Sliceformer), concatenated (``channels`` heads of size 1).
        ffn (bool): the feed-forward sub-block (with its own residual). Without it the activation
            ``act`` is applied to the branch sum instead, so the layer stays non-linear:
            :math:`\text{out} = \operatorname{act}(h^{\text{loc}} + h^{\text{glob}})`.
    """

    def __init__(
        self,
        channels: int,
        conv: str | MessagePassing | None = None,
        producer: Any = "full",
        heads: int = 1,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        act: str = "relu",
        norm: str | None = "layer_norm",
        norm_first: bool = False,
        ffn_ratio: int = 2,
        edge_dim: int | None = None,
        attn_kwargs: dict[str, Any] | None = None,
        producer_kwargs: dict[str, Any] | None = None,
        residual: bool = True,
        ffn: bool = True,
        in_channels: int | None = None,
        output_layer: bool = False,
    ) -> None:
        super().__init__()
        if conv is None and producer is None:
            raise ValueError("HybridLayer needs a local 'conv', a global 'producer', or both")
        check_channels("channels", channels, lazy=False)
        check_positive_int("heads", heads)
        check_positive_int("ffn_ratio", ffn_ratio)
        check_channels("edge_dim", edge_dim, optional=True)
        check_channels("in_channels", in_channels, optional=True)
        for name, value in (("attn_kwargs", attn_kwargs), ("producer_kwargs", producer_kwargs)):
            if value is not None and not isinstance(value, Mapping):
                raise ValueError(f"'{name}' must be a dict of keyword arguments or None, got "
                                 f"{value!r}")
        dropout = check_rate("dropout", dropout)
        attn_dropout = check_rate("attn_dropout", attn_dropout)
        in_c = channels if in_channels is None else in_channels
        if not output_layer and channels % heads:
            raise ValueError(f"'channels' ({channels}) must be divisible by 'heads' ({heads})")
        self.in_channels = in_c
        self.channels = channels
        self.heads = heads
        self.dropout = dropout
        self.norm_first = norm_first and not output_layer
        self.output_layer = output_layer
        if not isinstance(residual, bool):
            raise ValueError(f"'residual' must be True or False, got {residual!r}")
        self.conv = make_conv(conv, channels, heads=heads, edge_dim=edge_dim, in_channels=in_c,
                               output=output_layer)
        self.conv_edge_attr = self.conv is not None and conv_takes_edge_attr(self.conv)
        if producer is not None:
            self.producer, self.attn = attention_branch(
                in_c, channels, heads, producer, attn_dropout=attn_dropout, edge_dim=edge_dim,
                attn_kwargs=attn_kwargs, producer_kwargs=producer_kwargs, output_layer=output_layer)
            self.attn_out: Linear | None = None if output_layer else Linear(channels, channels)
        else:
            self.producer, self.attn, self.attn_out = None, None, None
        use_ffn = ffn and not output_layer
        self.mlp = nn.Sequential(
            Linear(channels, ffn_ratio * channels),
            activation(act),
            Dropout(dropout),
            Linear(ffn_ratio * channels, channels),
            Dropout(dropout),
        ) if use_ffn else None
        self.act = activation(act)
        norm = None if output_layer else norm
        self.norm1, self._nb1 = make_norm(norm, in_c if self.norm_first else channels)
        self.norm2, self._nb2 = make_norm(norm, in_c if self.norm_first else channels)
        self.norm3, self._nb3 = make_norm(norm, channels)
        # built last: a projection (widths differ, or the output layer) draws its initial weights
        # after every other block, so the layers without one initialise exactly as before
        self.skip = make_skip(residual, in_c, channels)

    @property
    def residual(self) -> bool:
        """Whether the layer has a residual path (identity or learned projection)."""
        return self.skip is not None

    def reset_parameters(self) -> None:
        for m in (self.conv, self.producer, self.attn, self.attn_out, self.norm1, self.norm2,
                  self.norm3, *(self.mlp or ()), self.skip):
            if m is not None and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _branch_out(self, h: Tensor, res: Tensor | None, norm: nn.Module | None, nb: bool,
                    batch: Tensor | None) -> Tensor:
        if self.output_layer:
            return h
        h = fast_dropout(h, p=self.dropout, training=self.training)
        h = res + h if res is not None else h
        if not self.norm_first:
            h = apply_norm(norm, nb, h, batch)
        return h

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor | None = None,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
        *,
        data: Any = None,
        generator: torch.Generator | None = None,
        signals: TrainingSignals | None = None,
        edge_cache: dict[Hashable, Any] | None = None,
    ) -> Tensor:
        """``x [N, in_channels]`` → ``[N, channels]``. ``edge_index`` / ``edge_attr`` feed the
        local conv; ``data`` (and ``generator``) feed the producer; ``signals`` receives the edge
        set the attention attended over (see :mod:`graphattn.core.signals`); ``edge_cache`` shares the
        batch-only edge sets of one forward pass between layers
        (:meth:`~graphattn.EdgeProducer.static_key`).

        The inputs are checked first (:class:`ValueError` naming the argument): ``x`` a float
        tensor of the layer's width and dtype, and, for the local conv, ``edge_index``, ``batch``,
        ``edge_attr`` and the values of ``x`` in one host read (the attention checks its own)."""
        if not inputs_are_checked():
            self._check_inputs(x, edge_index, batch, edge_attr)
            check_data_attributes(data, x.size(0))
        res = None if self.skip is None else self.skip(x)
        hs = []
        if self.conv is not None:
            if edge_index is None:
                raise ValueError("the local conv needs 'edge_index'")
            h = apply_norm(self.norm1, self._nb1, x, batch) if self.norm_first else x
            if self.conv_edge_attr and edge_attr is not None:
                h = self.conv(h, edge_index, edge_attr=edge_attr)
            else:
                h = self.conv(h, edge_index)
            hs.append(self._branch_out(h, res, self.norm1, self._nb1, batch))
        if self.attn is not None:
            assert self.producer is not None
            h = apply_norm(self.norm2, self._nb2, x, batch) if self.norm_first else x
            h = self.attend(h, batch, data, generator, signals, edge_cache)
            if self.attn_out is not None:
                h = self.attn_out(h)
            hs.append(self._branch_out(h, res, self.norm2, self._nb2, batch))
        out = hs[0] if len(hs) == 1 else hs[0] + hs[1]
        if self.output_layer:
            return out if res is None else out + res
        if self.mlp is None:
            return self.act(out)
        if self.norm_first:
            out = out + self.mlp(apply_norm(self.norm3, self._nb3, out, batch))
        else:
            out = apply_norm(self.norm3, self._nb3, out + self.mlp(out), batch)
        return out

    def _check_inputs(self, x: Any, edge_index: Any, batch: Any, edge_attr: Any) -> None:
        check_node_features(x, self.in_channels, self)
        if self.conv is None:  # the attention checks x and batch; edge_index is not read
            return
        if edge_index is None:
            raise ValueError("the local conv needs 'edge_index'")
        takes_attr = self.conv_edge_attr and edge_attr is not None
        check_graph_inputs(edge_index, x.size(0), batch,
                           finite={"x": x, "edge_attr": edge_attr if takes_attr else None})
        if takes_attr:
            if not isinstance(edge_attr, Tensor) or edge_attr.dim() not in (1, 2):
                shape = list(edge_attr.shape) if isinstance(edge_attr, Tensor) else type(edge_attr).__name__
                raise ValueError(f"'edge_attr' must be a 1-D or 2-D tensor [E, F_e], got {shape}")
            if edge_attr.size(0) != edge_index.size(1):
                raise ValueError(f"'edge_attr' must have one row per edge ({edge_index.size(1)}), "
                                 f"got shape {list(edge_attr.shape)}")

    def __repr__(self) -> str:
        prod = None if self.producer is None else (self.producer.name or type(self.producer).__name__)
        return (f"{self.__class__.__name__}({self.channels}, conv={self.conv}, producer={prod}, "
                f"heads={self.heads})")
