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

Structured subclasses (:class:`graphattn.core.structured.StructuredEdgeSet`) keep the same meaning and add
a faster kernel. They are :class:`EdgeSet` instances (``isinstance`` checks and the layer accept
them) that never enumerate their edges implicitly: their ``device`` and ``num_edges`` are computed
from the structure, their per-edge fields are ``None`` and the explicit-only members raise an
:class:`ExplicitOnlyError`. Only ``to_explicit()`` materialises plain edges (for tests, the viewer
and the generic kernel):

* :class:`SharedSourceEdgeSet`: every target of graph ``b`` attends, in head ``h``, to the same list
  ``sources[b, h]`` (SAMSA, full attention) → dense batched attention.
* :class:`PermutationEdgeSet`: exactly one in-edge per (target, head) (Sliceformer) → a gather.
* :class:`OperatorEdgeSet`: a linear operator ``matvec(v)`` that is never enumerated (Converter).
"""

from __future__ import annotations

import functools
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import Tensor

from graphattn.core.checks import all_finite
from graphattn.core.origins import origin_code
from graphattn.memory import check_edges

if TYPE_CHECKING:  # pragma: no cover
    from graphattn.core.dispatch import Attended, AttentionCall

F = TypeVar("F", bound=Callable[..., Any])
ES = TypeVar("ES", bound="BaseEdgeSet")

MODES = ("attention", "weighted")

_FLOAT_FIELDS = ("bias", "weight", "virtual_x", "edge_attr", "log_prob", "aux_loss")
#: fields that :meth:`EdgeSet.validate`'s index checks never read: replacing them keeps a check
_VALUE_FIELDS = frozenset({"bias", "weight", "origin", "edge_attr", "log_prob", "log_prob_graph",
                           "aux_loss", "stats"})


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _need_tensor(name: str, value: Any, *, dims: int | tuple[int, ...] | None = None) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(f"'{name}' must be a torch.Tensor, got {type(value).__name__}")
    if dims is not None:
        allowed = (dims,) if isinstance(dims, int) else dims
        if value.dim() not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"'{name}' must be {want}, got shape {_shape(value)}")
    return value


def _need_long(name: str, value: Tensor) -> Tensor:
    if value.dtype != torch.long:
        raise ValueError(f"'{name}' must have dtype torch.long, got {value.dtype}")
    return value


def _need_float(name: str, value: Tensor, *, complex_ok: bool = False) -> Tensor:
    if not (value.is_floating_point() or (complex_ok and value.is_complex())):
        kind = "floating-point or complex" if complex_ok else "floating-point"
        raise ValueError(f"'{name}' must be a {kind} tensor, got {value.dtype}")
    return value


_DERIVED = threading.local()


def derived_edge_sets(fn: F) -> F:
    """Marks ``fn`` as building edge sets from already checked ones (a conversion, a union, a
    selection): inside it, the NaN/inf scan of float fields (one device-to-host transfer per field)
    is skipped; every shape, dtype and index check still runs. Edge sets a user or a producer builds
    from new values are scanned as before."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_DERIVED, "depth", 0)
        _DERIVED.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DERIVED.depth = depth

    return wrapper  # type: ignore[return-value]


def _need_finite(name: str, value: Tensor) -> Tensor:
    if getattr(_DERIVED, "depth", 0):
        return value
    if value.numel() and not bool(all_finite(value)):
        raise ValueError(f"'{name}' contains NaN or infinite values")
    return value


def _check_num_heads(num_heads: Any) -> int:
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"'num_heads' must be a positive int, got {num_heads!r}")
    return num_heads


def _check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"'mode' must be one of {MODES}, got {mode!r}")
    return mode


def ptr_from_batch(batch: Tensor, num_graphs: int | None = None) -> Tensor:
    """CSR pointer ``[B + 1]`` of a sorted ``batch`` vector."""
    if num_graphs is None:
        num_graphs = int(batch.max()) + 1 if batch.numel() else 0
    return ptr_from_counts(torch.bincount(batch, minlength=num_graphs))


def ptr_from_counts(counts: Tensor) -> Tensor:
    """CSR pointer ``[R + 1]`` (exclusive prefix sum with the total) of ``counts [R]``."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def sort_rows(rows: Tensor, num_rows: int) -> tuple[Tensor, Tensor]:
    """``(perm, ptr)``: the stable permutation sorting ``rows [E]`` and the CSR pointer
    ``[num_rows + 1]`` of the sorted order (the layout of :meth:`EdgeSet.csr` and of the fused
    kernel's graphs)."""
    perm = torch.argsort(rows, stable=True)
    try:
        counts = torch.bincount(rows, minlength=num_rows)
    except RuntimeError as e:  # the counts are computed anyway: naming a bad index costs nothing
        raise ValueError(f"'edge_index' holds a negative node index (expected indices in "
                         f"[0, {num_rows})): {str(e).splitlines()[0]}") from None
    if counts.numel() > num_rows:
        raise ValueError(f"'edge_index' holds node index {counts.numel() - 1}, out of range "
                         f"[0, {num_rows})")
    return perm, ptr_from_counts(counts)


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
            _need_tensor("virtual_x", self.virtual_x, dims=2)
            _need_float("virtual_x", self.virtual_x)
            _need_finite("virtual_x", self.virtual_x)
        if self.virtual_batch is not None:
            if self.virtual_x is None:
                raise ValueError("'virtual_batch' given without 'virtual_x'")
            _need_long("virtual_batch", _need_tensor("virtual_batch", self.virtual_batch, dims=1))
            if self.virtual_batch.numel() != self.virtual_x.size(0):
                raise ValueError(
                    f"'virtual_batch' must have shape [{self.virtual_x.size(0)}] "
                    f"(one per virtual source), got {_shape(self.virtual_batch)}"
                )
        if self.log_prob is not None:
            _need_float("log_prob", _need_tensor("log_prob", self.log_prob, dims=1))
            if self.log_prob_graph is None:
                raise ValueError("'log_prob' needs 'log_prob_graph' (the graph of each entry)")
            _need_long("log_prob_graph", _need_tensor("log_prob_graph", self.log_prob_graph, dims=1))
            if self.log_prob_graph.numel() != self.log_prob.numel():
                raise ValueError(
                    f"'log_prob_graph' must have shape [{self.log_prob.numel()}], "
                    f"got {_shape(self.log_prob_graph)}"
                )
        if self.aux_loss is not None:
            _need_tensor("aux_loss", self.aux_loss)
            if self.aux_loss.numel() != 1:
                raise ValueError(f"'aux_loss' must be a scalar, got shape {_shape(self.aux_loss)}")

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
            _need_long("batch", _need_tensor("batch", batch, dims=1))
            if batch.numel() != num_nodes:
                raise ValueError(
                    f"'batch' must have shape [{num_nodes}] (one graph id per node), "
                    f"got {_shape(batch)}"
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
        return ("validated", num_nodes, *_tensor_ids(batch, *self._index_tensors()))

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
        edge_index = _need_long("edge_index", _need_tensor("edge_index", edge_index, dims=2))
        if edge_index.size(0) != 2:
            raise ValueError(
                f"'edge_index' must have shape [2, E] (row 0 = source, row 1 = target), "
                f"got {_shape(edge_index)}"
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
        _need_tensor(name, value, dims=(1, 2))
        _need_float(name, value, complex_ok=(name == "weight"))
        if value.size(0) != num_edges:
            raise ValueError(
                f"'{name}' must have {num_edges} rows (one per edge), got shape {_shape(value)}"
            )
        if value.dim() == 2:
            if self.per_head:
                raise ValueError(
                    f"'{name}' must be [E] when edges are per-head ('head' given), "
                    f"got shape {_shape(value)}"
                )
            if value.size(1) != self.num_heads:
                raise ValueError(
                    f"'{name}' must be [E] or [E, num_heads={self.num_heads}], "
                    f"got shape {_shape(value)}"
                )
        _need_finite(name, value)

    def _check_edge_fields(self) -> None:
        E = int(self._edge_index.size(1))
        if self.head is not None:
            _need_long("head", _need_tensor("head", self.head, dims=1))
            if self.head.numel() != E:
                raise ValueError(f"'head' must have shape [{E}], got {_shape(self.head)}")
        self._check_edge_field("bias", self.bias, E)
        self._check_edge_field("weight", self.weight, E)
        if self.origin is not None:
            _need_long("origin", _need_tensor("origin", self.origin, dims=1))
            if self.origin.numel() != E:
                raise ValueError(f"'origin' must have shape [{E}], got {_shape(self.origin)}")
        if self.edge_attr is not None:
            _need_tensor("edge_attr", self.edge_attr, dims=2)
            _need_float("edge_attr", self.edge_attr)
            if self.edge_attr.size(0) != E:
                raise ValueError(
                    f"'edge_attr' must have shape [{E}, F_e], got {_shape(self.edge_attr)}"
                )
            _need_finite("edge_attr", self.edge_attr)
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

    # --------------------------------------------------------- sparse matrices
    def to_sparse_tensor(self, value: str | Tensor | None = "weight", *,
                         num_nodes: int | None = None, duplicates: str = "error") -> Any:
        r"""This edge set as a :class:`torch_sparse.SparseTensor` in PyG's ``adj_t`` orientation:
        row = target :math:`i`, column = source :math:`j`, sizes ``(N, N + V)``; the entry
        :math:`(i, j)` holds ``value`` of edge :math:`j \to i` (default: ``weight``; no values
        without one). Duplicate edges raise a :class:`ValueError` unless
        ``duplicates="first"``/``"sum"``. Needs ``torch_sparse``. See :mod:`graphattn.interop`."""
        from graphattn.interop import to_sparse_tensor

        return to_sparse_tensor(self, value, num_nodes=num_nodes, duplicates=duplicates)

    @classmethod
    def from_sparse_tensor(cls, adj_t: Any, *, value_as: str | None = "weight",
                           duplicates: str = "error", **fields: Any) -> EdgeSet:
        """An explicit edge set from a :class:`torch_sparse.SparseTensor` ``adj_t`` (row = target,
        column = source), its values stored as ``value_as``, edges sorted by (target, source);
        ``fields``: other :class:`EdgeSet` arguments. See :mod:`graphattn.interop`."""
        from graphattn.interop import from_sparse_tensor

        return from_sparse_tensor(adj_t, value_as=value_as, duplicates=duplicates, **fields)

    def to_torch_sparse(self, layout: torch.layout = torch.sparse_csr,
                        value: str | Tensor | None = "weight", *, num_nodes: int | None = None,
                        duplicates: str = "error") -> Tensor:
        """This edge set as a plain torch sparse tensor ``[N, N + V]`` (``torch.sparse_csr`` or
        ``torch.sparse_coo``; row = target, column = source), as :meth:`to_sparse_tensor`; entries
        without a value are ones. See :mod:`graphattn.interop`."""
        from graphattn.interop import to_torch_sparse

        return to_torch_sparse(self, layout, value, num_nodes=num_nodes, duplicates=duplicates)

    @classmethod
    def from_torch_sparse(cls, t: Tensor, *, value_as: str | None = "weight",
                          duplicates: str = "error", **fields: Any) -> EdgeSet:
        """An explicit edge set from a torch sparse tensor (COO, CSR or CSC; row = target, column
        = source), as :meth:`from_sparse_tensor`. See :mod:`graphattn.interop`."""
        from graphattn.interop import from_torch_sparse

        return from_torch_sparse(t, value_as=value_as, duplicates=duplicates, **fields)

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
                parts.append(f"{name}={_shape(getattr(self, name))}")
        return f"{type(self).__name__}({', '.join(parts)})"


def tensor_version(t: Tensor) -> int | None:
    """The in-place version counter of ``t``, or ``None`` for a tensor made under
    :func:`torch.inference_mode` (such tensors keep no counter: reading it raises). Cache keys
    holding ``None`` are never reused across calls (see :func:`cacheable`)."""
    return None if t.is_inference() else t._version


#: graph pointers the library built from a sorted batch: id -> (weak reference, in-place version)
_KNOWN_PTRS: dict[int, tuple[weakref.ref, int | None]] = {}


def known_ptr(ptr: Tensor) -> Tensor:
    """Marks ``ptr`` (built by the library from a sorted batch, e.g. :attr:`ProducerContext.ptr`)
    as a valid graph pointer, so that an edge set built on this very tensor skips checking it
    again (:func:`is_known_ptr`). The mark dies with the tensor and with any in-place change of it
    (an inference tensor keeps no version counter: the mark is then that object's identity)."""
    key = id(ptr)

    def forget(ref: weakref.ref, key: int = key) -> None:
        entry = _KNOWN_PTRS.get(key)
        if entry is not None and entry[0] is ref:
            _KNOWN_PTRS.pop(key, None)

    _KNOWN_PTRS[key] = (weakref.ref(ptr, forget), tensor_version(ptr))
    return ptr


def is_known_ptr(ptr: Tensor) -> bool:
    """Whether ``ptr`` is, unchanged, a pointer marked by :func:`known_ptr`."""
    entry = _KNOWN_PTRS.get(id(ptr))
    return entry is not None and entry[0]() is ptr and entry[1] == tensor_version(ptr)


def cacheable(*tensors: Tensor | None) -> bool:
    """Whether results derived from these tensors may be cached across calls: not when one is an
    inference tensor, whose in-place changes no version counter records."""
    return not any(t is not None and t.is_inference() for t in tensors)


def _tensor_ids(*tensors: Tensor | None) -> tuple[Any, ...]:
    """Identity and version of each tensor (``None`` stays ``None``): a cache key that changes when
    a tensor is replaced or modified in place (an inference tensor's version is ``None``: within one
    forward pass, where these keys live, it is not modified)."""
    return tuple(None if t is None else (id(t), tensor_version(t)) for t in tensors)


#: on the CPU, :func:`first_occurrences` of at least this many keys runs the compiled radix sort
#: (``kernels/csrc/unique_first.cpp``) when the extension is available; ``None`` never does (the
#: same positions from torch's stable argsort)
NATIVE_UNIQUE_MIN: int | None = 1 << 12


def first_occurrences(key: Tensor) -> Tensor:
    """Positions of the first occurrence of every distinct value of ``key [E]``, in increasing
    ``key`` order (the de-duplication of :meth:`EdgeSet.coalesce` and of sampled multi-edges).

    Equals ``order[first]`` for ``order = argsort(key, stable=True)`` and ``first`` the start of
    each run of equal sorted keys. Large int64 keys on the CPU go through a compiled LSD radix
    sort over the bits that vary (:data:`NATIVE_UNIQUE_MIN`); the result is the same."""
    return unique_first(key)[0]


def unique_first(key: Tensor) -> tuple[Tensor, Tensor]:
    """``(positions, values)``: :func:`first_occurrences` of ``key`` and the distinct values
    themselves, ``key[positions]`` (sorted), without a gather on the compiled path."""
    if (NATIVE_UNIQUE_MIN is not None and key.device.type == "cpu" and key.dtype == torch.long
            and key.dim() == 1 and key.numel() >= NATIVE_UNIQUE_MIN):
        from graphattn.kernels.cpu_extension import cpu_ops

        ops = cpu_ops(warn=False)
        if ops is not None and hasattr(ops, "unique_first"):
            return ops.unique_first(key)
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    first = torch.ones_like(sorted_key, dtype=torch.bool)
    first[1:] = sorted_key[1:] != sorted_key[:-1]
    runs = first.nonzero().view(-1)  # one host read for both results
    return order[runs], sorted_key[runs]


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


# -------------------------------------------------------------------------------------- union
def featured_rows(es: EdgeSet) -> Tensor | None:
    """The rows of ``es.edge_attr`` that may be non-zero, as a long index, when the edge set knows
    that the others are zeros filled in by :func:`union_edge_sets` (``None`` when it does not:
    every row counts). Reads a count on the host."""
    marks = getattr(es, "_featured", None)
    if es.edge_attr is None or marks is None:
        return None
    return marks.nonzero().view(-1)


@derived_edge_sets
def union_edge_sets(
    edge_sets: Sequence[EdgeSet], num_nodes: int, *, coalesce: bool = False
) -> EdgeSet:
    """Union of edge sets as one explicit edge set, keeping each edge's ``origin``.

    All parts must share ``mode`` and ``num_heads``. Head-shared parts are expanded to per-head
    edges if any part is per-head. Missing ``bias`` / ``weight`` / ``edge_attr`` are filled with
    0 / 1 / 0, missing ``origin`` with ``"unknown"``. Virtual sources are concatenated and the source
    ids of later parts shifted accordingly. ``aux_loss`` values are summed and ``log_prob`` entries
    concatenated. With ``coalesce=True`` duplicate edges are dropped, the first part winning. The
    total edge count is checked against the memory budget (:mod:`graphattn.memory`) first.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        # a wrong count would shift real sources as if they were virtual (sources >= num_nodes)
        raise ValueError(f"'num_nodes' must be a non-negative int, got {num_nodes!r}")
    if isinstance(edge_sets, (EdgeSet, Tensor)) or not isinstance(edge_sets, Sequence) or any(
            not isinstance(e, EdgeSet) for e in edge_sets):
        raise ValueError(f"'edge_sets' must be a sequence of EdgeSets, got {edge_sets!r:.80}")
    parts = [e.to_explicit() for e in edge_sets]
    if not parts:
        raise ValueError("'edge_sets' must contain at least one EdgeSet")
    modes = {p.mode for p in parts}
    heads = {p.num_heads for p in parts}
    if len(modes) > 1:
        raise ValueError(f"cannot unite edge sets of different modes {sorted(modes)}")
    if len(heads) > 1:
        raise ValueError(f"cannot unite edge sets with different num_heads {sorted(heads)}")
    H = heads.pop()
    expand = any(p.per_head for p in parts) and H > 1
    # memory guard: the concatenated edges (head-shared parts expanded to every head)
    check_edges(sum(p.num_edges * (H if expand and not p.per_head else 1) for p in parts),
                what=f"the union of {len(parts)} edge sets", how_to_lower="use fewer or sparser parts",
                device=parts[0].device)
    if expand:
        parts = [p.expand_heads() for p in parts]
    per_head = parts[0].per_head
    dev = parts[0].device

    edge_attr_dims = {p.edge_attr.size(1) for p in parts if p.edge_attr is not None}
    if len(edge_attr_dims) > 1:
        raise ValueError(f"cannot unite edge sets with edge_attr widths {sorted(edge_attr_dims)}")
    want_2d = any(t is not None and t.dim() == 2 for p in parts for t in (p.bias, p.weight))

    def fill(p: EdgeSet, t: Tensor | None, value: float, ref: Tensor | None) -> Tensor:
        shape = (p.num_edges, H) if want_2d else (p.num_edges,)
        if t is None:
            dtype = ref.dtype if ref is not None else torch.get_default_dtype()
            return torch.full(shape, value, dtype=dtype, device=dev)
        if want_2d and t.dim() == 1:
            return t[:, None].expand(shape)
        return t

    def first(name: str) -> Tensor | None:
        return next((getattr(p, name) for p in parts if getattr(p, name) is not None), None)

    ref_bias, ref_weight, ref_attr = first("bias"), first("weight"), first("edge_attr")
    edge_index, vx, vb, offset = [], [], [], 0
    for p in parts:
        ei = p.edge_index
        if offset:  # shift this part's virtual sources past the earlier parts' (no host sync)
            src = ei[0]
            ei = torch.stack([torch.where(src >= num_nodes, src + offset, src), ei[1]])
        edge_index.append(ei)
        if p.virtual_x is not None:
            vx.append(p.virtual_x)
            vb.append(
                p.virtual_batch
                if p.virtual_batch is not None
                else torch.full((p.num_virtual,), -1, dtype=torch.long, device=dev)
            )
            offset += p.num_virtual
    if len({v.size(1) for v in vx}) > 1:
        raise ValueError("cannot unite edge sets whose virtual_x have different widths")
    aux = [p.aux_loss for p in parts if p.aux_loss is not None]
    lp = [p for p in parts if p.log_prob is not None]
    stats: dict[str, Any] = {}
    for i, p in enumerate(parts):
        for k, v in p.stats.items():
            stats[f"part{i}.{k}" if len(parts) > 1 else k] = v
    out = EdgeSet(
        torch.cat(edge_index, 1),
        head=torch.cat([p.head for p in parts]) if per_head else None,
        num_heads=H,
        mode=parts[0].mode,
        bias=None if ref_bias is None else torch.cat([fill(p, p.bias, 0.0, ref_bias) for p in parts]),
        weight=None
        if ref_weight is None
        else torch.cat([fill(p, p.weight, 1.0, ref_weight) for p in parts]),
        virtual_x=torch.cat(vx) if vx else None,
        virtual_batch=torch.cat(vb) if vb else None,
        origin=torch.cat(
            [
                p.origin
                if p.origin is not None
                else torch.full((p.num_edges,), origin_code("unknown"), dtype=torch.long, device=dev)
                for p in parts
            ]
        ),
        edge_attr=None
        if ref_attr is None
        else torch.cat(
            [
                p.edge_attr
                if p.edge_attr is not None
                else ref_attr.new_zeros(p.num_edges, ref_attr.size(1))
                for p in parts
            ]
        ),
        log_prob=torch.cat([p.log_prob for p in lp]) if lp else None,
        log_prob_graph=torch.cat([p.log_prob_graph for p in lp]) if lp else None,
        aux_loss=torch.stack([a.reshape(()) for a in aux]).sum() if aux else None,
        stats=stats,
    )
    if ref_attr is not None and any(p.edge_attr is None or p._featured is not None for p in parts):
        out._featured = torch.cat([
            p._featured if p.edge_attr is not None and p._featured is not None
            else torch.full((p.num_edges,), p.edge_attr is not None, dtype=torch.bool, device=dev)
            for p in parts
        ])
    return out.coalesce() if coalesce else out


def _raise_failed(checks: Sequence[tuple[Tensor, str]], oks: Sequence[int]) -> None:
    for (_, message), ok in zip(checks, oks, strict=True):
        if not ok:
            raise ValueError(message)


def check_graph_inputs(
    edge_index: Tensor | None,
    num_nodes: int,
    batch: Tensor | None = None,
    *,
    finite: Mapping[str, Tensor | None] | None = None,
    num_graphs: int | None = None,
) -> None:
    """Checks a graph's inputs with one device-to-host transfer (:meth:`EdgeSet.validate`'s):
    ``edge_index`` (``[2, E]`` long, indices in ``[0, num_nodes)``, no edge joining two graphs of
    ``batch``), ``batch`` (graph ids non-negative and, given ``num_graphs``, below it) and every
    floating-point tensor of ``finite`` (name → tensor) free of NaN/inf. Raises a
    :class:`ValueError` naming the argument. ``edge_index=None``: no edges to check."""
    if batch is not None:
        _need_long("batch", _need_tensor("batch", batch, dims=1))
        if batch.numel() != num_nodes:
            raise ValueError(f"'batch' must have shape [{num_nodes}] (one graph id per node), "
                             f"got {_shape(batch)}")
    checks = [(all_finite(t), f"'{name}' contains NaN or infinite values")
              for name, t in (finite or {}).items()
              if isinstance(t, Tensor) and t.numel() and (t.is_floating_point() or t.is_complex())]
    if edge_index is None:  # on the device of what is checked (the flags are read together)
        device = batch.device if batch is not None else (checks[0][0].device if checks else None)
        edge_index = torch.empty(2, 0, dtype=torch.long, device=device)
    es = EdgeSet(edge_index)
    if num_graphs is not None and batch is not None and batch.numel():
        checks.append((batch.max() < num_graphs,
                       f"'batch' holds a graph id >= num_graphs={num_graphs}"))
    es._validate_indices(num_nodes, batch, checks)


def as_edge_set(edges: EdgeSet | Tensor | Any, *, num_heads: int, mode: str = "attention",
                edge_attr: Tensor | None = None) -> EdgeSet:
    """Accepts an EdgeSet, a plain ``edge_index`` tensor (an explicit attention edge set), or a
    sparse ``adj_t`` matrix (a :class:`torch_sparse.SparseTensor` or a torch sparse tensor; row =
    target, column = source, values → ``weight``, edges sorted by (target, source), duplicate
    entries refused: :meth:`EdgeSet.from_sparse_tensor`, :meth:`EdgeSet.from_torch_sparse`)."""
    if isinstance(edges, EdgeSet):
        if edge_attr is not None:
            if edges.structure != "explicit":
                raise ValueError("'edge_attr' can only be given with explicit edges")
            edges = edges.replace(edge_attr=edge_attr)
        return edges
    if isinstance(edges, Tensor) and edges.layout == torch.strided:
        return EdgeSet(edges, num_heads=num_heads, mode=mode, edge_attr=edge_attr)
    from graphattn.interop import from_sparse_tensor, from_torch_sparse, is_sparse_matrix

    if is_sparse_matrix(edges):
        if edge_attr is not None:
            raise ValueError("'edge_attr' cannot be given with a sparse adjacency matrix (its rows "
                             "could not be matched to the matrix entries): store the features as "
                             "the matrix values, EdgeSet.from_sparse_tensor(adj_t, "
                             "value_as='edge_attr')")
        convert = from_torch_sparse if isinstance(edges, Tensor) else from_sparse_tensor
        return convert(edges, num_heads=num_heads, mode=mode)
    raise ValueError(
        f"'edges' must be an EdgeSet, an edge_index tensor [2, E], a sparse adj_t matrix or an "
        f"EdgeProducer, got {type(edges).__name__}"
    )
