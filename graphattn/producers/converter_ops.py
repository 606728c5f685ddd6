r"""The mathematics of Converter (Zhang et al., "Converting Transformers into DGNNs Form").

Everything here is plain tensor code with no parameters:

* :func:`givens` — the SU(2) block of paper eq. 6 for every pair :math:`(j, j+1)` of a chain;
* :func:`linear_scan` — the first-order linear recurrence :math:`h_t = a_t h_{t-1} + b_t` in
  :math:`O(L F)` work (a two-level blocked scan, custom autograd: the backward is the reverse
  scan with :math:`\bar a_{t+1}`), never through the underflowing closed form
  :math:`A_t \sum b/A`;
* :func:`upper_sweep` / :func:`lower_sweep` — :math:`H_u x` and :math:`H_l x` for the unitary
  Hessenberg products :math:`H_u = G_{0,1} G_{1,2} \cdots G_{N-2,N-1}` and
  :math:`H_l = G_{N-2,N-1} \cdots G_{0,1}` as one scan each;
* :class:`UnitaryChainOperator` — the unitary digraph shift
  :math:`S = \Phi^H \operatorname{diag}(e^{i\varphi}) \Phi` with :math:`\Phi = D H_l H_u P`, as an
  :class:`~graphattn.structured.OperatorEdgeSet` (``matvec`` = :math:`S v`, ``rmatvec`` =
  :math:`S^H v`), block-diagonal over the graphs of a batch;
* :func:`chebyshev_phase`, :func:`gibbs_damping`, :func:`kernel_polynomial_loss` — Kernelution's
  eigen-phase polynomial (paper eqs. 10–12) and its penalty.

The released code of the paper drops the scan's boundary carry (so its :math:`\Phi` is not unitary
and the last token never contributes) and inverts with swapped factors; the sweeps below are the
corrected ones (``docs/converter.md``, departures) and are tested against dense products of explicit
Givens matrices.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from graphattn.edgeset import (
    EdgeSet,
    _need_finite,
    _need_long,
    _need_tensor,
    _shape,
    ptr_from_counts,
)
from graphattn.memory import EDGE_BYTES, check_edges
from graphattn.origins import origin_code
from graphattn.structured import OperatorEdgeSet

KERNELS = ("dirichlet", "fejer", "jackson", "lanczos", "lorentz", "vekic", "wang")

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
    from graphattn.kernels.cpu_extension import cpu_ops

    ops = cpu_ops(warn=False)
    return ops if ops is not None and hasattr(ops, "linear_scan_") else None


# --------------------------------------------------------------------------------------------- Givens
def givens(half_sum: Tensor, half_diff: Tensor, half_gamma: Tensor) -> Tensor:
    r"""The SU(2) blocks of paper eq. 6, ``[..., 4]`` complex ``(ii, ij, ji, jj)``:

    .. math::
        \begin{bmatrix} ii & ij \\ ji & jj \end{bmatrix} =
        \begin{bmatrix} e^{-i s_+}\cos c & -e^{i s_-}\sin c \\
                        e^{-i s_-}\sin c & e^{i s_+}\cos c \end{bmatrix},\qquad
        s_\pm = \tfrac{\alpha \pm \beta}{2},\ c = \tfrac{\gamma}{2}.

    Unitary with determinant 1 for any real angles. The arguments are real tensors of one shape;
    the result is ``complex64`` for ``float32`` input and ``complex128`` for ``float64``.
    """
    c, s = torch.cos(half_gamma), torch.sin(half_gamma)
    cp, sp = torch.cos(half_sum), torch.sin(half_sum)
    cm, sm = torch.cos(half_diff), torch.sin(half_diff)
    ii = torch.complex(cp * c, -sp * c)
    ij = torch.complex(-cm * s, -sm * s)
    ji = torch.complex(cm * s, -sm * s)
    jj = torch.complex(cp * c, sp * c)
    return torch.stack([ii, ij, ji, jj], dim=-1)


def adjoint_rotations(rot: Tensor) -> Tensor:
    r"""The blocks of :math:`G^H` for blocks ``rot [..., 4] = (ii, ij, ji, jj)``:
    :math:`(\bar{ii}, \bar{ji}, \bar{ij}, \bar{jj})` (conjugate transpose of each 2×2 block)."""
    return rot[..., [0, 2, 1, 3]].conj()


def identity_rotations(rot: Tensor, mask: Tensor) -> Tensor:
    """``rot [P, 4]`` with the pairs where ``mask`` is set replaced by the exact identity
    ``(1, 0, 0, 1)`` (graph boundaries of a segmented chain: the scans reset there)."""
    eye = torch.tensor([1, 0, 0, 1], dtype=rot.dtype, device=rot.device)
    return torch.where(mask[:, None], eye, rot)


def givens_matrix(rot: Tensor, j: int, n: int) -> Tensor:
    """The explicit :math:`n \times n` matrix :math:`G_{j,j+1}` of the block ``rot [4]``."""
    g = torch.eye(n, dtype=rot.dtype, device=rot.device)
    g[j, j], g[j, j + 1], g[j + 1, j], g[j + 1, j + 1] = rot
    return g


def dense_givens_chain(rot: Tensor, order: str) -> Tensor:
    r"""Dense :math:`N \times N` product of the Givens rotations ``rot [N-1, 4]`` (test oracle).

    ``order="upper"``: :math:`H_u = G_{0,1} G_{1,2} \cdots G_{N-2,N-1}`;
    ``order="lower"``: :math:`H_l = G_{N-2,N-1} \cdots G_{1,2} G_{0,1}`. Each factor is applied as
    its 2×2 block on two columns (``upper``, right products) or two rows (``lower``, left
    products) of the running product, :math:`O(N^2)` per factor; equal to the product of the
    :func:`givens_matrix` s.
    """
    if order not in ("upper", "lower"):
        raise ValueError(f"'order' must be 'upper' or 'lower', got {order!r}")
    n = rot.size(0) + 1
    out = torch.eye(n, dtype=rot.dtype, device=rot.device)
    for j in range(n - 1):
        block = rot[j].reshape(2, 2)
        if order == "upper":
            out[:, j:j + 2] = out[:, j:j + 2] @ block
        else:
            out[j:j + 2] = block @ out[j:j + 2]
    return out


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
        raise ValueError(f"'a' must be [L] and 'b' [L, ...], got {_shape(a)} and {_shape(b)}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    shape = b.shape
    if b.numel() == 0:
        return b.to(dtype).clone()
    a, b = a.to(dtype).contiguous(), b.to(dtype).reshape(shape[0], -1).contiguous()
    return _LinearScan.apply(a, b, reverse).reshape(shape)


# --------------------------------------------------------------------------------------------- sweeps
def extend_rotations(rot: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-node coefficient arrays ``(ii, ij, ji, jj)``, each ``[N]``, of pair rotations
    ``rot [N-1, 4]``: ``ii, ij`` padded with ``(1, 0)`` at the end (pair ``j`` lives at node
    ``j``), ``ji, jj`` padded with ``(0, 1)`` at the start (pair ``j-1`` lives at node ``j``)."""
    one, zero = rot.new_ones(1), rot.new_zeros(1)
    ii, ij, ji, jj = rot.unbind(-1)
    return (torch.cat([ii, one]), torch.cat([ij, zero]), torch.cat([zero, ji]),
            torch.cat([one, jj]))


def _upper_into(x: Tensor, ii: Tensor, ij: Tensor, ji: Tensor, jj: Tensor, out: Tensor) -> Tensor:
    """:math:`H_u x` written into ``out`` (``[N, F]``, distinct from ``x``), no autograd."""
    torch.mul(ii[:, None], x, out=out)
    _scan_(ij, out, reverse=True)
    out.mul_(jj[:, None])
    out[1:].addcmul_(ji[1:, None], x[:-1])
    return out


def _lower_into(y: Tensor, ii: Tensor, ij: Tensor, ji: Tensor, jj: Tensor, out: Tensor) -> Tensor:
    """:math:`H_l y` written into ``out`` (``[N, F]``, distinct from ``y``), no autograd."""
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
            return _upper_into(x, ii, ij, ji, jj, torch.empty_like(x, dtype=ii.dtype))
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
            return _lower_into(y, ii, ij, ji, jj, torch.empty_like(y, dtype=ii.dtype))
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


def _sweep_inputs(x: Tensor, coef: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Contiguous inputs in one dtype; a real ``x`` of the coefficients' real dtype stays real
    (the first product promotes it, saving a complex copy)."""
    dtype = torch.promote_types(x.dtype, coef[0].dtype)
    if not (x.dtype == dtype or (not x.is_complex() and x.dtype == dtype.to_real())):
        x = x.to(dtype)
    return (x.contiguous(), *(c.to(dtype).contiguous() for c in coef))


def upper_sweep(x: Tensor, coef: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
    r""":math:`y = H_u x` with :math:`H_u = G_{0,1} G_{1,2} \cdots G_{N-2,N-1}`, ``x [N, F]``:

    .. math::
        h_{N-1} = x_{N-1},\quad h_j = ii_j x_j + ij_j h_{j+1};\qquad
        y_0 = h_0,\quad y_j = ji_{j-1} x_{j-1} + jj_{j-1} h_j

    (one reverse scan; ``coef`` from :func:`extend_rotations`).
    """
    if x.numel() == 0:
        return x.to(torch.promote_types(x.dtype, coef[0].dtype)).clone()
    return _UpperSweep.apply(*_sweep_inputs(x, coef))


def lower_sweep(y: Tensor, coef: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
    r""":math:`z = H_l y` with :math:`H_l = G_{N-2,N-1} \cdots G_{0,1}`, ``y [N, F]``:

    .. math::
        c_0 = y_0,\quad c_j = ji_{j-1} c_{j-1} + jj_{j-1} y_j;\qquad
        z_j = ii_j c_j + ij_j y_{j+1},\quad z_{N-1} = c_{N-1}

    (one forward scan; ``coef`` from :func:`extend_rotations`).
    """
    if y.numel() == 0:
        return y.to(torch.promote_types(y.dtype, coef[0].dtype)).clone()
    return _LowerSweep.apply(*_sweep_inputs(y, coef))


# -------------------------------------------------------------------------------------- Kernelution
def gibbs_damping(kernel: str, order: int, *, lanczos_m: int = 3, lorentz_xi: float = 4.0,
                  wang_a: float = 2.0, wang_b: float = 2.0) -> Tensor:
    r"""Gibbs damping factors :math:`g_0 .. g_K` (paper Table 6), ``float64 [K + 1]``,
    :math:`g_0 = 1`; with :math:`x_k = k / (K+1)`:

    ``dirichlet`` :math:`1`; ``fejer`` :math:`1 - x_k`; ``jackson``
    :math:`[(K{+}2{-}k)\cos\frac{k\pi}{K+2} + \sin\frac{k\pi}{K+2}\cot\frac{\pi}{K+2}]/(K{+}2)`;
    ``lanczos`` :math:`(\sin(\pi x_k)/(\pi x_k))^M`; ``lorentz``
    :math:`\sinh(\xi(1 - x_k))/\sinh\xi`; ``vekic``
    :math:`\tfrac12 - \tfrac12\tanh\frac{x_k - 1/2}{x_k(1 - x_k)}`; ``wang``
    :math:`\exp(-(a x_k)^b)`.
    """
    if kernel not in KERNELS:
        raise ValueError(f"'kernel' must be one of {KERNELS}, got {kernel!r}")
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"'order' must be a non-negative int, got {order!r}")
    K = order
    k = torch.arange(1, K + 1, dtype=torch.float64)
    x = k / (K + 1)
    if kernel == "dirichlet":
        g = torch.ones_like(k)
    elif kernel == "fejer":
        g = 1 - x
    elif kernel == "jackson":
        q = math.pi / (K + 2)
        g = ((K + 2 - k) * torch.cos(k * q) + torch.sin(k * q) / math.tan(q)) / (K + 2)
    elif kernel == "lanczos":
        g = (torch.sin(math.pi * x) / (math.pi * x)) ** lanczos_m
    elif kernel == "lorentz":
        g = torch.sinh(lorentz_xi * (1 - x)) / math.sinh(lorentz_xi)
    elif kernel == "vekic":
        g = 0.5 - 0.5 * torch.tanh((x - 0.5) / (x * (1 - x)))
    else:  # wang
        g = torch.exp(-((wang_a * x) ** wang_b))
    return torch.cat([torch.ones(1, dtype=torch.float64), g])


def chebyshev_phase(lam: Tensor, weight: Tensor, damping: Tensor) -> Tensor:
    r"""Kernelution's eigen-phases (paper eq. 10 with learnable :math:`w_k`):

    .. math::
        \varphi = \tfrac12 g_0 w_0 + \sum_{k=1}^{K} g_k w_k T_k(\lambda),\qquad
        T_0 = 1,\ T_1 = \lambda,\ T_k = 2\lambda T_{k-1} - T_{k-2}.

    Args:
        lam: ``[N]`` phases :math:`\lambda \in [-1, 1]`.
        weight: ``[K + 1]`` coefficients :math:`w`.
        damping: ``[K + 1]`` Gibbs factors :math:`g` (:func:`gibbs_damping`).
    """
    c = (weight * damping.to(weight.dtype)).to(lam.dtype)
    out = 0.5 * c[0] * torch.ones_like(lam)
    t_prev, t = torch.ones_like(lam), lam
    for k in range(1, c.numel()):
        if k > 1:
            t_prev, t = t, 2 * lam * t - t_prev
        out = out + c[k] * t
    return out


def kernel_polynomial_loss(weight: Tensor) -> Tensor:
    r"""Kernel polynomial loss (paper eq. 11) :math:`L_{KP} = \pi \sum_{k=1}^{K} k^2 w_k^2`.

    The paper derives it as :math:`\int_{-1}^{1} |p'(x)|^2 dx`, which is not exact (for
    :math:`k = 1` that integral is 2, not :math:`\pi`); the exact identity is
    :math:`\pi \sum_k k^2 w_k^2 = 2 \int_{-1}^{1} |p'(x)|^2 \sqrt{1 - x^2}\, dx`, a weighted
    Sobolev penalty on the phase polynomial.
    """
    k = torch.arange(weight.numel(), dtype=weight.dtype, device=weight.device)
    return math.pi * (k.square() * weight.square())[1:].sum()


# ------------------------------------------------------------------------------------------ operator
def stride_permutation(counts: Tensor, stride: int) -> Tensor:
    """``perm [N]`` of the fixed stride shuffle :math:`P` applied per graph (``P x = x[perm]``):
    each graph's local indices reshaped ``(n / M, M)``, transposed and flattened."""
    bad = counts % stride != 0
    if bool(bad.any()):
        raise ValueError(f"'stride'={stride} needs every graph size to be a multiple of it, "
                         f"got a graph of {int(counts[bad][0])} nodes")
    # slot l of a graph of n = m·M nodes (M = stride) reads its local node (l mod m)·M + l div m
    ptr = ptr_from_counts(counts)
    N = int(ptr[-1])
    graph = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts,
                                    output_size=N)
    start = ptr[graph]
    local = torch.arange(N, device=counts.device) - start
    m = counts[graph] // stride
    return start + (local % m) * stride + torch.div(local, m, rounding_mode="floor")


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
        _need_long("ptr", _need_tensor("ptr", ptr, dims=1))
        N = int(ptr[-1]) if ptr.numel() else 0
        for name, t, n in (("rot_l", rot_l, max(N - 1, 0)), ("rot_u", rot_u, max(N - 1, 0))):
            _need_tensor(name, t, dims=2)
            if not t.is_complex() or t.shape != (n, 4):
                raise ValueError(f"'{name}' must be a complex [{n}, 4] tensor (ii, ij, ji, jj per "
                                 f"pair), got {t.dtype} {_shape(t)}")
        for name, t in (("diag", diag), ("eig", eig)):
            _need_tensor(name, t, dims=1)
            if not t.is_complex() or t.numel() != N:
                raise ValueError(f"'{name}' must be a complex [{N}] tensor, got {t.dtype} {_shape(t)}")
        dtypes = {t.dtype for t in (rot_l, rot_u, diag, eig)}
        if len(dtypes) != 1:
            raise ValueError(f"'rot_l', 'rot_u', 'diag' and 'eig' must share one dtype, got {dtypes}")
        for name, t in (("rot_l", rot_l), ("rot_u", rot_u), ("diag", diag), ("eig", eig)):
            _need_finite(name, torch.view_as_real(t.detach()))
        if perm is not None:
            _need_long("perm", _need_tensor("perm", perm, dims=1))
            if perm.numel() != N:
                raise ValueError(f"'perm' must have shape [{N}], got {_shape(perm)}")
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
    def _coefs(self) -> tuple[tuple[Tensor, ...], ...]:
        if "coefs" not in self._cache:
            self._cache["coefs"] = tuple(
                extend_rotations(r) for r in (self.rot_u, self.rot_l, adjoint_rotations(self.rot_l),
                                              adjoint_rotations(self.rot_u)))
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
            raise ValueError(f"'v' must have one row per node ({self.num_nodes}), got {_shape(v)}")
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
        lo_h_e = (ii * e, ij, torch.cat([ji[:1], ji[1:] * e[:-1]]), jj)
        tracked = (x, self.rot_l, self.rot_u, e)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
            out = lower_sweep(upper_sweep(lower_sweep(upper_sweep(x, u), lo), lo_h_e), u_h)
        else:  # inference: two buffers in turn, no autograd state
            cast = [tuple(c.to(dtype).contiguous() for c in cf) for cf in (u, lo, lo_h_e, u_h)]
            x = x.contiguous()
            a = torch.empty(x.shape, dtype=dtype, device=x.device)
            b = torch.empty_like(a)
            _upper_into(x, *cast[0], a)
            _lower_into(a, *cast[1], b)
            _upper_into(b, *cast[2], a)
            out = _lower_into(a, *cast[3], b)
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

    def to_explicit(self, max_nodes_per_graph: int = 4096) -> EdgeSet:
        r"""The complete digraph of every graph (self-loops included) with complex weights
        :math:`w_{j \to i} = S_{ij}`, target-major (small graphs: :math:`n^2` edges per graph,
        one pass of the operator over ``n_max`` columns, shared by all heads)."""
        cached = self._cache.get("explicit")
        if cached is not None:
            return cached
        dense = self.local_dense(max_nodes_per_graph)  # [N, n_max]
        counts = self.ptr[1:] - self.ptr[:-1]
        N, dev = self.num_nodes, self.ptr.device
        graph = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts,
                                        output_size=N)
        per_target = counts[graph]
        E = int(per_target.sum())
        dst = torch.repeat_interleave(torch.arange(N, device=dev), per_target, output_size=E)
        first = torch.cumsum(per_target, 0) - per_target
        within = torch.arange(E, device=dev) - torch.repeat_interleave(first, per_target,
                                                                         output_size=E)
        src = self.ptr[graph][dst] + within
        w = dense[dst, within]
        es = EdgeSet(
            torch.stack([src, dst]),
            num_heads=self.num_heads,
            mode="weighted",
            weight=w[:, None].expand(E, self.num_heads),
            origin=torch.full((E,), origin_code("operator"), dtype=torch.long, device=dev),
            aux_loss=self.aux_loss,
            stats=self.stats,
        )
        self._cache["explicit"] = es
        return es

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
