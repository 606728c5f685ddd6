r"""The citation anchors, PyG's own layers in the published recipes, as registered models
(``--model gcn`` / ``--model gat``): they run through the runner's data, split, metric, model
selection and seeds, so a graphattn result and its anchor differ only in the model.

* **GCN** (Kipf & Welling, 2017; PyG's ``examples/gcn.py``): for each layer :math:`l < L`,
  :math:`h \leftarrow \mathrm{act}(\hat A\, \mathrm{drop}(h) W_l)` with
  :math:`\hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (:class:`~torch_geometric.nn.GCNConv`), and
  the last layer :math:`\hat A\, \mathrm{drop}(h) W_L` gives the class logits. Published on Cora /
  CiteSeer / PubMed: 81.5 / 70.3 / 79.0 (2 layers, hidden 16, dropout 0.5, lr 0.01, weight decay
  5e-4, 200 epochs).
* **GAT** (Veličković et al., 2018; PyG's ``examples/gat.py``): hidden layers
  :math:`h \leftarrow \mathrm{act}(\Vert_{k=1}^{K} \sum_j \alpha^k_{ij} W^k \mathrm{drop}(h)_j)`
  (:class:`~torch_geometric.nn.GATConv`, ``heads`` = K heads of ``hidden / heads`` channels,
  attention dropout), the output layer one head (``out_heads``) averaged. Published: 83.0 ± 0.7 /
  72.5 ± 0.7 / 79.0 ± 0.3 (8 heads × 8, ELU, dropout 0.6 on inputs and attention, lr 0.005,
  weight decay 5e-4; PubMed 8 output heads, lr 0.01, weight decay 0.001).

Both read the raw node features (no encoder) and are node-level models, like their papers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv

from graphattn.core.signals import TrainingSignals
from graphattn.nn.blocks import activation
from graphattn.nn.registry import register_model


class _Anchor(nn.Module):
    """What the runner needs of a model: ``forward(data, generator=None, return_signals=False)``
    and ``layers`` (each without a graphattn edge set: ``last_edges`` is ``None``)."""

    layers: nn.ModuleList

    def _check(self, task: str, num_layers: int, dropout: float) -> None:
        if task != "node":
            raise ValueError(f"{type(self).__name__} is a node-level anchor (the citation recipes); "
                             f"got task={task!r}")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"'num_layers' must be a positive int, got {num_layers!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"'dropout' must be in [0, 1), got {dropout!r}")

    dropout: float
    input_dropout: float
    act: nn.Module

    def convs_forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """``input_dropout`` on the input features, ``dropout`` before every later layer, the
        activation between layers, none after the last (it gives the class logits)."""
        for i, conv in enumerate(self.layers):
            p = self.input_dropout if i == 0 else self.dropout
            x = conv(F.dropout(x, p=p, training=self.training), edge_index)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x

    def forward(self, data: Any, *, generator: torch.Generator | None = None,
                return_signals: bool = False) -> Any:
        """Class logits ``[N, out_channels]``; with ``return_signals``, also an empty
        :class:`~graphattn.core.signals.TrainingSignals` (no producer, no auxiliary loss)."""
        if getattr(data, "x", None) is None or getattr(data, "edge_index", None) is None:
            raise ValueError(f"{type(self).__name__} needs data.x and data.edge_index")
        out = self.convs_forward(data.x, data.edge_index)
        return (out, TrainingSignals()) if return_signals else out

    def reset_parameters(self) -> None:
        for conv in self.layers:
            conv.reset_parameters()


@register_model("gcn")
class GCNAnchor(_Anchor):
    """Kipf & Welling's GCN from PyG's :class:`~torch_geometric.nn.GCNConv` (see the module
    docstring for the math and the published recipe): ``dropout`` between layers and
    ``input_dropout`` on the input features (the paper drops both, 0.5)."""

    OPTIONS: ClassVar[tuple[str, ...]] = ("hidden_channels", "out_channels", "num_layers", "dropout",
                                          "input_dropout", "act", "task")

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 2,
                 dropout: float = 0.5, input_dropout: float = 0.5, act: str = "relu",
                 task: str = "node") -> None:
        super().__init__()
        self._check(task, num_layers, dropout)
        self.dropout, self.input_dropout = dropout, input_dropout
        self.act = activation(act)
        widths = [-1] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.layers = nn.ModuleList(GCNConv(widths[i], widths[i + 1], cached=False)
                                    for i in range(num_layers))
        for conv in self.layers:
            conv.last_edges = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={len(self.layers)}, dropout={self.dropout})"


@register_model("gat")
class GATAnchor(_Anchor):
    """Veličković et al.'s GAT from PyG's :class:`~torch_geometric.nn.GATConv` (see the module
    docstring): hidden layers of ``heads`` heads × ``hidden_channels / heads`` channels,
    concatenated; the output layer ``out_heads`` heads averaged. ``attn_dropout`` drops attention
    coefficients, ``dropout`` the features between layers, ``input_dropout`` the input features
    (0.6 each in the paper)."""

    OPTIONS: ClassVar[tuple[str, ...]] = ("hidden_channels", "out_channels", "num_layers", "heads",
                                          "dropout", "attn_dropout", "input_dropout", "act",
                                          "out_heads", "task")

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 2,
                 heads: int = 8, dropout: float = 0.6, attn_dropout: float = 0.6,
                 input_dropout: float = 0.6, act: str = "elu", out_heads: int = 1,
                 task: str = "node") -> None:
        super().__init__()
        self._check(task, num_layers, dropout)
        if hidden_channels % heads:
            raise ValueError(f"'hidden_channels' ({hidden_channels}) must be a multiple of 'heads' "
                             f"({heads}): each head has hidden_channels / heads channels")
        if isinstance(out_heads, bool) or not isinstance(out_heads, int) or out_heads < 1:
            raise ValueError(f"'out_heads' must be a positive int, got {out_heads!r}")
        self.dropout, self.input_dropout = dropout, input_dropout
        attn = attn_dropout
        self.act = activation(act)
        layers = []
        for i in range(num_layers):
            last = i == num_layers - 1
            layers.append(GATConv(-1, out_channels if last else hidden_channels // heads,
                                  heads=out_heads if last else heads, concat=not last,
                                  dropout=attn))
        self.layers = nn.ModuleList(layers)
        for conv in self.layers:
            conv.last_edges = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(layers={len(self.layers)}, heads={self.layers[0].heads}, "
                f"dropout={self.dropout})")

