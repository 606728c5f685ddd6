"""GraphTransformer: encoders + L hybrid layers + a node- or graph-level head."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from torch import nn

from graphattn.nn.base import (  # noqa: F401  (also importable from here, as before)
    PE_ATTRS,
    POOLS,
    GraphModel,
    LastPassSignals,
    check_mapping,
    check_model_args,
    check_task_and_pool,
    graph_count,
    layer_pass,
    read_positional_encoding,
    shared_producers,
    sinusoidal,
)
from graphattn.nn.hybrid import HybridLayer, producer_defaults
from graphattn.nn.registry import register_model
from graphattn.producers.registry import build_producer


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


@register_model("hybrid")
class GraphTransformer(GraphModel):
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
            linearly and adds it to :math:`h^{(0)}`. ``"position"``: sinusoids
            (:func:`sinusoidal`, ``pe_dim`` per coordinate) of ``data.pos`` — sequence index, pixel
            (row, col) or point coordinates.
        pe_attr (str, optional): the data attribute holding the encoding.
        pe_dim (int): sinusoid width per coordinate for ``pe="position"``.
        pe_sign_flip (bool): flip each Laplacian eigenvector's sign at random in training (GraphGPS's
            augmentation, for eigenvectors whose signs are arbitrary, such as PyG's
            ``AddLaplacianEigenvectorPE``). Off by default:
            :class:`~graphattn.nn.laplacian_pe.LaplacianPE` gives every eigenvector a canonical
            sign (its largest entry positive), and the flips only add noise (Peptides-func, 3
            epochs: ``docs/runner.md``).
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

    OPTIONS: ClassVar[tuple[str, ...]] = (
        "hidden_channels", "out_channels", "num_layers", "producer", "conv", "heads", "dropout",
        "attn_dropout", "norm", "norm_first", "act", "ffn_ratio", "node_encoder", "num_embeddings",
        "edge_encoder", "pe", "pe_attr", "pe_dim", "pe_sign_flip", "task", "pool", "head_layers",
        "head_norm",
        "input_dropout", "attn_kwargs", "producer_kwargs", "residual", "ffn", "in_channels",
        "allow_order_dependent",
    )

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
        pe_sign_flip: bool = False,
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
        check_task_and_pool(task, pool)
        check_mapping("attn_kwargs", attn_kwargs)
        check_mapping("producer_kwargs", producer_kwargs)
        check_model_args(hidden_channels=hidden_channels, out_channels=out_channels,
                         num_layers=num_layers, heads=heads, ffn_ratio=ffn_ratio,
                         head_layers=head_layers, pe_dim=pe_dim, num_embeddings=num_embeddings,
                         dropout=dropout, attn_dropout=attn_dropout, input_dropout=input_dropout)
        if head_layers == 0 and conv == "gine" and out_channels != hidden_channels:
            raise ValueError(f"head_layers=0 makes the last layer an output layer of width "
                             f"out_channels={out_channels}, which conv='gine' cannot build (it needs "
                             f"in_channels == channels = {hidden_channels}); use head_layers >= 1")
        if conv == "gine" and edge_encoder is None:
            raise ValueError("conv='gine' adds edge features to every message: set "
                             "edge_encoder='linear' (or 'bond' for ogb molecules) and give the "
                             "data an 'edge_attr', or choose a conv that reads no edge features "
                             "('gin', 'gcn', 'gat', ...)")
        self.task = task
        self.pool = pool
        #: the local conv adds edge features to every message (GINE): data must carry edge_attr
        self.needs_edge_attr = conv == "gine"
        self.add_encoders(hidden_channels, node_encoder=node_encoder, num_embeddings=num_embeddings,
                          edge_encoder=edge_encoder, pe=pe, pe_attr=pe_attr, pe_dim=pe_dim,
                          input_dropout=input_dropout, pe_sign_flip=pe_sign_flip)
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
        self.add_head(hidden_channels, out_channels, head_layers=head_layers, head_norm=head_norm,
                      act=act, dropout=dropout, final_norm=norm_first)


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
