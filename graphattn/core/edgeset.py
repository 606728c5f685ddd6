r"""The EdgeSet: the contract between edge-set producers and :class:`~graphattn.EdgeAttention`.

An edge set names, for every target (query) node :math:`i`, the sources (key/value nodes) :math:`j`
it attends to, per head. PyG convention: ``edge_index[0]`` is the **source** :math:`j`,
``edge_index[1]`` the **target** :math:`i`, the owner of the softmax segment.

In ``"attention"`` mode the layer computes, for every target :math:`i` and head :math:`h`,

.. math::
    \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}_h(i)}
        \Big(\frac{q_i^h \cdot k_j^h}{\sqrt{d}} + b_{ij}^h\Big), \qquad
    o_i^h = \sum_{j \in \mathcal{N}_h(i)} \alpha_{ij}^h \, w_{ij}^h \, v_j^h,

and in ``"weighted"`` mode :math:`o_i^h = \sum_j w_{ij}^h v_j^h` with no softmax and no query/key.
Targets without in-edges receive 0. A duplicate edge is a second term in the softmax (like a
duplicated key); :meth:`EdgeSet.coalesce` removes duplicates.

Sources ``>= N`` (``N`` = number of real nodes) index the **virtual sources** ``virtual_x``, which are
projected by the layer like real nodes. Virtual sources are never targets.

Every edge set, explicit or structured, is a :class:`BaseEdgeSet`: ``num_heads``, ``mode``, virtual
sources, ``log_prob``, ``aux_loss``, ``stats``, ``device``, ``num_edges``, ``per_head``, ``validate``,
``to``, ``detach`` and ``to_explicit()``, none of which enumerates edges. :class:`EdgeSet` (explicit
COO) adds the explicit-only members: ``edge_index`` and the per-edge fields, ``csr``, ``replace``,
``select``, ``coalesce``, ``expand_heads``.

The structured kinds (:class:`graphattn.core.structured.StructuredEdgeSet`) keep the same meaning
and add a faster kernel. They are siblings of :class:`EdgeSet` under :class:`BaseEdgeSet` (what the
layer accepts) that never enumerate their edges implicitly: their ``device`` and ``num_edges`` are computed
from the structure, their per-edge fields are ``None`` and the explicit-only members raise an
:class:`ExplicitOnlyError`. Only ``to_explicit()`` materialises plain edges (for tests, the viewer
and the generic kernel):

* :class:`SharedSourceEdgeSet`: every target of graph ``b`` attends, in head ``h``, to the same list
  ``sources[b, h]`` (SAMSA, full attention) → dense batched attention.
* :class:`PermutationEdgeSet`: exactly one in-edge per (target, head) (Sliceformer) → a gather.
* :class:`OperatorEdgeSet`: a linear operator ``matvec(v)`` that is never enumerated (Converter).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import Tensor

from graphattn.core.index import (
    derived_edge_sets,
    first_occurrences,
    need_finite,
    need_float,
    need_long,
    need_tensor,
    shape_str,
    sort_rows,
    tensor_ids,
)

if TYPE_CHECKING:  # pragma: no cover
    from graphattn.core.dispatch import Attended, AttentionCall

ES = TypeVar("ES", bound="BaseEdgeSet")

MODES = ("attention", "weighted")

_FLOAT_FIELDS = ("bias", "weight", "virtual_x", "edge_attr", "log_prob", "aux_loss")
#: fields that :meth:`EdgeSet.validate`'s index checks never read: replacing them keeps a check
_VALUE_FIELDS = frozenset({"bias", "weight", "origin", "edge_attr", "log_prob", "log_prob_graph",
                           "aux_loss", "stats"})


def _check_num_heads(num_heads: Any) -> int:
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"'num_heads' must be a positive int, got {num_heads!r}")
    return num_heads


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
    return mode


def _raise_failed(checks: Sequence[tuple[Tensor, str]], oks: Sequence[int]) -> None:
    for (_, message), ok in zip(checks, oks, strict=True):
        if not ok:
            raise ValueError(message)


class ExplicitOnlyError(TypeError):
    """An explicit-only member (``edge_index``, ``csr``, ``select``, ...) was used on a structured
    edge set, which does not hold its edges: answering would enumerate all of them. Call
    ``to_explicit()`` first to materialise them on purpose."""


class BaseEdgeSet(ABC):
    r"""What every edge set has, explicit (:class:`EdgeSet`) or structured
    (:class:`graphattn.core.structured.StructuredEdgeSet`); none of it enumerates edges.

    Fields: ``num_heads``, ``mode``, ``virtual_x`` / ``virtual_batch`` (virtual sources),
    ``log_prob`` / ``log_prob_graph`` (policy gradient), ``aux_loss`` and ``stats`` (see
    :class:`EdgeSet` for their meaning). Subclasses implement :attr:`device`, :attr:`num_edges`,
    :attr:`per_head`, :meth:`to_explicit` and the index checks of :meth:`validate` from what they
    store.
    """

    #: ``"explicit"``, or the fast path of a structured edge set (``"shared_sources"``, ...)
    structure: ClassVar[str]

    num_heads: int
    mode: str
    virtual_x: Tensor | None
    virtual_batch: Tensor | None
    log_prob: Tensor | None
    log_prob_graph: Tensor | None
    aux_loss: Tensor | None
    stats: dict[str, Any]
    _cache: dict[Any, Any]

    def _init_common(
        self,
        *,
        num_heads: int,
        mode: str,
        virtual_x: Tensor | None,
        virtual_batch: Tensor | None,
        log_prob: Tensor | None,
        log_prob_graph: Tensor | None,
        aux_loss: Tensor | None,
        stats: dict[str, Any] | None,
    ) -> None:
        """Checks ``num_heads`` and ``mode`` and stores the common fields; the subclass checks the
        tensors with :meth:`_check_common_fields` once its own fields are set."""
        self.num_heads = _check_num_heads(num_heads)
        self.mode = _check_mode(mode)
        self.virtual_x = virtual_x
        self.virtual_batch = virtual_batch
        self.log_prob = log_prob
        self.log_prob_graph = log_prob_graph
        self.aux_loss = aux_loss
        self.stats = dict(stats) if stats else {}
        self._cache = {}

    # ------------------------------------------------------------------ fields
    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The device of the edges (of the tensors that define them)."""

    @property
    @abstractmethod
    def num_edges(self) -> int:
        """The number of edges of :meth:`to_explicit`, computed without enumerating them."""

    @property
    @abstractmethod
    def per_head(self) -> bool:
        """Whether edges belong to one head each (the explicit form has ``head``)."""

    @property
    def num_virtual(self) -> int:
        return 0 if self.virtual_x is None else int(self.virtual_x.size(0))

    def _check_common_fields(self) -> None:
        if self.virtual_x is not None:
            need_tensor("virtual_x", self.virtual_x, dims=2)
            need_float("virtual_x", self.virtual_x)
            need_finite("virtual_x", self.virtual_x)
        if self.virtual_batch is not None:
            if self.virtual_x is None:
                raise ValueError("'virtual_batch' given without 'virtual_x'")
            need_long("virtual_batch", need_tensor("virtual_batch", self.virtual_batch, dims=1))
            if self.virtual_batch.numel() != self.virtual_x.size(0):
                raise ValueError(
                    f"'virtual_batch' must have shape [{self.virtual_x.size(0)}] "
                    f"(one per virtual source), got {shape_str(self.virtual_batch)}"
                )
        if self.log_prob is not None:
            need_float("log_prob", need_tensor("log_prob", self.log_prob, dims=1))
            if self.log_prob_graph is None:
                raise ValueError("'log_prob' needs 'log_prob_graph' (the graph of each entry)")
            need_long("log_prob_graph", need_tensor("log_prob_graph", self.log_prob_graph, dims=1))
            if self.log_prob_graph.numel() != self.log_prob.numel():
                raise ValueError(
                    f"'log_prob_graph' must have shape [{self.log_prob.numel()}], "
                    f"got {shape_str(self.log_prob_graph)}"
                )
        if self.aux_loss is not None:
            need_tensor("aux_loss", self.aux_loss)
            if self.aux_loss.numel() != 1:
                raise ValueError(f"'aux_loss' must be a scalar, got shape {shape_str(self.aux_loss)}")

    # -------------------------------------------------------------- validation
    def validate(self: ES, num_nodes: int, batch: Tensor | None = None) -> ES:
        """Checks indices against ``num_nodes`` real nodes and the graph assignment ``batch``.

        Raises :class:`ValueError` naming the field on: sources or targets out of range, virtual
        sources without ``virtual_x``, head ids out of range, targets that are virtual, and edges that
        join two graphs of the batch (``batch[src] != batch[dst]``, also for graph-bound virtual
        sources). Returns ``self``.
        """
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
            raise ValueError(f"'num_nodes' must be a non-negative int, got {num_nodes!r}")
        if batch is not None:
            need_long("batch", need_tensor("batch", batch, dims=1))
            if batch.numel() != num_nodes:
                raise ValueError(
                    f"'batch' must have shape [{num_nodes}] (one graph id per node), "
                    f"got {shape_str(batch)}"
                )
        # an edge set shared by several layers (EdgeProducer.static_key) is checked once per batch:
        # the key holds the tensors' identities and versions, so any change checks again
        key = self._validated_key(num_nodes, batch)
        if key in self._cache:
            return self
        self._validate_indices(num_nodes, batch)
        self._cache[key] = batch  # held, so that its id is not reused while the key is cached
        return self

    def _validated_key(self, num_nodes: int, batch: Tensor | None) -> tuple[Any, ...]:
        return ("validated", num_nodes, *tensor_ids(batch, *self._index_tensors()))

    def assume_valid(self: ES, num_nodes: int, batch: Tensor | None = None) -> ES:
        """Records, without checking, that :meth:`validate` would pass for ``num_nodes`` and
        ``batch``: for a producer that assembles this edge set from parts it validated itself
        (e.g. ``union``). A later change of the edges or another batch is checked again."""
        self._cache[self._validated_key(num_nodes, batch)] = batch
        return self

    def _index_tensors(self) -> tuple[Tensor | None, ...]:
        """The tensors the index checks of :meth:`validate` read (whose changes void a check)."""
        return tuple(v for v in vars(self).values() if isinstance(v, Tensor))

    @abstractmethod
    def _validate_indices(self, num_nodes: int, batch: Tensor | None) -> None:
        """The index checks of :meth:`validate` (``num_nodes`` and ``batch`` already checked)."""

    # ---------------------------------------------------------- conversions
    @abstractmethod
    def to_explicit(self) -> EdgeSet:
        """Plain COO edges with the same meaning (``self`` for an explicit edge set); the only
        member of a structured edge set that enumerates its edges."""

    @abstractmethod
    def attend(self, call: AttentionCall) -> Attended:
        """Attention over these edges on this structure's own path (:mod:`graphattn.core.dispatch`)."""

    def to(self: ES, *args: Any, **kwargs: Any) -> ES:
        """Moves tensors like :meth:`torch.Tensor.to`; a dtype applies to real floating fields only."""
        out = _copy_edge_set(self)
        for name, value in vars(out).items():
            if not isinstance(value, Tensor):
                continue
            if value.is_floating_point():
                new = value.to(*args, **kwargs)
            else:
                device = _device_of(args, kwargs)
                new = value if device is None else value.to(device)
            setattr(out, name, new)
        out._cache = {}
        return out

    def detach(self: ES) -> ES:
        """A copy whose tensors are detached from the autograd graph."""
        out = _copy_edge_set(self)
        for name, value in vars(out).items():
            if isinstance(value, Tensor):
                setattr(out, name, value.detach())
        out._cache = {}
        return out

    # --------------------------------------------------------------- kernels
    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()`` once per edge set and ``key``: kernel graph layouts (e.g. the fused
        kernel's CSR/CSC, :func:`graphattn.kernels.prepare_graph`). ``to()`` / ``detach()`` drop it."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


class EdgeSet(BaseEdgeSet):
    r"""Explicit edge set (COO). See the module docstring for the math.

    Args:
        edge_index (LongTensor): ``[2, E]``, row 0 = source :math:`j`, row 1 = target :math:`i`.
        head (LongTensor, optional): ``[E]`` head of each edge; ``None`` = every edge in every head.
        num_heads (int): number of heads the edge set is meant for.
        mode (str): ``"attention"`` (softmax over each target's in-edges) or ``"weighted"``.
        bias (Tensor, optional): ``[E]`` or ``[E, H]`` added to the logit (may carry gradient).
        weight (Tensor, optional): ``[E]`` or ``[E, H]``, real or complex, multiplies the message after
            the softmax (may carry gradient).
        virtual_x (Tensor, optional): ``[Nv, F]`` features of virtual sources ``N .. N + Nv - 1``.
        virtual_batch (LongTensor, optional): ``[Nv]`` graph of each virtual source, ``-1`` for
            graph-agnostic sources (e.g. learned support tokens). ``None`` = all graph-agnostic.
        origin (LongTensor, optional): ``[E]`` producer code of each edge (:mod:`graphattn.core.origins`).
        edge_attr (Tensor, optional): ``[E, F_e]`` edge features, added to keys and values.
        log_prob (Tensor, optional): ``[A]`` log-probabilities of sampled decisions (policy gradient).
        log_prob_graph (LongTensor, optional): ``[A]`` graph of each ``log_prob`` entry.
        aux_loss (Tensor, optional): differentiable scalar added to the training loss.
        stats (dict, optional): statistics for logging; never read by the math.

    With per-head edges (``head`` given), ``bias`` and ``weight`` must be ``[E]``.

    The per-edge fields (``edge_index``, ``head``, ``bias``, ``weight``, ``origin``, ``edge_attr``)
    and the members built on them (``csr``, ``replace``, ``select``, ``coalesce``, ``expand_heads``)
    are explicit-only: the structured subclasses hold ``None`` in the per-edge fields and raise an
    :class:`ExplicitOnlyError` from the members (see :class:`BaseEdgeSet`).
    """

    structure = "explicit"

    head: Tensor | None
    bias: Tensor | None
    weight: Tensor | None
    origin: Tensor | None
    edge_attr: Tensor | None

    def __init__(
        self,
        edge_index: Tensor,
        *,
        head: Tensor | None = None,
        num_heads: int = 1,
        mode: str = "attention",
        bias: Tensor | None = None,
        weight: Tensor | None = None,
        virtual_x: Tensor | None = None,
        virtual_batch: Tensor | None = None,
        origin: Tensor | None = None,
        edge_attr: Tensor | None = None,
        log_prob: Tensor | None = None,
        log_prob_graph: Tensor | None = None,
        aux_loss: Tensor | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        self._init_common(num_heads=num_heads, mode=mode, virtual_x=virtual_x,
                          virtual_batch=virtual_batch, log_prob=log_prob,
                          log_prob_graph=log_prob_graph, aux_loss=aux_loss, stats=stats)
        edge_index = need_long("edge_index", need_tensor("edge_index", edge_index, dims=2))
        if edge_index.size(0) != 2:
            raise ValueError(
                f"'edge_index' must have shape [2, E] (row 0 = source, row 1 = target), "
                f"got {shape_str(edge_index)}"
            )
        self._edge_index = edge_index
        self.head = head
        self.bias = bias
        self.weight = weight
        self.origin = origin
        self.edge_attr = edge_attr
        # bool [E] or None: the rows of ``edge_attr`` that may be non-zero; the others are the
        # zeros :func:`union_edge_sets` filled in for parts without features (set there, carried by
        # ``select`` / ``coalesce`` / ``expand_heads``). The layer projects the marked rows only.
        self._featured: Tensor | None = None
        self._check_edge_fields()
        self._check_common_fields()

    # ------------------------------------------------------------------ fields
    @property
    def edge_index(self) -> Tensor:
        """``[2, E]`` explicit edges."""
        return self._edge_index

    @property
    def per_head(self) -> bool:
        """Whether edges belong to one head each (``head`` given)."""
        return self.head is not None

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    def _check_edge_field(self, name: str, value: Tensor | None, num_edges: int) -> None:
        """Checks an ``[E]`` / ``[E, H]`` per-edge float field."""
        if value is None:
            return
        need_tensor(name, value, dims=(1, 2))
        need_float(name, value, complex_ok=(name == "weight"))
        if value.size(0) != num_edges:
            raise ValueError(
                f"'{name}' must have {num_edges} rows (one per edge), got shape {shape_str(value)}"
            )
        if value.dim() == 2:
            if self.per_head:
                raise ValueError(
                    f"'{name}' must be [E] when edges are per-head ('head' given), "
                    f"got shape {shape_str(value)}"
                )
            if value.size(1) != self.num_heads:
                raise ValueError(
                    f"'{name}' must be [E] or [E, num_heads={self.num_heads}], "
                    f"got shape {shape_str(value)}"
                )
        need_finite(name, value)

    def _check_edge_fields(self) -> None:
        E = int(self._edge_index.size(1))
        if self.head is not None:
            need_long("head", need_tensor("head", self.head, dims=1))
            if self.head.numel() != E:
                raise ValueError(f"'head' must have shape [{E}], got {shape_str(self.head)}")
        self._check_edge_field("bias", self.bias, E)
        self._check_edge_field("weight", self.weight, E)
        if self.origin is not None:
            need_long("origin", need_tensor("origin", self.origin, dims=1))
            if self.origin.numel() != E:
                raise ValueError(f"'origin' must have shape [{E}], got {shape_str(self.origin)}")
        if self.edge_attr is not None:
            need_tensor("edge_attr", self.edge_attr, dims=2)
            need_float("edge_attr", self.edge_attr)
            if self.edge_attr.size(0) != E:
                raise ValueError(
                    f"'edge_attr' must have shape [{E}, F_e], got {shape_str(self.edge_attr)}"
                )
            need_finite("edge_attr", self.edge_attr)
        if self.mode == "weighted" and self.bias is not None:
            raise ValueError("'bias' is only meaningful in mode='attention' (no logits in 'weighted')")

    # -------------------------------------------------------------- validation
    def _validate_indices(self, num_nodes: int, batch: Tensor | None,
                          checks: Sequence[tuple[Tensor, str]] = ()) -> None:
        """All index checks with one device-to-host transfer (on a GPU each transfer stalls the
        host); the messages of a failed check read what they need afterwards. ``checks``: more
        ``(ok, message)`` pairs (``ok`` a 0-d bool tensor) read in the same transfer, a
        :class:`ValueError` with ``message`` where ``ok`` is false (see :func:`check_graph_inputs`;
        the structured subclasses do not take them)."""
        ei = self.edge_index
        check_batch = batch is not None and batch.numel() > 0
        if ei.numel() == 0:
            if check_batch or checks:
                first = batch.min() if check_batch else ei.new_zeros(())  # type: ignore[union-attr]
                bmin, *oks = torch.stack([first, *(ok.long() for ok, _ in checks)]).tolist()
                if bmin < 0:
                    raise ValueError("'batch' must hold non-negative graph ids")
                _raise_failed(checks, oks)
            return
        src, dst = ei[0], ei[1]
        nv = self.num_virtual
        stats = [batch.min() if check_batch else dst.new_zeros(()),  # type: ignore[union-attr]
                 dst.min(), dst.max(), src.min(), src.max()]
        if self.head is not None:
            stats += [self.head.min(), self.head.max()]
        real = bad = bad_virtual = None
        if batch is not None and num_nodes > 0:
            # indices clamped: out-of-range ones are reported by the range checks below
            hi = num_nodes - 1
            real = src < num_nodes
            bad = real & (batch[src.clamp(0, hi)] != batch[dst.clamp(0, hi)])
            stats.append(bad.any())
            if nv and self.virtual_batch is not None:
                vb = self.virtual_batch[(src - num_nodes).clamp(0, nv - 1)]
                bad_virtual = (~real) & (vb >= 0) & (vb != batch[dst])
                stats.append(bad_virtual.any())
        stats += [ok for ok, _ in checks]
        values = [int(v) for v in torch.stack([t.long() for t in stats]).tolist()]
        if checks:
            values, oks = values[:-len(checks)], values[-len(checks):]
        bmin, dmin, dmax, smin, smax = values[:5]
        if bmin < 0:
            raise ValueError("'batch' must hold non-negative graph ids")
        if checks:
            _raise_failed(checks, oks)
        if dmin < 0 or dmax >= num_nodes:
            raise ValueError(
                f"'edge_index' targets (row 1) must lie in [0, {num_nodes}) (virtual sources are "
                f"never targets), got range [{dmin}, {dmax}]"
            )
        if smin < 0:
            raise ValueError(f"'edge_index' sources (row 0) must be >= 0, got {smin}")
        if smax >= num_nodes + nv:
            if nv == 0:
                raise ValueError(
                    f"'edge_index' has source {smax} >= num_nodes={num_nodes} but no "
                    f"'virtual_x' (sources >= N index virtual sources)"
                )
            raise ValueError(
                f"'edge_index' sources must lie in [0, {num_nodes + nv}) ({num_nodes} nodes + "
                f"{nv} virtual sources), got {smax}"
            )
        rest = values[5:]
        if self.head is not None:
            hmin, hmax, *rest = rest
            if hmin < 0 or hmax >= self.num_heads:
                raise ValueError(
                    f"'head' ids must lie in [0, num_heads={self.num_heads}), got range "
                    f"[{hmin}, {hmax}]"
                )
        if bad is None:
            return
        if rest[0]:
            e = int(bad.nonzero()[0])
            raise ValueError(
                f"'edge_index' joins two graphs: edge {e} goes from node {int(src[e])} (graph "
                f"{int(batch[src[e]])}) to node {int(dst[e])} (graph {int(batch[dst[e]])})"
            )
        if bad_virtual is not None and rest[1]:
            e = int(bad_virtual.nonzero()[0])
            vb = self.virtual_batch[(src - num_nodes).clamp(0, nv - 1)]  # type: ignore[index]
            raise ValueError(
                f"'edge_index' joins two graphs: edge {e} goes from virtual source "
                f"{int(src[e])} (graph {int(vb[e])}) to node {int(dst[e])} "
                f"(graph {int(batch[dst[e]])})"
            )

    # ---------------------------------------------------------- conversions
    def to_explicit(self) -> EdgeSet:
        """Plain COO edges with the same meaning (``self`` for an explicit edge set)."""
        return self

    def attend(self, call: AttentionCall) -> Attended:
        """The layer's explicit path (fused kernel or reference)."""
        return call.explicit(self)

    def _fields(self) -> dict[str, Any]:
        return {
            "head": self.head,
            "num_heads": self.num_heads,
            "mode": self.mode,
            "bias": self.bias,
            "weight": self.weight,
            "virtual_x": self.virtual_x,
            "virtual_batch": self.virtual_batch,
            "origin": self.origin,
            "edge_attr": self.edge_attr,
            "log_prob": self.log_prob,
            "log_prob_graph": self.log_prob_graph,
            "aux_loss": self.aux_loss,
            "stats": self.stats,
        }

    @derived_edge_sets
    def replace(self, **changes: Any) -> EdgeSet:
        """A copy of this explicit edge set with some fields replaced. When only per-edge values
        change (``bias``, ``weight``, ``origin``, ``edge_attr``, ``log_prob``, ...; none that the
        index checks read), the copy keeps this set's passed :meth:`validate` calls."""
        fields = self._fields()
        keeps_indices = set(changes) <= _VALUE_FIELDS
        edge_index = changes.pop("edge_index", self.edge_index)
        fields.update(changes)
        out = EdgeSet(edge_index, **fields)
        if keeps_indices:
            for key, batch in list(self._cache.items()):
                if isinstance(key, tuple) and key[:1] == ("validated",):
                    out.assume_valid(key[1], batch)
        return out

    @derived_edge_sets
    def expand_heads(self) -> EdgeSet:
        """Per-head form: every head-shared edge becomes ``num_heads`` edges, one per head."""
        es = self
        if es.per_head:
            return es
        H, E = es.num_heads, es.num_edges
        rep = torch.arange(E, device=es.device).repeat_interleave(H)
        head = torch.arange(H, device=es.device).repeat(E)

        def per_edge(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            if t.dim() == 2:
                return t.reshape(-1)
            return t[rep]

        out = es.replace(
            edge_index=es.edge_index[:, rep],
            head=head,
            bias=per_edge(es.bias),
            weight=per_edge(es.weight),
            origin=None if es.origin is None else es.origin[rep],
            edge_attr=None if es.edge_attr is None else es.edge_attr[rep],
        )
        out._featured = None if es._featured is None else es._featured[rep]
        return out

    @derived_edge_sets
    def coalesce(self) -> EdgeSet:
        """Removes duplicate ``(source, target, head)`` edges, keeping each one's first occurrence.

        The result is sorted by target, then head, then source.
        """
        es = self
        if es.num_edges == 0:
            return es
        src, dst = es.edge_index
        n = int(es.edge_index.max()) + 1
        h = es.head if es.per_head else torch.zeros_like(src)
        H = es.num_heads if es.per_head else 1
        return es.select(first_occurrences((dst * H + h) * n + src))

    @derived_edge_sets
    def select(self, index: Tensor) -> EdgeSet:
        """The edges ``index`` (a long index or a bool mask over edges), fields sliced alike."""
        es = self

        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[index]

        out = es.replace(
            edge_index=es.edge_index[:, index],
            head=take(es.head),
            bias=take(es.bias),
            weight=take(es.weight),
            origin=take(es.origin),
            edge_attr=take(es.edge_attr),
        )
        out._featured = take(es._featured)
        return out

    # --------------------------------------------------------------- kernels
    def csr(self, num_nodes: int) -> tuple[Tensor, Tensor, Tensor]:
        """Destination-sorted layout, cached: ``(perm, ptr, rows)``.

        ``rows`` are the softmax segments (target, or ``target * H + head`` for per-head edges),
        ``perm`` the stable permutation sorting edges by row, ``ptr`` the CSR pointer over rows.
        """
        key = ("csr", num_nodes)
        if key not in self._cache:
            _src, dst = self.edge_index
            if self.per_head:
                rows = dst * self.num_heads + self.head
                num_rows = num_nodes * self.num_heads
            else:
                rows, num_rows = dst, num_nodes
            perm, ptr = sort_rows(rows, num_rows)
            self._cache[key] = (perm, ptr, rows)
        return self._cache[key]

    # -------------------------------------------------------------- display
    def __repr__(self) -> str:
        parts = [f"num_edges={self.num_edges}", f"num_heads={self.num_heads}", f"mode={self.mode!r}"]
        if self.per_head:
            parts.append("per_head=True")
        for name in ("bias", "weight", "edge_attr", "virtual_x", "origin", "log_prob", "aux_loss"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={shape_str(getattr(self, name))}")
        return f"{type(self).__name__}({', '.join(parts)})"


def _copy_edge_set(es: ES) -> ES:
    out = es.__class__.__new__(es.__class__)
    out.__dict__.update(es.__dict__)
    out.stats = dict(es.stats)
    return out


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    if "device" in kwargs:
        return torch.device(kwargs["device"])
    for a in args:
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
        if isinstance(a, Tensor):
            return a.device
    return None
