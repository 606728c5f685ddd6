r"""The linear scan of Converter's shift operator and the Givens-chain sweeps built on it.

* :func:`linear_scan` — the first-order linear recurrence :math:`h_t = a_t h_{t-1} + b_t` over the
  first axis in :math:`O(L F)` work, real or complex, differentiable in both inputs (custom
  autograd, :class:`_LinearScan`: the backward is the reverse scan with :math:`\bar a_{t+1}`), never
  through the underflowing closed form :math:`A_t \sum b/A`. On the CPU the recurrence runs in the
  compiled kernel ``kernels/csrc/linear_scan.cpp`` (the ``linear_scan_`` operator of the CPU
  extension, loaded by :func:`~graphattn.kernels.cpu_extension.cpu_ops`) when it is available
  (:data:`NATIVE_SCAN`), else in a two-level blocked torch scan (:func:`_scan_`).
* :func:`upper_sweep` / :func:`lower_sweep` — :math:`H_u x` and :math:`H_l x` for the unitary
  Hessenberg products :math:`H_u = G_{0,1} G_{1,2} \cdots G_{N-2,N-1}` and
  :math:`H_l = G_{N-2,N-1} \cdots G_{0,1}` of Givens rotations on adjacent rows, one scan each
  (custom autograd: :class:`_UpperSweep`, :class:`_LowerSweep`); :func:`upper_sweep_into` /
  :func:`lower_sweep_into` are the same without autograd, into a given buffer.
* The rotations are ``[N-1, 4]`` complex blocks ``(ii, ij, ji, jj)`` (one per adjacent pair);
  :func:`extend_rotations` turns them into the per-node :class:`SweepCoefs` the sweeps take and
  :func:`adjoint_rotations` gives the blocks of :math:`G^H`.

The operator that applies these is
:class:`~graphattn.producers.converter.chain_operator.UnitaryChainOperator`; the Givens and Kernelution
mathematics live with the Converter producer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from graphattn.core.index import shape_str

from .cpu_extension import cpu_ops

_SCAN_BLOCK = 16  # shortest block of the blocked scan (sequences up to this length: one loop)
#: run the scan in the compiled CPU kernel (``kernels/csrc/linear_scan.cpp``) when it is available;
#: ``False`` forces the blocked torch scan (tests compare the two)
NATIVE_SCAN = True
_SCAN_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _native_scan_ops(a: Tensor, b: Tensor) -> Any | None:
    """The compiled scan's operators if they can run ``a [L]``, ``b [L, F]`` here, else ``None``."""
    if not NATIVE_SCAN or a.device.type != "cpu" or b.device.type != "cpu" or b.dim() != 2:
        return None
    if a.dtype != b.dtype or b.dtype not in _SCAN_DTYPES:
        return None
    if not (a.is_contiguous() and b.is_contiguous()):
        return None
    ops = cpu_ops(warn=False)
    return ops if ops is not None and hasattr(ops, "linear_scan_") else None


# ---------------------------------------------------------------------------------------------- scans
def scan_sequential(a: Tensor, b: Tensor) -> Tensor:
    """Reference loop for :math:`h_t = a_t h_{t-1} + b_t`, :math:`h_{-1} = 0` (tests only)."""
    out = []
    h = torch.zeros_like(b[:1])[0] if b.size(0) else None
    for t in range(b.size(0)):
        h = a[t] * h + b[t]
        out.append(h)
    return torch.stack(out) if out else b.clone()


def _block_loop(a: Tensor, b: Tensor, reverse: bool) -> None:
    """In place along axis 1 of ``a [M, T, 1]``, ``b [M, T, F]``: the recurrence inside each of the
    ``M`` rows at once (``T - 1`` fused multiply-adds on ``[M, F]`` slices)."""
    a_t, b_t = a.unbind(1), b.unbind(1)
    if reverse:
        for t in range(len(b_t) - 2, -1, -1):
            b_t[t].addcmul_(a_t[t], b_t[t + 1])
    else:
        for t in range(1, len(b_t)):
            b_t[t].addcmul_(a_t[t], b_t[t - 1])


def _scan_(a: Tensor, b: Tensor, reverse: bool = False) -> Tensor:
    r"""In place: ``b`` becomes :math:`h` with :math:`h_t = a_t h_{t-1} + b_t` (``reverse``:
    :math:`h_t = a_t h_{t+1} + b_t`), zero carry-in, for contiguous ``a [L]``, ``b [L, F]``.

    Blocked (the two-level form of a parallel scan): ``M`` blocks of ``T`` steps; (1) the
    recurrence runs inside all blocks at once with zero carry-in (``T`` vectorised steps), (2) the
    states at the block ends follow their own recurrence with coefficients
    :math:`\prod_{t \in m} a_t` (recursively), (3) every block adds its carry-in
    :math:`(\prod_{s \le t} a_s)\, h_{\text{end}(m-1)}`; a ragged tail continues from the last block
    (recursively). Two passes over the data, :math:`O(L F)` work, :math:`O(T \log_T L)` Python steps,
    no temporaries of the data's size. Products only (no division), so tiny products underflow
    harmlessly to 0; a zero :math:`a_t` resets the recurrence exactly for finite inputs.

    On the CPU the compiled kernel (``kernels/csrc/linear_scan.cpp``: the recurrence in its
    sequential order, columns in parallel) replaces the blocked scan when it is available.
    """
    ops = _native_scan_ops(a, b)
    if ops is not None:
        ops.linear_scan_(a, b, reverse)
        return b
    L = a.size(0)
    if L <= _SCAN_BLOCK:
        _block_loop(a[None, :, None], b[None], reverse)
        return b
    T = _SCAN_BLOCK
    M = L // T
    tail = L - M * T
    lo = tail if reverse else 0  # the blocks cover [lo, lo + M T); the tail is scanned last
    av = a[lo:lo + M * T].view(M, T)
    bv = b[lo:lo + M * T].view(M, T, -1)
    _block_loop(av[:, :, None], bv, reverse)
    if reverse:
        prefix = torch.cumprod(av.flip(1), dim=1).flip(1)  # prod_{s >= t} a_s within the block
        ends = bv[:, 0].clone()
        _scan_(prefix[:, 0].contiguous(), ends, reverse=True)
        bv[:-1].addcmul_(prefix[:-1, :, None], ends[1:, None])
    else:
        prefix = torch.cumprod(av, dim=1)  # prod_{s <= t} a_s within the block
        ends = bv[:, -1].clone()
        _scan_(prefix[:, -1].contiguous(), ends)
        bv[1:].addcmul_(prefix[1:, :, None], ends[:-1, None])
    if tail:
        if reverse:
            b[tail - 1].addcmul_(a[tail - 1], b[tail])
            _scan_(a[:tail], b[:tail], reverse=True)
        else:
            b[M * T].addcmul_(a[M * T], b[M * T - 1])
            _scan_(a[M * T:], b[M * T:])
    return b


def _shifted(a: Tensor, reverse: bool) -> Tensor:
    """Adjoint coefficients: :math:`\\bar a_{t+1}` (``0`` last) for a forward scan's backward,
    :math:`\\bar a_{t-1}` (``0`` first) for a reverse scan's."""
    zero = a.new_zeros(1)
    return torch.cat([zero, a[:-1].conj()]) if reverse else torch.cat([a[1:].conj(), zero])


def _rowdot(g: Tensor, h: Tensor) -> Tensor:
    r""":math:`\sum_f g_{t,f}\, \bar h_{t,f}` per row (a gradient of a per-row coefficient)."""
    if g.is_complex() and not h.is_complex():
        return torch.complex(torch.linalg.vecdot(h, g.real, dim=-1),
                             torch.linalg.vecdot(h, g.imag, dim=-1))
    return torch.linalg.vecdot(h, g, dim=-1)


class _LinearScan(torch.autograd.Function):
    r"""Autograd for :math:`h_t = a_t h_{t-1} + b_t` (or :math:`h_{t+1}` when reversed). With
    :math:`u_t = \partial L / \partial \bar h_t` accumulated along the opposite direction,
    :math:`u_t = g_t + \bar a_{t+1} u_{t+1}` (a reverse scan), :math:`\nabla b_t = u_t` and
    :math:`\nabla a_t = \sum_f u_{t,f} \bar h_{t-1,f}` (PyTorch's conjugate-Wirtinger convention).
    Memory: the states ``h`` only."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, reverse: bool) -> Tensor:  # type: ignore[override]
        h = _scan_(a, b.clone(), reverse)
        ctx.reverse = reverse
        ctx.save_for_backward(a, h)
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, None]:  # type: ignore[override]
        a, h = ctx.saved_tensors
        reverse = ctx.reverse
        u = _scan_(_shifted(a, reverse), g.contiguous().clone(), not reverse)
        grad_a = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.zeros_like(a)
            if reverse:
                grad_a[:-1] = _rowdot(u[:-1], h[1:])
            else:
                grad_a[1:] = _rowdot(u[1:], h[:-1])
        return grad_a, u, None


def linear_scan(a: Tensor, b: Tensor, reverse: bool = False) -> Tensor:
    r"""The linear recurrence over the first axis, real or complex, differentiable in both inputs.

    ``reverse=False``: :math:`h_t = a_t h_{t-1} + b_t` (:math:`h_{-1} = 0`);
    ``reverse=True``: :math:`h_t = a_t h_{t+1} + b_t` (:math:`h_L = 0`).

    Args:
        a: ``[L]`` coefficients (shared by all features).
        b: ``[L, ...]`` inputs.
    """
    if a.dim() != 1 or b.dim() < 1 or b.size(0) != a.size(0):
        raise ValueError(f"'a' must be [L] and 'b' [L, ...], got {shape_str(a)} and {shape_str(b)}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    shape = b.shape
    if b.numel() == 0:
        return b.to(dtype).clone()
    a, b = a.to(dtype).contiguous(), b.to(dtype).reshape(shape[0], -1).contiguous()
    return _LinearScan.apply(a, b, reverse).reshape(shape)


# --------------------------------------------------------------------------------------------- sweeps
class SweepCoefs(NamedTuple):
    """Per-node coefficients of a sweep, each ``[N]`` (:func:`extend_rotations`): the block
    ``(ii, ij)`` of pair ``j`` at node ``j`` (``(1, 0)`` at the last node) and ``(ji, jj)`` of pair
    ``j-1`` at node ``j`` (``(0, 1)`` at the first)."""

    ii: Tensor
    ij: Tensor
    ji: Tensor
    jj: Tensor


def adjoint_rotations(rot: Tensor) -> Tensor:
    r"""The blocks of :math:`G^H` for blocks ``rot [..., 4] = (ii, ij, ji, jj)``:
    :math:`(\bar{ii}, \bar{ji}, \bar{ij}, \bar{jj})` (conjugate transpose of each 2×2 block)."""
    return rot[..., [0, 2, 1, 3]].conj()


def extend_rotations(rot: Tensor) -> SweepCoefs:
    """Per-node coefficient arrays ``(ii, ij, ji, jj)``, each ``[N]``, of pair rotations
    ``rot [N-1, 4]``: ``ii, ij`` padded with ``(1, 0)`` at the end (pair ``j`` lives at node
    ``j``), ``ji, jj`` padded with ``(0, 1)`` at the start (pair ``j-1`` lives at node ``j``)."""
    one, zero = rot.new_ones(1), rot.new_zeros(1)
    ii, ij, ji, jj = rot.unbind(-1)
    return SweepCoefs(torch.cat([ii, one]), torch.cat([ij, zero]), torch.cat([zero, ji]),
                      torch.cat([one, jj]))


def upper_sweep_into(x: Tensor, coef: SweepCoefs, out: Tensor) -> Tensor:
    """:math:`H_u x` written into ``out`` (``[N, F]``, distinct from ``x``), no autograd; ``x`` and
    the coefficients contiguous, the coefficients of ``out``'s dtype."""
    ii, ij, ji, jj = coef
    torch.mul(ii[:, None], x, out=out)
    _scan_(ij, out, reverse=True)
    out.mul_(jj[:, None])
    out[1:].addcmul_(ji[1:, None], x[:-1])
    return out


def lower_sweep_into(y: Tensor, coef: SweepCoefs, out: Tensor) -> Tensor:
    """:math:`H_l y` written into ``out`` (``[N, F]``, distinct from ``y``), no autograd; ``y`` and
    the coefficients contiguous, the coefficients of ``out``'s dtype."""
    ii, ij, ji, jj = coef
    torch.mul(jj[:, None], y, out=out)
    _scan_(ji, out)
    out.mul_(ii[:, None])
    out[:-1].addcmul_(ij[:-1, None], y[1:])
    return out


class _UpperSweep(torch.autograd.Function):
    """:func:`upper_sweep` with a hand-written backward (adjoint sweep + per-row reductions)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, ii: Tensor, ij: Tensor, ji: Tensor,  # type: ignore[override]
                jj: Tensor) -> Tensor:
        if not any(ctx.needs_input_grad):  # no state to keep
            return upper_sweep_into(x, SweepCoefs(ii, ij, ji, jj),
                                    torch.empty_like(x, dtype=ii.dtype))
        h = _scan_(ij, ii[:, None] * x, reverse=True)
        y = jj[:, None] * h
        y[1:].addcmul_(ji[1:, None], x[:-1])
        ctx.save_for_backward(x, h, ii, ij, ji, jj)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, h, ii, ij, ji, jj = ctx.saved_tensors
        gy = gy.contiguous()
        need = ctx.needs_input_grad
        gjj = _rowdot(gy, h) if need[4] else None
        gji = None
        if need[3]:
            gji = torch.zeros_like(ji)
            gji[1:] = _rowdot(gy[1:], x[:-1])
        u = _scan_(_shifted(ij, reverse=True), jj.conj()[:, None] * gy)  # adjoint of h
        gii = _rowdot(u, x) if need[1] else None
        gij = None
        if need[2]:
            gij = torch.zeros_like(ij)
            gij[:-1] = _rowdot(u[:-1], h[1:])
        gx = None
        if need[0]:
            gx = ii.conj()[:, None] * u
            gx[:-1].addcmul_(ji[1:].conj()[:, None], gy[1:])
            if not x.is_complex():
                gx = gx.real
        return gx, gii, gij, gji, gjj


class _LowerSweep(torch.autograd.Function):
    """:func:`lower_sweep` with a hand-written backward (adjoint sweep + per-row reductions)."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, ii: Tensor, ij: Tensor, ji: Tensor,  # type: ignore[override]
                jj: Tensor) -> Tensor:
        if not any(ctx.needs_input_grad):  # no state to keep
            return lower_sweep_into(y, SweepCoefs(ii, ij, ji, jj),
                                    torch.empty_like(y, dtype=ii.dtype))
        c = _scan_(ji, jj[:, None] * y)
        z = ii[:, None] * c
        z[:-1].addcmul_(ij[:-1, None], y[1:])
        ctx.save_for_backward(y, c, ii, ij, ji, jj)
        return z

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, gz: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        y, c, ii, ij, ji, jj = ctx.saved_tensors
        gz = gz.contiguous()
        need = ctx.needs_input_grad
        gii = _rowdot(gz, c) if need[1] else None
        gij = None
        if need[2]:
            gij = torch.zeros_like(ij)
            gij[:-1] = _rowdot(gz[:-1], y[1:])
        u = _scan_(_shifted(ji, reverse=False), ii.conj()[:, None] * gz, reverse=True)  # adjoint of c
        gjj = _rowdot(u, y) if need[4] else None
        gji = None
        if need[3]:
            gji = torch.zeros_like(ji)
            gji[1:] = _rowdot(u[1:], c[:-1])
        gy = None
        if need[0]:
            gy = jj.conj()[:, None] * u
            gy[1:].addcmul_(ij[:-1].conj()[:, None], gz[:-1])
            if not y.is_complex():
                gy = gy.real
        return gy, gii, gij, gji, gjj


def _sweep_inputs(x: Tensor, coef: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """Contiguous inputs in one dtype; a real ``x`` of the coefficients' real dtype stays real
    (the first product promotes it, saving a complex copy)."""
    dtype = torch.promote_types(x.dtype, coef[0].dtype)
    if not (x.dtype == dtype or (not x.is_complex() and x.dtype == dtype.to_real())):
        x = x.to(dtype)
    return (x.contiguous(), *(c.to(dtype).contiguous() for c in coef))


def upper_sweep(x: Tensor, coef: SweepCoefs) -> Tensor:
    r""":math:`y = H_u x` with :math:`H_u = G_{0,1} G_{1,2} \cdots G_{N-2,N-1}`, ``x [N, F]``:

    .. math::
        h_{N-1} = x_{N-1},\quad h_j = ii_j x_j + ij_j h_{j+1};\qquad
        y_0 = h_0,\quad y_j = ji_{j-1} x_{j-1} + jj_{j-1} h_j

    (one reverse scan; ``coef`` from :func:`extend_rotations`).
    """
    if x.numel() == 0:
        return x.to(torch.promote_types(x.dtype, coef[0].dtype)).clone()
    return _UpperSweep.apply(*_sweep_inputs(x, coef))


def lower_sweep(y: Tensor, coef: SweepCoefs) -> Tensor:
    r""":math:`z = H_l y` with :math:`H_l = G_{N-2,N-1} \cdots G_{0,1}`, ``y [N, F]``:

    .. math::
        c_0 = y_0,\quad c_j = ji_{j-1} c_{j-1} + jj_{j-1} y_j;\qquad
        z_j = ii_j c_j + ij_j y_{j+1},\quad z_{N-1} = c_{N-1}

    (one forward scan; ``coef`` from :func:`extend_rotations`).
    """
    if y.numel() == 0:
        return y.to(torch.promote_types(y.dtype, coef[0].dtype)).clone()
    return _LowerSweep.apply(*_sweep_inputs(y, coef))
