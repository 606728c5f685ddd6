"""Structured edge sets: the same meaning as :class:`~graphattn.EdgeSet`, a faster kernel.

* :class:`SharedSourceEdgeSet` — every target of graph ``b`` attends, in head ``h``, to the same
  source list ``sources[b, h]`` (SAMSA, full attention, virtual nodes) → dense batched SDPA.
* :class:`PermutationEdgeSet` — one in-edge per (target, head) (Sliceformer) → a gather.
* :class:`OperatorEdgeSet` — a linear operator ``matvec(v)`` never enumerated (Converter).

All three derive from :class:`StructuredEdgeSet`, a :class:`~graphattn.BaseEdgeSet` (what the layer
accepts) and a sibling of the explicit :class:`~graphattn.EdgeSet`, that never enumerates its edges
implicitly: ``device``,
``num_edges`` and ``per_head`` come from the structure, the per-edge fields of the explicit form
(``head``, ``bias``, ``weight``, ``origin``, ``edge_attr``) are ``None`` (the per-slot values live in
``slot_bias``, ``slot_weight``, ``slot_origin``), and the explicit-only members (``edge_index``,
``csr``, ``replace``, ``select``, ``coalesce``, ``expand_heads``) raise an
:class:`~graphattn.core.edgeset.ExplicitOnlyError` that points to ``to_explicit()``.

Each implements ``to_explicit()``, the one member that materialises plain edges, in a documented
order; the tests check every fast kernel against the explicit path on those edges. It caches them
(:attr:`StructuredEdgeSet.is_materialised`) and first checks the edge count against the memory
budget (:mod:`graphattn.memory`), raising a :class:`~graphattn.MemoryBudgetError` rather than
allocating more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.core.dispatch import Attended
from graphattn.core.edgeset import BaseEdgeSet, EdgeSet, ExplicitOnlyError
from graphattn.core.index import (
    derived_edge_sets,
    is_known_ptr,
    need_finite,
    need_float,
    need_long,
    need_tensor,
    shape_str,
)
from graphattn.core.origins import origin_code
from graphattn.kernels import gather_rows, permutation_gather, shared_source_attention
from graphattn.memory import EDGE_BYTES, check_edges

if TYPE_CHECKING:  # pragma: no cover
    from graphattn.core.dispatch import AttentionCall

#: the advice of the memory guard when materialising a structured edge set
_LOWER_EXPLICIT = ("use the structured fast path (kernel='auto', without return_attention_weights or "
                   "a trace) or smaller graphs")


def _check_ptr_and_batch(ptr: Tensor, num_nodes: int, batch: Tensor | None, kind: str) -> None:
    """``ValueError`` unless ``ptr`` ends at ``num_nodes`` and the sorted ``batch`` agrees with it:
    structured edge sets address contiguous per-graph node ranges, so this is their
    no-cross-graph-edge guarantee."""
    if int(ptr[-1]) != num_nodes:
        raise ValueError(f"'ptr' must end at num_nodes={num_nodes} (the targets are all real "
                         f"nodes), got {int(ptr[-1])}")
    if batch is not None and batch.numel() == num_nodes and num_nodes:
        expected = torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=batch.device),
                                           ptr[1:] - ptr[:-1], output_size=num_nodes)
        if not torch.equal(expected, batch):
            raise ValueError(f"'batch' must be sorted and agree with 'ptr' for a {kind}")


def _check_source_range(name: str, src: Tensor, num_nodes: int, num_virtual: int,
                        batch: Tensor | None = None) -> None:
    """``ValueError`` naming ``name`` unless every source id lies in ``[0, N + n_virtual)`` (and,
    given ``batch``, unless its graph ids are non-negative), with one host read."""
    stats = [src.min(), src.max()]
    if batch is not None and batch.numel():
        stats.append(batch.min())
    lo, hi, *bmin = torch.stack(stats).tolist()
    if bmin and bmin[0] < 0:
        raise ValueError(f"'batch' must hold non-negative graph ids, got {bmin[0]}")
    if lo < 0 or hi >= num_nodes + num_virtual:
        raise ValueError(
            f"'{name}' must lie in [0, {num_nodes + num_virtual}) ({num_nodes} nodes + "
            f"{num_virtual} virtual sources), got range [{lo}, {hi}]"
        )


class StructuredEdgeSet(BaseEdgeSet):
    r"""Common base of the structured edge sets: a :class:`~graphattn.BaseEdgeSet` that stores a
    structure instead of edges and never enumerates them implicitly; a sibling of the explicit
    :class:`~graphattn.EdgeSet`, not a subclass, so it inherits none of its explicit-only members.

    Subclasses implement, from their structure, :attr:`device`, :attr:`num_edges`,
    :attr:`per_head`, the index checks of :meth:`validate` and :meth:`to_explicit` (which caches its
    result: :attr:`is_materialised`). The per-edge fields of the explicit form (``head``, ``bias``,
    ``weight``, ``origin``, ``edge_attr``) are ``None``; reaching one of the explicit form's members
    listed in :attr:`EXPLICIT_ONLY` raises an :class:`~graphattn.core.edgeset.ExplicitOnlyError`
    that names the way out: call it on ``to_explicit()``.
    """

    #: the members of :class:`~graphattn.EdgeSet` that need enumerated edges: name -> how to call it
    EXPLICIT_ONLY: ClassVar[dict[str, str]] = {
        "edge_index": "edge_index", "csr": "csr(num_nodes)", "replace": "replace(...)",
        "expand_heads": "expand_heads()", "coalesce": "coalesce()", "select": "select(index)",
    }

    def __init__(
        self,
        *,
        num_heads: int,
        mode: str,
        virtual_x: Tensor | None = None,
        virtual_batch: Tensor | None = None,
        log_prob: Tensor | None = None,
        log_prob_graph: Tensor | None = None,
        aux_loss: Tensor | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        self._init_common(num_heads=num_heads, mode=mode, virtual_x=virtual_x,
                          virtual_batch=virtual_batch, log_prob=log_prob,
                          log_prob_graph=log_prob_graph, aux_loss=aux_loss, stats=stats)
        # the per-edge fields of the explicit form: none without enumerated edges
        self.head = None
        self.bias = None
        self.weight = None
        self.origin = None
        self.edge_attr = None
        self._check_common_fields()

    @property
    def is_materialised(self) -> bool:
        """Whether :meth:`to_explicit` has built this edge set's explicit edges (which it keeps
        until ``to()`` / ``detach()``); nothing else builds them."""
        return "explicit" in self._cache

    def __getattr__(self, name: str) -> NoReturn:
        """Only reached for attributes the class does not have: an explicit-only member gets an
        :class:`~graphattn.core.edgeset.ExplicitOnlyError` that points to ``to_explicit()``."""
        call = type(self).EXPLICIT_ONLY.get(name)
        if call is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        member = name if name == "edge_index" else f"{name}()"
        raise ExplicitOnlyError(
            f"{type(self).__name__}.{member} needs enumerated edges, which a structured edge set "
            f"does not hold (enumerating its {self.structure!r} structure costs memory and time "
            f"proportional to num_edges); call .to_explicit().{call} to materialise them on purpose"
        )


class SharedSourceEdgeSet(StructuredEdgeSet):
    r"""Every target of graph :math:`b` attends, in head :math:`h`, to the sources ``sources[b, h]``.

    Args:
        sources (LongTensor): ``[B, Hs, k]`` global source ids (real nodes or virtual sources
            ``>= N``), ``Hs = 1`` (the same for every head) or ``Hs = num_heads``.
        ptr (LongTensor): ``[B + 1]`` the targets of graph ``b`` are nodes ``ptr[b] .. ptr[b+1]-1``.
        source_mask (BoolTensor, optional): ``[B, Hs, k]``, ``False`` for padding slots.
        bias, weight (Tensor, optional): ``[B, Hs, k]`` per-slot logit bias / message weight.
        origin (LongTensor, optional): ``[B, Hs, k]`` producer code per slot.

    The layer's fast path gathers ``[B, H, k]`` keys and values and runs
    :func:`torch.nn.functional.scaled_dot_product_attention` with query-side padding only.
    """

    structure = "shared_sources"

    def __init__(
        self,
        sources: Tensor,
        ptr: Tensor,
        *,
        num_heads: int = 1,
        source_mask: Tensor | None = None,
        mode: str = "attention",
        bias: Tensor | None = None,
        weight: Tensor | None = None,
        origin: Tensor | None = None,
        virtual_x: Tensor | None = None,
        virtual_batch: Tensor | None = None,
        log_prob: Tensor | None = None,
        log_prob_graph: Tensor | None = None,
        aux_loss: Tensor | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        need_long("sources", need_tensor("sources", sources, dims=3))
        need_long("ptr", need_tensor("ptr", ptr, dims=1))
        B, Hs, _ = sources.shape
        if ptr.numel() != B + 1:
            raise ValueError(f"'ptr' must have shape [{B + 1}] for {B} graphs, got {shape_str(ptr)}")
        if B and not is_known_ptr(ptr) and bool(  # one read; none for the context's pointer
                torch.stack([ptr[0] != 0, (ptr[1:] < ptr[:-1]).any()]).any()):
            raise ValueError("'ptr' must start at 0 and be non-decreasing")
        if Hs not in (1, num_heads):
            raise ValueError(
                f"'sources' must have shape [B, 1 or num_heads={num_heads}, k], "
                f"got {shape_str(sources)}"
            )
        for name, t in (("source_mask", source_mask), ("bias", bias), ("weight", weight),
                        ("origin", origin)):
            if t is None:
                continue
            need_tensor(name, t, dims=3)
            if t.shape != sources.shape:
                raise ValueError(
                    f"'{name}' must have the shape of 'sources' {shape_str(sources)}, got {shape_str(t)}"
                )
        if source_mask is not None and source_mask.dtype != torch.bool:
            raise ValueError(f"'source_mask' must have dtype torch.bool, got {source_mask.dtype}")
        if origin is not None:
            need_long("origin", origin)
        for name, t in (("bias", bias), ("weight", weight)):
            if t is not None:
                need_finite(name, need_float(name, t))
        self.sources = sources
        self.ptr = ptr
        self.source_mask = source_mask
        self.slot_bias = bias
        self.slot_weight = weight
        self.slot_origin = origin
        super().__init__(
            num_heads=num_heads,
            mode=mode,
            virtual_x=virtual_x,
            virtual_batch=virtual_batch,
            log_prob=log_prob,
            log_prob_graph=log_prob_graph,
            aux_loss=aux_loss,
            stats=stats,
        )
        if mode == "weighted" and bias is not None:
            raise ValueError("'bias' is only meaningful in mode='attention'")

    @property
    def num_graphs(self) -> int:
        return int(self.sources.size(0))

    @property
    def device(self) -> torch.device:
        return self.sources.device

    @property
    def per_head(self) -> bool:
        return self.sources.size(1) > 1

    @property
    def num_edges(self) -> int:
        counts = self.ptr[1:] - self.ptr[:-1]
        if self.source_mask is None:
            per_graph = torch.full_like(counts, self.sources.size(1) * self.sources.size(2))
        else:
            per_graph = self.source_mask.sum((1, 2))
        return int((counts * per_graph).sum())

    def attend(self, call: AttentionCall) -> Attended:
        """Dense batched SDPA over the gathered sources of every (graph, head)."""
        q = call.query()
        slots = self._slot_projections(call)
        k, v = call.sources(self) if slots is None else slots
        out = shared_source_attention(
            q, k, v, self.sources, self.ptr, call.ctx.batch, source_mask=self.source_mask,
            bias=self.slot_bias, weight=self.slot_weight, mode=self.mode, dropout=call.dropout,
            scale=call.scale, gathered=slots is not None,
        )
        return Attended(out, None, "shared_sources" if slots is None else "shared_slots")

    def _slot_projections(self, call: AttentionCall) -> tuple[Tensor | None, Tensor] | None:
        r"""Keys and values of the slots, ``[B, H, k, C]``, projected after gathering the slots'
        input rows: :math:`k_{b,h,j} = W_K^{(h)} x_{s(b,h,j)} + b_K^{(h)}`. This costs
        :math:`B k H C F` multiply-adds instead of :math:`(N + n_v) H C F` for projecting every
        source, so it is used when :math:`B k < N + n_v` (SAMSA: k of N nodes per graph and head)
        and the projections of all sources were not computed already. ``None``: project all."""
        if call.lazy() or call.projections_computed():
            return None
        B, _, k = self.sources.shape
        if B * k >= call.num_nodes + self.num_virtual:
            return None
        x = call.ctx.x
        table = x if self.virtual_x is None else torch.cat([x, self.virtual_x.to(x.dtype)])
        mask = self.source_mask
        idx = self.sources if mask is None else torch.where(mask, self.sources,
                                                            torch.zeros_like(self.sources))
        rows = gather_rows(table, idx)  # [B, Hs, k, F]
        kd = None
        if call.attend_keys:
            assert call.lin_key is not None
            kd = call.project_rows(call.lin_key, rows)
        return kd, call.project_rows(call.lin_value, rows)

    def _validate_indices(self, num_nodes: int, batch: Tensor | None) -> None:
        """The explicit checks on ``sources [B, Hs, k]`` directly, in O(B·Hs·k), without
        materialising the N·Hs·k edges, all read in one host transfer: ``ptr`` ends at
        ``num_nodes`` and agrees with the sorted ``batch`` (the no-cross-graph guarantee of the
        targets), the sources lie in ``[0, N + n_virtual)``, and no source belongs to another graph.
        Slots of graphs without nodes make no edge and are skipped, as are masked slots."""
        B, ptr, dev = self.num_graphs, self.ptr, self.sources.device
        nv = self.num_virtual
        stats = [ptr[-1]]
        check_batch = batch is not None and batch.numel() == num_nodes and num_nodes > 0
        if check_batch:
            assert batch is not None
            # the graph of node i under ptr, without a data-dependent size
            expected = torch.searchsorted(ptr[1:], torch.arange(num_nodes, device=dev), right=True)
            stats.append((expected != batch).any())
        check_sources = B > 0 and self.sources.size(2) > 0
        if check_sources:
            src = self.sources
            live = ((ptr[1:] - ptr[:-1]) > 0).view(B, 1, 1).expand_as(src)
            if self.source_mask is not None:
                live = live & self.source_mask
            graph = torch.arange(B, device=dev).view(B, 1, 1).expand_as(src)
            real = src < num_nodes
            bad = live & real & ((src < ptr[graph]) | (src >= ptr[graph + 1]))
            if nv and self.virtual_batch is not None:
                vb = self.virtual_batch[(src - num_nodes).clamp(min=0, max=nv - 1)]
                bad |= live & ~real & (vb >= 0) & (vb != graph)
            big = torch.iinfo(src.dtype).max
            stats += [torch.where(live, src, big).min(), torch.where(live, src, -1).max(),
                      bad.any() if batch is not None else torch.zeros((), dtype=torch.bool,
                                                                      device=dev)]
        end, *rest = torch.stack([s.long() for s in stats]).tolist()
        if end != num_nodes:
            raise ValueError(f"'ptr' must end at num_nodes={num_nodes} (the targets are all real "
                             f"nodes), got {end}")
        if check_batch and rest.pop(0):
            raise ValueError(f"'batch' must be sorted and agree with 'ptr' for a {type(self).__name__}")
        if not check_sources:
            return
        lo, hi, joins = rest
        if hi < 0:  # no live slot
            return
        if lo < 0 or hi >= num_nodes + nv:
            raise ValueError(f"'sources' must lie in [0, {num_nodes + nv}) ({num_nodes} nodes + "
                             f"{nv} virtual sources), got range [{lo}, {hi}]")
        if joins:
            e = int(bad.reshape(-1).nonzero()[0])
            raise ValueError(
                f"'sources' joins two graphs: the targets of graph {int(graph.reshape(-1)[e])} read "
                f"source {int(src.reshape(-1)[e])}"
            )

    @derived_edge_sets
    def to_explicit(self) -> EdgeSet:
        cached = self._cache.get("explicit")
        if cached is not None:
            return cached
        B, Hs, k = self.sources.shape
        dev = self.sources.device
        counts = self.ptr[1:] - self.ptr[:-1]
        N = int(self.ptr[-1])
        check_edges(N * Hs * k, what=f"to_explicit() of a shared-sources edge set ({N:,} targets × "
                    f"{Hs * k:,} sources)", how_to_lower=_LOWER_EXPLICIT, device=dev)
        graph_of = torch.repeat_interleave(torch.arange(B, device=dev), counts, output_size=N)
        # edges in order: target-major, then head, then slot
        src = self.sources[graph_of].reshape(-1)  # [N * Hs * k]
        dst = torch.arange(N, device=dev).repeat_interleave(Hs * k)
        head = torch.arange(Hs, device=dev).repeat_interleave(k).repeat(N) if Hs > 1 else None

        def per_slot(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[graph_of].reshape(-1)

        keep = per_slot(self.source_mask)
        es = EdgeSet(
            torch.stack([src, dst]),
            head=head,
            num_heads=self.num_heads,
            mode=self.mode,
            bias=per_slot(self.slot_bias),
            weight=per_slot(self.slot_weight),
            origin=per_slot(self.slot_origin),
            virtual_x=self.virtual_x,
            virtual_batch=self.virtual_batch,
            log_prob=self.log_prob,
            log_prob_graph=self.log_prob_graph,
            aux_loss=self.aux_loss,
            stats=self.stats,
        )
        if keep is not None:
            es = es.select(keep)
        self._cache["explicit"] = es
        return es

    def __repr__(self) -> str:
        B, Hs, k = self.sources.shape
        return (
            f"{type(self).__name__}(num_graphs={B}, sources_per_head={k}, head_shared={Hs == 1}, "
            f"num_heads={self.num_heads}, mode={self.mode!r}, num_virtual={self.num_virtual})"
        )


class PermutationEdgeSet(StructuredEdgeSet):
    r"""Exactly one in-edge per (target, head): target :math:`t` reads source ``src[t, h]`` in head
    :math:`h`.

    Args:
        src (LongTensor): ``[N, Hs]`` with ``Hs = 1`` (shared) or ``num_heads``.
        weight (Tensor, optional): ``[N, Hs]`` message weight.
        origin (LongTensor, optional): ``[N, Hs]`` producer code.

    In ``"attention"`` mode the softmax over a single edge is 1, so ``out[t, h] = w · v[src[t,h], h]``
    (a gather); in ``"weighted"`` mode the same.
    """

    structure = "permutation"

    def __init__(
        self,
        src: Tensor,
        *,
        num_heads: int = 1,
        mode: str = "weighted",
        weight: Tensor | None = None,
        origin: Tensor | None = None,
        virtual_x: Tensor | None = None,
        virtual_batch: Tensor | None = None,
        aux_loss: Tensor | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        need_long("src", need_tensor("src", src, dims=2))
        if src.size(1) not in (1, num_heads):
            raise ValueError(
                f"'src' must have shape [N, 1 or num_heads={num_heads}], got {shape_str(src)}"
            )
        for name, t in (("weight", weight), ("origin", origin)):
            if t is not None:
                need_tensor(name, t, dims=2)
                if t.shape != src.shape:
                    raise ValueError(
                        f"'{name}' must have the shape of 'src' {shape_str(src)}, got {shape_str(t)}"
                    )
        if weight is not None:
            need_finite("weight", need_float("weight", weight, complex_ok=True))
        if origin is not None:
            need_long("origin", origin)
        self.src = src
        self.slot_weight = weight
        self.slot_origin = origin
        super().__init__(
            num_heads=num_heads,
            mode=mode,
            virtual_x=virtual_x,
            virtual_batch=virtual_batch,
            aux_loss=aux_loss,
            stats=stats,
        )

    @property
    def device(self) -> torch.device:
        return self.src.device

    @property
    def per_head(self) -> bool:
        return self.src.size(1) > 1

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())

    def attend(self, call: AttentionCall) -> Attended:
        """A gather of the values (dropout drops whole messages, rescaled by :math:`1/(1-p)`)."""
        v = call.sources(self, keys=False)[1]
        alpha = None
        if call.dropout > 0:
            alpha = F.dropout(v.new_ones(call.num_nodes, call.heads), p=call.dropout, training=True)
        return Attended(permutation_gather(v, self.src, weight=self.slot_weight, alpha=alpha), None,
                        self.structure)

    def validate(self, num_nodes: int, batch: Tensor | None = None) -> PermutationEdgeSet:
        if self.src.size(0) != num_nodes:
            raise ValueError(
                f"'src' must have one row per target node ({num_nodes}), got {shape_str(self.src)}"
            )
        return super().validate(num_nodes, batch)

    def _validate_indices(self, num_nodes: int, batch: Tensor | None) -> None:
        """The explicit checks on ``src [N, Hs]`` directly, without materialising the edges."""
        src = self.src
        if src.numel() == 0:
            return
        nv = self.num_virtual
        _check_source_range("src", src, num_nodes, nv, batch)
        if batch is None:
            return
        dst_graph = batch[:, None]
        if nv == 0:  # take() is several times faster than batch[src] for a 2-D index
            bad = batch.take(src) != dst_graph
        else:
            real = src < num_nodes
            bad = real & (batch.take(src.clamp(max=num_nodes - 1)) != dst_graph)
            if self.virtual_batch is not None:
                vb = self.virtual_batch.take((src - num_nodes).clamp(min=0))
                bad |= (~real) & (vb >= 0) & (vb != dst_graph)
        if bool(bad.any()):
            t, h = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"'src' joins two graphs: target {t} (graph {int(batch[t])}) reads source "
                f"{int(src[t, h])} in head column {h}"
            )

    @derived_edge_sets
    def to_explicit(self) -> EdgeSet:
        cached = self._cache.get("explicit")
        if cached is not None:
            return cached
        N, Hs = self.src.shape
        dev = self.src.device
        check_edges(N * Hs, what=f"to_explicit() of a permutation edge set ({N:,} targets × {Hs} "
                    f"heads)", how_to_lower=_LOWER_EXPLICIT, device=dev)
        dst = torch.arange(N, device=dev).repeat_interleave(Hs)
        es = EdgeSet(
            torch.stack([self.src.reshape(-1), dst]),
            head=torch.arange(Hs, device=dev).repeat(N) if Hs > 1 else None,
            num_heads=self.num_heads,
            mode=self.mode,
            weight=None if self.slot_weight is None else self.slot_weight.reshape(-1),
            origin=None if self.slot_origin is None else self.slot_origin.reshape(-1),
            virtual_x=self.virtual_x,
            virtual_batch=self.virtual_batch,
            aux_loss=self.aux_loss,
            stats=self.stats,
        )
        self._cache["explicit"] = es
        return es

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_nodes={self.src.size(0)}, "
            f"head_shared={self.src.size(1) == 1}, num_heads={self.num_heads}, mode={self.mode!r})"
        )


class OperatorEdgeSet(StructuredEdgeSet):
    r"""A block-diagonal linear operator :math:`o = S v` applied without enumerating its edges.

    Subclasses implement :meth:`matvec` (``v [N, H, C] -> [N, H, C]``, real or complex) and may
    implement :meth:`rmatvec` (:math:`S^H v`). ``ptr`` ``[B + 1]`` delimits the graphs; the operator
    must not mix graphs. ``to_explicit()`` materialises the dense complete digraph per graph by
    applying :meth:`matvec` to a per-graph identity (small graphs only). Always ``"weighted"`` mode.
    """

    structure = "operator"

    def __init__(
        self,
        ptr: Tensor,
        *,
        num_heads: int = 1,
        aux_loss: Tensor | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        need_long("ptr", need_tensor("ptr", ptr, dims=1))
        self.ptr = ptr
        super().__init__(
            num_heads=num_heads,
            mode="weighted",
            aux_loss=aux_loss,
            stats=stats,
        )

    def matvec(self, v: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def rmatvec(self, v: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} does not implement rmatvec")

    @property
    def device(self) -> torch.device:
        return self.ptr.device

    @property
    def per_head(self) -> bool:
        """``False``: one operator for every head (the explicit form has ``[E, H]`` weights)."""
        return False

    @property
    def num_edges(self) -> int:
        counts = self.ptr[1:] - self.ptr[:-1]
        return int((counts * counts).sum())

    def attend(self, call: AttentionCall) -> Attended:
        """:meth:`matvec` on the values."""
        return Attended(self.matvec(call.value()), None, self.structure)

    def validate(self, num_nodes: int, batch: Tensor | None = None) -> OperatorEdgeSet:
        """The shared checks of :meth:`EdgeSet.validate` (``num_nodes``, ``batch``), then the
        operator's own: it acts within the contiguous node ranges of ``ptr``, so ``ptr`` must end
        at ``num_nodes`` and agree with ``batch`` (no cross-graph mixing)."""
        _check_ptr_and_batch(self.ptr, num_nodes, batch, type(self).__name__)
        return super().validate(num_nodes, batch)

    def _validate_indices(self, num_nodes: int, batch: Tensor | None) -> None:
        """No enumerated indices: the ``ptr`` / ``batch`` check in :meth:`validate` covers them."""

    def _explicit_rows(self, max_nodes_per_graph: int) -> Tensor:
        """``[N, H, n_max]``: :meth:`matvec` of a per-graph identity, so that row ``ptr_b + i``,
        head ``h`` holds :math:`S_b[i, :]` in head ``h`` (columns past the graph's size are 0),
        after the size and memory checks. :meth:`to_explicit` reads its edge weights here; an
        operator shared by every head may return ``[N, 1, n_max]`` (one pass instead of ``H``)."""
        counts = self.ptr[1:] - self.ptr[:-1]
        N = int(self.ptr[-1])
        dev = self.ptr.device
        n_max = int(counts.max()) if counts.numel() else 0
        if n_max > max_nodes_per_graph:
            raise ValueError(
                f"to_explicit() of an operator materialises n^2 edges per graph; the largest graph "
                f"has {n_max} > max_nodes_per_graph={max_nodes_per_graph} nodes"
            )
        H = self.num_heads
        # the per-graph identity and its image ([N, H, n_max] each, complex at most) and the edges
        check_edges(N * n_max, bytes_per_edge=EDGE_BYTES + 20 * H,
                    what=f"to_explicit() of an operator edge set ({N:,} targets, graphs of up to "
                    f"{n_max:,} nodes)", how_to_lower=_LOWER_EXPLICIT, device=dev)
        graph_of = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts)
        local = torch.arange(N, device=dev) - self.ptr[graph_of]
        eye = torch.zeros(N, H, n_max, device=dev)
        eye[torch.arange(N, device=dev), :, local] = 1.0
        return self.matvec(eye)  # dense[ptr_b + i, h, j] = S_b[i, j] in head h

    @derived_edge_sets
    def to_explicit(self, max_nodes_per_graph: int = 4096) -> EdgeSet:
        """The complete digraph of every graph (self-loops included), target-major, with weights
        :math:`w_{j \\to i} = S_{ij}` per head (:meth:`_explicit_rows`), built once and cached."""
        cached = self._cache.get("explicit")
        if cached is not None:
            return cached
        dense = self._explicit_rows(max_nodes_per_graph)  # [N, H or 1, n_max]
        counts = self.ptr[1:] - self.ptr[:-1]
        N = int(self.ptr[-1])
        dev = self.ptr.device
        H = self.num_heads
        graph_of = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts)
        # edges j -> i for every pair of one graph
        dst = torch.repeat_interleave(torch.arange(N, device=dev), counts[graph_of])
        start = self.ptr[graph_of].repeat_interleave(counts[graph_of])
        within = torch.arange(dst.numel(), device=dev) - torch.repeat_interleave(
            torch.cumsum(counts[graph_of], 0) - counts[graph_of], counts[graph_of]
        )
        src = start + within
        w = dense[dst, :, within]  # [E, H], or [E, 1] for one operator shared by every head
        if w.size(1) != H:
            w = w.expand(dst.numel(), H)
        es = EdgeSet(
            torch.stack([src, dst]),
            num_heads=H,
            mode="weighted",
            weight=w,
            origin=torch.full((dst.numel(),), origin_code("operator"), device=dev),
            aux_loss=self.aux_loss,
            stats=self.stats,
        )
        self._cache["explicit"] = es
        return es

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_nodes={int(self.ptr[-1])}, num_heads={self.num_heads})"


