"""GraphTransformer: encoders + L hybrid layers + a node- or graph-level head."""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.nn import BatchNorm, Linear, global_add_pool, global_max_pool, global_mean_pool

from graphattn.core.checks import check_data_attributes, inputs_checked
from graphattn.core.edgeset import BaseEdgeSet, check_graph_inputs
from graphattn.core.signals import TrainingSignals
from graphattn.kernels.dropout import dropout as fast_dropout
from graphattn.nn.blocks import DataView, EdgeEncoder, NodeEncoder, activation, random_sign_flip
from graphattn.nn.dropout import Dropout
from graphattn.nn.hybrid import HybridLayer, producer_defaults
from graphattn.nn.registry import register_model
from graphattn.producers.base import check_channels, check_dtype, check_positive_int, check_rate
from graphattn.producers.registry import build_producer
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


def check_unused_args(preset: type, given: Mapping[str, Any]) -> None:
    """A preset that builds its own blocks does not use some of :class:`GraphTransformer`'s
    arguments (``preset.UNUSED_ARGS``: name -> why). Leaving one at its default (GraphTransformer's
    or the preset's own) is fine; any other value raises a :class:`ValueError` instead of being
    silently ignored."""
    base = inspect.signature(GraphTransformer.__init__).parameters
    own = inspect.signature(preset.__init__).parameters
    for name, why in preset.UNUSED_ARGS.items():
        if name not in given:
            continue
        defaults = {p.default for p in (base.get(name), own.get(name)) if p is not None
                    and p.default is not inspect.Parameter.empty}
        if given[name] not in defaults:
            raise ValueError(f"the {preset.__name__} preset does not use {name!r} ({why}); got "
                             f"{name}={given[name]!r}: leave it at its default")


def check_mapping(name: str, value: Any) -> None:
    """A :class:`ValueError` naming ``name`` unless ``value`` is a mapping (of keyword arguments)
    or ``None``."""
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"'{name}' must be a dict of keyword arguments or None, got {value!r}")


def check_node_level_producers(layers: Any) -> None:
    """A :class:`ValueError` for a node-level model whose layers use a producer that is not
    permutation-equivariant (its slot outputs do not follow the nodes: Sliceformer)."""
    for i, layer in enumerate(layers):
        producer = getattr(layer, "producer", None)
        if producer is not None and not getattr(producer, "permutation_equivariant", True):
            name = producer.name or type(producer).__name__
            raise ValueError(
                f"producer {name!r} (layer {i}) is order-dependent: node r receives the r-th order "
                f"statistic of each channel, not a value computed from node r, so a node-level "
                f"model's predictions would follow the data set's node order; use it on graph "
                f"tasks (pooled or CLS read-out), or pass allow_order_dependent=True where the "
                f"node order is the signal")


def _param_dtype_module(model: nn.Module) -> nn.Module:
    """The module whose parameters the node features meet first (for the dtype check)."""
    return model.node_encoder if model.node_encoder is not None else model  # type: ignore[return-value]


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


def read_positional_encoding(data: Any, pe: str | None, attr: str, training: bool) -> Tensor:
    """``data.<attr>``, the encoding ``pe`` the runner's transform wrote (a :class:`ValueError`
    saying which transform writes it when absent); Laplacian eigenvectors get a random sign flip
    per eigenvector in training (:func:`random_sign_flip`)."""
    value = getattr(data, attr, None)
    if value is None:
        raise ValueError(f"pe={pe!r} reads data.{attr}; add the PyG transform that writes it (see "
                         f"graphattn.nn.positional_encoding)")
    return random_sign_flip(value, training) if pe == "laplacian" else value


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


def graph_count(data: Any, batch: Tensor) -> int:
    """``data.num_graphs`` (a PyG ``Batch``), else the largest graph id + 1 (one host read), else 1."""
    n = getattr(data, "num_graphs", None)
    if n is not None:
        return int(n)
    return int(batch.max()) + 1 if batch.numel() else 1


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


@register_model("hybrid")
class GraphTransformer(LastPassSignals, nn.Module):
    r"""A stack of :class:`HybridLayer` s between input encoders and a prediction head.

    .. math::
        h^{(0)} = \operatorname{Enc}(x) + W_{PE}\,\mathrm{pe}, \qquad
        h^{(\ell)} = \operatorname{HybridLayer}_\ell(h^{(\ell-1)}), \qquad
        \hat y = \operatorname{MLP}\big(h^{(L)}\big)\ \text{(node task)}\ \text{or}\
        \operatorname{MLP}\big(\operatorname{pool}_b h^{(L)}\big)\ \text{(graph task)}

    Args:
        hidden_channels (int): width of every layer.
        out_channels (int): outputs per node (node task) or per graph (graph task).
        num_layers (int): :math:`L`.
        producer: producer spec for every layer, or a list with one spec per layer (``None`` =
            no global branch in that layer). A mapping spec with ``"shared": true`` (or an
            :class:`~graphattn.producers.EdgeProducer` instance) is built once, sized for the first
            layer's input, and used by every layer; ``"shared": false`` (the default) builds one
            producer per layer.
        conv (str, optional): local MPNN in every layer (see :class:`HybridLayer`).
        heads (int): attention heads.
        dropout, attn_dropout (float): see :class:`HybridLayer`.
        norm (str), norm_first (bool), act (str), ffn_ratio (int): see :class:`HybridLayer`.
        node_encoder (str, optional): ``"linear"``, ``"atom"`` (ogb molecules), ``"embedding"``, or
            ``None``: the first layer reads the raw features (lazily sized), as GCN / GAT do.
        num_embeddings (int, optional): vocabulary size for ``node_encoder="embedding"``.
        edge_encoder (str, optional): ``"linear"``, ``"bond"`` or ``None`` (edge features unused).
        pe (str, optional): ``"laplacian"`` or ``"random_walk"``: reads the attribute written by
            :class:`~graphattn.nn.laplacian_pe.LaplacianPE` (or PyG's
            :class:`~torch_geometric.transforms.AddLaplacianEigenvectorPE`) /
            :class:`~torch_geometric.transforms.AddRandomWalkPE` (or ``pe_attr``), encodes it
            linearly and adds it to :math:`h^{(0)}`. Laplacian eigenvector signs are flipped at
            random in training. ``"position"``: sinusoids (:func:`sinusoidal`, ``pe_dim`` per
            coordinate) of ``data.pos`` — sequence index, pixel (row, col) or point coordinates.
        pe_attr (str, optional): the data attribute holding the encoding.
        pe_dim (int): sinusoid width per coordinate for ``pe="position"``.
        task (str): ``"node"`` or ``"graph"``.
        pool (str): graph read-out, ``"mean"``, ``"add"``, ``"max"`` or ``"cls"`` (the first node of
            each graph, e.g. the CLS node the sequence and image loaders put at local index 0).
            A node task has no read-out: another value than the default is refused there.
        head_layers (int): layers of the prediction MLP (default 1: a linear read-out);
            ``0``: the last layer is an output layer (:class:`HybridLayer` ``output_layer=True``)
            producing ``out_channels`` itself, as the last layer of GCN / GAT (its attention heads
            are averaged). A deeper head is GraphGym's MLP: ``head_layers - 1`` times
            ``Linear → BatchNorm → act → dropout``, then ``Linear``. The batch norm is what keeps
            it alive: the pooled vectors of different graphs are nearly the same (a channel
            offset shared by every node dominates them after a post-norm layer), so without it
            each ReLU unit is on for every graph or off for every graph, Adam switches them all
            off within a few steps, and the output is nearly the same for every graph (measured
            on Peptides-func: validation AP 0.177 after 8 epochs on 2000 graphs, the class prior
            0.159; benchmarks/results/cpu-2026-11-29/peptides_head_collapse/);
            centring each channel over the batch gives the units graphs on both sides.
        head_norm (str, optional): the norm of the head's hidden layers, ``"batch_norm"`` (what
            ``None``, the default, means) or ``"none"`` (the head before the batch norm was
            added); set on a head without hidden layers (``head_layers`` < 2) it is an error.
        input_dropout (float): dropout on the raw input features (on their embedding for integer
            features).
        attn_kwargs, producer_kwargs (dict, optional), residual, ffn (bool): forwarded to every
            :class:`HybridLayer`. Producers whose constructor takes ``layer`` / ``num_layers`` also
            receive their 0-based layer index and :math:`L` by default.
        in_channels (int): width of the raw features the first layer reads without a node encoder
            (``-1``: lazily sized on the first call). Producers with parameters sized by their
            input (SAMSA's importance network, the Converter's) need it there.
        allow_order_dependent (bool): with ``task="node"``, accept a producer whose output at
            slot :math:`r` does not depend on the node at :math:`r`
            (``permutation_equivariant = False``: Sliceformer gives node :math:`r` the
            :math:`r`-th order statistic of each channel). By default such a node model is a
            :class:`ValueError`: its predictions would follow the data set's index order (on
            Planetoid the training nodes are the first 140, so they only ever see the lowest
            order statistics). Set it where the node order is the signal (e.g. token positions).
    """

    #: set by presets that build their own blocks (SAMSA, Converter): no HybridLayers are built
    builds_own_layers: bool = False
    #: the arguments such a preset does not use, with the reason (see :func:`check_unused_args`)
    UNUSED_ARGS: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        hidden_channels: int,
        out_channels: int,
        num_layers: int = 4,
        producer: Any = "full",
        conv: str | None = None,
        heads: int = 4,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm: str | None = "layer_norm",
        norm_first: bool = False,
        act: str = "relu",
        ffn_ratio: int = 2,
        node_encoder: str | None = "linear",
        num_embeddings: int | None = None,
        edge_encoder: str | None = None,
        pe: str | None = None,
        pe_attr: str | None = None,
        pe_dim: int = 16,
        task: str = "graph",
        pool: str = "mean",
        head_layers: int = 1,
        head_norm: str | None = None,
        input_dropout: float = 0.0,
        attn_kwargs: dict[str, Any] | None = None,
        producer_kwargs: dict[str, Any] | None = None,
        residual: bool = True,
        ffn: bool = True,
        in_channels: int = -1,
        allow_order_dependent: bool = False,
    ) -> None:
        super().__init__()
        if task not in ("node", "graph"):
            raise ValueError(f"'task' must be 'node' or 'graph', got {task!r}")
        if not isinstance(pool, str) or pool not in POOLS:
            raise ValueError(f"'pool' must be one of {sorted(POOLS)}, got {pool!r}")
        if task == "node" and pool != "mean":
            raise ValueError(f"'pool' is the graph read-out; task='node' has none (got "
                             f"pool={pool!r}): leave it at its default or use task='graph'")
        check_mapping("attn_kwargs", attn_kwargs)
        check_mapping("producer_kwargs", producer_kwargs)
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         num_layers=num_layers, heads=heads, ffn_ratio=ffn_ratio,
                         head_layers=head_layers, pe_dim=pe_dim, num_embeddings=num_embeddings,
                         dropout=dropout, attn_dropout=attn_dropout, input_dropout=input_dropout)
        if (head_layers == 0 and conv == "gine" and out_channels != hidden_channels
                and not self.builds_own_layers):
            raise ValueError(f"head_layers=0 makes the last layer an output layer of width "
                             f"out_channels={out_channels}, which conv='gine' cannot build (it needs "
                             f"in_channels == channels = {hidden_channels}); use head_layers >= 1")
        if conv == "gine" and edge_encoder is None and not self.builds_own_layers:
            raise ValueError("conv='gine' adds edge features to every message: set "
                             "edge_encoder='linear' (or 'bond' for ogb molecules) and give the "
                             "data an 'edge_attr', or choose a conv that reads no edge features "
                             "('gin', 'gcn', 'gat', ...)")
        if pe is not None and pe not in PE_ATTRS and pe_attr is None:
            raise ValueError(f"'pe' must be one of {sorted(PE_ATTRS)} (or give 'pe_attr'), got {pe!r}")
        self.task = task
        self.pool = pool
        #: the local conv adds edge features to every message (GINE): data must carry edge_attr
        self.needs_edge_attr = conv == "gine" and not self.builds_own_layers
        self.pe = pe
        self.pe_attr = pe_attr or (PE_ATTRS.get(pe) if pe else None)
        self.pe_dim = pe_dim
        self.input_dropout = input_dropout
        if node_encoder is None and self.pe_attr:
            raise ValueError("a positional encoding needs a node encoder (it is added to its output)")
        self.node_encoder = (NodeEncoder(node_encoder, hidden_channels, num_embeddings)
                             if node_encoder is not None else None)
        self.edge_encoder = EdgeEncoder(edge_encoder, hidden_channels) if edge_encoder else None
        self.pe_encoder = Linear(-1, hidden_channels) if self.pe_attr else None
        self.layers = nn.ModuleList()  # a preset (builds_own_layers) fills it itself
        if not self.builds_own_layers:
            if isinstance(producer, Mapping) and "shared" in producer:
                shared = producer["shared"]
                if not isinstance(shared, bool):
                    raise ValueError(f"a producer spec's 'shared' must be true or false, got {shared!r}")
                producer = {k: v for k, v in producer.items() if k != "shared"}
                if shared:
                    # one instance serves every layer (parameters shared; e.g. SAC predicts one
                    # structure). It is sized for the first layer's input: the raw features
                    # (lazily sized) without a node encoder, the hidden width with one.
                    first_in = in_channels if node_encoder is None else hidden_channels
                    producer = build_producer(producer, **producer_defaults(first_in, heads,
                                                                            producer_kwargs))
            producers = (
                list(producer)
                if isinstance(producer, Sequence) and not isinstance(producer, (str, bytes))
                else [producer] * num_layers
            )
            if len(producers) != num_layers:
                raise ValueError(f"got {len(producers)} producer specs for num_layers={num_layers}")
            edge_dim = hidden_channels if edge_encoder else None
            n = num_layers
            self.layers = nn.ModuleList(
                HybridLayer(
                    out_channels if (head_layers == 0 and i == n - 1) else hidden_channels,
                    conv=conv,
                    producer=p,
                    heads=heads,
                    dropout=dropout,
                    attn_dropout=attn_dropout,
                    act=act,
                    norm=norm,
                    norm_first=norm_first,
                    ffn_ratio=ffn_ratio,
                    edge_dim=edge_dim,
                    attn_kwargs=attn_kwargs,
                    # layer-dependent producers (Sliceformer's interleave) learn their depth here
                    producer_kwargs={"layer": i, "num_layers": n, **(producer_kwargs or {})},
                    residual=residual,
                    ffn=ffn,
                    in_channels=in_channels if (i == 0 and node_encoder is None) else hidden_channels,
                    output_layer=head_layers == 0 and i == n - 1,
                )
                for i, p in enumerate(producers)
            )
        if task == "node" and not allow_order_dependent:
            check_node_level_producers(self.layers)
        self.final_norm = nn.LayerNorm(hidden_channels) if norm_first and head_layers else None
        head: list[nn.Module] = []
        if head_norm not in ("batch_norm", "none", None):
            raise ValueError(f"'head_norm' must be 'batch_norm' or 'none', got {head_norm!r}")
        if head_norm is not None and head_layers < 2:
            raise ValueError(f"head_norm={head_norm!r} needs a head with a hidden layer "
                             f"(head_layers >= 2), got head_layers={head_layers}")
        head_norm = head_norm or "batch_norm"
        for _ in range(head_layers - 1):  # GraphGym's MLP head: Linear → BatchNorm → act → dropout
            head += [Linear(hidden_channels, hidden_channels),
                     *([BatchNorm(hidden_channels, allow_single_element=True)]
                       if head_norm == "batch_norm" else []),
                     activation(act), Dropout(dropout)]
        if head_layers:
            head.append(Linear(hidden_channels, out_channels))
        self.head = nn.Sequential(*head)

    def reset_parameters(self) -> None:
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def encode(self, data: Any) -> tuple[Tensor, Tensor | None]:
        x = data.x
        if x is None:
            raise ValueError("GraphTransformer needs node features 'data.x'")
        if x.is_floating_point():  # dropout on the raw input features (as in GCN / GAT)
            x = fast_dropout(x, self.input_dropout, self.training)
        if self.node_encoder is None:
            if not x.is_floating_point():
                raise ValueError("node_encoder=None needs floating-point node features")
            return x, self._edge_attr(data)
        h = self.node_encoder(x)
        if not x.is_floating_point():
            h = fast_dropout(h, self.input_dropout, self.training)
        if self.pe_encoder is not None:
            pe = read_positional_encoding(data, self.pe, self.pe_attr, self.training)
            if self.pe == "position":
                pe = sinusoidal(pe, self.pe_dim)
            h = h + self.pe_encoder(pe.to(h.dtype))
        return h, self._edge_attr(data)

    def _edge_attr(self, data: Any) -> Tensor | None:
        edge_attr = getattr(data, "edge_attr", None)
        if self.edge_encoder is None or edge_attr is None:
            return None
        return self.edge_encoder(edge_attr)

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

    def check_data(self, data: Any) -> None:
        """Checks the attributes of ``data`` the model reads, with one host read for all value
        checks (:func:`~graphattn.core.edgeset.check_graph_inputs`): ``x`` (a tensor of the encoder's
        rank, floating-point features of the model's dtype, no NaN/inf), ``batch`` (``[N]`` long,
        graph ids in ``[0, num_graphs)``), ``edge_index`` (``[2, E]`` long, in range, no edge
        joining two graphs) and ``edge_attr`` (one row per edge, no NaN/inf) when the model encodes
        it. The layers then skip their own checks."""
        x = getattr(data, "x", None)
        if x is None:
            raise ValueError("GraphTransformer needs node features 'data.x'")
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
            check_dtype("data.x", x, _param_dtype_module(self), type(self).__name__)
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

    def encode_with_batch(self, data: Any) -> tuple[Tensor, Tensor | None, Tensor]:
        """``(h, edge_attr, batch)``: :meth:`encode` and the graph of each node (one graph when
        ``data`` has no ``batch``)."""
        h, edge_attr = self.encode(data)
        batch = getattr(data, "batch", None)
        if batch is None:
            batch = torch.zeros(h.size(0), dtype=torch.long, device=h.device)
        return h, edge_attr, batch

    def _forward(self, data: Any, generator: torch.Generator | None,
                 signals: TrainingSignals) -> Tensor:
        h, edge_attr, batch = self.encode_with_batch(data)
        view = DataView(data, edge_attr=edge_attr)
        edge_index = getattr(data, "edge_index", None)
        with layer_pass(self.layers) as edge_cache:
            for layer in self.layers:
                h = layer(h, edge_index, batch, edge_attr, data=view, generator=generator,
                          signals=signals, edge_cache=edge_cache)
        if self.final_norm is not None:
            h = self.final_norm(h)
        if self.task == "graph":
            h = self._pool(h, batch, graph_count(data, batch), self.pool)
        return self.head(h)

    @staticmethod
    def _pool(h: Tensor, batch: Tensor, num_graphs: int, pool: str) -> Tensor:
        """Graph read-out: ``"cls"`` takes each graph's first node, else a PyG pooling."""
        if pool == "cls":
            counts = torch.bincount(batch, minlength=num_graphs)
            if bool((counts == 0).any()):
                raise ValueError(f"{pool=!r} needs every graph to have a node (its CLS node)")
            return h[torch.cumsum(counts, 0) - counts]
        return POOLS[pool](h, batch, size=num_graphs)


def positional_encoding(kind: str, dim: int) -> Any:
    """The PyG transform writing the encoding ``GraphTransformer(pe=kind)`` reads: Laplacian
    eigenvectors computed reproducibly (:class:`~graphattn.nn.laplacian_pe.LaplacianPE`), the
    random-walk one memoised per graph structure
    (:class:`~graphattn.nn.random_walk_pe.CachedRandomWalkPE`)."""
    from graphattn.nn.laplacian_pe import LaplacianPE
    from graphattn.nn.random_walk_pe import CachedRandomWalkPE

    if kind == "laplacian":
        return LaplacianPE(dim, attr_name=PE_ATTRS["laplacian"])
    if kind == "random_walk":  # deterministic: computed once per distinct graph structure
        return CachedRandomWalkPE(dim, attr_name=PE_ATTRS["random_walk"])
    raise ValueError(f"unknown positional encoding {kind!r}; use 'laplacian' or 'random_walk'")
