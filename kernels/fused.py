r"""Fused sparse attention: cached graph preparation, the autograd Function, backend dispatch.

For every target row :math:`i` (a target node, or ``target * H + head`` for per-head edge sets) and
in-edge :math:`e = (j \to i)`:

.. math::
    s_e = \text{scale}\; q_i \cdot k_j + b_e, \qquad
    p_e = \exp(s_e - \mathrm{lse}_i), \quad \mathrm{lse}_i = \log \sum_{e' \to i} \exp(s_{e'}), \qquad
    o_i = \sum_{e \to i} p_e\, w_e\, v_j

(``softmax=False``, the ``"weighted"`` mode: :math:`o_i = \sum_e w_e v_j`). Rows without edges give
:math:`o_i = 0`. Nothing of size :math:`E \times H \times D` is ever materialised: the forward
writes ``o`` and the log-sum-exp ``lse`` (per row and head), the backward is a destination pass over
the CSR (:math:`dq`, :math:`db`, :math:`dw`) and a source pass over the CSC (:math:`dk`, :math:`dv`)
that recomputes :math:`p` instead of reading an ``[E, H]`` handoff; neither uses atomics, so results
are bit-identical across runs.

Backends: the C++/OpenMP extension (:mod:`.cpu_extension`) for CPU tensors, Triton
(:mod:`.triton_attention`) for CUDA tensors. Both expose the same operators (``forward``,
``backward_dst``, ``backward_src``, ``probs``). On CPUs with AVX2/FMA, float32 softmax attention
with a multiple of 4 heads of 8, 16, 32 or 64 channels runs the cache-blocked kernel
(``blocked_*`` operators, :data:`BLOCKED`): the forward and the destination pass visit the edges
block of sources by block of sources (keeping an online softmax, or dq, per row between blocks),
the source pass block of targets by block of targets, so that the rows gathered at random come from
the last-level cache; its layouts (:meth:`FusedGraph.blocked_layout`) replace the CSC.

Graph preparation (:func:`prepare_graph`) is cached on the :class:`~graphattn.EdgeSet`: a stable
counting sort by row gives ``rowptr``, ``col`` (source, or ``source * H + head``) and ``eid`` (the
edge's position in the edge set, used to read ``bias`` / ``weight`` and to write their gradients in
the caller's order), all int32; the CSC (``colptr``, per entry the target row and ``eid``) is built
on the first backward. Work is split into contiguous row ranges of equal edges + rows per thread.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from graphattn.core.index import cacheable, ptr_from_counts, sort_rows, tensor_version

from .cpu_extension import cpu_extension_error, cpu_ops

BACKENDS = ("cpu", "triton")
_triton_state: dict[str, str | None] = {"error": None}  # the failed import, cached
_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------- graph layout
@dataclass
class FusedGraph:
    """Destination-sorted CSR (and lazily its CSC) of an edge set, int32 indices.

    Attributes:
        rowptr: ``[R + 1]`` row pointer over target rows.
        col: ``[E]`` source row of each edge (CSR order).
        eid: ``[E]`` position of each edge in the edge set.
        num_rows: ``R`` (targets, times ``H`` for per-head edge sets).
        num_sources: source rows (sources, times ``H`` for per-head edge sets).
        per_head: whether rows are ``target * H + head`` (the kernel then sees one head).
    """

    rowptr: Tensor
    col: Tensor
    eid: Tensor
    num_rows: int
    num_sources: int
    per_head: bool
    _csc: tuple[Tensor, Tensor, Tensor] | None = field(default=None, repr=False)
    _blocked: dict[tuple[bool, int, bool], tuple[Tensor, ...]] = field(
        default_factory=dict, repr=False
    )

    @property
    def num_edges(self) -> int:
        return int(self.col.numel())

    def csc(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(colptr [S + 1], row [E], eid [E])`` sorted by source, then row (built once)."""
        if self._csc is None:
            ops = cpu_ops(warn=False) if self.col.device.type == "cpu" else None
            if ops is not None:  # the transposed layout with one block of all target rows
                colptr, row, eid = ops.build_layout(self.rowptr, self.col, self.eid,
                                                    self.num_sources, max(self.num_rows, 1), False,
                                                    True)
                self._csc = (colptr[0], row, eid)
            else:
                self._csc = _build_csc_torch(self.rowptr, self.col, self.eid, self.num_sources)
        return self._csc

    def blocked_layout(
        self, block_rows: int, *, by_target: bool, edge_ids: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """A layout of the cache-blocked CPU kernel, built once from the CSR.

        ``by_target=True`` (forward, destination pass): ``(bptr [B, R + 1], col [E], eid)``, edges
        sorted by (block of ``block_rows`` sources, target row). ``by_target=False`` (source
        pass): ``(bptr [B, S + 1], row [E], eid)``, sorted by (block of ``block_rows`` target
        rows, source, row). ``eid`` (the edges' positions in the edge set) is empty unless
        ``edge_ids``: only bias and weight need it. A layout with edge ids serves calls without.
        """
        for ids in (True,) if edge_ids else (True, False):
            hit = self._blocked.get((by_target, block_rows, ids))
            if hit is not None:
                return hit
        ops = cpu_ops(warn=False)
        if ops is None:
            raise RuntimeError("the cache-blocked layout needs the CPU extension")
        layout = tuple(ops.build_layout(self.rowptr, self.col, self.eid, self.num_sources,
                                        block_rows, by_target, edge_ids))
        self._blocked[(by_target, block_rows, edge_ids)] = layout
        return layout  # type: ignore[return-value]


def _ptr(counts: Tensor) -> Tensor:
    return ptr_from_counts(counts).to(torch.int32)


def _build_csr_torch(
    src: Tensor, dst: Tensor, head: Tensor | None, H: int, N: int, S: int
) -> tuple[Tensor, Tensor, Tensor]:
    Hm = H if head is not None else 1
    if src.numel():
        if int(dst.min()) < 0 or int(dst.max()) >= N:
            raise ValueError(f"edge targets must lie in [0, {N})")
        if int(src.min()) < 0 or int(src.max()) >= S:
            raise ValueError(f"edge sources must lie in [0, {S})")
        if head is not None and (int(head.min()) < 0 or int(head.max()) >= H):
            raise ValueError(f"edge heads must lie in [0, {H})")
    rows = dst * Hm + head if head is not None else dst
    cols = src * Hm + head if head is not None else src
    perm, rowptr = sort_rows(rows, N * Hm)
    return rowptr.to(torch.int32), cols[perm].to(torch.int32), perm.to(torch.int32)


def _build_csc_torch(rowptr: Tensor, col: Tensor, eid: Tensor, S: int) -> tuple[Tensor, Tensor, Tensor]:
    R = rowptr.numel() - 1
    rows = torch.repeat_interleave(
        torch.arange(R, device=col.device, dtype=torch.int32), (rowptr[1:] - rowptr[:-1]).long()
    )
    perm = torch.argsort(col, stable=True)
    colptr = _ptr(torch.bincount(col.long(), minlength=S))
    return colptr, rows[perm].contiguous(), eid[perm].contiguous()


def build_graph(
    edge_index: Tensor,
    num_targets: int,
    num_sources: int,
    *,
    head: Tensor | None = None,
    num_heads: int = 1,
) -> FusedGraph:
    """Builds the CSR layout of explicit edges (``edge_index [2, E]``: row 0 source, row 1 target).

    With ``head`` (per-head edges) rows are ``target * num_heads + head`` and columns
    ``source * num_heads + head``. Raises :class:`ValueError` on out-of-range indices or graphs
    beyond int32.
    """
    src, dst = edge_index[0].contiguous(), edge_index[1].contiguous()
    Hm = num_heads if head is not None else 1
    E = src.numel()
    if max(E, num_targets * Hm + 1, num_sources * Hm + 1) > _INT32_MAX:
        raise ValueError("the graph is too large for the fused kernel's int32 indices")
    head = None if head is None else head.contiguous()
    ops = cpu_ops(warn=False) if src.device.type == "cpu" else None
    if ops is not None:
        try:
            rowptr, col, eid = ops.build_csr(src, dst, head, num_heads, num_targets, num_sources)
        except RuntimeError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
    else:
        rowptr, col, eid = _build_csr_torch(src, dst, head, num_heads, num_targets, num_sources)
    return FusedGraph(rowptr, col, eid, num_targets * Hm, num_sources * Hm, head is not None)


# Layouts of recently seen edge_index tensors, so that a new EdgeSet around the same (unmodified)
# tensor (``layer(x, edge_index)`` every step, an input-graph producer) reuses its layout. Entries
# hold a weak reference and the tensor's version counter; they go when the tensor is freed.
_TENSOR_CACHE: OrderedDict[tuple, tuple[Any, Any, FusedGraph]] = OrderedDict()
_TENSOR_CACHE_SIZE = 8


def _identity(t: Tensor | None) -> tuple | None:
    if t is None:
        return None
    return (id(t), tensor_version(t), t.data_ptr(), tuple(t.shape), str(t.device))


def _cached_by_tensor(es: Any, num_targets: int, num_sources: int) -> FusedGraph:
    ei, head = es.edge_index, es.head
    if not cacheable(ei, head):  # inference tensors: no version counter, no cross-call cache
        return build_graph(ei, num_targets, num_sources, head=head, num_heads=es.num_heads)
    key = (_identity(ei), _identity(head), num_targets, num_sources, es.num_heads)
    hit = _TENSOR_CACHE.get(key)
    if hit is not None and hit[0]() is ei and (head is None or hit[1]() is head):
        _TENSOR_CACHE.move_to_end(key)
        return hit[2]
    graph = build_graph(ei, num_targets, num_sources, head=head, num_heads=es.num_heads)
    try:
        refs = (weakref.ref(ei), None if head is None else weakref.ref(head))
    except TypeError:  # not weak-referenceable: no cross-EdgeSet caching
        return graph
    _TENSOR_CACHE[key] = (refs[0], refs[1] or (lambda: None), graph)
    weakref.finalize(ei, _TENSOR_CACHE.pop, key, None)
    while len(_TENSOR_CACHE) > _TENSOR_CACHE_SIZE:
        _TENSOR_CACHE.popitem(last=False)
    return graph


def prepare_graph(es: Any, num_targets: int, num_sources: int) -> FusedGraph:
    """The :class:`FusedGraph` of an explicit :class:`~graphattn.EdgeSet`, cached on it (and, for
    a few recent ``edge_index`` tensors, across edge sets built around the same unmodified tensor)."""
    key = ("fused_graph", num_targets, num_sources, str(es.device))
    return es.cached(key, lambda: _cached_by_tensor(es, num_targets, num_sources))


# -------------------------------------------------------------------------------- backends
def _triton_ops() -> Any:
    from . import triton_attention

    return triton_attention


def backend_ops(backend: str, *, warn: bool = True) -> Any:
    """The operator set of ``backend`` (``"cpu"`` or ``"triton"``), or ``None`` if unavailable
    (with one warning unless ``warn=False``)."""
    if backend == "cpu":
        return cpu_ops(warn=warn)
    if backend == "triton":
        if _triton_state.get("error") is not None:
            return None
        try:
            return _triton_ops()
        except ImportError as exc:
            _triton_state["error"] = str(exc)
            if warn:
                warnings.warn(
                    f"graphattn: the Triton kernel is unavailable ({exc}); EdgeAttention uses the "
                    "torch reference path on CUDA (pip install 'graphattn[triton]')",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return None
    raise ValueError(f"'backend' must be one of {BACKENDS}, got {backend!r}")


def unavailable_reason(backend: str) -> str:
    """Why :func:`backend_ops` returned ``None`` for ``backend``."""
    if backend == "cpu":
        return cpu_extension_error() or "the CPU extension was not built"
    return _triton_state.get("error") or "triton could not be imported"


def default_backend(device: torch.device) -> str | None:
    """``"cpu"`` for CPU tensors, ``"triton"`` for CUDA tensors (``None``: no fused kernel)."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return "triton"
    return None


def fused_dtypes(backend: str) -> tuple[torch.dtype, ...]:
    if backend == "cpu":
        return (torch.float32, torch.float64)
    return (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ------------------------------------------------------------------- cache-blocked CPU path
#: Settings of the cache-blocked CPU kernel (``kernels/csrc/edge_attention_blocked.cpp``), used for
#: float32 softmax attention with a multiple of 4 heads of 8, 16, 32 or 64 channels: ``enabled``
#: (``GRAPHATTN_FUSED_BLOCKED=0`` turns it off) and ``block_bytes``, the bytes of gathered rows per
#: block (``GRAPHATTN_FUSED_BLOCK_BYTES``, default 8 MiB: a block stays in a server CPU's last-level
#: cache while every edge into it is processed). A graph whose gathered rows fit in one block runs
#: unblocked (still on the head-vectorised kernel).
BLOCKED = {
    "enabled": os.environ.get("GRAPHATTN_FUSED_BLOCKED", "1") != "0",
    "block_bytes": int(os.environ.get("GRAPHATTN_FUSED_BLOCK_BYTES", 8 << 20)),
}


def blocked_rows(ops: Any, q: Tensor | None, v: Tensor, softmax: bool) -> tuple[int, int] | None:
    """Rows per block ``(sources, targets)`` when the cache-blocked CPU kernel applies, else
    ``None``. They depend on the shapes and :data:`BLOCKED` only, never on the thread count, so
    results do not either."""
    if not (BLOCKED["enabled"] and softmax and q is not None and v.device.type == "cpu"):
        return None
    H, D = v.size(1), v.size(2)
    if v.dtype != torch.float32 or H % 4 or D not in (8, 16, 32, 64):
        return None
    if not hasattr(ops, "blocked_supported") or not ops.blocked_supported():
        return None
    budget = max(1, int(BLOCKED["block_bytes"]))
    src_rows = max(1, budget // (2 * H * D * 4))  # k and v rows
    dst_rows = max(1, budget // ((2 * H * D + 2 * H) * 4))  # q, dO and (lse, Dterm) rows
    return src_rows, dst_rows


# ---------------------------------------------------------------------------- autograd
def _features(ops: Any, ef: Tensor | None) -> tuple[Tensor | None, ...]:
    """The trailing edge-feature argument of the operators, ``None`` included: the C++
    (``torch.ops.graphattn_fused``) and the Triton operators (:mod:`.triton_attention`) both take
    it (``backward_dst`` also ``need_def``, and returns ``def`` as a 5th output)."""
    return (ef,)


class FusedEdgeAttentionFunction(torch.autograd.Function):
    """``(out, lse) = fused attention(q, k, v, bias, weight, f)`` on a :class:`FusedGraph`.

    ``f [E, H, D]`` (optional) are per-edge features added to keys and values. ``lse`` (log-sum-exp
    per row and head, ``-inf`` for empty rows) is not differentiable.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: Tensor | None,
        k: Tensor | None,
        v: Tensor,
        bias: Tensor | None,
        weight: Tensor | None,
        graph: FusedGraph,
        scale: float,
        softmax: bool,
        ops: Any,
        ef: Tensor | None = None,
    ) -> Tensor:
        qq = q if softmax else v
        kk = k if softmax else v
        blocks = blocked_rows(ops, q, v, softmax) if ef is None else None
        if blocks is not None:
            ids = bias is not None or weight is not None
            layout = graph.blocked_layout(blocks[0], by_target=True, edge_ids=ids)
            out, lse = ops.blocked_forward(qq, kk, v, *layout, bias, weight, scale)
        else:
            out, lse = ops.forward(qq, kk, v, graph.rowptr, graph.col, graph.eid, bias, weight,
                                   scale, softmax, *_features(ops, ef))
        ctx.save_for_backward(qq, kk, v, bias, weight, out, lse, ef)
        ctx.graph, ctx.scale, ctx.softmax, ctx.ops = graph, scale, softmax, ops
        ctx.blocks = blocks
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: Tensor, _dlse: Tensor | None) -> tuple[Tensor | None, ...]:
        q, k, v, bias, weight, out, lse, ef = ctx.saved_tensors
        graph, ops, softmax, scale = ctx.graph, ctx.ops, ctx.softmax, ctx.scale
        need_q, need_k, need_v, need_b, need_w = ctx.needs_input_grad[:5]
        need_f = ef is not None and ctx.needs_input_grad[9]
        dout = dout.contiguous()
        dq = dbias = dweight = dk = dv = def_ = None
        dterm = None
        blocks, ids = ctx.blocks, bias is not None or weight is not None
        if (softmax and need_q) or need_b or need_w or need_f:
            if blocks is not None:  # over the forward's layout (blocks of sources)
                layout = graph.blocked_layout(blocks[0], by_target=True, edge_ids=ids)
                dq, dbias, dweight, dterm = ops.blocked_backward_dst(
                    q, k, v, out, dout, lse, *layout, bias, weight, scale, bool(need_q),
                    bool(need_b), bool(need_w),
                )
            else:
                dq, dbias, dweight, dterm, *rest = ops.backward_dst(
                    q, k, v, out, dout, lse, graph.rowptr, graph.col, graph.eid, bias, weight,
                    scale, softmax, bool(need_q), bool(need_b), bool(need_w),
                    ef, bool(need_f),
                )
                def_ = rest[0] if rest else None
        if (softmax and need_k) or need_v:
            if dterm is None:  # no destination pass ran: Dterm_i = dO_i . o_i directly
                # in lse's (accumulation) dtype, as the destination pass: fp32 for fp16 / bf16
                # storage on Triton (a no-op cast on the CPU, whose lse has the inputs' dtype)
                dterm = ((dout.to(lse.dtype) * out.to(lse.dtype)).sum(-1) if softmax else lse)
            if blocks is not None:  # blocks of target rows
                layout = graph.blocked_layout(blocks[1], by_target=False, edge_ids=ids)
                dk, dv = ops.blocked_backward_src(
                    q, k, v, dout, lse, dterm, *layout, bias, weight, scale, bool(need_k),
                    bool(need_v),
                )
            else:
                dk, dv = ops.backward_src(
                    q, k, v, dout, lse, dterm, *graph.csc(), bias, weight, scale, softmax,
                    bool(need_k), bool(need_v), *_features(ops, ef),
                )
        return (dq if softmax else None, dk if softmax else None, dv, dbias, dweight,
                None, None, None, None, def_)


def _ops_and_scale(x: Tensor, backend: str | None, scale: float | None) -> tuple[Any, float]:
    """The operator set of ``backend`` (default: by ``x``'s device; raises if there is none) and the
    logit scale (default ``D ** -0.5``, ``D`` the last dimension of ``x``)."""
    backend = backend or default_backend(x.device)
    ops = backend_ops(backend) if backend is not None else None
    if ops is None:
        raise RuntimeError(f"no fused kernel is available for {x.device} tensors")
    return ops, x.size(-1) ** -0.5 if scale is None else float(scale)


def fused_attention(
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor,
    graph: FusedGraph,
    *,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    scale: float | None = None,
    softmax: bool = True,
    backend: str | None = None,
    return_lse: bool = False,
    edge_features: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Fused attention of the rows of ``graph`` (differentiable in ``q, k, v, bias, weight`` and
    ``edge_features``).

    Args:
        q: ``[R, H, D]`` queries of the target rows (``None`` if ``softmax=False``).
        k, v: ``[S, H, D]`` keys and values of the source rows.
        graph: from :func:`build_graph` / :func:`prepare_graph` (per-head graphs: ``H = 1`` rows).
        bias, weight: ``[E]`` (shared by the heads) or ``[E, H]`` in edge-set order.
        scale: logit scale (default ``D ** -0.5``).
        softmax: ``False`` for the weighted mode (:math:`o_i = \\sum_e w_e v_j`).
        backend: ``"cpu"`` / ``"triton"`` (default: by device).
        edge_features: ``[E, H, D]`` in edge-set order, added to the keys and values of each edge
            (:math:`k_j + f_e`, :math:`v_j + f_e`; TransformerConv's projected edge features),
            never gathered into an :math:`E \times H \times D` message tensor (both backends).

    Returns ``out [R, H, D]`` (and ``lse [R, H]`` with ``return_lse``).
    """
    ops, scale = _ops_and_scale(v, backend, scale)
    v = v.contiguous()
    q = None if q is None else q.contiguous()
    k = None if k is None else k.contiguous()
    bias = None if bias is None else bias.to(v.dtype).contiguous()
    weight = None if weight is None else weight.to(v.dtype).contiguous()
    ef = None if edge_features is None else edge_features.to(v.dtype).contiguous()
    out, lse = FusedEdgeAttentionFunction.apply(q, k, v, bias, weight, graph, scale, softmax, ops,
                                                ef)
    return (out, lse) if return_lse else out


def attention_probs(
    q: Tensor,
    k: Tensor,
    lse: Tensor,
    graph: FusedGraph,
    *,
    bias: Tensor | None = None,
    scale: float | None = None,
    backend: str | None = None,
    edge_features: Tensor | None = None,
) -> Tensor:
    """Softmax coefficients ``p [E, H]`` (edge-set order) of every edge given the forward's
    ``lse``, without gradient."""
    ops, scale = _ops_and_scale(q, backend, scale)
    with torch.no_grad():
        q, k = q.detach().contiguous(), k.detach().contiguous()
        b = None if bias is None else bias.detach().to(q.dtype).contiguous()
        ef = None if edge_features is None else edge_features.detach().to(q.dtype).contiguous()
        return ops.probs(q, k, lse.contiguous(), graph.rowptr, graph.col, graph.eid, b, scale,
                         *_features(ops, ef))


# ------------------------------------------------------------------ the layer's explicit path
def unsupported_reason(es: Any, v: Tensor, backend: str | None) -> str | None:
    """Why the fused kernel cannot run this explicit edge set (``None``: it can)."""
    if backend is None:
        return f"no fused kernel for {v.device.type} tensors"
    if es.weight is not None and es.weight.is_complex():
        return "complex weights"
    if v.dtype not in fused_dtypes(backend):
        return f"dtype {v.dtype}"
    return None


def dropout_mask(num_edges: int, heads: int, p: float, like: Tensor) -> Tensor:
    """Attention dropout as a post-softmax weight: ``Bernoulli(1 - p) / (1 - p)`` per (edge, head).

    Folding the mask into the weight gives exactly ``dropout(alpha) * w``; it uses the global RNG
    like :func:`torch.nn.functional.dropout`.
    """
    return torch.nn.functional.dropout(like.new_ones(num_edges, heads), p=p)


def fused_explicit_attention(
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor,
    es: Any,
    num_targets: int,
    *,
    scale: float,
    dropout: float = 0.0,
    need_alpha: bool = False,
    backend: str | None = None,
    edge_features: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:class:`~graphattn.EdgeAttention`'s explicit path on the fused kernel.

    ``q [N, H, C]`` (``None`` in weighted mode), ``k, v [S, H, C]`` (real then virtual sources),
    ``es`` an explicit edge set, ``edge_features`` (optional) ``[E, H, C]`` its projected edge
    features (per-head edges: each edge's own head is used). ``dropout`` > 0 draws a mask (see
    :func:`dropout_mask`). Returns
    ``(out [N, H, C], alpha)`` where ``alpha`` (if ``need_alpha``) is the coefficient of ``v_j``
    before dropout in edge-set order: ``[E, H]``, or ``[E, 1]`` for per-head edges.
    """
    backend = backend or default_backend(v.device)
    N, S = num_targets, v.size(0)
    H, C = v.size(1), v.size(2)
    softmax = es.mode == "attention" and q is not None
    graph = prepare_graph(es, N, S)
    if graph.per_head:
        q = None if q is None else q.reshape(N * H, 1, C)
        k = None if k is None else k.reshape(S * H, 1, C)
        v = v.reshape(S * H, 1, C)
        if edge_features is not None:  # each edge's own head
            rows = torch.arange(graph.num_edges, device=v.device)
            edge_features = edge_features[rows, es.head][:, None]
    Hk = v.size(1)
    bias = es.bias if softmax else None
    weight = es.weight
    w_eff = weight
    if dropout > 0:  # attention: dropout(alpha) * w; weighted: dropped, rescaled messages
        mask = dropout_mask(graph.num_edges, Hk, dropout, v)
        w_eff = mask if weight is None else (weight if weight.dim() == 2 else weight[:, None]) * mask
    out, lse = fused_attention(q, k, v, graph, bias=bias, weight=w_eff, scale=scale,
                               softmax=softmax, backend=backend, return_lse=True,
                               edge_features=edge_features)
    alpha = None
    if need_alpha:
        if softmax:
            assert q is not None and k is not None
            alpha = attention_probs(q, k, lse, graph, bias=bias, scale=scale, backend=backend,
                                    edge_features=edge_features)
        else:
            alpha = v.new_ones(graph.num_edges, Hk)
        if weight is not None:
            w = weight.detach().to(alpha.dtype)
            alpha = alpha * (w if w.dim() == 2 else w[:, None])
    return out.view(N, H, C), alpha
