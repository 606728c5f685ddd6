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
from graphattn.nn.base import POOLS, GraphModel, check_mapping, check_model_args, check_task_and_pool
from graphattn.nn.blocks import activation
from graphattn.nn.dropout import Dropout
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
class SAMSATransformer(GraphModel):
    r"""The SAMSA model: encoders, :math:`L` :class:`SAMSABlock` s sharing one residual scalar
    :math:`\alpha` (initialised to 0, so the stack is the identity at initialisation and only
    :math:`\alpha`, the encoders and the head learn in the first step), then a read-out and head.

    .. math::
        h^{(0)} = \operatorname{Enc}(x) + W_{PE}\,\mathrm{pe}, \qquad
        h^{(\ell)} = \operatorname{SAMSABlock}_\ell(h^{(\ell-1)};\ \alpha), \qquad
        \hat y = \operatorname{MLP}\big(\operatorname{readout}_b\, h^{(L)}\big)

    The encoders and the head are :class:`~graphattn.GraphTransformer`'s (the arguments below
    without a note mean what they mean there); the block is always Pre-RMSNorm with the shared
    residual scalar and reads no edge features, so there is no ``norm``, ``norm_first``,
    ``residual`` or ``edge_encoder``.

    Args:
        producer: a SAMSA spec (``"samsa"`` or ``{"name": "samsa", "k": ..., ...}``) or a list
            with one per layer; another producer raises a :class:`ValueError`.
        conv: must be ``None`` (the paper's block is attention only; for a local conv plus a SAMSA
            global branch use :class:`~graphattn.GraphTransformer`, ``--model hybrid``).
        heads (int): attention heads.
        act (str): MLP activation (official: ``"gelu"``), also the head's.
        ffn_ratio (int): MLP width = ``ffn_ratio * hidden_channels`` (official: 4).
        ffn (bool): the MLP sub-block.
        dropout (float): dropout in the MLPs (official ``p_dropout_model``) and the head.
        attn_dropout (float), attn_kwargs (dict, optional): the blocks' attention's.
        producer_kwargs (dict, optional): defaults for the producer specs.
        head_layers (int): layers of the prediction MLP after the read-out (>= 1).
        drop_path (float): stochastic depth per graph (official ``p_droppath``).
        readout (str, optional): graph read-out, overriding ``pool``: ``"attention"`` is the
            official ``REGHEAD`` pooling :math:`\sum_{v \in b} \operatorname{softmax}_{v \in b}
            (w^\top h_v)\, h_v`; else one of ``"mean"``, ``"add"``, ``"max"``, ``"cls"``.
        node_encoder, num_embeddings, pe, pe_attr, pe_dim, input_dropout, task, pool, head_norm:
            as in :class:`~graphattn.GraphTransformer`.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = (
        "hidden_channels", "out_channels", "num_layers", "producer", "conv", "heads", "act",
        "ffn_ratio", "ffn", "dropout", "attn_dropout", "attn_kwargs", "producer_kwargs",
        "head_layers", "drop_path", "readout", "node_encoder", "num_embeddings", "pe", "pe_attr",
        "pe_dim", "input_dropout", "task", "pool", "head_norm",
    )
    layers_count_graphs = True  # the blocks' drop path draws per graph

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 4,
                 producer: Any = "samsa", conv: str | None = None, *, heads: int = 8,
                 act: str = "gelu", ffn_ratio: int = 4, ffn: bool = True, dropout: float = 0.0,
                 attn_dropout: float = 0.0, attn_kwargs: dict[str, Any] | None = None,
                 producer_kwargs: dict[str, Any] | None = None, head_layers: int = 1,
                 drop_path: float = 0.0, readout: str | None = None,
                 node_encoder: str | None = "linear", num_embeddings: int | None = None,
                 pe: str | None = None, pe_attr: str | None = None, pe_dim: int = 16,
                 input_dropout: float = 0.0, task: str = "graph", pool: str = "mean",
                 head_norm: str | None = None) -> None:
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         num_layers=num_layers, heads=heads, ffn_ratio=ffn_ratio,
                         head_layers=head_layers, pe_dim=pe_dim, num_embeddings=num_embeddings,
                         dropout=dropout, attn_dropout=attn_dropout, input_dropout=input_dropout)
        if conv not in (None, "none"):
            raise ValueError(
                f"the 'samsa' model has no local conv (got conv={conv!r}); pass --conv none, or use "
                f"--model hybrid with a conv and the samsa producer for the hybrid alternative"
            )
        if head_layers < 1:
            raise ValueError(f"the 'samsa' model needs head_layers >= 1, got {head_layers}")
        readout = readout or pool
        if readout not in READOUTS:
            raise ValueError(f"'readout' must be one of {READOUTS}, got {readout!r}")
        check_mapping("attn_kwargs", attn_kwargs)
        check_mapping("producer_kwargs", producer_kwargs)
        specs = _samsa_specs(producer, num_layers, producer_kwargs)
        pool = "mean" if readout == "attention" else readout
        check_task_and_pool(task, pool)
        super().__init__()
        self.task, self.pool, self.readout = task, pool, readout
        # the encoders and the head first, then the blocks (the order of the parameters)
        self.add_encoders(hidden_channels, node_encoder=node_encoder, num_embeddings=num_embeddings,
                          edge_encoder=None, pe=pe, pe_attr=pe_attr, pe_dim=pe_dim,
                          input_dropout=input_dropout)
        self.add_head(hidden_channels, out_channels, head_layers=head_layers, head_norm=head_norm,
                      act=act, dropout=dropout, final_norm=False)
        self.layers = nn.ModuleList(
            SAMSABlock(hidden_channels, heads, spec, ffn_channels=ffn_ratio * hidden_channels if ffn
                       else 0, dropout=dropout, attn_dropout=attn_dropout, drop_path=drop_path,
                       act=act, attn_kwargs=attn_kwargs)
            for spec in specs
        )
        self.residual_scale = nn.Parameter(torch.zeros(1))
        self.readout_score = Linear(hidden_channels, 1) if readout == "attention" else None

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for layer in self.layers:
            layer.init_projections()
        nn.init.zeros_(self.residual_scale)

    def propagate_layers(self, h: Tensor, edge_attr: Tensor | None, batch: Tensor, data: Any, *,
                         generator: torch.Generator | None, signals: TrainingSignals,
                         num_graphs: int | None) -> Tensor:
        alpha = self.residual_scale.to(h.dtype)
        for layer in self.layers:
            h = layer(h, batch, alpha, num_graphs=num_graphs, data=data, generator=generator,
                      signals=signals)
        return h

    def pool_nodes(self, h: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        """The read-out: ``"attention"`` pools each graph's nodes with softmax weights, the others
        as :class:`~graphattn.GraphTransformer`."""
        if self.readout == "attention":
            assert self.readout_score is not None
            w = softmax(self.readout_score(h).squeeze(-1), batch, num_nodes=num_graphs)
            return scatter(w.unsqueeze(-1) * h, batch, dim=0, dim_size=num_graphs, reduce="sum")
        return super().pool_nodes(h, batch, num_graphs)
