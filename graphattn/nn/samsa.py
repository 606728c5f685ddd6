r"""The SAMSA preset: the paper's block (Pre-RMSNorm, SAMSA attention, one zero-initialised residual
scalar shared by every layer) stacked between the library's encoders and heads.

The hybrid alternative (an input-graph local conv next to a SAMSA global branch) needs no preset:
``GraphTransformer(conv="gine", producer={"name": "samsa", "k": 32})`` (``--model hybrid``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.nn import Linear
from torch_geometric.utils import scatter, softmax

from graphattn.core.attention import EdgeAttention
from graphattn.core.edgeset import EdgeSet
from graphattn.core.signals import TrainingSignals
from graphattn.nn.blocks import activation
from graphattn.nn.dropout import Dropout
from graphattn.nn.model import (
    POOLS,
    GraphTransformer,
    check_model_args,
    check_unused_args,
    graph_count,
)
from graphattn.nn.registry import register_model
from graphattn.producers.base import check_positive_int, check_rate
from graphattn.producers.registry import build_producer
from graphattn.producers.samsa import SAMSA, RMSNorm

#: the producer input (:attr:`~graphattn.ProducerContext.inputs`) through which a block hands its
#: un-normalised input to the score network
SCORE_INPUT = "residual"
READOUTS = (*POOLS, "attention")


def drop_path(x: Tensor, batch: Tensor, num_graphs: int, p: float, training: bool) -> Tensor:
    r"""Stochastic depth per graph: the branch output of graph :math:`b` is zeroed with probability
    :math:`p` and scaled by :math:`1/(1-p)` otherwise (training only)."""
    if not training or p == 0.0:
        return x
    keep = (torch.rand(num_graphs, device=x.device) >= p).to(x.dtype) / (1.0 - p)
    return x * keep[batch].unsqueeze(-1)


class SAMSABlock(nn.Module):
    r"""One SAMSA layer (the official ``HSTRANS``), on a PyG batch:

    .. math::
        \hat x = \operatorname{RMSNorm}_1(x), \qquad
        x \leftarrow x + \alpha\,\operatorname{DropPath}\big(W_O\,
            \operatorname{EdgeAttention}(\hat x,\ \operatorname{SAMSA}(\hat x;\ s(x)))\big)

        x \leftarrow x + \alpha\,\operatorname{DropPath}\big(\operatorname{MLP}(
            \operatorname{RMSNorm}_2(x))\big), \qquad
        \operatorname{MLP} = \operatorname{Lin}\!-\!\operatorname{act}\!-\!\operatorname{Drop}
            \!-\!\operatorname{Lin}\!-\!\operatorname{Drop}

    :math:`\alpha` is passed in (shared by every layer of :class:`SAMSATransformer`); the importance
    scores :math:`s(x)` read the un-normalised :math:`x`, the keys and values the normalised
    :math:`\hat x`. The query/key/value weights get ``kaiming_uniform_(nonlinearity="linear")`` (as
    the official code).

    Args:
        channels (int): width :math:`d`.
        heads (int): attention heads :math:`H` (head size :math:`d/H`).
        producer: the SAMSA producer (spec or instance); built with ``channels``, ``num_heads`` and
            ``score_from`` set for this block unless the spec sets them.
        ffn_channels (int): hidden width of the MLP (0: no MLP sub-block).
        dropout (float): dropout in the MLP.
        attn_dropout (float): dropout on the attention coefficients (training only).
        drop_path (float): stochastic depth per graph on both branches.
        act (str): MLP activation.
        attn_kwargs (dict, optional): extra :class:`~graphattn.EdgeAttention` arguments.
    """

    def __init__(self, channels: int, heads: int, producer: Any = "samsa", ffn_channels: int = 0,
                 dropout: float = 0.0, attn_dropout: float = 0.0, drop_path: float = 0.0,
                 act: str = "gelu", attn_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        check_positive_int("channels", channels)
        check_positive_int("heads", heads)
        check_positive_int("ffn_channels", ffn_channels, allow_zero=True)
        dropout, attn_dropout = check_rate("dropout", dropout), check_rate("attn_dropout", attn_dropout)
        drop_path = check_rate("drop_path", drop_path)
        if channels % heads:
            raise ValueError(f"'channels' ({channels}) must be divisible by 'heads' ({heads})")
        self.channels, self.heads, self.drop_path = channels, heads, drop_path
        self.norm1 = RMSNorm(channels)
        self.norm2 = RMSNorm(channels)
        self.producer = build_producer(producer, channels=channels, num_heads=heads,
                                       score_from=SCORE_INPUT)
        if not isinstance(self.producer, SAMSA):
            raise ValueError(f"SAMSABlock needs a SAMSA producer, got {type(self.producer).__name__}")
        self.attn = EdgeAttention(channels, channels // heads, heads=heads, dropout=attn_dropout,
                                  **(attn_kwargs or {}))
        self.attn_out = Linear(channels, channels)
        self.mlp = nn.Sequential(
            Linear(channels, ffn_channels), activation(act), Dropout(dropout),
            Linear(ffn_channels, channels), Dropout(dropout),
        ) if ffn_channels else None
        self.reset_parameters()

    @property
    def last_edges(self) -> EdgeSet | None:
        """The edge set the last forward attended over (read from the attention layer)."""
        return self.attn.last_edges

    def reset_parameters(self) -> None:
        for m in (self.norm1, self.norm2, self.producer, self.attn, self.attn_out,
                  *(self.mlp or ())):
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        self.init_projections()

    def init_projections(self) -> None:
        """The official initialisation of the query/key/value weights."""
        for lin in (self.attn.lin_query, self.attn.lin_key, self.attn.lin_value):
            nn.init.kaiming_uniform_(lin.weight, nonlinearity="linear")

    def forward(self, x: Tensor, batch: Tensor, alpha: Tensor, *, num_graphs: int | None = None,
                data: Any = None, generator: torch.Generator | None = None,
                signals: TrainingSignals | None = None) -> Tensor:
        """``x [N, d]`` → ``[N, d]``; ``alpha`` is the residual scalar; ``signals`` receives the
        edge set (see :mod:`graphattn.core.signals`)."""
        B = int(batch.max()) + 1 if num_graphs is None and batch.numel() else (num_graphs or 1)
        h = self.attn(self.norm1(x), self.producer, batch=batch, data=data, generator=generator,
                      inputs={SCORE_INPUT: x}, signals=signals)
        x = x + alpha * drop_path(self.attn_out(h), batch, B, self.drop_path, self.training)
        if self.mlp is not None:
            h = self.mlp(self.norm2(x))
            x = x + alpha * drop_path(h, batch, B, self.drop_path, self.training)
        return x

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.channels}, heads={self.heads}, "
                f"k={self.producer.k}, hard={self.producer.hard})")


def _samsa_specs(producer: Any, num_layers: int, producer_kwargs: Mapping[str, Any] | None
                 ) -> list[Any]:
    specs = (list(producer) if isinstance(producer, Sequence) and not isinstance(producer, str)
             else [producer] * num_layers)
    if len(specs) != num_layers:
        raise ValueError(f"got {len(specs)} producer specs for num_layers={num_layers}")
    out = []
    for spec in specs:
        if spec is None:
            spec = "samsa"
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        if not (isinstance(spec, SAMSA) or name == "samsa"):
            raise ValueError(
                f"the 'samsa' model's global branch is SAMSA; got producer {name!r}. Pass "
                f"--producer samsa (with its arguments), or use --model hybrid for other producers"
            )
        if isinstance(spec, str):
            spec = {"name": "samsa"}
        if isinstance(spec, Mapping):
            spec = {**(producer_kwargs or {}), **spec}
        out.append(spec)
    return out


@register_model("samsa")
class SAMSATransformer(GraphTransformer):
    r"""The SAMSA model: encoders, :math:`L` :class:`SAMSABlock` s sharing one residual scalar
    :math:`\alpha` (initialised to 0, so the stack is the identity at initialisation and only
    :math:`\alpha`, the encoders and the head learn in the first step), then a read-out and head.

    .. math::
        h^{(0)} = \operatorname{Enc}(x) + W_{PE}\,\mathrm{pe}, \qquad
        h^{(\ell)} = \operatorname{SAMSABlock}_\ell(h^{(\ell-1)};\ \alpha), \qquad
        \hat y = \operatorname{MLP}\big(\operatorname{readout}_b\, h^{(L)}\big)

    Takes :class:`~graphattn.GraphTransformer`'s arguments (so the runner builds it with
    ``--model samsa``), with these meanings:

    Args:
        producer: a SAMSA spec (``"samsa"`` or ``{"name": "samsa", "k": ..., ...}``) or a list
            with one per layer; another producer raises a :class:`ValueError`.
        conv: must be ``None`` (the paper's block is attention only; for a local conv plus a SAMSA
            global branch use :class:`~graphattn.GraphTransformer`, ``--model hybrid``).
        ffn_ratio (int): MLP width = ``ffn_ratio * hidden_channels`` (official: 4).
        dropout (float): dropout in the MLPs (official ``p_dropout_model``).
        act (str): MLP activation (official: ``"gelu"``).
        edge_encoder, norm, norm_first, residual: not used (no branch reads edge features; the
            block is always Pre-RMSNorm with the shared residual scalar): a value other than the
            default raises a :class:`ValueError`.
        head_layers (int): layers of the prediction MLP after the read-out (>= 1).
        drop_path (float): stochastic depth per graph (official ``p_droppath``).
        readout (str, optional): graph read-out, overriding ``pool``: ``"attention"`` is the
            official ``REGHEAD`` pooling :math:`\sum_{v \in b} \operatorname{softmax}_{v \in b}
            (w^\top h_v)\, h_v`; else one of ``"mean"``, ``"add"``, ``"max"``, ``"cls"``.
        Other arguments as in :class:`~graphattn.GraphTransformer`.
    """

    builds_own_layers = True
    UNUSED_ARGS: ClassVar[dict[str, str]] = {
        "edge_encoder": "no branch of the SAMSA block reads edge features",
        "norm": "the block is always Pre-RMSNorm",
        "norm_first": "the block is always Pre-RMSNorm",
        "residual": "the block always adds its branches with the shared residual scalar",
    }

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 4,
                 producer: Any = "samsa", conv: str | None = None, *, heads: int = 8,
                 act: str = "gelu", ffn_ratio: int = 4, head_layers: int = 1,
                 drop_path: float = 0.0, readout: str | None = None, **kwargs: Any) -> None:
        check_unused_args(type(self), kwargs)
        for name in self.UNUSED_ARGS:
            kwargs.pop(name, None)
        attn_dropout = kwargs.pop("attn_dropout", 0.0)
        attn_kwargs = kwargs.pop("attn_kwargs", None)
        producer_kwargs = kwargs.pop("producer_kwargs", None)
        ffn = kwargs.pop("ffn", True)
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         num_layers=num_layers, heads=heads, ffn_ratio=ffn_ratio,
                         head_layers=head_layers, attn_dropout=attn_dropout)
        if conv not in (None, "none"):
            raise ValueError(
                f"the 'samsa' model has no local conv (got conv={conv!r}); pass --conv none, or use "
                f"--model hybrid with a conv and the samsa producer for the hybrid alternative"
            )
        if head_layers < 1:
            raise ValueError(f"the 'samsa' model needs head_layers >= 1, got {head_layers}")
        readout = readout or kwargs.pop("pool", "mean")
        kwargs.pop("pool", None)
        if readout not in READOUTS:
            raise ValueError(f"'readout' must be one of {READOUTS}, got {readout!r}")
        specs = _samsa_specs(producer, num_layers, producer_kwargs)
        # the encoders, positional encodings and head of GraphTransformer (which checks the rest of
        # its arguments); the blocks are built below (builds_own_layers)
        super().__init__(
            hidden_channels, out_channels, num_layers=num_layers, producer=None, conv=None,
            heads=heads, norm=None, act=act, ffn=False, edge_encoder=None,
            pool="mean" if readout == "attention" else readout, head_layers=head_layers, **kwargs,
        )
        dropout = kwargs.get("dropout", 0.0)
        self.readout = readout
        self.layers = nn.ModuleList(
            SAMSABlock(hidden_channels, heads, spec, ffn_channels=ffn_ratio * hidden_channels if ffn
                       else 0, dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path,
                       act=act, attn_kwargs=attn_kwargs)
            for spec in specs
        )
        self.final_norm = None
        self.residual_scale = nn.Parameter(torch.zeros(1))
        self.readout_score = Linear(hidden_channels, 1) if readout == "attention" else None

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for layer in self.layers:
            layer.init_projections()
        nn.init.zeros_(self.residual_scale)

    def _forward(self, data: Any, generator: torch.Generator | None,
                 signals: TrainingSignals) -> Tensor:
        h, _, batch = self.encode_with_batch(data)
        B = graph_count(data, batch)
        alpha = self.residual_scale.to(h.dtype)
        for layer in self.layers:
            h = layer(h, batch, alpha, num_graphs=B, data=data, generator=generator, signals=signals)
        if self.task == "graph":
            h = self._read_out(h, batch, B)
        return self.head(h)

    def _read_out(self, h: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        if self.readout == "attention":
            assert self.readout_score is not None
            w = softmax(self.readout_score(h).squeeze(-1), batch, num_nodes=num_graphs)
            return scatter(w.unsqueeze(-1) * h, batch, dim=0, dim_size=num_graphs, reduce="sum")
        return self._pool(h, batch, num_graphs, self.readout)
