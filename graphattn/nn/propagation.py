r"""Random propagation over a producer's edge set (``--model grand``): the GRAND recipe (Feng et
al., NeurIPS 2020) with the graph replaced by any graphattn edge set.

For one sample, with :math:`m_i \sim \mathrm{Bernoulli}(1 - \delta)` per node (DropNode),

.. math::

    \tilde X = \operatorname{diag}(m)\, X \;(\text{training}), \qquad
    \tilde X = (1 - \delta)\, X \;(\text{evaluation}), \qquad
    \bar X = \frac{1}{K + 1} \sum_{k=0}^{K} \hat A^k \tilde X, \qquad
    \hat A = \tilde D^{-1/2} (A_E + I) \tilde D^{-1/2},

where :math:`A_E` is the adjacency of the producer's edge set :math:`E` (the ``input`` producer:
the graph itself, which gives GRAND; a stochastic producer: a new edge set per sample) and
:math:`\tilde D` its degree matrix with self loops. An MLP maps :math:`\bar X` to the logits
(``input_dropout`` on :math:`\bar X`, ``dropout`` between layers, BatchNorm before each linear layer
with ``norm="batch_norm"``).

The runner's consistency regularisation (``--consistency-samples S``,
:func:`graphattn.consistency.consistency_loss`) trains on :math:`S` such samples per step and pulls
each sample's prediction toward the sharpened mean prediction on every node, labelled or not.

Departure from the paper's code: :math:`\hat A` is built from the producer's edges (the ``input``
producer's are the graph's, so this is GRAND's operator); ``feature_dropout`` (dropout on the raw
features) is an addition, and with ``input_dropout=0`` and no norm the first linear layer is applied
before propagating (exact: everything before it is linear), which propagates ``hidden_channels``
instead of the input width; ``rescale=True`` moves DropNode's scaling into training (the features
are :math:`1 / (1 - \delta)` times GRAND's in both modes).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import spmm

from graphattn.core.checks import check_dtype, check_positive_int, check_rate
from graphattn.core.contract import ProducerContext
from graphattn.core.edgeset import EdgeSet
from graphattn.core.index import cacheable
from graphattn.core.inputs import check_graph_inputs
from graphattn.core.signals import TrainingSignals
from graphattn.nn.blocks import activation
from graphattn.nn.dropout import Dropout
from graphattn.nn.registry import register_model
from graphattn.producers.registry import build_producer

__all__ = ["MixedOrderPropagation", "RandomPropagation", "drop_node"]

#: features at most this dense are multiplied as a sparse matrix (Cora 1.3 %, CiteSeer 0.9 %,
#: PubMed 10 %)
SPARSE_DENSITY = 0.25


def drop_node(x: Tensor, p: float, training: bool, generator: torch.Generator | None = None,
              rescale: bool = False) -> Tensor:
    r"""DropNode: in training each row of ``x`` is zeroed with probability ``p``. GRAND's convention
    (``rescale=False``) keeps the other rows unscaled and scales every row by :math:`1 - p` in
    evaluation; ``rescale=True`` scales the kept rows by :math:`1 / (1 - p)` in training and leaves
    evaluation unscaled (dropout's convention). Both match the expectation of training and
    evaluation; they differ by a factor :math:`1 / (1 - p)` of the features the network sees."""
    if p == 0.0:
        return x
    if not training:
        return x if rescale else x * (1.0 - p)
    keep = torch.rand(x.size(0), 1, device=x.device, dtype=x.dtype, generator=generator) >= p
    return x * keep.to(x.dtype) / (1.0 - p) if rescale else x * keep.to(x.dtype)


class SparseFeatures:
    r"""A sparse feature matrix :math:`X` ``[N, F]`` kept as CSR for :math:`X W^\top` and as the CSR
    of :math:`X^\top` for the weight gradient :math:`G^\top X` (torch's own backward of a CSR
    product is several times slower than the forward on the CPU).

    :meth:`matmul` takes optional replacement ``values`` for the stored non-zeros (in CSR order),
    e.g. a dropout of them; their gradient is not computed (the features are data)."""

    def __init__(self, x: Tensor) -> None:
        with warnings.catch_warnings():  # torch's notes that sparse tensors are in beta
            warnings.simplefilter("ignore", UserWarning)
            self.csr = x.detach().to_sparse_csr()
            coo = x.detach().t().to_sparse_coo().coalesce()
        self.values = self.csr.values()
        # position of each X^T non-zero in X's CSR value order (to transpose replaced values)
        n_f = x.size(1)
        rows = torch.repeat_interleave(torch.arange(x.size(0), device=x.device),
                                       self.csr.crow_indices().diff())
        order = torch.argsort(self.csr.col_indices() * x.size(0) + rows, stable=True)
        self._t_order = order
        self._t_crow = torch.ops.aten._convert_indices_from_coo_to_csr(
            coo.indices()[0], n_f)
        self._t_col = coo.indices()[1]
        self.shape = tuple(x.shape)

    def _matrices(self, values: Tensor) -> tuple[Tensor, Tensor]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            x = torch.sparse_csr_tensor(self.csr.crow_indices(), self.csr.col_indices(), values,
                                        self.shape)
            xt = torch.sparse_csr_tensor(self._t_crow, self._t_col, values.index_select(0, self._t_order),
                                         self.shape[::-1])
        return x, xt

    def matmul(self, weight: Tensor, values: Tensor | None = None) -> Tensor:
        """:math:`X W^\top` for ``weight [C, F]`` (``[N, C]``), with ``values`` replacing the
        stored non-zeros where given."""
        x, xt = self._matrices(self.values if values is None else values.detach())
        return _SparseLinear.apply(weight, x, xt)


class _SparseLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight: Tensor, x: Tensor, xt: Tensor) -> Tensor:
        ctx.xt = xt
        return x @ weight.t()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return (ctx.xt @ grad).t(), None, None


class MixedOrderPropagation(MessagePassing):
    r"""The parameter-free mixed-order propagation
    :math:`\bar X = \frac{1}{K + 1} \sum_{k=0}^{K} \hat A^k X` with the symmetric normalised
    adjacency :math:`\hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}` of ``edge_index`` (self loops
    added where missing, PyG's :func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm`).

    Args:
        steps (int): :math:`K`, the largest power of :math:`\hat A` (0: the identity).

    ``forward(x, edge_index)`` takes ``x [N, F]`` and ``edge_index [2, E]`` (row 0 source, row 1
    target) or the operator :meth:`operator` built from it (a sparse CSR ``[N, N]``) and returns
    ``[N, F]``. One sparse CSR matrix is built per call; each step is one
    sparse-dense product.
    """

    def __init__(self, steps: int = 8) -> None:
        super().__init__(aggr="add")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"'steps' must be a non-negative int, got {steps!r}")
        self.steps = steps
        self.last_edges: EdgeSet | None = None

    def reset_parameters(self) -> None:  # parameter-free
        pass

    def operator(self, edge_index: Tensor, num_nodes: int, dtype: torch.dtype) -> Tensor:
        r""":math:`\hat A` as a sparse CSR matrix (rows = targets)."""
        ei, w = gcn_norm(edge_index, None, num_nodes, add_self_loops=True, dtype=dtype)
        with warnings.catch_warnings():  # torch's notes that sparse tensors are in beta
            warnings.simplefilter("ignore", UserWarning)
            adj = torch.sparse_coo_tensor(ei.flip(0), w, (num_nodes, num_nodes)).coalesce()
            return adj.to_sparse_csr()

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        if x.dim() != 2:
            raise ValueError(f"'x' must be [N, F], got shape {tuple(x.shape)}")
        if edge_index.layout == torch.sparse_csr:
            if tuple(edge_index.shape) != (x.size(0), x.size(0)):
                raise ValueError(f"a prebuilt operator must be [N, N] = [{x.size(0)}, "
                                 f"{x.size(0)}], got {tuple(edge_index.shape)}")
            adj = edge_index
        else:
            adj = self.operator(edge_index, x.size(0), x.dtype)
        total, h = x, x
        for _ in range(self.steps):
            h = self.propagate(adj, x=h)
            total = total + h
        return total / (self.steps + 1)

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:  # reference path (unused)
        return edge_weight.view(-1, 1) * x_j

    def message_and_aggregate(self, adj_t: Any, x: Tensor) -> Tensor:
        return spmm(adj_t, x, reduce="sum")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps={self.steps})"


@register_model("grand")
class RandomPropagation(nn.Module):
    r"""DropNode, mixed-order propagation over the producer's edge set, then an MLP (the module
    docstring has the math). Trained with the runner's consistency regularisation this is GRAND
    on the ``input`` producer's edges.

    Args:
        hidden_channels (int): the MLP's hidden width (GRAND: 32).
        out_channels (int): classes.
        num_layers (int): linear layers of the MLP (GRAND: 2).
        producer: the edge set propagated over (default: the input graph).
        steps (int): :math:`K` (GRAND: 8 on Cora, 2 on CiteSeer, 5 on PubMed).
        drop_node (float): DropNode rate :math:`\delta` (GRAND: 0.5).
        rescale (bool): DropNode's scaling (:func:`drop_node`): ``False`` GRAND's (evaluation
            features times :math:`1 - \delta`), ``True`` dropout's (kept rows times
            :math:`1 / (1 - \delta)` in training).
        input_dropout (float): dropout on :math:`\bar X` (GRAND's input dropout).
        feature_dropout (float): dropout on the raw features :math:`X` before DropNode and the
            propagation (a cheaper alternative to ``input_dropout``: with ``input_dropout=0`` and
            no norm the first linear layer is applied before propagating; see ``projects_first``).
        dropout (float): dropout between the MLP's layers.
        norm (str, optional): ``"batch_norm"`` (before each linear layer) or ``None``.
        act (str): the MLP's activation.
    """

    OPTIONS: ClassVar[tuple[str, ...]] = (
        "hidden_channels", "out_channels", "num_layers", "producer", "steps", "drop_node",
        "input_dropout", "dropout", "feature_dropout", "rescale", "norm", "act", "task",
    )

    def __init__(self, hidden_channels: int, out_channels: int, num_layers: int = 2,
                 producer: Any = "input", steps: int = 8, drop_node: float = 0.5,
                 input_dropout: float = 0.5, dropout: float = 0.5, feature_dropout: float = 0.0,
                 rescale: bool = False, norm: str | None = None,
                 act: str = "relu", task: str = "node") -> None:
        super().__init__()
        if task != "node":
            raise ValueError(f"{type(self).__name__} is a node-level model; got task={task!r}")
        check_positive_int("hidden_channels", hidden_channels)
        check_positive_int("out_channels", out_channels)
        check_positive_int("num_layers", num_layers)
        for name, p in (("drop_node", drop_node), ("input_dropout", input_dropout),
                        ("dropout", dropout)):
            check_rate(name, p)
        if norm in ("none", ""):
            norm = None
        if norm not in (None, "batch_norm"):
            raise ValueError(f"'norm' must be 'batch_norm' or None, got {norm!r}")
        if producer is None:
            raise ValueError("'producer' must name the edge set to propagate over (e.g. 'input')")
        self.producer = build_producer(producer)
        self.drop_node = float(drop_node)
        if not isinstance(rescale, bool):
            raise ValueError(f"'rescale' must be true or false, got {rescale!r}")
        self.rescale = rescale
        self.prop = MixedOrderPropagation(steps)
        self.layers = nn.ModuleList([self.prop])
        widths = [-1] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.lins = nn.ModuleList(nn.LazyLinear(widths[i + 1]) if i == 0
                                  else nn.Linear(widths[i], widths[i + 1])
                                  for i in range(num_layers))
        self.norms = nn.ModuleList(
            (nn.LazyBatchNorm1d() if i == 0 else nn.BatchNorm1d(widths[i])) if norm else nn.Identity()
            for i in range(num_layers))
        self.input_dropout = Dropout(input_dropout)
        check_rate("feature_dropout", feature_dropout)
        self.feature_dropout = Dropout(feature_dropout)
        self.dropout = Dropout(dropout)
        self.act = activation(act)
        self.norm = norm
        #: W1 before the propagation (propagating ``hidden_channels`` instead of the input width):
        #: exact when neither input dropout nor a norm sits between the propagation and W1
        self.projects_first = input_dropout == 0.0 and norm is None
        self._memo_key: tuple[Any, ...] | None = None
        self._memo: SparseFeatures | None = None
        self._xw_key: tuple[Any, ...] | None = None
        self._edge_key: tuple[Any, ...] | None = None
        self._edge_value: tuple[EdgeSet, Tensor] | None = None
        self._xw: Tensor | None = None

    def reset_parameters(self) -> None:
        for m in (*self.lins, *self.norms):
            lazy = isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()
            if not lazy and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def _input_memo(self, x: Tensor, data: Any) -> SparseFeatures | None:
        """Checks the graph once per set of input tensors (the same ones come back every step of a
        node task; a changed tensor, in place or new, is checked again) with one host read
        (:func:`~graphattn.core.edgeset.check_graph_inputs`: ``x`` free of NaN/inf, ``batch`` long and
        one id per node, ``edge_index`` in range with no edge joining two graphs) and returns the
        sparse copy of ``x`` when the first layer is applied before propagating and at most
        :data:`SPARSE_DENSITY` of its entries are non-zero (bag-of-words features), else ``None``."""
        edge_index, batch = getattr(data, "edge_index", None), getattr(data, "batch", None)
        inputs = [t if isinstance(t, Tensor) else None for t in (x, edge_index, batch)]
        key = tuple(None if t is None else (t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device)
                    for t in inputs) if cacheable(*inputs) else None
        if key is not None and self._memo_key == key:
            return self._memo
        check_graph_inputs(edge_index, x.size(0), batch, finite={"data.x": x})
        sparse = (self.projects_first
                  and int(torch.count_nonzero(x)) <= SPARSE_DENSITY * x.numel())
        self._memo = SparseFeatures(x) if sparse else None
        self._memo_key = key
        return self._memo

    def _projected(self, x: Tensor, memo: SparseFeatures | None, weight: Tensor) -> Tensor:
        """:math:`X W_1^\top`, reused by the passes of one training step (the runner's consistency
        samples): the key is the input, the weight's version (the optimizer's in-place update
        changes it) and the grad mode, so a new step or an evaluation computes it afresh; a backward
        pass through it also clears it (its graph is freed then)."""
        key = (self._memo_key, weight.data_ptr(), weight._version, torch.is_grad_enabled()) \
            if self._memo_key is not None and cacheable(weight) else None
        if key is not None and self._xw_key == key and self._xw is not None:
            return self._xw
        xw = memo.matmul(weight) if memo is not None else F.linear(x, weight)
        self._xw_key, self._xw = key, xw
        if xw.requires_grad:  # once a backward pass has gone through it, its graph is freed
            xw.register_hook(self._forget_projection)
        return xw

    def _forget_projection(self, grad: Tensor) -> None:
        self._xw_key, self._xw = None, None

    def _edges(self, ctx: ProducerContext, data: Any) -> tuple[EdgeSet, Tensor]:
        r"""The producer's edge set and its operator :math:`\hat A`. A deterministic producer's
        (:meth:`~graphattn.core.contract.EdgeProducer.static_key` not ``None``) are kept across forward
        passes while the batch's tensors are the same (identity, in-place version, shape), so the
        passes and steps of a node task build them once."""
        static = self.producer.static_key(ctx)
        key = None
        items = [(k, v) for k in sorted(data.keys()) if isinstance(v := data[k], Tensor)]
        if static is not None and cacheable(*(v for _, v in items)):
            tensors = tuple((k, v.data_ptr(), v._version, tuple(v.shape), v.device) for k, v in items)
            key = (static, ctx.num_nodes, ctx.x.dtype, tensors)
            if self._edge_key == key and self._edge_value is not None:
                return self._edge_value
        es = self.producer(ctx.x, context=ctx)
        if not isinstance(es, EdgeSet):
            raise TypeError(f"{type(self).__name__} propagates over explicit edge sets; the "
                            f"producer gave a {type(es).__name__}")
        if es.virtual_x is not None:
            raise ValueError(f"{type(self).__name__} propagates between real nodes; the producer's "
                             f"edge set has virtual sources")
        value = (es, self.prop.operator(es.edge_index, ctx.num_nodes, ctx.x.dtype))
        if key is not None:
            self._edge_key, self._edge_value = key, value
        return value

    def forward(self, data: Any, *, generator: torch.Generator | None = None,
                return_signals: bool = False) -> Any:
        """Class logits ``[N, out_channels]`` (and, with ``return_signals``, the pass's
        :class:`~graphattn.core.signals.TrainingSignals`, holding the producer's edge set)."""
        x = getattr(data, "x", None)
        if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
            raise ValueError(f"{type(self).__name__} needs data.x, a 2-D floating-point tensor of "
                             f"node features; got {x if x is None else getattr(x, 'shape', type(x))}")
        check_dtype("data.x", x, self, type(self).__name__)
        memo = self._input_memo(x, data)
        ctx = ProducerContext(x, num_heads=1, data=data, generator=generator,
                              training=self.training, validate=False)
        es, adj = self._edges(ctx, data)
        self.prop.last_edges = es
        first = 0
        if self.projects_first:
            # exact: the propagation and DropNode are linear and nothing acts between them and the
            # first linear layer, so W1 is applied to the F input features first (a sparse product
            # where the features are sparse), the row mask after it, the bias after propagating
            lin = self.lins[0]
            if isinstance(lin, LazyModuleMixin) and lin.has_uninitialized_params():
                lin.initialize_parameters(x)
            if self.training and self.feature_dropout.p > 0:
                # dropout on the raw features (each pass its own draw): the stored non-zeros of a
                # sparse input, the whole matrix of a dense one
                if memo is not None:
                    xw = memo.matmul(lin.weight, self.feature_dropout(memo.values))
                else:
                    xw = F.linear(self.feature_dropout(x), lin.weight)
            else:
                xw = self._projected(x, memo, lin.weight)
            h = self.prop(drop_node(xw, self.drop_node, self.training, generator, self.rescale),
                          adj) + lin.bias
            first = 1
            if len(self.lins) > 1:
                h = self.act(h)
        else:
            h = self.prop(drop_node(self.feature_dropout(x), self.drop_node, self.training,
                                    generator, self.rescale), adj)
        for i in range(first, len(self.lins)):
            lin, norm = self.lins[i], self.norms[i]
            h = lin((self.input_dropout if i == 0 else self.dropout)(norm(h)))
            if i < len(self.lins) - 1:
                h = self.act(h)
        if not return_signals:
            return h
        signals = TrainingSignals()
        signals.add(es)
        return h, signals

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(producer={self.producer.name or type(self.producer).__name__}, "
                f"steps={self.prop.steps}, drop_node={self.drop_node}, rescale={self.rescale}, "
                f"mlp_layers={len(self.lins)}, norm={self.norm})")
