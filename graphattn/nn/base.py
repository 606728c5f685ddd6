r"""What every model of :mod:`graphattn.nn` with an encoder and a read-out shares: a model is an
input encoder, a stack of layers and a read-out,

.. math::
    h^{(0)} = \operatorname{encode}(x, \mathrm{pe}), \qquad
    h^{(L)} = \operatorname{layers}(h^{(0)}), \qquad
    \hat y = \operatorname{head}\big(\operatorname{pool}_b\, h^{(L)}\big)\ \text{(graph task; node
    task: no pool)}

:class:`GraphModel` runs that path (the input checks, :meth:`~GraphModel.encode`, the layers,
:meth:`~GraphModel.read_out`) for :class:`~graphattn.GraphTransformer`, the SAMSA and Converter
presets and GCN+; each builds its own encoders, layers and head in ``__init__`` (the order it builds
them in is the order of its parameters, which checkpoints and optimizer states follow) and declares
the keyword arguments it takes in ``OPTIONS`` (see :func:`~graphattn.nn.registry.register_model`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.nn import BatchNorm, Linear, global_add_pool, global_max_pool, global_mean_pool

from graphattn.core.checks import check_data_attributes, inputs_checked
from graphattn.core.edgeset import BaseEdgeSet
from graphattn.core.index import default_batch
from graphattn.core.inputs import check_graph_inputs
from graphattn.core.signals import TrainingSignals
from graphattn.kernels.dropout import dropout as fast_dropout
from graphattn.nn.blocks import DataView, EdgeEncoder, NodeEncoder, activation, random_sign_flip
from graphattn.nn.dropout import Dropout
from graphattn.producers.base import check_channels, check_dtype, check_positive_int, check_rate
from graphattn.tracing import trace

POOLS = {"mean": global_mean_pool, "add": global_add_pool, "sum": global_add_pool,
         "max": global_max_pool, "cls": None}
PE_ATTRS = {"laplacian": "laplacian_eigenvector_pe", "random_walk": "random_walk_pe",
            "position": "pos"}


def check_model_args(*, hidden_channels: Any, out_channels: Any, num_layers: Any = 1,
                     heads: Any = 1, ffn_ratio: Any = 1, head_layers: Any = 1, pe_dim: Any = 1,
                     num_embeddings: Any = None, dropout: Any = 0.0, attn_dropout: Any = 0.0,
                     input_dropout: Any = 0.0) -> None:
    """Type and range of the model arguments every preset shares (a :class:`ValueError` naming
    the argument)."""
    check_channels("hidden_channels", hidden_channels, lazy=False)
    check_channels("out_channels", out_channels, lazy=False)
    check_positive_int("num_layers", num_layers)
    check_positive_int("heads", heads)
    check_positive_int("ffn_ratio", ffn_ratio)
    check_positive_int("head_layers", head_layers, allow_zero=True)
    check_positive_int("pe_dim", pe_dim)
    check_channels("num_embeddings", num_embeddings, lazy=False, optional=True)
    for name, rate in (("dropout", dropout), ("attn_dropout", attn_dropout),
                       ("input_dropout", input_dropout)):
        check_rate(name, rate)


def check_mapping(name: str, value: Any) -> None:
    """A :class:`ValueError` naming ``name`` unless ``value`` is a mapping (of keyword arguments)
    or ``None``."""
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"'{name}' must be a dict of keyword arguments or None, got {value!r}")


def check_task_and_pool(task: Any, pool: Any) -> None:
    """``task`` is ``"node"`` or ``"graph"``; ``pool`` one of :data:`POOLS`, left at ``"mean"`` by a
    node task (it has no read-out)."""
    if task not in ("node", "graph"):
        raise ValueError(f"'task' must be 'node' or 'graph', got {task!r}")
    if not isinstance(pool, str) or pool not in POOLS:
        raise ValueError(f"'pool' must be one of {sorted(POOLS)}, got {pool!r}")
    if task == "node" and pool != "mean":
        raise ValueError(f"'pool' is the graph read-out; task='node' has none (got "
                         f"pool={pool!r}): leave it at its default or use task='graph'")


def graph_count(data: Any, batch: Tensor) -> int:
    """``data.num_graphs`` (a PyG ``Batch``), else the largest graph id + 1 (one host read), else 1."""
    n = getattr(data, "num_graphs", None)
    if n is not None:
        return int(n)
    return int(batch.max()) + 1 if batch.numel() else 1


def graph_pool(h: Tensor, batch: Tensor, num_graphs: int, pool: str) -> Tensor:
    """Graph read-out: ``"cls"`` takes each graph's first node, else a PyG pooling (:data:`POOLS`)."""
    if pool == "cls":
        counts = torch.bincount(batch, minlength=num_graphs)
        if bool((counts == 0).any()):
            raise ValueError(f"{pool=!r} needs every graph to have a node (its CLS node)")
        return h[torch.cumsum(counts, 0) - counts]
    return POOLS[pool](h, batch, size=num_graphs)


def mlp_head(channels: int, out_channels: int, layers: int,
             hidden_block: Callable[[], list[nn.Module]]) -> nn.Sequential:
    """A prediction MLP of ``layers`` linear layers: ``layers - 1`` times ``Linear(channels,
    channels)`` followed by ``hidden_block()`` (a model's norm, activation and dropout), then
    ``Linear(channels, out_channels)``; no layers: the identity."""
    head: list[nn.Module] = []
    for _ in range(layers - 1):
        head += [Linear(channels, channels), *hidden_block()]
    if layers:
        head.append(Linear(channels, out_channels))
    return nn.Sequential(*head)


def sinusoidal(pos: Tensor, dim: int) -> Tensor:
    r"""Transformer sinusoids of every coordinate of ``pos [N, d]``: for each coordinate
    :math:`p`, :math:`[\sin(p\,\omega_m), \cos(p\,\omega_m)]_{m < dim/2}` with
    :math:`\omega_m = 10000^{-2m/dim}`; the ``d`` blocks are concatenated → ``[N, d·dim]``."""
    if pos.dim() == 1:
        pos = pos[:, None]
    half = dim // 2
    freq = torch.exp(-torch.arange(half, device=pos.device, dtype=torch.float)
                     * (torch.log(torch.tensor(10000.0)) / max(half, 1)))
    ang = pos.float()[:, :, None] * freq[None, None, :]
    return torch.cat([ang.sin(), ang.cos()], -1).reshape(pos.size(0), -1)


def check_sign_flip(sign_flip: Any, pe: str | None, pe_attr: str | None) -> bool:
    """``sign_flip`` checked: a bool, set only for eigenvectors (``pe="laplacian"``) or an encoding
    the user names (``pe_attr``); a :class:`ValueError` naming ``pe_sign_flip`` otherwise."""
    if not isinstance(sign_flip, bool):
        raise ValueError(f"'pe_sign_flip' must be true or false, got {sign_flip!r}")
    if sign_flip and pe != "laplacian" and pe_attr is None:
        raise ValueError(f"'pe_sign_flip' flips the signs of Laplacian eigenvectors; pe={pe!r} has "
                         f"none (use pe='laplacian' or name the encoding with 'pe_attr')")
    return sign_flip


def read_positional_encoding(data: Any, pe: str | None, attr: str, training: bool,
                             sign_flip: bool = False) -> Tensor:
    """``data.<attr>``, the encoding ``pe`` the runner's transform wrote (a :class:`ValueError`
    saying which transform writes it when absent); with ``sign_flip``, a random sign per
    eigenvector in training (:func:`random_sign_flip`: for eigenvectors whose signs are arbitrary,
    such as those of PyG's ``AddLaplacianEigenvectorPE``; those of
    :class:`~graphattn.nn.laplacian_pe.LaplacianPE` have canonical signs and need none)."""
    value = getattr(data, attr, None)
    if value is None:
        raise ValueError(f"pe={pe!r} reads data.{attr}; add the PyG transform that writes it (see "
                         f"graphattn.nn.positional_encoding)")
    return random_sign_flip(value, training) if sign_flip else value


def shared_producers(layers: Any) -> list[Any]:
    """Producer instances (a layer's ``producer`` attribute) that serve more than one of
    ``layers``: their :meth:`~graphattn.EdgeProducer.sharing_scope` must span the forward pass."""
    seen: dict[int, tuple[Any, int]] = {}
    for layer in layers:
        p = getattr(layer, "producer", None)
        if p is not None:
            seen[id(p)] = (p, seen.get(id(p), (p, 0))[1] + 1)
    return [p for p, uses in seen.values() if uses > 1]


@contextmanager
def layer_pass(layers: Any) -> Iterator[dict[Hashable, Any]]:
    """One forward pass through ``layers`` whose inputs the model checked: the sharing scopes of
    the producers that serve several layers, the layers' own input checks off, and the edge cache
    (batch-only edge sets built once, shared by the layers) it yields."""
    with ExitStack() as scopes:
        for producer in shared_producers(layers):
            scopes.enter_context(producer.sharing_scope())
        scopes.enter_context(inputs_checked())
        yield {}


class LastPassSignals:
    """The training signals of a model's last forward pass (``forward(..., return_signals=True)``
    returns the same values with the predictions; the model keeps them as ``_last_signals``, not
    its layers)."""

    def _signals(self) -> TrainingSignals:
        return self.__dict__.get("_last_signals") or TrainingSignals()

    def edge_sets(self) -> list[BaseEdgeSet]:
        """The edge sets of the last forward pass, one per layer with a global branch."""
        return list(self._signals().edge_sets)

    def aux_loss(self) -> Tensor | None:
        """Sum of the producers' differentiable auxiliary losses in the last forward pass."""
        return self._signals().aux_loss

    def policy_terms(self) -> list[tuple[Tensor, Tensor]]:
        """``(log_prob [A], log_prob_graph [A])`` of every sampling producer in the last pass."""
        return self._signals().policy_terms


class GraphModel(LastPassSignals, nn.Module):
    r"""A model as an input encoder, a stack of layers (``layers``) and a read-out (see the module
    docstring). :meth:`forward` checks the data (:meth:`check_data`), encodes it
    (:meth:`encode`), runs the layers (:meth:`propagate_layers`) and reads out
    (:meth:`read_out`: the final norm, the pooling of a graph task, the ``head``).

    A subclass builds, in ``__init__``: the encoder's modules (``node_encoder``, ``edge_encoder``,
    ``pe_encoder`` and ``pe_norm``, each ``None`` where absent; :meth:`add_encoders` builds the
    usual ones), ``layers``, and ``head`` (:meth:`add_head` builds GraphGym's MLP head), and sets
    ``task`` and ``pool``. ``OPTIONS`` lists the keyword arguments its constructor takes.
    """

    #: the keyword arguments the constructor takes (the model registry passes no other)
    OPTIONS: ClassVar[tuple[str, ...]] = ()
    #: the layers need the number of graphs of a batch (counted once per forward pass)
    layers_count_graphs: ClassVar[bool] = False

    layers: nn.ModuleList
    head: nn.Module

    def __init__(self) -> None:
        super().__init__()
        self.task = "graph"
        self.pool = "mean"
        #: the data must carry edge features (e.g. a GINE conv adds them to every message)
        self.needs_edge_attr = False
        # the encoder: the encoding of positional encoding ``pe`` read from ``data.<pe_attr>``
        # (``pe_dim`` sinusoids per coordinate for "position"), added to the node encoder's
        # output, or (``pe_concat``) normalised by ``pe_norm`` and concatenated to it
        self.pe: str | None = None
        self.pe_attr: str | None = None
        self.pe_dim = 16
        self.pe_concat = False
        self.pe_sign_flip = False
        self.input_dropout = 0.0
        self.node_encoder: NodeEncoder | None = None
        self.edge_encoder: EdgeEncoder | None = None
        self.pe_encoder: nn.Module | None = None
        self.pe_norm: nn.Module | None = None
        self.final_norm: nn.Module | None = None

    # ------------------------------------------------------------------------------ building
    def add_encoders(self, hidden_channels: int, *, node_encoder: str | None,
                     num_embeddings: int | None, edge_encoder: str | None, pe: str | None,
                     pe_attr: str | None, pe_dim: int, input_dropout: float,
                     pe_sign_flip: bool = False) -> None:
        """The node encoder (``None``: the first layer reads the raw features), the edge encoder
        and the linear encoding of ``pe`` added to the node encoder's output (``pe_sign_flip``:
        a random sign per eigenvector in training, :func:`read_positional_encoding`), then the place
        of the ``layers`` (empty until the model fills it): their parameters come in this order."""
        if pe is not None and pe not in PE_ATTRS and pe_attr is None:
            raise ValueError(f"'pe' must be one of {sorted(PE_ATTRS)} (or give 'pe_attr'), got {pe!r}")
        self.pe = pe
        self.pe_attr = pe_attr or (PE_ATTRS.get(pe) if pe else None)
        self.pe_dim = pe_dim
        self.pe_sign_flip = check_sign_flip(pe_sign_flip, pe, pe_attr)
        self.input_dropout = input_dropout
        if node_encoder is None and self.pe_attr:
            raise ValueError("a positional encoding needs a node encoder (it is added to its output)")
        self.node_encoder = (NodeEncoder(node_encoder, hidden_channels, num_embeddings)
                             if node_encoder is not None else None)
        self.edge_encoder = EdgeEncoder(edge_encoder, hidden_channels) if edge_encoder else None
        self.pe_encoder = Linear(-1, hidden_channels) if self.pe_attr else None
        self.layers = nn.ModuleList()

    def add_head(self, hidden_channels: int, out_channels: int, *, head_layers: int,
                 head_norm: str | None, act: str, dropout: float, final_norm: bool) -> None:
        """With ``final_norm``, a LayerNorm on the last layer's output (pre-norm layers leave it
        unnormalised); then the prediction head, GraphGym's MLP: ``head_layers - 1`` times
        ``Linear → BatchNorm → act → dropout`` (``head_norm="none"``: no BatchNorm), then
        ``Linear``."""
        self.final_norm = nn.LayerNorm(hidden_channels) if final_norm and head_layers else None
        if head_norm not in ("batch_norm", "none", None):
            raise ValueError(f"'head_norm' must be 'batch_norm' or 'none', got {head_norm!r}")
        if head_norm is not None and head_layers < 2:
            raise ValueError(f"head_norm={head_norm!r} needs a head with a hidden layer "
                             f"(head_layers >= 2), got head_layers={head_layers}")
        batch_norm = (head_norm or "batch_norm") == "batch_norm"

        def hidden_block() -> list[nn.Module]:
            norm = [BatchNorm(hidden_channels, allow_single_element=True)] if batch_norm else []
            return [*norm, activation(act), Dropout(dropout)]

        self.head = mlp_head(hidden_channels, out_channels, head_layers, hidden_block)

    def reset_parameters(self) -> None:
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    # ------------------------------------------------------------------------------- the path
    def forward(self, data: Any, *, generator: torch.Generator | None = None,
                trace_attention: bool = False, return_signals: bool = False) -> Any:
        """Predictions for ``data`` (a PyG ``Data``/``Batch``); with ``trace_attention=True`` also
        the :class:`~graphattn.AttentionTrace` of every layer; with ``return_signals=True`` also the
        :class:`~graphattn.core.signals.TrainingSignals` of the pass (the producers' ``aux_loss`` and
        policy-gradient terms, which a training loop adds to its objective). Both: ``(out, trace,
        signals)``.

        ``data`` is checked first (:meth:`check_data`): a :class:`ValueError` naming the attribute
        for malformed ``x``, ``batch``, ``edge_index`` or ``edge_attr``. Node features of another
        floating-point dtype than the model's parameters are refused, not cast."""
        self.check_data(data)
        signals = TrainingSignals()
        if trace_attention:
            with trace(self) as t:
                out = self._forward(data, generator, signals)
        else:
            out = self._forward(data, generator, signals)
        self._last_signals = signals
        extra = ((t,) if trace_attention else ()) + ((signals,) if return_signals else ())
        return (out, *extra) if extra else out

    def _forward(self, data: Any, generator: torch.Generator | None,
                 signals: TrainingSignals) -> Tensor:
        h, edge_attr, batch = self.encode_with_batch(data)
        num_graphs = graph_count(data, batch) if self.layers_count_graphs else None
        h = self.propagate_layers(h, edge_attr, batch, data, generator=generator, signals=signals,
                                  num_graphs=num_graphs)
        return self.read_out(h, data, batch, num_graphs)

    def check_data(self, data: Any) -> None:
        """Checks the attributes of ``data`` the model reads, with one host read for all value
        checks (:func:`~graphattn.core.inputs.check_graph_inputs`): ``x`` (a tensor of the encoder's
        rank, floating-point features of the model's dtype, no NaN/inf), ``batch`` (``[N]`` long,
        graph ids in ``[0, num_graphs)``), ``edge_index`` (``[2, E]`` long, in range, no edge
        joining two graphs) and ``edge_attr`` (one row per edge, no NaN/inf) when the model encodes
        it. The layers then skip their own checks."""
        x = getattr(data, "x", None)
        if x is None:
            raise ValueError(f"{type(self).__name__} needs node features 'data.x'")
        if not isinstance(x, Tensor):
            raise ValueError(f"'data.x' must be a torch.Tensor, got {type(x).__name__}")
        kind = None if self.node_encoder is None else self.node_encoder.kind
        if kind == "embedding":
            if not (x.dim() == 1 or (x.dim() == 2 and x.size(1) == 1)):
                raise ValueError(f"'data.x' must hold one token id per node ([N] or [N, 1]) for "
                                 f"node_encoder='embedding', got shape {list(x.shape)}")
        elif x.dim() != 2:
            raise ValueError(f"'data.x' must be 2-D [N, F], got shape {list(x.shape)}")
        if kind in (None, "linear") and x.is_floating_point():
            check_dtype("data.x", x, param_dtype_module(self), type(self).__name__)
        elif kind is None:
            raise ValueError(f"'data.x' must be floating-point with node_encoder=None, got {x.dtype}")
        N = x.size(0)
        batch = getattr(data, "batch", None)
        if batch is not None and not isinstance(batch, Tensor):
            raise ValueError(f"'data.batch' must be a torch.Tensor, got {type(batch).__name__}")
        edge_index = getattr(data, "edge_index", None)
        edge_attr = getattr(data, "edge_attr", None) if self.edge_encoder is not None else None
        if edge_attr is None and self.needs_edge_attr:
            raise ValueError("'data.edge_attr' is missing: conv='gine' adds edge features to every "
                             "message (give the data edge features, or choose a conv that reads "
                             "none)")
        check_data_attributes(data, N)
        pe = getattr(data, self.pe_attr, None) if self.pe_encoder is not None else None
        num_graphs = getattr(data, "num_graphs", None)
        check_graph_inputs(edge_index, N, batch,
                           finite={"data.x": x, "data.edge_attr": edge_attr, f"data.{self.pe_attr}": pe},
                           num_graphs=num_graphs if isinstance(num_graphs, int) else None)

    def encode(self, data: Any) -> tuple[Tensor, Tensor | None]:
        """``(h0, encoded edge features or None)``: ``input_dropout`` on float features (on the
        node encoder's output for integer ones), the node encoder and the positional encoding."""
        x = data.x
        if x is None:
            raise ValueError(f"{type(self).__name__} needs node features 'data.x'")
        if x.is_floating_point():  # dropout on the raw input features (as in GCN / GAT)
            x = fast_dropout(x, self.input_dropout, self.training)
        if self.node_encoder is None:
            if not x.is_floating_point():
                raise ValueError("node_encoder=None needs floating-point node features")
            return x, self.encode_edges(data)
        h = self.node_encoder(x)
        if not x.is_floating_point():
            h = fast_dropout(h, self.input_dropout, self.training)
        if self.pe_encoder is not None:
            assert self.pe_attr is not None
            pe = read_positional_encoding(data, self.pe, self.pe_attr, self.training,
                                          self.pe_sign_flip)
            if self.pe == "position":
                pe = sinusoidal(pe, self.pe_dim)
            pe = pe.to(h.dtype)
            if self.pe_norm is not None:
                pe = self.pe_norm(pe)
            h = torch.cat([h, self.pe_encoder(pe)], dim=-1) if self.pe_concat else h + self.pe_encoder(pe)
        return h, self.encode_edges(data)

    def encode_edges(self, data: Any) -> Tensor | None:
        """The edge encoder's output on ``data.edge_attr`` (``None`` without either)."""
        edge_attr = getattr(data, "edge_attr", None)
        if self.edge_encoder is None or edge_attr is None:
            return None
        return self.edge_encoder(edge_attr)

    def encode_with_batch(self, data: Any) -> tuple[Tensor, Tensor | None, Tensor]:
        """``(h, edge_attr, batch)``: :meth:`encode` and the graph of each node (one graph when
        ``data`` has no ``batch``)."""
        h, edge_attr = self.encode(data)
        return h, edge_attr, default_batch(getattr(data, "batch", None), h.size(0), h.device)

    def propagate_layers(self, h: Tensor, edge_attr: Tensor | None, batch: Tensor, data: Any, *,
                         generator: torch.Generator | None, signals: TrainingSignals,
                         num_graphs: int | None) -> Tensor:
        """The layers, from the encoded nodes to the node states the read-out pools: each called
        as ``layer(h, edge_index, batch, edge_attr, data=..., generator=..., signals=...,
        edge_cache=...)`` (:class:`~graphattn.HybridLayer`'s interface) in one
        :func:`layer_pass`; ``data`` is seen with the encoded ``edge_attr``. ``num_graphs`` is
        counted where :attr:`layers_count_graphs` asks for it."""
        view = DataView(data, edge_attr=edge_attr)
        edge_index = getattr(data, "edge_index", None)
        with layer_pass(self.layers) as edge_cache:
            for layer in self.layers:
                h = layer(h, edge_index, batch, edge_attr, data=view, generator=generator,
                          signals=signals, edge_cache=edge_cache)
        return h

    def read_out(self, h: Tensor, data: Any, batch: Tensor, num_graphs: int | None = None) -> Tensor:
        """The predictions from the last layer's node states: ``final_norm``, the pooling of a
        graph task (:meth:`pool_nodes`; ``num_graphs`` counted here unless given), the head."""
        if self.final_norm is not None:
            h = self.final_norm(h)
        if self.task == "graph":
            h = self.pool_nodes(h, batch, graph_count(data, batch) if num_graphs is None else num_graphs)
        return self.head(h)

    def pool_nodes(self, h: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        """``[num_graphs, d]``: the node states of each graph pooled by ``pool``
        (:func:`graph_pool`)."""
        return graph_pool(h, batch, num_graphs, self.pool)


def param_dtype_module(model: nn.Module) -> nn.Module:
    """The module whose parameters the node features meet first (for the dtype check)."""
    encoder = getattr(model, "node_encoder", None)
    return encoder if encoder is not None else model
