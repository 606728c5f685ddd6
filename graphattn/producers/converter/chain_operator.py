r"""Converter's operator edge set (:mod:`graphattn.producers.converter`): a linear operator
:math:`o = S v` that the layer applies without enumerating its edges
(:class:`~graphattn.core.structured.OperatorEdgeSet`).

* :class:`UnitaryChainOperator` — Converter's unitary digraph shift
  :math:`S = \Phi^H \operatorname{diag}(e^{i\varphi}) \Phi` with
  :math:`\Phi = \operatorname{diag}(e^{i\theta}) H_l H_u P` (``matvec`` = :math:`S v`, ``rmatvec`` =
  :math:`S^H v`), block-diagonal over the graphs of a batch, applied by four linear scans
  (:mod:`graphattn.kernels.linear_scan`). The Converter producer builds it from node features.

The released code of the Converter paper drops the scan's boundary carry (so its :math:`\Phi` is
not unitary and the last token never contributes) and inverts with swapped factors; the sweeps used
here are the corrected ones (``docs/converter.md``, departures).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.core.index import need_finite, need_long, need_tensor, shape_str
from graphattn.core.origins import origin_code
from graphattn.core.structured import OperatorEdgeSet
from graphattn.kernels.linear_scan import (
    SweepCoefs,
    adjoint_rotations,
    extend_rotations,
    lower_sweep,
    lower_sweep_into,
    upper_sweep,
    upper_sweep_into,
)
from graphattn.memory import EDGE_BYTES, check_edges

__all__ = ["UnitaryChainOperator"]


class _ChainCoefs(NamedTuple):
    """The sweep coefficients of :class:`UnitaryChainOperator` (cached per operator)."""

    upper: SweepCoefs  # H_u
    lower: SweepCoefs  # H_l
    lower_adj: SweepCoefs  # H_l^H (the upper form with blocks G^H)
    upper_adj: SweepCoefs  # H_u^H (the lower form with blocks G^H)


class UnitaryChainOperator(OperatorEdgeSet):
    r"""Converter's unitary digraph shift as an operator edge set (never enumerated):

    .. math::
        S = \Phi^H \operatorname{diag}(e^{i\varphi}) \Phi,\qquad
        \Phi = \operatorname{diag}(e^{i\theta})\, H_l\, H_u\, P,\qquad
        o_i = \sum_j S_{ij} v_j,

    with :math:`H_u = G_{0,1} \cdots G_{N-2,N-1}` and :math:`H_l = G_{N-2,N-1} \cdots G_{0,1}`
    products of Givens rotations on adjacent nodes of one chain over all nodes of the batch. The
    rotation of every pair that straddles two graphs is the exact identity, so :math:`S` is exactly
    block-diagonal :math:`\bigoplus_g S_g` (no padding). :math:`S` is unitary and normal, its
    eigenvalues are exactly :math:`e^{i\varphi_n}` with eigenvectors the columns of :math:`\Phi^H`.
    One :math:`S` is shared by every head and channel. :meth:`matvec` costs four linear scans,
    :math:`O(N F)`. The phases :math:`\theta` cancel in :math:`S`
    (:math:`D^H E D = E`): they shape :math:`\Phi` (:meth:`phi`, :meth:`phi_inv`) but not the
    operator, which skips them.

    Args:
        rot_l (Tensor): ``[N-1, 4]`` complex blocks ``(ii, ij, ji, jj)`` of :math:`H_l`.
        rot_u (Tensor): ``[N-1, 4]`` complex blocks of :math:`H_u`.
        diag (Tensor): ``[N]`` unit complex :math:`e^{i\theta}`.
        eig (Tensor): ``[N]`` unit complex eigenvalues :math:`e^{i\varphi}`.
        ptr (LongTensor): ``[B + 1]`` graph pointer (graphs are contiguous).
        num_heads (int): heads of the consuming layer.
        perm (LongTensor, optional): ``[N]`` node permutation :math:`P` (``P x = x[perm]``),
            within graphs.
        aux_loss (Tensor, optional): the kernel polynomial loss.
        stats (dict, optional): statistics for logging.
        check_boundaries (bool): verify that the pairs straddling two graphs are identities.
    """

    def __init__(
        self,
        rot_l: Tensor,
        rot_u: Tensor,
        diag: Tensor,
        eig: Tensor,
        ptr: Tensor,
        *,
        num_heads: int = 1,
        perm: Tensor | None = None,
        aux_loss: Tensor | None = None,
        stats: dict[str, Any] | None = None,
        check_boundaries: bool = True,
    ) -> None:
        need_long("ptr", need_tensor("ptr", ptr, dims=1))
        N = int(ptr[-1]) if ptr.numel() else 0
        for name, t, n in (("rot_l", rot_l, max(N - 1, 0)), ("rot_u", rot_u, max(N - 1, 0))):
            need_tensor(name, t, dims=2)
            if not t.is_complex() or t.shape != (n, 4):
                raise ValueError(f"'{name}' must be a complex [{n}, 4] tensor (ii, ij, ji, jj per "
                                 f"pair), got {t.dtype} {shape_str(t)}")
        for name, t in (("diag", diag), ("eig", eig)):
            need_tensor(name, t, dims=1)
            if not t.is_complex() or t.numel() != N:
                raise ValueError(f"'{name}' must be a complex [{N}] tensor, got {t.dtype} {shape_str(t)}")
        dtypes = {t.dtype for t in (rot_l, rot_u, diag, eig)}
        if len(dtypes) != 1:
            raise ValueError(f"'rot_l', 'rot_u', 'diag' and 'eig' must share one dtype, got {dtypes}")
        for name, t in (("rot_l", rot_l), ("rot_u", rot_u), ("diag", diag), ("eig", eig)):
            need_finite(name, torch.view_as_real(t.detach()))
        if perm is not None:
            need_long("perm", need_tensor("perm", perm, dims=1))
            if perm.numel() != N:
                raise ValueError(f"'perm' must have shape [{N}], got {shape_str(perm)}")
        super().__init__(ptr, num_heads=num_heads, aux_loss=aux_loss, stats=stats)
        self.rot_l, self.rot_u, self.diag, self.eig, self.perm = rot_l, rot_u, diag, eig, perm
        self.inv_perm = None if perm is None else torch.argsort(perm)
        if check_boundaries and N > 1:
            self._check_boundaries()

    # ------------------------------------------------------------------------------- structure
    @property
    def num_nodes(self) -> int:
        return int(self.diag.numel())

    @property
    def dtype(self) -> torch.dtype:
        return self.diag.dtype

    def boundary_mask(self) -> Tensor:
        """``[N-1]`` bool, ``True`` for the chain pairs that straddle two graphs."""
        N = self.num_nodes
        mask = torch.zeros(max(N - 1, 0), dtype=torch.bool, device=self.ptr.device)
        inner = self.ptr[1:-1]
        inner = inner[(inner > 0) & (inner < N)]
        mask[inner - 1] = True
        return mask

    def _check_boundaries(self) -> None:
        mask = self.boundary_mask()
        if not bool(mask.any()):
            return
        eye = torch.tensor([1, 0, 0, 1], dtype=self.dtype, device=self.diag.device)
        for name, rot in (("rot_l", self.rot_l), ("rot_u", self.rot_u)):
            if not bool((rot.detach()[mask] == eye).all()):
                raise ValueError(f"'{name}' must be the identity (1, 0, 0, 1) on the pairs that "
                                 f"straddle two graphs (the operator must not mix graphs)")

    # ---------------------------------------------------------------------------------- math
    def _coefs(self) -> _ChainCoefs:
        if "coefs" not in self._cache:
            self._cache["coefs"] = _ChainCoefs(
                *(extend_rotations(r) for r in (self.rot_u, self.rot_l, adjoint_rotations(self.rot_l),
                                                adjoint_rotations(self.rot_u))))
        return self._cache["coefs"]

    def _sweeps(self, x: Tensor, inverse: bool) -> Tensor:
        """:math:`H_l H_u P x` (``inverse=False``) or :math:`P^T H_u^H H_l^H x`."""
        u, lo, lo_h, u_h = self._coefs()
        if not inverse:
            if self.perm is not None:
                x = x[self.perm]
            return lower_sweep(upper_sweep(x, u), lo)
        out = lower_sweep(upper_sweep(x, lo_h), u_h)
        return out if self.inv_perm is None else out[self.inv_perm]

    def phi(self, x: Tensor) -> Tensor:
        r""":math:`\Phi x = e^{i\theta} \odot H_l H_u P x` for ``x [N, F]`` (complex)."""
        return self.diag[:, None] * self._sweeps(x, inverse=False)

    def phi_inv(self, w: Tensor) -> Tensor:
        r""":math:`\Phi^H w = P^T H_u^H H_l^H (e^{-i\theta} \odot w)` (:math:`H_l^H` has the upper
        form with blocks :math:`G^H`, :math:`H_u^H` the lower form)."""
        return self._sweeps(self.diag.conj()[:, None] * w, inverse=True)

    def _apply(self, v: Tensor, eig: Tensor) -> Tensor:
        if v.dim() < 1 or v.size(0) != self.num_nodes:
            raise ValueError(f"'v' must have one row per node ({self.num_nodes}), got {shape_str(v)}")
        dtype = torch.promote_types(self.dtype, v.dtype)
        shape = v.shape
        if v.numel() == 0:
            return v.to(dtype).clone()
        x = v.reshape(shape[0], -1)
        if v.is_complex() and v.dtype != dtype:
            x = x.to(dtype)
        # S = Φ^H E Φ = P^T H_u^H H_l^H D^H E D H_l H_u P and D^H E D = E (diagonal, |D| = 1):
        # the phases θ cancel in S, so the sweeps skip them (Φ itself keeps them: phi / phi_inv).
        # E is folded into the coefficients of the first inverse sweep (ii_j e_j, ji_j e_{j-1}).
        u, lo, lo_h, u_h = self._coefs()
        if self.perm is not None:
            x = x[self.perm]
        ii, ij, ji, jj = lo_h
        e = eig.to(dtype)
        lo_h_e = SweepCoefs(ii * e, ij, torch.cat([ji[:1], ji[1:] * e[:-1]]), jj)
        tracked = (x, self.rot_l, self.rot_u, e)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
            out = lower_sweep(upper_sweep(lower_sweep(upper_sweep(x, u), lo), lo_h_e), u_h)
        else:  # inference: two buffers in turn, no autograd state
            cast = [SweepCoefs._make(c.to(dtype).contiguous() for c in cf)
                    for cf in (u, lo, lo_h_e, u_h)]
            x = x.contiguous()
            a = torch.empty(x.shape, dtype=dtype, device=x.device)
            b = torch.empty_like(a)
            upper_sweep_into(x, cast[0], a)
            lower_sweep_into(a, cast[1], b)
            upper_sweep_into(b, cast[2], a)
            out = lower_sweep_into(a, cast[3], b)
        if self.inv_perm is not None:
            out = out[self.inv_perm]
        return out.reshape(shape)

    def matvec(self, v: Tensor) -> Tensor:
        r""":math:`S v` for ``v [N, ...]`` (real or complex); complex result of the same shape."""
        return self._apply(v, self.eig)

    def rmatvec(self, v: Tensor) -> Tensor:
        r""":math:`S^H v = \Phi^H \operatorname{diag}(e^{-i\varphi}) \Phi v`."""
        return self._apply(v, self.eig.conj())

    # ----------------------------------------------------------------------- materialisation
    def local_dense(self, max_nodes_per_graph: int = 4096) -> Tensor:
        """``[N, n_max]`` complex: row ``i`` of graph ``g`` holds :math:`S_g[i_{loc}, :]` (columns
        past the graph's size are 0). Costs one pass over ``n_max`` columns. Checked against the
        memory budget (:mod:`graphattn.memory`) first."""
        counts = self.ptr[1:] - self.ptr[:-1]
        n_max = int(counts.max()) if counts.numel() else 0
        if n_max > max_nodes_per_graph:
            raise ValueError(f"materialising the operator needs n^2 entries per graph; the largest "
                             f"graph has {n_max} > max_nodes_per_graph={max_nodes_per_graph} nodes")
        N = self.num_nodes
        # memory guard: the dense rows, the scan's buffers and (to_explicit) the edges, per entry
        check_edges(N * n_max, bytes_per_edge=EDGE_BYTES + 4 * 16,
                    what=f"materialising the Converter operator ({N:,} targets, graphs of up to "
                    f"{n_max:,} nodes)", how_to_lower="trace or materialise fewer or smaller graphs",
                    device=self.ptr.device)
        graph = torch.repeat_interleave(torch.arange(counts.numel(), device=self.ptr.device),
                                        counts, output_size=N)
        local = torch.arange(N, device=self.ptr.device) - self.ptr[graph]
        eye = torch.zeros(N, n_max, dtype=self.dtype, device=self.ptr.device)
        eye[torch.arange(N, device=self.ptr.device), local] = 1
        return self.matvec(eye)

    def _explicit_rows(self, max_nodes_per_graph: int) -> Tensor:
        r"""``[N, 1, n_max]``: :meth:`local_dense`, one operator for every head. So
        :meth:`~graphattn.core.structured.OperatorEdgeSet.to_explicit` gives the complete digraph of
        every graph (self-loops included) with complex weights :math:`w_{j \to i} = S_{ij}`,
        target-major, from one pass of the operator over ``n_max`` columns, shared by all heads
        (small graphs: :math:`n^2` edges per graph)."""
        return self.local_dense(max_nodes_per_graph)[:, None]

    def to_dense(self) -> Tensor:
        """The whole block-diagonal :math:`N \\times N` complex matrix (small batches only)."""
        N = self.num_nodes
        return self.matvec(torch.eye(N, dtype=self.dtype, device=self.ptr.device))

    def row_energy_captured(self, k: int, max_nodes_per_graph: int = 4096) -> Tensor:
        r"""``[N]`` share of each row's energy :math:`\sum_j |S_{ij}|^2` (= 1, unitary) held by its
        ``k`` largest entries: the diagnostic to read before trusting :meth:`to_topk`."""
        power = self.local_dense(max_nodes_per_graph).detach().abs().square()
        k = max(min(int(k), power.size(1)), 0)
        top = power.topk(k, dim=1).values.sum(1) if k else power.new_zeros(power.size(0))
        return top / power.sum(1).clamp_min(torch.finfo(power.dtype).tiny)

    def to_topk(self, k: int, max_nodes_per_graph: int = 4096) -> EdgeSet:
        r"""**An approximation**: for every target :math:`i`, only its ``k`` sources with the largest
        :math:`|S_{ij}|` (complex weights; gradients reach the kept entries only). Not unitary. The
        stats hold the captured row energy (``row_energy_min`` / ``row_energy_mean``) and
        ``approximation = True``. ``k >= `` the graph size gives the exact dense edge set."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"'k' must be a positive int, got {k!r}")
        dense = self.local_dense(max_nodes_per_graph)
        counts = self.ptr[1:] - self.ptr[:-1]
        N = self.num_nodes
        dev = self.ptr.device
        graph = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts,
                                        output_size=N)
        kk = min(k, dense.size(1))
        power = dense.detach().abs().square()
        col = power.topk(kk, dim=1).indices if kk else torch.zeros(N, 0, dtype=torch.long, device=dev)
        valid = col < counts[graph][:, None]
        dst = torch.arange(N, device=dev)[:, None].expand_as(col)
        src = self.ptr[graph][:, None] + col
        weight = dense.gather(1, col)[valid]
        captured = power.gather(1, col).sum(1) / power.sum(1).clamp_min(torch.finfo(power.dtype).tiny)
        stats = dict(self.stats)
        stats.update(approximation=True, topk=k,
                     row_energy_min=float(captured.min()) if N else 1.0,
                     row_energy_mean=float(captured.mean()) if N else 1.0)
        E = int(valid.sum())
        return EdgeSet(
            torch.stack([src[valid], dst[valid]]),
            num_heads=self.num_heads,
            mode="weighted",
            weight=weight[:, None].expand(E, self.num_heads),
            origin=torch.full((E,), origin_code("operator"), dtype=torch.long, device=dev),
            aux_loss=self.aux_loss,
            stats=stats,
        )

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_nodes={self.num_nodes}, "
                f"num_graphs={self.ptr.numel() - 1}, num_heads={self.num_heads}, "
                f"dtype={self.dtype}, permuted={self.perm is not None})")
