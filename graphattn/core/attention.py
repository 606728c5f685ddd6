r"""EdgeAttention: the one sparse message-passing attention layer that consumes every edge set."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import Linear, MessagePassing
from torch_geometric.utils import segment

from graphattn import tracing as _trace
from graphattn.core.checks import (
    all_finite,
    check_channels,
    check_node_features,
    check_positive_int,
    check_rate,
    inputs_are_checked,
)
from graphattn.core.contract import EdgeProducer, ProducerContext
from graphattn.core.dispatch import Attended, AttentionCall, attend, use_fused
from graphattn.core.edgeset import MODES, BaseEdgeSet, EdgeSet
from graphattn.core.index import default_batch
from graphattn.core.inputs import as_edge_set, check_bipartite_indices, forward_arguments
from graphattn.core.signals import TrainingSignals
from graphattn.core.syncs import cpu_only
from graphattn.core.union import featured_rows
from graphattn.kernels import sddmm, segment_softmax
from graphattn.kernels.fused import fused_explicit_attention
from graphattn.memory import EDGE_BYTES, check_edges

KERNELS = ("auto", "reference", "fused")


class EdgeAttention(MessagePassing):
    r"""Multi-head attention over an arbitrary :class:`~graphattn.EdgeSet`.

    For every target node :math:`i`, head :math:`h` and in-edge :math:`j \to i` of the edge set:

    .. math::
        q_i = W_Q x_i,\quad k_j = W_K x_j + W_E e_{ji},\quad v_j = W_V x_j + W_E e_{ji}

        \alpha_{ij}^h = \operatorname{softmax}_{j \to i}\Big(\frac{q_i^h \cdot k_j^h}{\sqrt{C}}
            + b_{ji}^h\Big), \qquad
        o_i^h = \sum_{j \to i} \operatorname{dropout}(\alpha_{ij}^h)\, w_{ji}^h\, v_j^h

    (``"attention"`` mode), or :math:`o_i^h = \sum_{j \to i} w_{ji}^h v_j^h` (``"weighted"`` mode, no
    :math:`W_Q, W_K` allocated). :math:`b` and :math:`w` are the edge set's ``bias`` and ``weight``;
    :math:`x_j` for a source :math:`j \ge N` is row :math:`j - N` of the edge set's ``virtual_x``;
    :math:`e_{ji}` are optional edge features (like :class:`~torch_geometric.nn.conv.TransformerConv`'s
    ``edge_dim``). Targets without in-edges get :math:`o_i = 0`. The heads are concatenated
    (``concat=True``, output ``[N, H·C]``) or averaged (``[N, C]``).

    Structured edge sets take their fast path: shared sources → dense SDPA over the gathered
    sources; permutation → a gather; operator → its ``matvec``; explicit edges → the fused kernel
    (:mod:`graphattn.kernels.fused`: C++/OpenMP on CPU, Triton on CUDA; never an
    :math:`E \times H \times C` tensor) where it applies, else the reference path.
    ``kernel="reference"`` forces the explicit segment-softmax path on ``to_explicit()`` edges (the
    oracle the fast paths are tested against). ``to_explicit()`` and the reference path's
    :math:`E \times H \times C` messages are checked against the memory budget first
    (:mod:`graphattn.memory`): too many edges raise a :class:`~graphattn.MemoryBudgetError`.

    **A drop-in for PyG's attention convolutions.** ``forward(x, edge_index, edge_attr=None,
    return_attention_weights=None, *, batch=None)`` takes the positional order of
    :class:`~torch_geometric.nn.conv.TransformerConv` / :class:`~torch_geometric.nn.conv.GATConv`;
    bipartite input ``x = (x_src, x_dst)`` with ``in_channels=(a, b)`` (queries from ``x_dst``,
    keys and values from ``x_src``, on a plain ``edge_index`` or an explicit edge set);
    ``root_weight`` and ``beta`` are TransformerConv's skip and gate,

    .. math::
        o_i \leftarrow o_i + W_r x_i \quad\text{or, with beta,}\quad
        \beta_i = \sigma\big(w_\beta^\top [o_i, W_r x_i, o_i - W_r x_i]\big),\;
        o_i \leftarrow \beta_i W_r x_i + (1 - \beta_i)\, o_i,

    and ``add_self_loops`` is GATConv's (self-loops added to a plain ``edge_index``, after removing
    any there are, their edge features filled by ``fill_value``). With the same weights and the
    same options the layer computes TransformerConv's function. Its own defaults differ from
    TransformerConv's in one place: ``root_weight=False`` (the attention alone, as a transformer
    block's attention whose residual lives outside it); pass ``root_weight=True`` for
    TransformerConv's default. The earlier order ``forward(x, edges, batch, edge_attr)`` still
    works for one release with a :class:`FutureWarning` (a third positional argument that is an
    integer vector of one graph id per node is read as ``batch``).

    Args:
        in_channels (int or tuple): input size, ``-1`` for lazy initialisation; a pair
            ``(source width, target width)`` for bipartite input.
        out_channels (int): size :math:`C` of each head.
        heads (int): number of heads :math:`H`.
        concat (bool): concatenate (``True``) or average the heads.
        dropout (float): dropout on the attention coefficients :math:`\alpha` (training only); in
            ``"weighted"`` mode each message is dropped and the rest rescaled by :math:`1/(1-p)`.
            Operator edge sets have no edges to drop: a :class:`ValueError` if ``dropout > 0``.
        edge_dim (int, optional): edge feature size; enables :math:`W_E`.
        bias (bool): biases in the projections.
        mode (str): ``"attention"`` or ``"weighted"``.
        kernel (str): ``"auto"`` (fast path by structure; explicit edges on the fused kernel unless it
            cannot run them: complex weights, other dtypes, PyG explain/propagate hooks, or no
            compiler),
            ``"fused"`` (explicit edges always on the fused kernel; a :class:`ValueError` where it
            cannot run them) or ``"reference"``. Edge features on the fused kernel are added to
            the keys and values inside it (no :math:`E \times H \times C` message tensor).
        validate (bool): validate every edge set against the nodes and the batch (cheap, O(E)).
            With ``False`` an out-of-range index still raises a :class:`ValueError` (from the
            kernel that meets it), but an edge joining two graphs goes unnoticed.
        complex_output (str): for complex weights (operator edge sets): ``"real"`` keeps the real
            part, ``"complex"`` returns the complex result.
        root_weight (bool): add the skip :math:`W_r x_i` to the output (TransformerConv's
            ``root_weight``; default ``False``, see above).
        beta (bool): gate the skip and the attention by :math:`\beta_i` (needs ``root_weight``).
        add_self_loops (bool): add a self-loop to every target of a plain ``edge_index`` (GATConv's
            ``add_self_loops``); an edge set or a producer chooses its own edges (a
            :class:`ValueError`: e.g. ``{"name": "input", "self_loops": True}``).
        fill_value (float or str): the edge features of the added self-loops (``"mean"``, ``"add"``,
            ... or a number; :func:`torch_geometric.utils.add_self_loops`).

    **PyG explain.** The layer is a :class:`~torch_geometric.nn.MessagePassing` citizen for
    :class:`torch_geometric.explain.Explainer`:

    * message-forward hooks (:meth:`register_message_forward_hook`, used by
      :class:`~torch_geometric.explain.algorithm.AttentionExplainer`) see the coefficients
      :math:`\alpha` (softmax times weight, before dropout; ``[E, H]``, per-head edges ``[E, 1]``)
      in the **order of the edges given** (the explicit edge set's, i.e. a plain ``edge_index``'s
      own order, although the reference path propagates destination-sorted edges): as
      :attr:`_alpha` during the hook on the reference path (whose messages ``out`` stay in
      destination-sorted order), and as ``msg_kwargs["alpha"]`` (plus :attr:`_alpha`) on the
      fused kernel, which has no message tensor and calls each hook once with ``out=None`` (a hook
      that returns replacement messages raises a :class:`ValueError` there). With
      ``kernel="auto"`` any hook sends explicit edges to the reference path, and structured edge
      sets are attended on their explicit form while a hook is registered. No hook, no cost.
    * explain mode (``explain=True``, set by mask-learning explainers such as
      :class:`~torch_geometric.explain.algorithm.GNNExplainer`) multiplies message :math:`j \to i`
      by the explainer's edge mask entry of that edge, in the order of the edges given.
    """

    _alpha: Tensor | None

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        dropout: float = 0.0,
        edge_dim: int | None = None,
        bias: bool = True,
        mode: str = "attention",
        kernel: str = "auto",
        validate: bool = True,
        complex_output: str = "real",
        root_weight: bool = False,
        beta: bool = False,
        add_self_loops: bool = False,
        fill_value: float | str = "mean",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        if mode not in MODES:
            raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
        if kernel not in KERNELS:
            raise ValueError(f"'kernel' must be one of {KERNELS}, got {kernel!r}")
        # -1 is PyG's lazy width; 0 and other negative widths are refused (they used to be lazy)
        if isinstance(in_channels, (tuple, list)):
            if len(in_channels) != 2:
                raise ValueError(f"'in_channels' must be an int or a pair (source width, target "
                                 f"width), got {in_channels!r}")
            src_c, dst_c = (check_channels("in_channels", c) for c in in_channels)
            in_channels = (src_c, dst_c)
        else:
            src_c = dst_c = check_channels("in_channels", in_channels)
        check_positive_int("out_channels", out_channels)
        check_positive_int("heads", heads)
        check_channels("edge_dim", edge_dim, optional=True)
        dropout = check_rate("dropout", dropout)
        for flag, value in (("concat", concat), ("bias", bias), ("validate", validate),
                            ("root_weight", root_weight), ("beta", beta),
                            ("add_self_loops", add_self_loops)):
            if not isinstance(value, bool):
                raise ValueError(f"'{flag}' must be a bool, got {value!r}")
        if complex_output not in ("real", "complex"):
            raise ValueError(f"'complex_output' must be 'real' or 'complex', got {complex_output!r}")
        if beta and not root_weight:
            raise ValueError("'beta' gates the root weight's skip: set root_weight=True too")
        if isinstance(fill_value, bool) or not isinstance(fill_value, (int, float, str)):
            raise ValueError(f"'fill_value' must be a number or a reduction name such as 'mean', "
                             f"got {fill_value!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.dropout = dropout
        self.edge_dim = edge_dim
        self.mode = mode
        self.kernel = kernel
        self.validate = validate
        self.complex_output = complex_output
        self.root_weight = root_weight
        self.beta = beta
        self.add_self_loops = add_self_loops
        self.fill_value = fill_value
        #: the widths of the source (key, value) and target (query, skip) features
        self.source_channels, self.target_channels = src_c, dst_c
        self.scale = 1.0 / math.sqrt(out_channels)
        self._alpha = None

        HC = heads * out_channels
        if mode == "attention":
            self.lin_query = Linear(dst_c, HC, bias=bias)
            self.lin_key = Linear(src_c, HC, bias=bias)
        else:
            self.register_module("lin_query", None)
            self.register_module("lin_key", None)
        self.lin_value = Linear(src_c, HC, bias=bias)
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, HC, bias=False)
        else:
            self.register_module("lin_edge", None)
        out_width = HC if concat else out_channels
        self.lin_skip = Linear(dst_c, out_width, bias=bias) if root_weight else None
        self.lin_beta = Linear(3 * out_width, 1, bias=False) if beta else None
        #: the edge set of the last call, and the attention path that ran on it
        #: (``"fused"``, ``"reference"``, ``"shared_sources"``, ``"shared_slots"``, ``"permutation"``,
        #: ``"operator"``; see :mod:`graphattn.core.dispatch`)
        self.last_edges: BaseEdgeSet | None = None
        self.last_kernel: str | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for lin in (self.lin_query, self.lin_key, self.lin_value, self.lin_edge, self.lin_skip,
                    self.lin_beta):
            if lin is not None:
                lin.reset_parameters()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edges: EdgeSet | Tensor | EdgeProducer,
        *args: Any,
        edge_attr: Tensor | None = None,
        return_attention_weights: bool | None = None,
        batch: Tensor | None = None,
        data: Any = None,
        generator: torch.Generator | None = None,
        inputs: Mapping[str, Tensor] | None = None,
        signals: TrainingSignals | None = None,
        edge_cache: dict[Hashable, Any] | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        r"""Runs the layer: ``forward(x, edges, edge_attr=None, return_attention_weights=None, *,
        batch=None, ...)`` (``edge_attr`` and ``return_attention_weights`` may be given
        positionally, in TransformerConv's order).

        Args:
            x: ``[N, F]`` node features, no NaN/inf, of the layer's parameter dtype: another
                floating-point dtype is refused with a :class:`ValueError` naming both (not cast;
                under :func:`torch.autocast` the projections cast as usual); or a pair
                ``(x_src [S, F_s], x_dst [N, F_t])`` (bipartite: one graph, edges ``src < S`` →
                ``dst < N``).
            edges: an :class:`EdgeSet`, a plain ``edge_index [2, E]`` (an explicit edge set in the
                layer's mode), a sparse ``adj_t`` (:class:`torch_sparse.SparseTensor` or torch
                sparse tensor, row = target, column = source, values = ``weight``; see
                :meth:`EdgeSet.from_sparse_tensor`) or an :class:`EdgeProducer`, called here after
                the projections.
            edge_attr: ``[E, edge_dim]`` features of a plain ``edge_index``.
            batch: ``[N]`` graph of each node (default: one graph); keyword only.
            return_attention_weights: if set, also return ``(edge_index, alpha)`` for the edges
                really used (``to_explicit()`` order): ``alpha [E, H]`` is the coefficient of
                :math:`v_j` in :math:`o_i` (softmax times weight, before dropout); for per-head
                edges the entries of the other heads are 0.
            data: the PyG data object, passed to a producer.
            generator: random generator, passed to a producer.
            inputs: named tensors passed to a producer (:attr:`ProducerContext.inputs`).
            signals: a :class:`~graphattn.core.signals.TrainingSignals` that receives the edge set
                attended over (its ``aux_loss`` and ``log_prob`` are training signals).
            edge_cache: the forward pass's shared edge sets
                (:attr:`ProducerContext.edge_cache`), passed to a producer.

        After the call, :attr:`last_edges` is that edge set and :attr:`last_kernel` names the path
        that ran (see :mod:`graphattn.core.dispatch`).
        """
        edge_attr, return_attention_weights, batch = forward_arguments(
            args, edge_attr=edge_attr, return_attention_weights=return_attention_weights,
            batch=batch)
        x_src = None
        if isinstance(x, (tuple, list)):
            x_src, x = self._check_bipartite(x, edges, batch)
        x, batch, num_graphs = self._check_inputs(x, batch)
        if self.add_self_loops:
            edges, edge_attr = self._with_self_loops(edges, edge_attr, x, x_src)
        ctx = ProducerContext(x, batch, num_graphs=num_graphs, num_heads=self.heads, data=data,
                              generator=generator, training=self.training, inputs=inputs,
                              edge_cache=edge_cache, projections=self._projections(x, x_src),
                              validate=False)  # checked above
        es = self._edge_set(edges, ctx, edge_attr, num_sources=None if x_src is None
                            else x_src.size(0))
        if signals is not None:
            signals.add(es)
        need_alpha = return_attention_weights is not None or _trace.is_tracing()
        hooked = bool(self._message_forward_hooks) or bool(self._explain)
        call = AttentionCall(
            ctx, heads=self.heads, channels=self.out_channels, scale=self.scale,
            dropout=self.dropout if self.training else 0.0,
            attend_keys=self.mode == "attention" and es.mode == "attention",
            lin_key=self.lin_key, lin_value=self.lin_value,
            explicit=lambda explicit: self._attend_explicit(call, explicit, need_alpha or hooked))
        res = attend(es, call, explicit=self.kernel == "reference" or need_alpha or hooked)
        self.last_kernel = res.kernel
        out = res.out.real if res.out.is_complex() and self.complex_output == "real" else res.out
        out = out.reshape(x.size(0), self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if self.lin_skip is not None:
            out = self._skip(out, x)
        if not need_alpha:
            return out
        explicit = es.to_explicit()
        assert res.alpha is not None
        coef = self._alpha_per_head(explicit, res.alpha)
        if _trace.is_tracing():
            _trace.record(self, explicit, coef, batch)
        if return_attention_weights is not None:
            return out, (explicit.edge_index, coef)
        return out

    def _edge_set(self, edges: EdgeSet | Tensor | EdgeProducer, ctx: ProducerContext,
                  edge_attr: Tensor | None, num_sources: int | None = None) -> EdgeSet:
        """The edge set to attend over (a producer is called with ``ctx``), checked against the
        layer and the nodes (bipartite: ``num_sources`` source rows); kept as
        :attr:`last_edges`."""
        if isinstance(edges, EdgeProducer):
            es = edges(ctx.x, ctx.batch, context=ctx)
            if edge_attr is not None:
                es = as_edge_set(es, num_heads=self.heads, edge_attr=edge_attr)
        else:
            es = as_edge_set(edges, num_heads=self.heads, mode=self.mode, edge_attr=edge_attr)
        self._check_edge_set(es, ctx.x, ctx.batch, num_sources)
        self.last_edges = es
        return es

    def _check_bipartite(self, x: tuple[Any, ...] | list[Any], edges: Any,
                         batch: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(x_src, x_dst)`` of bipartite input, checked: two feature tensors of the layer's
        source and target widths, on a plain ``edge_index`` or an explicit edge set, one graph."""
        if len(x) != 2:
            raise ValueError(f"'x' must be a tensor or a pair (x_src, x_dst), got {len(x)} items")
        x_src, x_dst = x
        if isinstance(edges, EdgeProducer):
            raise ValueError("bipartite input (x_src, x_dst) takes a plain 'edge_index' or an "
                             "explicit EdgeSet: a producer builds edges among one node set")
        if batch is not None:
            raise ValueError("bipartite input (x_src, x_dst) is one graph: pass no 'batch'")
        check_node_features(x_src, self.source_channels, self)
        check_node_features(x_dst, self.target_channels, self)
        if x_src.dtype != x_dst.dtype:
            raise ValueError(f"'x' must hold two tensors of one dtype, got {x_src.dtype} and "
                             f"{x_dst.dtype}")
        return x_src, x_dst

    def _with_self_loops(self, edges: Any, edge_attr: Tensor | None, x: Tensor,
                         x_src: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """GATConv's ``add_self_loops``: a plain ``edge_index`` without its self-loops, then one
        per target (bipartite: per index below both node counts), their features ``fill_value``."""
        from torch_geometric.utils import add_self_loops, remove_self_loops

        if not isinstance(edges, Tensor) or edges.is_sparse or edges.dim() != 2:
            raise ValueError("add_self_loops=True adds self-loops to a plain 'edge_index' [2, E]; "
                             "an edge set or a producer chooses its own edges (e.g. "
                             "{'name': 'input', 'self_loops': True})")
        num_nodes = x.size(0) if x_src is None else min(x.size(0), x_src.size(0))
        edges, edge_attr = remove_self_loops(edges, edge_attr)
        return add_self_loops(edges, edge_attr, fill_value=self.fill_value, num_nodes=num_nodes)

    def _skip(self, out: Tensor, x: Tensor) -> Tensor:
        r"""TransformerConv's root weight: :math:`o + W_r x`, or gated by :math:`\beta`."""
        assert self.lin_skip is not None
        x_r = self.lin_skip(x)
        if self.lin_beta is None:
            return out + x_r
        gate = torch.sigmoid(self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)))
        return gate * x_r + (1 - gate) * out

    def _project_edge_attr(self, es: EdgeSet) -> Tensor:
        r""":math:`W_E e_{ji}` for every edge, ``[E, H·C]``. ``lin_edge`` has no bias, so the rows
        that a union filled with zeros (parts without features, e.g. Exphormer's expander and
        virtual edges) project to zeros: on the CPU only the other rows go through the matrix
        product (on a GPU the product is cheap and finding the rows would cost a host sync)."""
        assert self.lin_edge is not None and es.edge_attr is not None
        attr = es.edge_attr
        rows = None
        if attr.device.type == "cpu":
            with cpu_only():
                rows = featured_rows(es)
        if rows is None or rows.numel() > 0.75 * attr.size(0):
            return self.lin_edge(attr)
        part = self.lin_edge(attr.index_select(0, rows))
        return part.new_zeros(attr.size(0), part.size(1)).index_copy_(0, rows, part)

    def _attend_explicit(self, call: AttentionCall, es: EdgeSet, need_alpha: bool) -> Attended:
        """The explicit path: the fused kernel where it applies (see ``kernel``), else the
        reference ``propagate``."""
        q = call.query()
        k, v = call.sources(es)
        N = call.num_nodes
        if use_fused(self.kernel, es, v, self):
            ef = None
            if es.edge_attr is not None:  # W_E e_ji, added to keys and values inside the kernel
                ef = self._project_edge_attr(es).view(-1, self.heads, self.out_channels)
            out, alpha = fused_explicit_attention(q, k, v, es, N, scale=self.scale,
                                                  dropout=call.dropout, need_alpha=need_alpha,
                                                  edge_features=ef)
            if self._message_forward_hooks:
                assert alpha is not None  # need_alpha is set while a hook is registered
                self._call_message_hooks(es, alpha)
            return Attended(out, alpha, "fused")
        try:
            out, alpha = self._explicit(q, k, v, es, N)
        except IndexError as e:
            if self.validate:
                raise
            # validate=False skips the one-transfer index checks: name the culprit
            raise ValueError(f"'edge_index' holds a node index out of range (the layer was built "
                             f"with validate=False, which skips the index checks): {e}") from e
        finally:
            self._alpha = None
        return Attended(out, alpha, "reference")

    def _call_message_hooks(self, es: EdgeSet, alpha: Tensor) -> None:
        """The message-forward hooks on a path without a message tensor (the fused kernel): each is
        called once as ``hook(self, (msg_kwargs,), None)`` with ``msg_kwargs = {"alpha": alpha,
        "edge_index": es.edge_index}`` and :attr:`_alpha` set, ``alpha`` in ``es`` order."""
        self._alpha = alpha
        try:
            for hook in self._message_forward_hooks.values():
                if hook(self, ({"alpha": alpha, "edge_index": es.edge_index},), None) is not None:
                    raise ValueError("a message-forward hook returned replacement messages, but "
                                     "the fused kernel has no message tensor to replace: build "
                                     "the layer with kernel='auto' or 'reference'")
        finally:
            self._alpha = None

    # ----------------------------------------------------------------- helpers
    def _check_inputs(self, x: Tensor, batch: Tensor | None) -> tuple[Tensor, Tensor, int | None]:
        """``(x, batch, num_graphs)``; ``num_graphs`` is ``None`` without nodes. The value checks
        (x finite, graph ids non-negative) and the graph count take one host read."""
        check_node_features(x, self.target_channels, self)
        N = x.size(0)
        if batch is None:
            batch = default_batch(None, N, x.device)
        elif not isinstance(batch, Tensor) or batch.dim() != 1 or batch.numel() != N:
            shape = list(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
            raise ValueError(f"'batch' must be 1-D with one graph id per node [{N}], got {shape}")
        elif batch.dtype != torch.long:
            raise ValueError(f"'batch' must have dtype torch.long, got {batch.dtype}")
        if not N:
            return x, batch, None
        # inside a model's forward (inputs_checked) the data were checked once: no pass over x
        stats = [batch.min(), batch.max()]
        if not inputs_are_checked():
            stats.append(all_finite(x).long())
        bmin, bmax, *finite = torch.stack(stats).tolist()
        if finite and not finite[0]:
            raise ValueError("'x' contains NaN or infinite values")
        if bmin < 0:
            raise ValueError(f"'batch' must hold non-negative graph ids, got {bmin}")
        return x, batch, bmax + 1

    def _check_edge_set(self, es: EdgeSet, x: Tensor, batch: Tensor,
                        num_sources: int | None = None) -> None:
        if es.num_heads != self.heads:
            raise ValueError(
                f"the edge set is for num_heads={es.num_heads} but the layer has heads={self.heads}"
            )
        if es.mode == "attention" and self.mode == "weighted":
            raise ValueError(
                "the layer was built with mode='weighted' (no query/key) but the edge set has "
                "mode='attention'"
            )
        if es.edge_attr is not None and self.lin_edge is None:
            raise ValueError("the edge set has 'edge_attr' but the layer was built without edge_dim")
        if es.structure == "operator" and self.dropout > 0:
            raise ValueError(
                f"attention dropout (dropout={self.dropout}) cannot be applied to an operator edge "
                f"set: it has no enumerated edges to drop; build the layer with dropout=0"
            )
        if es.structure != "explicit" and es.edge_attr is not None:
            raise ValueError("'edge_attr' is only supported on explicit edge sets")
        if num_sources is not None:  # bipartite: sources index x_src, targets x_dst
            check_bipartite_indices(es, num_sources, x.size(0))
        elif self.validate:
            es.validate(x.size(0), batch)
        if es.virtual_x is not None and es.virtual_x.size(1) != x.size(1):
            raise ValueError(
                f"'virtual_x' must have the width of 'x' ({x.size(1)}), got {es.virtual_x.size(1)}"
            )

    def _projections(self, x: Tensor, x_src: Tensor | None = None) -> dict[str, Any]:
        """The lazy projections: queries of the targets ``x``, keys and values of the sources
        (``x_src`` for bipartite input, else ``x``)."""
        H, C = self.heads, self.out_channels
        src = x if x_src is None else x_src
        proj: dict[str, Any] = {"value": lambda: self.lin_value(src).view(-1, H, C)}
        if self.mode == "attention":
            proj["query"] = lambda: self.lin_query(x).view(-1, H, C)
            proj["key"] = lambda: self.lin_key(src).view(-1, H, C)
        return proj

    def _explicit(
        self, q: Tensor | None, k: Tensor | None, v: Tensor, es: EdgeSet, N: int
    ) -> tuple[Tensor, Tensor | None]:
        """Reference path: ``propagate`` over destination-sorted (per-head: flattened) edges.

        Memory guard (:mod:`graphattn.memory`): the path gathers :math:`q_i, k_j, v_j` and the
        message for every edge and head (complex weights: a doubled message), checked against the
        budget before anything is gathered."""
        H, C = self.heads, self.out_channels
        Hm = 1 if es.per_head else H
        check_edges(es.num_edges, bytes_per_edge=EDGE_BYTES + Hm * (5 * C + 4) * v.element_size(),
                    what=f"EdgeAttention's reference path ({Hm} head(s) × {C} channels per edge)",
                    how_to_lower="use the fused kernel (kernel='auto' or 'fused'; no edge_attr, no "
                    "return_attention_weights) or fewer edges", device=v.device)
        perm, ptr, _rows = es.csr(N)
        src, dst = es.edge_index[0][perm], es.edge_index[1][perm]
        bias = None if es.bias is None else es.bias[perm]
        weight = None if es.weight is None else es.weight[perm]
        edge_feat = None
        if es.edge_attr is not None:
            assert self.lin_edge is not None  # _check_edge_set refuses edge_attr without edge_dim
            edge_feat = self.lin_edge(es.edge_attr[perm]).view(-1, H, C)
        if es.per_head:
            assert es.head is not None
            head = es.head[perm]
            S = v.size(0)
            v = v.reshape(S * H, 1, C)
            k = None if k is None else k.reshape(S * H, 1, C)
            q = None if q is None else q.reshape(N * H, 1, C)
            src = src * H + head
            dst = dst * H + head
            if edge_feat is not None:
                edge_feat = edge_feat[torch.arange(head.numel(), device=head.device), head][:, None]
            bias = None if bias is None else bias[:, None]
            weight = None if weight is None else weight[:, None]
            size = (S * H, N * H)
        else:
            size = (v.size(0), N)
            if bias is not None and bias.dim() == 1:
                bias = bias[:, None]
            if weight is not None and weight.dim() == 1:
                weight = weight[:, None]
        edge_index = torch.stack([src, dst])
        # hooks and explain masks see coefficients / masks in es order: message() un-sorts
        order = perm if self._message_forward_hooks or self._explain else None
        out = self.propagate(
            edge_index,
            query=q,
            key=k,
            value=v,
            edge_feat=edge_feat,
            logit_bias=bias,
            edge_weight=weight,
            dst_ptr=ptr,
            edge_order=order,
            size=size,
        )
        alpha = self._alpha
        if es.per_head:
            out = out.view(N, H, C)
        if alpha is not None and order is None:
            unsorted = torch.empty_like(alpha)
            unsorted[perm] = alpha
            alpha = unsorted
        return out, alpha

    def message(
        self,
        query_i: Tensor | None,
        key_j: Tensor | None,
        value_j: Tensor,
        edge_feat: Tensor | None,
        logit_bias: Tensor | None,
        edge_weight: Tensor | None,
        dst_ptr: Tensor,
        edge_order: Tensor | None,
    ) -> Tensor:
        # edge_order: the sorted edges' positions in the edge set, given while PyG hooks or explain
        # mode read _alpha: it is kept in the edge set's order then (see the class docstring)
        if edge_feat is not None:
            value_j = value_j + edge_feat
        if query_i is not None and key_j is not None:
            if edge_feat is not None:
                key_j = key_j + edge_feat
            alpha = segment_softmax(sddmm(query_i, key_j, self.scale, logit_bias), dst_ptr)
            coef = alpha if edge_weight is None else alpha * edge_weight
            self._alpha = coef if edge_order is None else _unsort(coef, edge_order)
            alpha = F.dropout(alpha, p=self.dropout, training=self.training)
            coef = alpha if edge_weight is None else alpha * edge_weight
        else:
            coef = value_j.new_ones(value_j.shape[:2]) if edge_weight is None else edge_weight
            self._alpha = coef if edge_order is None else _unsort(coef, edge_order)
            if self.training and self.dropout > 0:  # drop whole messages, rescaled by 1 / (1 - p)
                keep = F.dropout(value_j.new_ones(coef.shape, dtype=value_j.dtype), p=self.dropout)
                coef = coef * keep
        if coef.is_complex():
            # complex weights on real values: carry (re, im) as a doubled channel axis
            return torch.cat([coef.real.unsqueeze(-1) * value_j, coef.imag.unsqueeze(-1) * value_j],
                             dim=-1)
        return coef.unsqueeze(-1) * value_j

    def explain_message(self, inputs: Tensor, dim_size: int | None,
                        edge_order: Tensor | None) -> Tensor:
        r"""Explain mode: message :math:`j \to i` times the explainer's edge mask entry of that
        edge, the mask being in the order of the edges given (``edge_order`` maps the sorted
        messages back to it). The layer adds no edges, so the mask must have one entry per edge."""
        mask = self._edge_mask
        if mask is None:
            raise ValueError("explain mode is on but no edge mask was set (PyG's "
                             "set_masks(model, mask, edge_index) sets it)")
        if mask.numel() != inputs.size(0):
            raise ValueError(f"the explainer's edge mask has {mask.numel()} entries but the layer "
                             f"attends over {inputs.size(0)} edges: explain mode needs the layer's "
                             f"edges to be the explained edge_index")
        if self._apply_sigmoid:
            mask = mask.sigmoid()
        if edge_order is not None:
            mask = mask[edge_order]
        return inputs * mask.view(-1, *([1] * (inputs.dim() - 1)))

    def aggregate(self, inputs: Tensor, dst_ptr: Tensor) -> Tensor:
        # destination-sorted edges: a segment sum, deterministic and 0 for empty targets
        out = segment(inputs, dst_ptr, reduce="sum")
        if self._alpha is not None and self._alpha.is_complex():
            C = out.size(-1) // 2
            out = torch.complex(out[..., :C], out[..., C:])
        return out

    def _alpha_per_head(self, es: EdgeSet, alpha: Tensor) -> Tensor:
        """Coefficients ``[E, H]`` in ``es`` order (zeros off-head for per-head edges)."""
        H = self.heads
        alpha = alpha.detach()
        if not es.per_head:
            # a head-shared weight in weighted mode gives one coefficient for every head
            return alpha if alpha.size(1) == H else alpha.expand(-1, H).clone()
        out = alpha.new_zeros(es.num_edges, H)
        out[torch.arange(es.num_edges, device=alpha.device), es.head] = alpha[:, 0]
        return out

    def __repr__(self) -> str:
        extra = "" if self.mode == "attention" else f", mode={self.mode!r}"
        return (
            f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
            f"heads={self.heads}{extra})"
        )


def _unsort(sorted_rows: Tensor, order: Tensor) -> Tensor:
    """Rows given in sorted order back in the original order (``order[p]``: original position of
    sorted row ``p``)."""
    out = torch.empty_like(sorted_rows)
    out[order] = sorted_rows
    return out
