r"""The Converter preset (Zhang et al., "Converting Transformers into DGNNs Form"): the paper's block.

.. math::
    E &= \operatorname{Drop}\big(\operatorname{ScaleNorm}(h + \operatorname{GRU}_2(h))\big)
        \quad\text{(recurrent positional encoding, per graph in node order)}

    V &= \operatorname{Drop}(E W_\Re) + i\,\operatorname{Drop}(E W_\Im), \qquad
    K = S(E)\, V \quad\text{(Kernelution / Synvolution, exact, } O(N D)\text{)}

    Z &= \operatorname{ScaleNorm}(K + E) \in \mathbb{C}^{N \times D}

    F &= W_O\,\operatorname{Drop}\big(\operatorname{softplus}(\Re Z\, W_1 + b_1) \odot
        \tanh(\Im Z\, W_2 + b_2)\big) + b_O \quad\text{(gated FFN, eq. 13)}

    H &= \operatorname{ScaleNorm}\big(F + \zeta \Re Z + (1 - \zeta) \Im Z\big),\qquad
        \zeta = \operatorname{clamp}(\zeta', 0, 1)

followed by the graph read-out (the paper: mean) and an MLP head. The operator :math:`S` comes from
the ``converter`` producer (:class:`~graphattn.producers.converter.ConverterProducer`) and is
applied by :class:`ComplexValueAttention`, an :class:`~graphattn.EdgeAttention` with complex values.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from graphattn.core.attention import EdgeAttention
from graphattn.core.edgeset import EdgeSet
from graphattn.core.index import default_batch
from graphattn.core.signals import TrainingSignals
from graphattn.kernels.dropout import dropout as fast_dropout
from graphattn.nn.base import (
    POOLS,
    GraphModel,
    check_mapping,
    check_model_args,
    check_task_and_pool,
)
from graphattn.nn.registry import register_model
from graphattn.producers.base import check_positive_int, check_rate
from graphattn.producers.converter import ConverterProducer, ScaleNorm
from graphattn.producers.registry import build_producer

__all__ = ["ComplexValueAttention", "ConverterBlock", "ConverterModel", "GatedFFN",
           "RecurrentPositionalEncoding", "ScaleNorm"]


class ComplexValueAttention(EdgeAttention):
    r""":class:`~graphattn.EdgeAttention` (``"weighted"`` mode, one head) with complex values

    .. math::
        v_j = \operatorname{Drop}(W_\Re x_j) + i\,\operatorname{Drop}(W_\Im x_j),\qquad
        o_i = \sum_j w_{ji}\, v_j

    (independent dropout masks on the two parts, bias-free :math:`W_\Re, W_\Im \sim
    \mathcal{N}(0, 0.5)`). Operator edge sets get the complex values in their ``matvec``; on the
    explicit path (``kernel="reference"``, traces) the sum runs as
    :math:`\sum_j w v^\Re_j + i \sum_j w v^\Im_j`, each a real-valued message pass with complex
    weights (the layer's re/im split). The output is complex ``[N, channels]``.

    Args:
        channels (int): input and output width.
        value_dropout (float): dropout on the real and imaginary values (training only).
        **kwargs: further :class:`~graphattn.EdgeAttention` arguments (e.g. ``kernel``).
    """

    def __init__(self, channels: int, value_dropout: float = 0.0, **kwargs: Any) -> None:
        if not 0.0 <= value_dropout < 1.0:
            raise ValueError(f"'value_dropout' must lie in [0, 1), got {value_dropout!r}")
        super().__init__(channels, channels, heads=1, mode="weighted", bias=False,
                         complex_output="complex", **kwargs)
        self.value_dropout = float(value_dropout)
        self.lin_value_imag = nn.Linear(channels, channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        imag = getattr(self, "lin_value_imag", None)
        if imag is not None:
            for lin in (self.lin_value, imag):
                nn.init.normal_(lin.weight, std=math.sqrt(0.5))

    def _projections(self, x: Tensor, x_src: Tensor | None = None) -> dict[str, Any]:
        if x_src is not None:
            raise ValueError(f"{type(self).__name__} takes one node set, not bipartite input")
        C = self.out_channels

        def value() -> Tensor:
            re = fast_dropout(self.lin_value(x), self.value_dropout, self.training)
            im = fast_dropout(self.lin_value_imag(x), self.value_dropout, self.training)
            return torch.complex(re, im).view(-1, 1, C)

        return {"value": value}

    def _explicit(self, q: Tensor | None, k: Tensor | None, v: Tensor, es: EdgeSet,
                  N: int) -> tuple[Tensor, Tensor | None]:
        if not v.is_complex():
            return super()._explicit(q, k, v, es, N)
        out_re, alpha = super()._explicit(q, k, v.real.contiguous(), es, N)
        out_im, _ = super()._explicit(q, k, v.imag.contiguous(), es, N)
        return out_re + 1j * out_im, alpha

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, value_dropout={self.value_dropout})"


class GatedFFN(nn.Module):
    r"""Converter's gated feed-forward network (paper eq. 13, with the released code's biases):
    complex in, real out,

    .. math::
        \operatorname{GFFN}(Z) = W_O\,\operatorname{Drop}\big(\operatorname{softplus}(\Re Z\,W_\Re
            + b_\Re) \odot \tanh(\Im Z\,W_\Im + b_\Im)\big) + b_O,

    softplus with :math:`\beta = 1` and threshold 5; Xavier-uniform weights, zero biases. The real
    part carries the magnitude, the imaginary part the sign.

    Args:
        channels (int): input/output width :math:`D`.
        hidden_channels (int): :math:`D_{hid}`.
        dropout (float): dropout on the gated hidden units.
    """

    def __init__(self, channels: int, hidden_channels: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.lin_re = nn.Linear(channels, hidden_channels)
        self.lin_im = nn.Linear(channels, hidden_channels)
        self.lin_out = nn.Linear(hidden_channels, channels)
        self.dropout = float(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_re, self.lin_im, self.lin_out):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, z: Tensor) -> Tensor:
        gate = F.softplus(self.lin_re(z.real), beta=1.0, threshold=5.0) * torch.tanh(self.lin_im(z.imag))
        return self.lin_out(fast_dropout(gate, self.dropout, self.training))

    def extra_repr(self) -> str:
        return (f"{self.lin_re.in_features}, hidden={self.lin_re.out_features}, "
                f"dropout={self.dropout}")


class RecurrentPositionalEncoding(nn.Module):
    r"""Converter's "RPE": :math:`E = \operatorname{Drop}(\operatorname{ScaleNorm}(h +
    \operatorname{GRU}(h)))`, a multi-layer GRU run over each graph's nodes in their stored order
    (one recurrence per graph; empty graphs contribute nothing).

    Args:
        channels (int): width :math:`D` (GRU input and hidden size).
        num_layers (int): GRU layers (the paper: 2).
        dropout (float): dropout between GRU layers and on the output (the paper: 0.1).
    """

    def __init__(self, channels: int, num_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.gru = nn.GRU(channels, channels, num_layers=num_layers, batch_first=True,
                          dropout=dropout if num_layers > 1 else 0.0)
        self.norm = ScaleNorm(channels)
        self.dropout = float(dropout)

    def reset_parameters(self) -> None:
        self.gru.reset_parameters()
        self.norm.reset_parameters()

    def forward(self, h: Tensor, batch: Tensor) -> Tensor:
        if batch.numel() > 1 and not bool((batch[1:] >= batch[:-1]).all()):
            raise ValueError("'batch' must be sorted by graph (as in a PyG Batch): the recurrent "
                             "positional encoding runs over each graph's nodes in order")
        if h.size(0):
            # padded to [B, n_max, D]: each graph's padding follows its nodes and the GRU is
            # causal, so padding never reaches a real node (exactly the per-graph recurrence,
            # and faster on CPU than packed sequences)
            dense, mask = to_dense_batch(h, batch)
            out, _ = self.gru(dense)
            rec = out[mask]
        else:
            rec = torch.zeros_like(h)
        return fast_dropout(self.norm(h + rec), self.dropout, self.training)

    def extra_repr(self) -> str:
        return f"{self.gru.input_size}, num_layers={self.gru.num_layers}, dropout={self.dropout}"


class ConverterBlock(nn.Module):
    r"""One Converter block (see the module docstring): Kernelution/Synvolution with complex
    values, a complex ScaleNorm residual, the gated FFN and the :math:`\zeta`-mixed PostScaleNorm.

    Args:
        channels (int): width :math:`D`.
        producer: the ``converter`` producer (a spec or an instance).
        ffn_channels (int): hidden width of the gated FFN (the paper: :math:`4D`).
        dropout (float): dropout in the gated FFN.
        value_dropout (float): dropout on the complex values.
        attn_kwargs (dict, optional): extra :class:`ComplexValueAttention` arguments.
        producer_kwargs (dict, optional): defaults for building the producer.
    """

    def __init__(self, channels: int, producer: Any = "converter", ffn_channels: int | None = None,
                 dropout: float = 0.0, value_dropout: float = 0.0,
                 attn_kwargs: dict[str, Any] | None = None,
                 producer_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        defaults = {"channels": channels, "heads": 1, "num_heads": 1, **(producer_kwargs or {})}
        prod = build_producer(producer, **defaults)
        if not isinstance(prod, ConverterProducer):
            raise ValueError(f"the Converter block needs the 'converter' producer, got "
                             f"{type(prod).__name__}")
        self.channels = channels
        self.producer = prod
        self.attn = ComplexValueAttention(channels, value_dropout, **(attn_kwargs or {}))
        self.norm_z = ScaleNorm(channels)
        self.gffn = GatedFFN(channels, ffn_channels or 4 * channels, dropout)
        self.zeta = nn.Parameter(torch.ones(()))
        self.norm_out = ScaleNorm(channels)

    @property
    def last_edges(self) -> EdgeSet | None:
        """The edge set the last forward attended over (read from the attention layer)."""
        return self.attn.last_edges

    def reset_parameters(self) -> None:
        for m in (self.producer, self.attn, self.norm_z, self.gffn, self.norm_out):
            m.reset_parameters()
        nn.init.ones_(self.zeta)

    def forward(self, x: Tensor, edge_index: Tensor | None = None, batch: Tensor | None = None,
                edge_attr: Tensor | None = None, *, data: Any = None,
                generator: torch.Generator | None = None,
                signals: TrainingSignals | None = None,
                edge_cache: dict[Hashable, Any] | None = None) -> Tensor:
        """``x [N, D]`` (real) → ``[N, D]`` (real). ``edge_index`` / ``edge_attr`` are unused (the
        operator spans each graph's complete digraph); ``signals`` receives the operator edge set
        (its kernel-polynomial ``aux_loss``); ``edge_cache`` is passed to the producer."""
        kn = self.attn(x, self.producer, batch=batch, data=data, generator=generator, signals=signals,
                       edge_cache=edge_cache)
        z = self.norm_z(kn + x)
        zeta = self.zeta.clamp(0.0, 1.0)
        return self.norm_out(self.gffn(z) + zeta * z.real + (1.0 - zeta) * z.imag)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.channels}, producer={self.producer.extra_repr()})"


@register_model("converter")
class ConverterModel(GraphModel):
    r"""Converter (one or more :class:`ConverterBlock` s) between :class:`~graphattn.GraphTransformer`'s
    encoders and head: the node encoder (plus any ``pe``), the recurrent positional encoding, the
    blocks, the read-out and the MLP head.

    The block is fixed by the paper and one operator serves all channels: there is no ``heads``,
    ``norm``, ``norm_first``, ``residual``, ``ffn``, ``attn_dropout`` or ``edge_encoder``.

    Args:
        hidden_channels (int): :math:`D`.
        out_channels (int): predictions per graph (or node).
        num_layers (int): blocks (the paper: 1).
        producer: the ``converter`` producer (default Kernelution with the Dirichlet kernel;
            ``None``: that default).
        conv: must be ``None``.
        rpe (bool): the recurrent (GRU) positional encoding.
        rpe_layers (int): its GRU layers.
        value_dropout (float, optional): dropout on the complex values (default: ``dropout``).
        readout (str, optional): overrides ``pool`` (the runner sets ``pool`` from the task, e.g.
            ``"cls"`` for ListOps; the paper uses ``"mean"``).
        dropout (float): in the gated FFN, the recurrent encoding and the head.
        ffn_ratio (int): gated-FFN width :math:`= ratio \cdot D` (the paper: 4).
        act (str): the head's activation (the paper: ``leaky_relu``).
        attn_kwargs, producer_kwargs (dict, optional): the blocks' attention and producer
            arguments.
        node_encoder, num_embeddings, pe, pe_attr, pe_dim, input_dropout, task, pool, head_layers,
            head_norm: as in :class:`~graphattn.GraphTransformer` (a node encoder and a head are
            needed: the blocks keep the width).
    """

    OPTIONS: ClassVar[tuple[str, ...]] = (
        "hidden_channels", "out_channels", "num_layers", "producer", "conv", "rpe", "rpe_layers",
        "value_dropout", "readout", "dropout", "ffn_ratio", "act", "attn_kwargs", "producer_kwargs",
        "node_encoder", "num_embeddings", "pe", "pe_attr", "pe_dim", "input_dropout", "task", "pool",
        "head_layers", "head_norm",
    )

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 1,
                 producer: Any = "converter", conv: str | None = None, *, rpe: bool = True,
                 rpe_layers: int = 2, value_dropout: float | None = None,
                 readout: str | None = None, dropout: float = 0.0, ffn_ratio: int = 4,
                 act: str = "relu", attn_kwargs: dict[str, Any] | None = None,
                 producer_kwargs: dict[str, Any] | None = None,
                 node_encoder: str | None = "linear", num_embeddings: int | None = None,
                 pe: str | None = None, pe_attr: str | None = None, pe_dim: int = 16,
                 input_dropout: float = 0.0, task: str = "graph", pool: str = "mean",
                 head_layers: int = 1, head_norm: str | None = None) -> None:
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         num_layers=num_layers, ffn_ratio=ffn_ratio, head_layers=head_layers,
                         pe_dim=pe_dim, num_embeddings=num_embeddings, dropout=dropout,
                         input_dropout=input_dropout)
        check_positive_int("rpe_layers", rpe_layers)
        if value_dropout is not None:
            check_rate("value_dropout", value_dropout)
        if conv not in (None, "none"):
            raise ValueError(f"the Converter preset has no local conv; got conv={conv!r} "
                             f"(use conv=None)")
        if readout is not None and readout not in POOLS:
            raise ValueError(f"'readout' must be one of {sorted(POOLS)}, got {readout!r}")
        if head_layers < 1:
            raise ValueError("the Converter preset needs head_layers >= 1 (its blocks keep the width)")
        if node_encoder is None:
            raise ValueError("the Converter preset needs a node encoder (its blocks have width "
                             "hidden_channels)")
        check_task_and_pool(task, pool)
        check_mapping("attn_kwargs", attn_kwargs)
        check_mapping("producer_kwargs", producer_kwargs)
        if producer is None:  # the runner's "no producer": the preset's own
            producer = "converter"
        super().__init__()
        self.task, self.pool = task, pool if readout is None else readout
        # the encoders and the head first, then the recurrent encoding and the blocks (the order
        # of the parameters)
        self.add_encoders(hidden_channels, node_encoder=node_encoder, num_embeddings=num_embeddings,
                          edge_encoder=None, pe=pe, pe_attr=pe_attr, pe_dim=pe_dim,
                          input_dropout=input_dropout)
        self.add_head(hidden_channels, out_channels, head_layers=head_layers, head_norm=head_norm,
                      act=act, dropout=dropout, final_norm=False)
        dropout = float(dropout)
        self.rpe = (RecurrentPositionalEncoding(hidden_channels, rpe_layers, dropout)
                    if rpe else None)
        self.layers = nn.ModuleList(
            ConverterBlock(hidden_channels, producer, ffn_ratio * hidden_channels, dropout,
                           dropout if value_dropout is None else value_dropout,
                           attn_kwargs=attn_kwargs, producer_kwargs=producer_kwargs)
            for _ in range(num_layers)
        )

    def encode(self, data: Any) -> tuple[Tensor, Tensor | None]:
        """The encoders' output, then the recurrent positional encoding over each graph's nodes."""
        h, edge_attr = super().encode(data)
        if self.rpe is not None:
            h = self.rpe(h, default_batch(getattr(data, "batch", None), h.size(0), h.device))
        return h, edge_attr
