"""Converter producer and its operator (specs/converter.md, tests T1-T10 and the operator half of T11).

The fast O(N D) scans are checked against dense products of explicit Givens matrices in float64,
and against the layer's explicit reference path on the materialised complete digraph.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from graphattn.kernels.linear_scan import (
    adjoint_rotations,
    extend_rotations,
    linear_scan,
    lower_sweep,
    scan_sequential,
    upper_sweep,
)
from torch.autograd import gradcheck

from graphattn import EdgeAttention, HybridLayer, origin_code
from graphattn.producers import build_producer
from graphattn.producers.converter import ConverterProducer
from graphattn.producers.converter.chain import (
    dense_givens_chain,
    givens,
    givens_matrix,
    identity_rotations,
    stride_permutation,
)
from graphattn.producers.converter.chain_operator import UnitaryChainOperator
from graphattn.producers.converter.kernelution import (
    KERNELS,
    chebyshev_phase,
    gibbs_damping,
    kernel_polynomial_loss,
)
from tests.helpers import make_batch

SIZES = [1, 2, 3, 7, 8, 64, 257]
F64, C128 = torch.float64, torch.complex128


def angles(n, gen, dtype=F64):
    """Full-range random angles for ``n`` pairs: ``(s+, s-, c)`` = ((α±β)/2, γ/2), α, β, γ ∈ [0, 2π]."""
    a, b, c = (torch.rand(3, n, generator=gen, dtype=dtype) * 2 * math.pi).unbind(0)
    return (a + b) / 2, (a - b) / 2, c / 2


def random_operator(sizes, seed=0, dtype=F64, phase_scale=1.0, num_heads=1):
    """A UnitaryChainOperator with full-range random angles (identity across graph boundaries)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.tensor(sizes, dtype=torch.long)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    N = int(ptr[-1])
    batch = torch.repeat_interleave(torch.arange(len(sizes)), counts)
    boundary = batch[1:] != batch[:-1]
    rot_l = identity_rotations(givens(*angles(max(N - 1, 0), gen, dtype)), boundary)
    rot_u = identity_rotations(givens(*angles(max(N - 1, 0), gen, dtype)), boundary)
    theta = torch.rand(N, generator=gen, dtype=dtype) * 2 * math.pi
    phi = (torch.rand(N, generator=gen, dtype=dtype) * 2 - 1) * phase_scale
    diag = torch.complex(theta.cos(), theta.sin())
    eig = torch.complex(phi.cos(), phi.sin())
    return UnitaryChainOperator(rot_l, rot_u, diag, eig, ptr, num_heads=num_heads), phi


def dense_phi(op):
    """Oracle Φ = diag(e^{iθ}) · H_l · H_u from dense Givens products (one graph, P = I)."""
    N = op.num_nodes
    if N == 1:
        return torch.diag(op.diag)
    return torch.diag(op.diag) @ dense_givens_chain(op.rot_l, "lower") @ dense_givens_chain(
        op.rot_u, "upper")


def eye(n, dtype=C128):
    return torch.eye(n, dtype=dtype)


# ------------------------------------------------------------------------------------------- T1
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-6)])
def test_givens_block_is_su2(dtype, tol):
    gen = torch.Generator().manual_seed(1)
    rot = givens(*angles(200, gen, dtype))
    G = rot.reshape(-1, 2, 2)
    I2 = torch.eye(2, dtype=G.dtype)
    assert (G.mH @ G - I2).abs().max() < tol
    assert (G @ G.mH - I2).abs().max() < tol
    assert (torch.linalg.det(G) - 1).abs().max() < tol
    # r^H formula == conj().T, and (ii, ij, ji, jj)^H = (jj, -ij, -ji, ii) for this parameterisation
    assert torch.equal(adjoint_rotations(rot).reshape(-1, 2, 2), G.mH.contiguous())
    swapped = torch.stack([rot[:, 3], -rot[:, 1], -rot[:, 2], rot[:, 0]], -1)
    assert (adjoint_rotations(rot) - swapped).abs().max() < tol


def test_dense_chain_oracle_equals_explicit_products():
    gen = torch.Generator().manual_seed(2)
    n = 7
    rot = givens(*angles(n - 1, gen))
    mats = [givens_matrix(rot[j], j, n) for j in range(n - 1)]
    upper = torch.linalg.multi_dot(mats)  # G01 G12 ... G56
    lower = torch.linalg.multi_dot(mats[::-1])  # G56 ... G01
    assert (dense_givens_chain(rot, "upper") - upper).abs().max() < 1e-14
    assert (dense_givens_chain(rot, "lower") - lower).abs().max() < 1e-14


# ------------------------------------------------------------------------------------------- T2
@pytest.fixture(params=["native", "blocked"])
def scan_impl(request, monkeypatch):
    """Both scans: the compiled CPU kernel (skipped if it cannot be built here) and the blocked
    torch scan."""
    import graphattn.kernels.linear_scan as ops

    if request.param == "native":
        if ops._native_scan_ops(torch.zeros(2, dtype=F64), torch.zeros(2, 1, dtype=F64)) is None:
            pytest.skip("the compiled CPU kernel is unavailable here")
    monkeypatch.setattr(ops, "NATIVE_SCAN", request.param == "native")
    return request.param


@pytest.mark.parametrize("L", [1, 2, 16, 17, 37, 300, 1024, 5003])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_sequential(L, reverse, scan_impl):
    gen = torch.Generator().manual_seed(L)
    a = torch.complex(torch.randn(L, generator=gen, dtype=F64), torch.randn(L, generator=gen, dtype=F64))
    a = a / a.abs().clamp_min(1) * 0.95
    a[torch.randint(0, L, (max(L // 50, 1),), generator=gen)] = 0  # resets
    b = torch.randn(L, 3, generator=gen, dtype=C128)
    if reverse:
        want = scan_sequential(a.flip(0), b.flip(0)).flip(0)
    else:
        want = scan_sequential(a, b)
    got = linear_scan(a, b, reverse=reverse)
    assert (got - want).abs().max() < 1e-12


def test_scan_reset_is_exact_and_real_inputs_work(scan_impl):
    a = torch.tensor([0.5, 0.0, 0.5, 0.5], dtype=F64)
    b = torch.tensor([[1.0], [2.0], [4.0], [8.0]], dtype=F64)
    assert linear_scan(a, b).view(-1).tolist() == [1.0, 2.0, 5.0, 10.5]
    assert linear_scan(a, b, reverse=True).view(-1).tolist() == [2.0, 2.0, 8.0, 8.0]
    assert linear_scan(a[:0], b[:0]).shape == (0, 1)
    with pytest.raises(ValueError, match="'a' must be"):
        linear_scan(a[:3], b)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_gradcheck(reverse, scan_impl):
    gen = torch.Generator().manual_seed(3)
    L = 37  # > the block length: exercises blocks, carries and the ragged tail
    a = (torch.randn(L, generator=gen, dtype=C128) * 0.7)
    a[11] = 0
    a.requires_grad_()
    b = torch.randn(L, 2, generator=gen, dtype=C128, requires_grad=True)
    assert gradcheck(lambda a, b: linear_scan(a, b, reverse=reverse), (a, b), fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, C128])
@pytest.mark.parametrize("reverse", [False, True])
def test_native_scan_equals_blocked_and_ignores_threads(dtype, reverse, monkeypatch):
    """The compiled scan is used on the CPU, equals the blocked torch scan to rounding, and gives
    bit-identical results on 1 and 2 threads (each column is one sequential recurrence)."""
    import graphattn.kernels.linear_scan as ops

    gen = torch.Generator().manual_seed(7)
    L, F = 4099, 70  # F not a multiple of the column grain; L large enough to run threaded
    a = torch.randn(L, generator=gen, dtype=C128) * 0.9
    b = torch.randn(L, F, generator=gen, dtype=C128)
    a, b = ((t if dtype.is_complex else t.real).to(dtype).contiguous() for t in (a, b))
    native = ops._native_scan_ops(a, b)
    if native is None:
        pytest.skip("the compiled CPU kernel is unavailable here")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops._scan_(a, b.clone(), reverse)
        torch.set_num_threads(2)
        two = ops._scan_(a, b.clone(), reverse)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    monkeypatch.setattr(ops, "NATIVE_SCAN", False)
    blocked = ops._scan_(a, b.clone(), reverse)
    tol = 1e-4 if dtype in (torch.float32, torch.complex64) else 1e-11
    assert (one - blocked).abs().max() <= tol * blocked.abs().max()


@pytest.mark.parametrize("complex_input", [False, True])
def test_sweeps_equal_dense_and_gradcheck(complex_input):
    gen = torch.Generator().manual_seed(4)
    n = 21
    rot = givens(*angles(n - 1, gen)).requires_grad_()
    dtype = C128 if complex_input else F64
    x = torch.randn(n, 3, generator=gen, dtype=dtype, requires_grad=True)
    coef = extend_rotations(rot)
    up = dense_givens_chain(rot.detach(), "upper")
    lo = dense_givens_chain(rot.detach(), "lower")
    assert (upper_sweep(x, coef) - up @ x.detach().to(C128)).abs().max() < 1e-13
    assert (lower_sweep(x, coef) - lo @ x.detach().to(C128)).abs().max() < 1e-13
    assert gradcheck(lambda x, r: upper_sweep(x, extend_rotations(r)), (x, rot), fast_mode=True)
    assert gradcheck(lambda x, r: lower_sweep(x, extend_rotations(r)), (x, rot), fast_mode=True)


# ---------------------------------------------------------------------------------------- T3-T5
@pytest.mark.parametrize("n", SIZES)
def test_phi_fast_equals_dense_and_is_unitary(n):
    op, _ = random_operator([n], seed=n)
    Phi = op.phi(eye(n))
    assert (Phi - dense_phi(op)).abs().max() < 1e-12  # T3
    I = eye(n)
    assert (Phi.mH @ Phi - I).abs().max() < 1e-10  # T4
    assert (Phi @ Phi.mH - I).abs().max() < 1e-10
    assert torch.linalg.matrix_rank(Phi) == n
    assert (torch.linalg.vector_norm(Phi, dim=0) - 1).abs().max() < 1e-12
    assert Phi[:, -1].abs().sum() > 0.5  # B1 guard: the last token contributes
    v = torch.randn(n, 4, dtype=C128, generator=torch.Generator().manual_seed(0))
    assert (op.phi_inv(op.phi(v)) - v).abs().max() < 1e-12  # T5 (B2 guard)
    assert (op.phi_inv(I) - Phi.mH).abs().max() < 1e-12


@pytest.mark.parametrize("n", [1, 7, 64, 257])
def test_unitarity_float32(n):
    op, _ = random_operator([n], seed=n, dtype=torch.float32)
    I = torch.eye(n, dtype=torch.complex64)
    Phi = op.phi(I)
    assert (Phi.mH @ Phi - I).abs().max() < 1e-5
    S = op.to_dense()
    assert (S.mH @ S - I).abs().max() < 1e-5


# ------------------------------------------------------------------------------------------- T6
@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_spectrum(n):
    op, phi = random_operator([n], seed=10 + n, phase_scale=3.0)
    Phi = op.phi(eye(n))
    S = op.phi_inv(op.eig[:, None] * Phi)
    I = eye(n)
    assert (S.mH @ S - I).abs().max() < 1e-10
    assert (S @ S.mH - S.mH @ S).abs().max() < 1e-10  # normal
    U = Phi.mH  # eigenvectors = columns of Φ^H
    assert (S @ U - U * op.eig[None, :]).abs().max() < 1e-10
    ev = torch.linalg.eigvals(S)
    assert (ev.abs() - 1).abs().max() < 1e-10
    assert torch.allclose(ev.angle().sort().values, phi.sort().values, atol=1e-8)
    # the diagonal phases θ cancel in S: the fast operator (which skips them) is the same matrix
    assert (op.to_dense() - S).abs().max() < 1e-12


# ------------------------------------------------------------------------------------------- T7
@pytest.mark.parametrize("n", SIZES)
def test_fast_operator_equals_dense(n):
    op, _ = random_operator([n], seed=20 + n, phase_scale=3.0)
    Phi = dense_phi(op)
    S = Phi.mH @ torch.diag(op.eig) @ Phi
    gen = torch.Generator().manual_seed(n)
    V = torch.randn(n, 5, generator=gen, dtype=C128)
    R = torch.randn(n, 2, 3, generator=gen, dtype=F64)
    assert (op.matvec(V) - S @ V).abs().max() < 1e-12
    assert (op.rmatvec(V) - S.mH @ V).abs().max() < 1e-12
    assert (op.matvec(R) - torch.einsum("ij,jhc->ihc", S, R.to(C128))).abs().max() < 1e-12
    assert (op.to_dense() - S).abs().max() < 1e-12


def test_stride_permutation():
    counts = torch.tensor([6, 4])
    perm = stride_permutation(counts, 2)
    assert perm.tolist() == [0, 2, 4, 1, 3, 5, 6, 8, 7, 9]
    with pytest.raises(ValueError, match="stride"):
        stride_permutation(torch.tensor([5]), 2)
    base, _ = random_operator([6, 4], seed=5)
    op = UnitaryChainOperator(base.rot_l, base.rot_u, base.diag, base.eig, base.ptr, perm=perm)
    P = torch.eye(10, dtype=C128)[perm]  # P x = x[perm]
    no_p = UnitaryChainOperator(base.rot_l, base.rot_u, base.diag, base.eig, base.ptr)
    assert (op.phi(eye(10)) - no_p.phi(eye(10)) @ P).abs().max() < 1e-12
    assert (op.to_dense() - P.T @ no_p.to_dense() @ P).abs().max() < 1e-12


# ------------------------------------------------------------------------------------------- T8
def test_gibbs_damping_closed_forms():
    for K in (1, 2, 5):
        k = np.arange(1, K + 1)
        x = k / (K + 1)
        q = np.pi / (K + 2)
        want = {
            "dirichlet": np.ones(K),
            "fejer": 1 - x,
            "jackson": ((K + 2 - k) * np.cos(k * q) + np.sin(k * q) / np.tan(q)) / (K + 2),
            "lanczos": (np.sin(np.pi * x) / (np.pi * x)) ** 3,
            "lorentz": np.sinh(4.0 * (1 - x)) / np.sinh(4.0),
            "vekic": 0.5 - 0.5 * np.tanh((x - 0.5) / (x * (1 - x))),
            "wang": np.exp(-((2.0 * x) ** 2)),
        }
        for kernel in KERNELS:
            g = gibbs_damping(kernel, K).numpy()
            assert g[0] == 1.0
            np.testing.assert_allclose(g[1:], want[kernel], rtol=1e-12, atol=1e-15)
    # Jackson at K = 2 by hand: g1 = (3 cos π/4 + sin π/4 · cot π/4)/4 = √2/2, g2 = (0 + 1·1)/4
    np.testing.assert_allclose(gibbs_damping("jackson", 2).numpy(), [1.0, math.sqrt(0.5), 0.25])
    with pytest.raises(ValueError, match="kernel"):
        gibbs_damping("gauss", 2)


@pytest.mark.parametrize("kernel", ["dirichlet", "jackson", "lorentz"])
def test_chebyshev_phase_equals_numpy(kernel):
    K = 5
    gen = torch.Generator().manual_seed(6)
    lam = torch.rand(50, generator=gen, dtype=F64) * 2 - 1
    w = torch.randn(K + 1, generator=gen, dtype=F64)
    g = gibbs_damping(kernel, K)
    coef = (w * g).numpy().copy()
    coef[0] *= 0.5  # paper eq. 10: ½ g0 w0
    want = np.polynomial.chebyshev.chebval(lam.numpy(), coef)
    np.testing.assert_allclose(chebyshev_phase(lam, w, g).numpy(), want, rtol=1e-12, atol=1e-13)


def test_kernelution_initial_filter_and_eigenvalues():
    prod = ConverterProducer(8, order=2).double()
    lam = torch.linspace(-1, 1, 9, dtype=F64)
    want = 4 / 3 * lam**2 + 2 / 3 * lam - 1 / 3  # the released code's filter at init (K = 2)
    assert torch.allclose(prod.phase(lam), want, atol=1e-12)
    x = torch.randn(11, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    op = prod(x)
    _, lam_x = prod.eigen_parameters(x)
    assert torch.allclose(op.eig.angle(), prod.phase(lam_x), atol=1e-12)
    ev = torch.linalg.eigvals(op.to_dense())
    assert (ev.abs() - 1).abs().max() < 1e-10
    assert torch.allclose(ev.angle().sort().values, prod.phase(lam_x).sort().values, atol=1e-8)
    syn = ConverterProducer(8, kpm=False).double()
    assert syn.cheb_weight is None and syn(x).aux_loss is None
    assert syn.phase(lam) is lam


def test_kernel_polynomial_loss_and_its_gradient():
    w = torch.tensor([0.3, -0.7, 0.2, 1.1], dtype=F64, requires_grad=True)
    loss = kernel_polynomial_loss(w)
    k = torch.arange(4, dtype=F64)
    assert torch.allclose(loss, math.pi * (k[1:] ** 2 * w[1:] ** 2).sum())
    loss.backward()
    assert torch.allclose(w.grad, 2 * math.pi * k**2 * w.detach())
    # the exact identity behind eq. 11 (specs pitfall 7): π Σ k² w_k² = 2 ∫ |p'|² √(1 - x²) dx
    c = w.detach().numpy().copy()
    c[0] *= 0.5
    dp = np.polynomial.chebyshev.chebder(c)
    x, wq = np.polynomial.legendre.leggauss(400)
    integral = 2 * np.sum(wq * np.polynomial.chebyshev.chebval(x, dp) ** 2 * np.sqrt(1 - x**2))
    assert abs(integral - loss.item()) < 1e-3 * loss.item()
    prod = ConverterProducer(4, kp_weight=0.01).double()
    es = prod(torch.randn(3, 4, dtype=F64))
    assert torch.allclose(es.aux_loss, 0.01 * kernel_polynomial_loss(prod.cheb_weight))
    assert ConverterProducer(4, kp_weight=0.0)(torch.randn(3, 4)).aux_loss is None


# ------------------------------------------------------------------------------------------- T9
def _layer(channels, out, **kw):
    return EdgeAttention(channels, out, heads=2, mode="weighted", complex_output="complex", **kw).double()


def test_explicit_round_trip_equals_operator_through_the_layer():
    batch = make_batch([5, 1, 0, 8, 3], channels=6, seed=1)
    prod = ConverterProducer(6, dropout=0.0).double()
    fast = _layer(6, 3)
    ref = _layer(6, 3, kernel="reference")
    ref.load_state_dict(fast.state_dict())
    x1 = batch.x.clone().requires_grad_()
    x2 = batch.x.clone().requires_grad_()
    o1 = fast(x1, prod, batch.batch)
    es = prod(batch.x, batch.batch)
    ex = es.to_explicit()
    counts = (batch.ptr[1:] - batch.ptr[:-1])
    assert ex.num_edges == int((counts**2).sum()) == es.num_edges
    assert torch.equal(batch.batch[ex.edge_index[0]], batch.batch[ex.edge_index[1]])
    assert (ex.origin == origin_code("operator")).all() and ex.weight.is_complex()
    o2 = ref(x2, prod, batch.batch)
    assert o1.is_complex() and (o1 - o2).abs().max() < 1e-12
    w = torch.randn(o1.shape, dtype=C128, generator=torch.Generator().manual_seed(0))
    g1 = torch.autograd.grad((o1 * w).real.sum(), [x1, *prod.parameters()])
    g2 = torch.autograd.grad((o2 * w).real.sum(), [x2, *prod.parameters()])
    for a, b in zip(g1, g2, strict=True):
        assert (a - b).abs().max() < 1e-11
    # the default layer keeps the real part; attention weights come back as S entries
    real = EdgeAttention(6, 3, heads=2, mode="weighted").double()
    real.lin_value.load_state_dict(fast.lin_value.state_dict())
    out, (ei, alpha) = real(batch.x, prod, batch.batch, return_attention_weights=True)
    assert not out.is_complex() and (out - o1.real.reshape(out.shape)).abs().max() < 1e-12
    S = es.to_dense()
    assert (alpha[:, 0] - S[ei[1], ei[0]]).abs().max() < 1e-12


def test_topk_approximation_and_row_energy():
    op, _ = random_operator([9, 4, 1], seed=7)
    S = op.to_dense()
    prev = torch.zeros(op.num_nodes, dtype=F64)
    for k in (1, 2, 4, 9):
        energy = op.row_energy_captured(k)
        assert (energy >= prev - 1e-12).all() and (energy <= 1 + 1e-12).all()
        prev = energy
    assert torch.allclose(prev, torch.ones_like(prev))
    exact = op.to_topk(9)
    assert exact.stats["approximation"] is True and exact.num_edges == 81 + 16 + 1
    dense = torch.zeros(14, 14, dtype=C128)
    dense[exact.edge_index[1], exact.edge_index[0]] = exact.weight[:, 0]
    assert (dense - S).abs().max() < 1e-12
    approx = op.to_topk(2)
    assert approx.num_edges == 2 * 13 + 1
    assert approx.stats["row_energy_min"] <= approx.stats["row_energy_mean"] <= 1
    assert torch.equal(op.ptr.new_tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2])[
        approx.edge_index[1]], op.ptr.new_tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2])[
        approx.edge_index[0]])
    picked = S[approx.edge_index[1], approx.edge_index[0]].abs()
    for i in range(14):  # the kept entries are each row's largest
        row = picked[approx.edge_index[1] == i]
        others = S[i].abs()
        assert row.min() >= others.sort(descending=True).values[row.numel() - 1] - 1e-15
    with pytest.raises(ValueError, match="max_nodes_per_graph"):
        op.to_topk(2, max_nodes_per_graph=5)
    with pytest.raises(ValueError, match="'k'"):
        op.to_topk(0)


# ------------------------------------------------------------------------------------------ T10
def test_batching_is_block_diagonal_without_leakage():
    sizes = [3, 1, 5, 2, 7]
    batch = make_batch(sizes, channels=6, seed=2)
    prod = ConverterProducer(6).double().eval()
    op = prod(batch.x, batch.batch)
    S = op.to_dense()
    block = batch.batch[:, None] == batch.batch[None, :]
    assert torch.equal(S[~block], torch.zeros_like(S[~block]))  # exactly 0 off the blocks
    v = torch.randn(batch.num_nodes, 4, dtype=F64, generator=torch.Generator().manual_seed(3))
    flat = op.matvec(v)
    for g in range(len(sizes)):
        s, e = int(batch.ptr[g]), int(batch.ptr[g + 1])
        alone = prod(batch.x[s:e]).matvec(v[s:e])
        assert (flat[s:e] - alone).abs().max() < 1e-12
    # perturbing graph 2 leaves every other graph's output bit-identical
    layer = EdgeAttention(6, 4, mode="weighted", complex_output="complex").double()
    x = batch.x.clone().requires_grad_()
    out = layer(x, prod, batch.batch)
    x2 = batch.x.clone()
    mask = batch.batch == 2
    x2[mask] += torch.randn(int(mask.sum()), 6, dtype=F64)
    out2 = layer(x2, prod, batch.batch)
    assert torch.equal(out[~mask], out2[~mask]) and not torch.equal(out[mask], out2[mask])
    # the gradient of graph 2's output with respect to the other graphs' inputs is exactly 0
    (grad,) = torch.autograd.grad(out[mask].abs().square().sum(), x)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask])) and grad[mask].abs().sum() > 0


def test_tiny_graphs():
    prod = ConverterProducer(4).double()
    x = torch.randn(1, 4, dtype=F64)
    op = prod(x)
    S = op.to_dense()
    assert S.shape == (1, 1) and torch.allclose(S[0, 0], op.eig[0])  # S = e^{iφ}
    batch = make_batch([0, 3, 0, 1, 0], channels=4, seed=4)
    op = prod(batch.x, batch.batch)
    assert op.to_explicit().num_edges == 9 + 1
    out = EdgeAttention(4, 2, mode="weighted").double()(batch.x, prod, batch.batch)
    assert out.shape == (4, 2) and torch.isfinite(out).all()
    empty = make_batch([0, 0], channels=4)
    op = prod(empty.x, empty.batch)
    assert op.matvec(torch.zeros(0, 1, 2)).shape == (0, 1, 2) and op.to_explicit().num_edges == 0
    layer = EdgeAttention(4, 2, mode="weighted").double()
    assert layer(empty.x, prod, empty.batch).shape == (0, 2)


# ------------------------------------------------------------------------------------- T11 (op)
def test_operator_gradcheck():
    """gradcheck of S v with respect to v, every angle, θ and φ (N = 5, D = 2, float64)."""
    n = 5
    gen = torch.Generator().manual_seed(8)
    ang = (torch.rand(6, n - 1, generator=gen, dtype=F64) * 2 * math.pi).requires_grad_()
    theta = torch.randn(n, generator=gen, dtype=F64, requires_grad=True)
    phi = torch.randn(n, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(n, 2, generator=gen, dtype=C128, requires_grad=True)

    def unit(t):
        return torch.polar(torch.ones_like(t), t)

    def apply(v, ang, theta, phi, adjoint=False):
        op = UnitaryChainOperator(givens(*ang[:3]), givens(*ang[3:]), unit(theta), unit(phi),
                                  torch.tensor([0, n]))
        return op.rmatvec(v) if adjoint else op.matvec(v)

    assert gradcheck(apply, (v, ang, theta, phi))
    assert gradcheck(lambda *a: apply(*a, adjoint=True), (v, ang, theta, phi))

    def phi_apply(v, ang, theta):
        op = UnitaryChainOperator(givens(*ang[:3]), givens(*ang[3:]), unit(theta),
                                  torch.ones(n, dtype=C128), torch.tensor([0, n]))
        return op.phi(v), op.phi_inv(v)

    assert gradcheck(phi_apply, (v, ang, theta))


def test_producer_parameters_all_receive_gradient():
    batch = make_batch([6, 1, 4], channels=8, seed=5)
    prod = ConverterProducer(8, dropout=0.1).double()
    layer = EdgeAttention(8, 8, mode="weighted").double()
    layer.train()
    out = layer(batch.x, prod, batch.batch)
    (out.square().sum() + prod.kp_loss()).backward()
    for name, p in prod.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


# ------------------------------------------------------------------------- contract and options
def test_registry_mode_and_hybrid_layer():
    prod = build_producer({"name": "converter", "order": 3, "kernel": "jackson"}, channels=8,
                          heads=2, num_heads=2)
    assert isinstance(prod, ConverterProducer) and prod.mode == "weighted"
    assert "kernelution(order=3, kernel='jackson')" in repr(prod)
    layer = HybridLayer(8, producer="converter", heads=2)
    names = {n for n, _ in layer.attn.named_parameters()}
    assert names == {"lin_value.weight", "lin_value.bias"}  # no query / key
    batch = make_batch([5, 3], channels=8, dtype=torch.float32)
    out = layer(batch.x, batch=batch.batch, data=batch)
    assert out.shape == (8, 8) and torch.isfinite(out).all()
    assert layer.last_edges.structure == "operator" and layer.last_edges.num_heads == 2


def test_validation_errors():
    with pytest.raises(ValueError, match="'kernel'"):
        ConverterProducer(8, kernel="gauss")
    with pytest.raises(ValueError, match="'angle_param'"):
        ConverterProducer(8, angle_param="free")
    with pytest.raises(ValueError, match="'channels'"):
        ConverterProducer(0)
    with pytest.raises(ValueError, match="'dropout'"):
        ConverterProducer(8, dropout=1.0)
    for bad in (-1, float("inf"), "0.1"):
        with pytest.raises(ValueError, match="'kp_weight'"):
            ConverterProducer(8, kp_weight=bad)
    prod = ConverterProducer(4)
    with pytest.raises(ValueError, match="channels=4"):
        prod(torch.randn(3, 5))
    with pytest.raises(ValueError, match="NaN"):
        prod(torch.tensor([[float("nan")] * 4]))
    with pytest.raises(ValueError, match="sorted"):
        prod(torch.randn(3, 4), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="stride"):
        ConverterProducer(4, stride=2)(torch.randn(3, 4))
    op, _ = random_operator([3, 2])
    with pytest.raises(ValueError, match="rot_l"):
        UnitaryChainOperator(op.rot_l[:2], op.rot_u, op.diag, op.eig, op.ptr)
    with pytest.raises(ValueError, match="'eig'"):
        UnitaryChainOperator(op.rot_l, op.rot_u, op.diag, op.eig.real, op.ptr)
    with pytest.raises(ValueError, match="one dtype"):
        UnitaryChainOperator(op.rot_l, op.rot_u, op.diag, op.eig.to(torch.complex64), op.ptr)
    leaky = op.rot_l.clone()
    leaky[2] = op.rot_l[0]  # pair (2, 3) straddles the two graphs
    with pytest.raises(ValueError, match="identity"):
        UnitaryChainOperator(leaky, op.rot_u, op.diag, op.eig, op.ptr)
    with pytest.raises(ValueError, match="one row per node"):
        op.matvec(torch.randn(4, 2))
    with pytest.raises(ValueError, match="agree with 'ptr'"):
        op.validate(5, torch.tensor([0, 0, 1, 1, 1]))
    assert op.validate(5, torch.tensor([0, 0, 0, 1, 1])) is op
    assert "UnitaryChainOperator(num_nodes=5, num_graphs=2" in repr(op)


def test_determinism_and_dropout_generator():
    x = torch.randn(9, 8, generator=torch.Generator().manual_seed(0))
    prod = ConverterProducer(8, dropout=0.5)
    a = prod.eval()(x).to_dense()
    assert torch.equal(a, prod(x).to_dense())  # eval: deterministic, no dropout
    prod.train()
    g1 = prod(x, generator=torch.Generator().manual_seed(5)).to_dense()
    g2 = prod(x, generator=torch.Generator().manual_seed(5)).to_dense()
    g3 = prod(x, generator=torch.Generator().manual_seed(6)).to_dense()
    assert torch.equal(g1, g2) and not torch.equal(g1, g3) and not torch.equal(g1, a)


def test_angle_parameterisations():
    x = torch.randn(20, 14, generator=torch.Generator().manual_seed(1), dtype=F64)
    code = ConverterProducer(14, angle_param="code").double()
    paper = ConverterProducer(14, angle_param="paper").double()
    paper.load_state_dict(code.state_dict())
    p_code, lam_code = code.eigen_parameters(x)
    p_paper, lam_paper = paper.eigen_parameters(x)
    assert torch.equal(lam_code, lam_paper)
    # FixNorm: unit-norm features, so every bin mean of 2 features is at most 1/√2
    assert p_code.abs().max() <= math.sqrt(0.5) + 1e-12
    h = code.fixnorm(code.eigvec_siren(x))
    assert torch.allclose(torch.linalg.vector_norm(h, dim=-1), torch.ones(20, dtype=F64), atol=1e-4)
    assert not torch.allclose(p_code, p_paper)
    for prod in (code, paper):
        S = prod(x).to_dense()
        assert (S.mH @ S - torch.eye(20, dtype=C128)).abs().max() < 1e-10


def _off_diagonal_energy(prod, x, batch):
    """``1 - |S_ii|^2`` per row (the rows of the unitary ``S`` have unit norm)."""
    with torch.no_grad():
        S = prod(x, batch).to_dense()
    assert (S.mH @ S - torch.eye(x.size(0), dtype=S.dtype)).abs().max() < 1e-10
    return 1 - S.diagonal().abs() ** 2


@pytest.mark.parametrize("D", [32, 64])
@pytest.mark.parametrize("kpm", [True, False])
def test_mixing_initialisation(kpm, D):
    """The paper's initialisation (mean phase readout, pooled angles near 0) starts with
    S ≈ e^{iφ̄} I: the phases bunch and the Givens blocks are near-diagonal. The linear phase
    readout and the 45° angle offset start with an operator that mixes tokens (issue criterion:
    off-diagonal energy per row ≥ 0.1 on a random batch), still exactly unitary."""
    sizes = [40, 64, 25]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(sum(sizes), D, generator=gen, dtype=F64)
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    torch.manual_seed(0)
    paper = ConverterProducer(D, kpm=kpm).double()
    mixing = ConverterProducer(D, kpm=kpm, phase_readout="linear", gamma_offset=0.25).double()
    assert _off_diagonal_energy(paper, x, batch).mean() < 0.01
    energy = _off_diagonal_energy(mixing, x, batch)
    assert energy.mean() >= 0.1
    _, lam = mixing.eigen_parameters(x)
    assert lam.abs().max() <= 1 and lam.std() > 0.3  # the phases spread over [-1, 1]


def test_linear_phase_readout_options_and_gradient():
    prod = ConverterProducer(8, phase_readout="linear", gamma_offset=0.25).double()
    assert "phase_readout='linear', gamma_offset=0.25" in repr(prod)
    assert prod.eigval_readout is not None and prod.eigval_readout.shape == (8,)
    assert ConverterProducer(8).eigval_readout is None  # the paper's state dict, unchanged
    batch = make_batch([6, 1, 4], channels=8, seed=5)
    layer = EdgeAttention(8, 8, mode="weighted").double()
    out = layer(batch.x, prod, batch.batch)
    (out.square().sum() + prod.kp_loss()).backward()
    for name, p in prod.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    # the offset is in turns of π on γ/2: 2 is a whole turn, the same operator as 0
    x = torch.randn(7, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    a = ConverterProducer(8).double()
    b = ConverterProducer(8, gamma_offset=2.0).double()
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b(x).to_dense(), a(x).to_dense())
    for bad in ("0.25", True, float("nan")):
        with pytest.raises(ValueError, match="'gamma_offset'"):
            ConverterProducer(8, gamma_offset=bad)
    with pytest.raises(ValueError, match="'phase_readout'"):
        ConverterProducer(8, phase_readout="max")


def test_node_order_matters():
    """The operator is not permutation-equivariant (documented): relabelling the nodes of a graph
    changes S beyond the relabelling, because the Givens chain follows the node order."""
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(2), dtype=F64)
    prod = ConverterProducer(8, angle_param="paper").double()
    with torch.no_grad():  # a model whose rotations are far from the identity
        prod.eigvec_siren.lin2.weight.mul_(20)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    S = prod(x).to_dense()
    S_perm = prod(x[perm]).to_dense()
    assert (S_perm - S[perm][:, perm]).abs().max() > 1e-2
