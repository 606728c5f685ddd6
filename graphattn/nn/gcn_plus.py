r"""GCN+ (Luo, Shi & Wu, "Can Classic GNNs Be Strong Baselines for Graph-level Tasks?", ICML
2025): the classic GCN with the "GNN+" additions (edge features, normalisation, dropout, a
structural encoding, a deeper prediction head), the strongest message-passing anchor reported
on LRGB Peptides under the 500k-parameter budget (≈ 0.726 AP on Peptides-func with the recipe
below). Registered as ``--model gcnplus`` so it runs through the runner's data, split, metric,
model selection and seeds, like graphattn's own models.

**Layer** (:class:`EdgeGCNConv` followed by a norm, the activation and dropout):

.. math::
    m_i = b + \sum_{j \to i} \operatorname{ReLU}\big(W h_j + e_{ji}\big), \qquad
    h_i' = \operatorname{Drop}\big(\operatorname{act}(\operatorname{Norm}(m_i))\big)
    \;\big(+\, h_i \text{ with } \texttt{residual}\big)

with :math:`e_{ji}` the encoded bond features of the edge (shared by the layers). As in the
authors' code (a ``GCNConv`` subclass built with ``normalize=False`` and no self-loops), the sum
is not degree-normalised.

**Encoder**: :math:`h^{(0)}_i = [\operatorname{Enc}(x_i) \,\Vert\, W_{PE}\operatorname{BN}(p_i)]`:
the node encoder (ogb ``AtomEncoder`` on Peptides) gives ``hidden - pe_channels`` channels and the
structural encoding :math:`p_i` (RWSE: the return probabilities of 1..K-step random walks),
batch-normalised raw, is projected to ``pe_channels`` and concatenated (GraphGPS's ``Atom+RWSE``
encoder).

**Read-out** (graph tasks): a pooling (mean by default) then an MLP of ``head_layers`` layers:
``head_layers - 1`` times Linear → Norm → Dropout → act at full width (GraphGym's ``MLP`` head), then
the output Linear.

The recipe (``examples/configs/gcnplus_peptides_func.toml``, the authors' Peptides-func config):
3 layers × 275 channels, BatchNorm, dropout 0.2, no residual, no FFN, RWSE with 32 steps projected
to 28 channels, mean pooling, a 4-layer head, AdamW lr 1e-3 without weight decay, cosine schedule
with 5 warm-up epochs, 300 epochs, batches of 16 graphs.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.nn import Linear

from graphattn.core.inputs import check_graph_inputs
from graphattn.core.signals import TrainingSignals
from graphattn.nn.base import (
    PE_ATTRS,
    POOLS,
    GraphModel,
    check_model_args,
    check_sign_flip,
    mlp_head,
    param_dtype_module,
)
from graphattn.nn.blocks import EdgeEncoder, NodeEncoder, activation, apply_norm, make_norm, make_skip
from graphattn.nn.dropout import Dropout
from graphattn.nn.edge_gcn import EdgeGCNConv
from graphattn.nn.registry import register_model
from graphattn.producers.base import check_channels, check_dtype


class _GCNPlusLayer(nn.Module):
    """One GCN+ layer: conv → norm → act → dropout (+ the input with ``residual``)."""

    @property
    def last_edges(self) -> Any:
        """The edge set the global branch (``self.branch``, set by
        :class:`~graphattn.nn.gcn_plus_attention.GCNPlusAttention`) attended over last; ``None``
        without one (the runner's layer interface)."""
        return None if self.branch is None else self.branch.last_edges

    def __init__(self, in_channels: int, channels: int, edge_dim: int | None, norm: str | None,
                 act: str, dropout: float, residual: bool) -> None:
        super().__init__()
        self.conv = EdgeGCNConv(in_channels, channels, edge_dim=edge_dim)
        self.norm, self.norm_takes_batch = make_norm(norm, channels)
        self.act = activation(act)
        self.dropout = Dropout(dropout)
        #: an optional global branch whose output ``forward`` adds before the norm (``extra``)
        self.register_module("branch", None)
        # identity, or a learned projection between different widths (never dropped)
        self.skip = make_skip(residual, in_channels, channels)

    @property
    def residual(self) -> bool:
        return self.skip is not None

    def forward(self, h: Tensor, edge_index: Tensor, edge_attr: Tensor | None,
                batch: Tensor, extra: Tensor | None = None) -> Tensor:
        """``extra`` (e.g. a global attention branch's output) is added to the convolution's
        output before the norm."""
        out = self.conv(h, edge_index, edge_attr)
        if extra is not None:
            out = out + extra
        out = self.dropout(self.act(apply_norm(self.norm, self.norm_takes_batch, out, batch)))
        return out if self.skip is None else self.skip(h) + out


@register_model("gcnplus")
class GCNPlus(GraphModel):
    r"""GCN+ (see the module docstring for the math and the published recipe).

    Args:
        hidden_channels (int): width of every layer (node encoder + structural encoding).
        out_channels (int): predictions per graph (graph tasks) or node (node tasks).
        num_layers (int): graph convolutions.
        dropout (float): after every layer's activation and in the head.
        act (str): activation.
        norm (str, optional): ``"batch_norm"`` (the recipe), ``"layer_norm"``, a PyG norm or
            ``None``; also used in the head's hidden layers.
        residual (bool): ``h + layer(h)`` (the recipe on Peptides-func has none).
        head_layers (int): layers of the prediction MLP (≥ 1).
        node_encoder (str, optional): ``"atom"``, ``"linear"``, ``"embedding"`` or ``None`` (the
            first convolution reads the raw float features, lazily sized).
        num_embeddings (int, optional): vocabulary of ``node_encoder="embedding"``.
        edge_encoder (str, optional): ``"bond"`` or ``"linear"``; ``None``: no edge features.
        pe (str, optional): ``"random_walk"`` (RWSE) or ``"laplacian"`` (eigenvectors): read from
            the attribute the runner's transform writes.
        pe_dim (int): the encoding's raw width (random-walk steps, eigenvectors).
        pe_channels (int): its width after the projection, part of ``hidden_channels``.
        pe_sign_flip (bool): a random sign per eigenvector in training (for eigenvectors whose
            signs are arbitrary; the runner's :class:`~graphattn.nn.laplacian_pe.LaplacianPE`
            fixes them, so the default is off).
        pool (str): graph read-out, ``"mean"``, ``"add"``/``"sum"`` or ``"max"``.
        task (str): ``"graph"`` or ``"node"``.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = (
        "hidden_channels", "out_channels", "num_layers", "dropout", "act", "norm", "residual",
        "head_layers", "node_encoder", "num_embeddings", "edge_encoder", "pe", "pe_dim",
        "pe_channels", "pe_sign_flip", "pool", "task",
    )

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 3,
                 dropout: float = 0.2, act: str = "relu", norm: str | None = "batch_norm",
                 residual: bool = False, head_layers: int = 4, node_encoder: str | None = "atom",
                 num_embeddings: int | None = None, edge_encoder: str | None = "bond",
                 pe: str | None = None, pe_dim: int = 16, pe_channels: int = 28,
                 pe_sign_flip: bool = False, pool: str = "mean", task: str = "graph") -> None:
        super().__init__()
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         num_layers=num_layers, head_layers=head_layers, pe_dim=pe_dim,
                         num_embeddings=num_embeddings, dropout=dropout)
        if task not in ("node", "graph"):
            raise ValueError(f"'task' must be 'node' or 'graph', got {task!r}")
        if head_layers < 1:
            raise ValueError(f"'head_layers' must be >= 1 (the last one outputs the predictions), "
                             f"got {head_layers}")
        if pool not in POOLS or pool == "cls":
            raise ValueError(f"'pool' must be one of {sorted(set(POOLS) - {'cls'})}, got {pool!r}")
        if pe is not None and pe not in ("random_walk", "laplacian"):
            raise ValueError(f"'pe' must be 'random_walk', 'laplacian' or None, got {pe!r}")
        if pe is not None:
            check_channels("pe_channels", pe_channels, lazy=False)
            if node_encoder is None:
                raise ValueError("a structural encoding ('pe') is concatenated to the node "
                                 "encoder's output: it needs a 'node_encoder'")
            if pe_channels >= hidden_channels:
                raise ValueError(f"'pe_channels' ({pe_channels}) must be below 'hidden_channels' "
                                 f"({hidden_channels}): the node encoder gets the rest")
        self.task, self.pool, self.pe, self.dropout = task, pool, pe, dropout
        self.pe_attr = PE_ATTRS[pe] if pe is not None else None
        self.pe_sign_flip = check_sign_flip(pe_sign_flip, pe, None)
        # the encoder: the node encoder's output and the batch-normalised encoding, projected,
        # side by side (GraphGPS's Atom+RWSE)
        self.pe_concat = True
        node_width = hidden_channels - (pe_channels if pe is not None else 0)
        self.node_encoder = (NodeEncoder(node_encoder, node_width, num_embeddings)
                             if node_encoder is not None else None)
        self.pe_norm = nn.BatchNorm1d(pe_dim) if pe is not None else None
        self.pe_encoder = Linear(pe_dim, pe_channels) if pe is not None else None
        self.edge_encoder = EdgeEncoder(edge_encoder, hidden_channels) if edge_encoder else None
        edge_dim = hidden_channels if edge_encoder else None
        self.layers = nn.ModuleList(
            _GCNPlusLayer(hidden_channels if (i or node_encoder is not None) else -1,
                          hidden_channels, edge_dim, norm, act, dropout, residual)
            for i in range(num_layers))

        def hidden_block() -> list[nn.Module]:  # Linear → Norm → Dropout → act
            hnorm, _takes_batch = make_norm(norm, hidden_channels)
            return [*([hnorm] if hnorm is not None else []), Dropout(dropout), activation(act)]

        self.head = mlp_head(hidden_channels, out_channels, head_layers, hidden_block)

    def check_data(self, data: Any) -> None:
        """``data`` needs ``x`` and ``edge_index`` (plus ``batch`` for several graphs, ``edge_attr``
        with an edge encoder and the structural encoding with ``pe``); malformed inputs raise a
        :class:`ValueError` naming the attribute."""
        x, edge_index = getattr(data, "x", None), getattr(data, "edge_index", None)
        if not isinstance(x, Tensor) or not isinstance(edge_index, Tensor):
            raise ValueError(f"{type(self).__name__} needs data.x and data.edge_index as tensors")
        if self.node_encoder is None and not x.is_floating_point():
            raise ValueError(f"'data.x' must be floating-point with node_encoder=None, got {x.dtype}")
        if self.node_encoder is None or self.node_encoder.kind == "linear":
            check_dtype("data.x", x, param_dtype_module(self), type(self).__name__)
        batch = getattr(data, "batch", None)
        num_graphs = getattr(data, "num_graphs", None)
        pe = getattr(data, self.pe_attr, None) if self.pe_attr else None
        edge_attr = getattr(data, "edge_attr", None) if self.edge_encoder is not None else None
        check_graph_inputs(edge_index, x.size(0), batch,
                           finite={"data.x": x, "data.edge_attr": edge_attr,
                                   f"data.{self.pe_attr}": pe},
                           num_graphs=num_graphs if isinstance(num_graphs, int) else None)

    def propagate_layers(self, h: Tensor, edge_attr: Tensor | None, batch: Tensor, data: Any, *,
                         generator: torch.Generator | None, signals: TrainingSignals,
                         num_graphs: int | None) -> Tensor:
        """The layers, from the encoded nodes to the node states the read-out pools (``data``,
        ``generator`` and ``signals`` serve subclasses with producers)."""
        edge_index = data.edge_index
        for layer in self.layers:
            h = layer(h, edge_index, edge_attr, batch)
        return h

    def __repr__(self) -> str:
        conv = self.layers[0].conv
        head = sum(isinstance(m, Linear) for m in self.head)
        return (f"{type(self).__name__}(layers={len(self.layers)}, channels={conv.out_channels}, "
                f"pe={self.pe!r}, pool={self.pool!r}, head_layers={head})")
