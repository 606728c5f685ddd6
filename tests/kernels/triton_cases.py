"""Cases for the Triton kernels, run on the CPU by Triton's interpreter (``TRITON_INTERPRET=1``),
or natively on a CUDA device.

Not collected by itself (the name does not match ``test_*.py``): ``test_triton.py`` runs this file
in a subprocess with ``TRITON_INTERPRET=1`` set before anything imports triton (PyG does, at import),
which the interpreter needs. Small graphs only (the interpreter runs every program in numpy):
outputs and gradients against the float64 reference of :mod:`tests.kernels.test_fused`, per-head
rows, the weighted mode, half precision storage, attention probabilities and bit-identical reruns.

Every case takes a keyword ``device`` (default :data:`DEVICE`): ``"cuda"`` when a CUDA device is
present and ``TRITON_INTERPRET`` is not set (the kernels then compile for the GPU; running this
file directly with pytest on such a machine, or ``test_triton_cuda.py``, which calls these cases
with ``device="cuda"``), else ``"cpu"`` (the interpreter). These tests check the math, not the
speed; the float64 oracle always runs on the CPU.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from graphattn.kernels import attention_probs, build_graph, fused_attention
from graphattn.kernels.fused import fused_explicit_attention

from tests.kernels.test_fused import (
    inputs,
    per_head_graph,
    power_law_graph,
    random_graph,
    run_both,
)

#: where the cases run by default: natively on CUDA when there is a device and no interpreter
DEVICE = ("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
          else "cpu")


@pytest.fixture(scope="module", autouse=True)
def interpreted():
    """On the CPU the kernels must be interpreted (``TRITON_INTERPRET=1`` before triton was
    imported); on CUDA they run compiled, and nothing is checked."""
    from graphattn.kernels import triton_attention

    if DEVICE == "cpu" and type(triton_attention._forward_kernel).__name__ != "InterpretedFunction":
        pytest.fail("run with TRITON_INTERPRET=1 set before triton is imported (see test_triton.py)")
    return triton_attention


SMALL = {
    "random": lambda: (*random_graph(10, 40, 20, isolated=2), None),
    "power_law": lambda: (*power_law_graph(12, 50, 21), None),
    "per_head": lambda: per_head_graph(8, 30, 2, 22),
}


def run(kind, dtype, *, bias_dims=2, weight_dims=1, softmax=True, C=5, seed=0, device=DEVICE):
    """:func:`tests.kernels.test_fused.run_both` on the Triton kernels and the small graphs (results
    on the CPU)."""
    out, ref, grads, ref_grads, dst, _, _ = run_both(
        kind, dtype=dtype, C=C, bias_dims=bias_dims, weight_dims=weight_dims, softmax=softmax,
        seed=seed, graphs=SMALL, H=2, isolated=1, backend="triton", device=device)
    return out, ref, grads, ref_grads, dst


@pytest.mark.parametrize("kind", list(SMALL))
def test_float64_outputs_and_gradients(kind, *, device=DEVICE):
    out, ref, grads, ref_grads, dst = run(kind, torch.float64, device=device)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11)
    isolated = torch.ones(out.size(0), dtype=torch.bool)
    isolated[dst] = False
    assert isolated.any() and torch.all(out[isolated] == 0)


def test_float32_shared_bias_head_and_edge_weight(*, device=DEVICE):
    out, ref, grads, ref_grads, _ = run("random", torch.float32, bias_dims=1, weight_dims=2, C=16,
                                        device=device)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


def test_weighted_mode(*, device=DEVICE):
    out, ref, grads, ref_grads, _ = run("random", torch.float64, bias_dims=0, softmax=False,
                                        device=device)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_half_storage_with_fp32_math(*, device=DEVICE):
    out, ref, *_ = run("random", torch.float16, bias_dims=0, weight_dims=0, C=8, device=device)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def naive_probs(q, k, src, dst, head, bias, scale, N):
    """Softmax coefficients per edge in float64 (independent of the kernels): ``[E, H]``, or
    ``[E]`` for per-head edges (``q, k [N, H, C]``, ``bias [E, H]`` / ``[E]`` or ``None``)."""
    q, k = q.detach().cpu().double(), k.detach().cpu().double()
    bias = None if bias is None else bias.detach().cpu().double()
    H = q.size(1)
    rows = dst if head is None else dst * H + head
    if head is None:
        logits = (q[dst] * k[src]).sum(-1) * scale  # [E, H]
    else:
        logits = (q[dst, head] * k[src, head]).sum(-1) * scale  # [E]
    if bias is not None:
        logits = logits + bias
    shape = (N * (H if head is not None else 1), *logits.shape[1:])
    index = rows.view(-1, *[1] * (logits.dim() - 1)).expand_as(logits)
    m = torch.full(shape, float("-inf"), dtype=torch.float64).scatter_reduce(0, index, logits, "amax")
    e = torch.exp(logits - m[rows])
    den = torch.zeros(shape, dtype=torch.float64).index_add(0, rows, e)
    return e / den[rows]


def test_probabilities_and_bit_identical_reruns(*, device=DEVICE):
    src, dst = random_graph(10, 40, 23, isolated=2)
    N, H, C = 10, 2, 4
    graph = build_graph(torch.stack([src, dst]).to(device), N, N)
    q, k, v, bias, _ = inputs(N, H, C, src.numel(), dtype=torch.float32, bias_dims=2,
                              weight_dims=0, device=device)

    def once():
        out, lse = fused_attention(q, k, v, graph, bias=bias, backend="triton", return_lse=True)
        return out, lse, *torch.autograd.grad(out.sum(), (q, k, v, bias))

    first, second = once(), once()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert all(t.device.type == device for t in first)
    p = attention_probs(q, k, first[1], graph, bias=bias, backend="triton")
    assert p.device.type == device and p.shape == (src.numel(), H)
    ref = naive_probs(q, k, src, dst, None, bias, C**-0.5, N)
    torch.testing.assert_close(p.cpu().double(), ref, rtol=1e-5, atol=1e-6)
    sums = torch.zeros(N, H).index_add_(0, dst, p.cpu())
    assert torch.allclose(sums[torch.bincount(dst, minlength=N) > 0], torch.tensor(1.0))


def test_layer_path_with_virtual_rows_and_dropout_mask(*, device=DEVICE):
    """``fused_explicit_attention`` (EdgeAttention's explicit path) on the Triton backend on
    per-head (virtual-row) edges with attention dropout, against the float64 oracle with the same
    mask (drawn on the CPU; on CUDA the kernel gets a copy)."""
    from graphattn.kernels import fused

    from graphattn import EdgeSet
    from tests.kernels.test_fused import naive_attention

    N, H, C = 8, 2, 3
    src, dst, head = per_head_graph(N, 30, H, 24)
    bias = torch.randn(src.numel(), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    es = EdgeSet(torch.stack([src, dst]), head=head, num_heads=H, bias=bias)
    q, k, v, *_ = inputs(N, H, C, 0, bias_dims=0, weight_dims=0)

    real_mask = fused.dropout_mask
    drawn = []

    def cpu_mask(num_edges, heads, p, like):  # the CPU generator's mask, on every device
        mask = real_mask(num_edges, heads, p, like.cpu())
        drawn.append(mask)
        return mask.to(like.device)

    torch.manual_seed(5)
    with mock.patch.object(fused, "dropout_mask", cpu_mask):
        out, alpha = fused_explicit_attention(q.to(device), k.to(device), v.to(device),
                                              es.to(device), N, scale=0.5, dropout=0.3,
                                              need_alpha=True, backend="triton")
    assert out.device.type == alpha.device.type == device
    (mask,) = drawn
    assert mask.shape == (src.numel(), 1) and (mask == 0).any() and (mask > 1).any()
    ref = naive_attention(q.detach(), k.detach(), v.detach(), src, dst, head, bias, mask[:, 0],
                          0.5, N)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-10, atol=1e-12)
    # alpha: the coefficients before dropout, [E, 1] for per-head edges
    ref_alpha = naive_probs(q, k, src, dst, head, bias, 0.5, N)[:, None]
    torch.testing.assert_close(alpha.cpu(), ref_alpha, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_gradcheck_tiny_graph(*, device=DEVICE):
    src, dst = random_graph(4, 6, 25, isolated=1)
    graph = build_graph(torch.stack([src, dst]).to(device), 4, 4)
    q, k, v, bias, weight = inputs(4, 1, 2, src.numel(), bias_dims=1, weight_dims=1, device=device)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, w: fused_attention(q, k, v, graph, bias=b, weight=w, backend="triton"),
        (q, k, v, bias, weight),
    )


# ------------------------------------------------------------------- edge features in the kernels
def naive_with_features(q, k, v, ef, src, dst, bias, weight, scale, R, softmax=True):
    """float64 reference with edge features ``f`` on rows (independent of the kernels): ``q
    [R, H, D]``, ``k, v [S, H, D]``, ``ef [E, H, D]``, ``src`` / ``dst`` the rows of each edge,
    ``bias`` / ``weight`` ``[E]`` or ``[E, H]``. ``(out [R, H, D], lse [R, H], p [E, H])`` of
    ``s = scale·q_i·(k_j + f_e) + b_e``, ``o_i = Σ p_e w_e (v_j + f_e)`` (weighted mode: ``p = 1``,
    ``lse = 0``)."""
    E, H, D = ef.shape

    def heads(t):
        return t[:, None].expand(E, H) if t.dim() == 1 else t

    if softmax:
        s = (q[dst] * (k[src] + ef)).sum(-1) * scale
        if bias is not None:
            s = s + heads(bias)
        index = dst[:, None].expand(E, H)
        m = torch.full((R, H), float("-inf"), dtype=s.dtype).scatter_reduce(0, index, s.detach(),
                                                                            "amax")
        e = torch.exp(s - m[dst])
        den = torch.zeros(R, H, dtype=s.dtype).index_add(0, dst, e)
        p = e / den[dst]
        lse = m + torch.log(den)
    else:
        p = torch.ones(E, H, dtype=v.dtype)
        lse = torch.zeros(R, H, dtype=v.dtype)
    c = p if weight is None else p * heads(weight)
    out = torch.zeros(R, H, D, dtype=v.dtype).index_add(0, dst, c[..., None] * (v[src] + ef))
    return out, lse, p


def run_with_features(kind, dtype, *, softmax=True, bias_dims=2, weight_dims=1, C=5, seed=1,
                      device=DEVICE):
    """The Triton kernels with edge features on graph ``kind`` of :data:`SMALL` (per-head graphs as
    virtual rows with ``[E, 1, C]`` features) and the float64 reference: ``(results, reference)``,
    each ``(out, lse, p, grads)`` on the CPU, ``p`` (``None`` in weighted mode) from
    :func:`attention_probs`, ``grads`` of ``(q, k, v, bias, weight, f)`` (those present)."""
    src, dst, head = SMALL[kind]()
    H = 2
    N = int(max(src.max(), dst.max())) + 2  # an isolated target
    E = src.numel()
    if head is not None:
        bias_dims, weight_dims = min(bias_dims, 1), min(weight_dims, 1)
    q, k, v, bias, weight = inputs(N, H, C, E, dtype=dtype, seed=seed, bias_dims=bias_dims,
                                   weight_dims=weight_dims, device=device)
    Hk = H if head is None else 1
    g = torch.Generator().manual_seed(seed + 1)
    ef = torch.randn(E, Hk, C, generator=g, dtype=dtype).to(device).requires_grad_()
    if not softmax:
        q = k = bias = None
    scale = C**-0.5
    graph = build_graph(torch.stack([src, dst]).to(device), N, N,
                        head=None if head is None else head.to(device), num_heads=H)
    leaves = [t for t in (q, k, v, bias, weight, ef) if t is not None]
    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    rq, rk, rv, rb, rw, rf = (next(it) if t is not None else None
                              for t in (q, k, v, bias, weight, ef))
    if head is None:
        rows, cols, R = dst, src, N

        def view(t):
            return t
    else:  # virtual rows target * H + head, one head each
        rows, cols, R = dst * H + head, src * H + head, N * H

        def view(t):
            return None if t is None else t.reshape(t.size(0) * H, 1, C)

    go = torch.randn(R, Hk, C, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    out, lse = fused_attention(view(q), view(k), view(v), graph, bias=bias, weight=weight,
                               scale=scale, softmax=softmax, backend="triton", return_lse=True,
                               edge_features=ef)
    assert out.device == v.device and out.dtype == dtype
    grads = torch.autograd.grad(out, leaves, go.to(dtype).to(device))
    p = None
    if softmax:
        p = attention_probs(view(q), view(k), lse, graph, bias=bias, scale=scale,
                            backend="triton", edge_features=ef).cpu()
    ref_out, ref_lse, ref_p = naive_with_features(view(rq), view(rk), view(rv), rf, cols, rows, rb,
                                                  rw, scale, R, softmax)
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, go)
    return ((out.cpu(), lse.cpu(), p, [t.cpu() for t in grads]),
            (ref_out.detach(), ref_lse.detach(), ref_p.detach() if softmax else None, ref_grads))


#: (rtol, atol) of outputs / lse / probabilities and of gradients against the float64 reference
EF_TOL = {torch.float64: ((1e-10, 1e-12), (1e-9, 1e-11)),
          torch.float32: ((1e-5, 1e-5), (1e-4, 1e-4))}


@pytest.mark.parametrize("kind", ["random", "per_head"])
@pytest.mark.parametrize("mode", ["attention", "weighted"])
@pytest.mark.parametrize("fields", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_edge_features_outputs_lse_probs_and_gradients(kind, mode, fields, dtype, *, device=DEVICE):
    """``k_j + f_e`` and ``v_j + f_e`` in the Triton kernels: output, ``lse``, probabilities and
    the gradients of q, k, v, bias, weight and f against the float64 reference, with and without
    bias / weight (float64: ``[E, H]`` bias, ``[E]`` weight; float32: the other way round)."""
    softmax = mode == "attention"
    dims = ((2, 1) if dtype == torch.float64 else (1, 2)) if fields else (0, 0)
    (out, lse, p, grads), (ref, ref_lse, ref_p, ref_grads) = run_with_features(
        kind, dtype, softmax=softmax, bias_dims=dims[0], weight_dims=dims[1], device=device)
    (rtol, atol), (grtol, gatol) = EF_TOL[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    assert lse.dtype == dtype
    torch.testing.assert_close(lse.double(), ref_lse, rtol=rtol, atol=atol)  # -inf: empty rows
    if softmax:
        assert torch.isinf(ref_lse).any()
        torch.testing.assert_close(p.double(), ref_p, rtol=rtol, atol=atol)
    assert len(grads) == 2 + 2 * softmax + fields * (1 + softmax)  # (q, k,) v, (bias,) weight, f
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=grtol, atol=gatol)


def test_half_storage_with_edge_features(*, device=DEVICE):
    """float16 storage (fp32 math): output and every gradient, edge features included, against the
    float64 reference."""
    (out, lse, p, grads), (ref, ref_lse, ref_p, ref_grads) = run_with_features(
        "random", torch.float16, bias_dims=2, weight_dims=1, C=8, device=device)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert grads[-1].dtype == torch.float16
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(p.double(), ref_p, rtol=2e-2, atol=2e-3)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=3e-2, atol=3e-2)


def test_operators_with_edge_features_match_the_cpu_extension(*, device=DEVICE):
    """The Triton operators called like the C++ ones (trailing ``ef``; ``backward_dst`` with
    ``need_def`` returning ``def`` 5th) give the C++ results on the same float64 inputs, over
    several chunks per row (``BLOCK_E = 4``); zero features give bit for bit the results without
    features; ``def`` only when asked for."""
    from graphattn.kernels import triton_attention as tri
    from graphattn.kernels.cpu_extension import cpu_ops

    ops = cpu_ops(warn=False)
    if ops is None:
        pytest.skip("the CPU extension is not available")
    src, dst = random_graph(9, 60, 26, isolated=2)
    N, H, D, E = 9, 2, 3, src.numel()
    gen = torch.Generator().manual_seed(27)
    q, k, v, dout, ef = (torch.randn(*s, generator=gen, dtype=torch.float64)
                         for s in ((N, H, D), (N, H, D), (N, H, D), (N, H, D), (E, H, D)))
    bias = torch.randn(E, generator=gen, dtype=torch.float64)
    weight = torch.rand(E, H, generator=gen, dtype=torch.float64) + 0.5
    cpu_graph = build_graph(torch.stack([src, dst]), N, N)
    graph = build_graph(torch.stack([src, dst]).to(device), N, N)

    def on(*ts):
        return [None if t is None else t.to(device) for t in ts]

    def same(a, b, exact=False):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert (x is None) == (y is None)
            if x is None:
                continue
            if exact:
                assert torch.equal(x, y)
            else:
                torch.testing.assert_close(x.cpu(), y, rtol=1e-12, atol=1e-12)

    with mock.patch.object(tri, "BLOCK_E", 4):
        for softmax in (True, False):
            qq, kk, b = (q, k, bias) if softmax else (v, v, None)
            cpu_args = (cpu_graph.rowptr, cpu_graph.col, cpu_graph.eid, b, weight, 0.7, softmax)
            args = (graph.rowptr, graph.col, graph.eid, *on(b, weight), 0.7, softmax)
            fwd = on(qq, kk, v)
            out, lse = ops.forward(qq, kk, v, *cpu_args, ef)
            same(tri.forward(*fwd, *args, *on(ef)), (out, lse))
            back = ops.backward_dst(qq, kk, v, out, dout, lse, *cpu_args, True, True, True, ef,
                                    True)
            dst_args = (*on(qq, kk, v, out, dout, lse), *args, True, True, True)
            same(tri.backward_dst(*dst_args, *on(ef), True), back)
            no_def = tri.backward_dst(*dst_args, *on(ef), False)
            assert no_def[4] is None
            same(no_def[:4], back[:4])
            dterm = back[3]
            src_args = (*on(qq, kk, v, dout, lse, dterm), *graph.csc(), *on(b, weight), 0.7,
                        softmax, True, True)
            same(tri.backward_src(*src_args, *on(ef)),
                 ops.backward_src(qq, kk, v, dout, lse, dterm, *cpu_graph.csc(), b, weight, 0.7,
                                  softmax, True, True, ef))
            if softmax:
                same([tri.probs(*on(q, k, lse), *args[:4], 0.7, *on(ef))],
                     [ops.probs(q, k, lse, *cpu_args[:4], 0.7, ef)])
            # zero features: bit for bit the kernels without (HAS_EF = False)
            (zero,) = on(torch.zeros_like(ef))
            same(tri.forward(*fwd, *args, zero), tri.forward(*fwd, *args), exact=True)
            same(tri.backward_dst(*dst_args, zero, True)[:4], tri.backward_dst(*dst_args)[:4],
                 exact=True)
            same(tri.backward_src(*src_args, zero), tri.backward_src(*src_args), exact=True)
    with pytest.raises(RuntimeError, match="edge features"):
        tri.forward(*on(q, k, v), *args, *on(ef[:, :1]))


def test_layer_path_with_edge_features(*, device=DEVICE):
    """``fused_explicit_attention`` with projected edge features on the Triton backend (per-head
    edges: each edge's own head) equals the C++ kernel: output, attention weights and gradients;
    the fused kernel accepts ``edge_attr`` on every backend."""
    from graphattn.kernels import fused
    from graphattn.kernels.cpu_extension import cpu_ops

    from graphattn import EdgeSet

    if cpu_ops(warn=False) is None:
        pytest.skip("the CPU extension is not available")
    N, H, C = 8, 2, 3
    src, dst, head = per_head_graph(N, 30, H, 28)
    E = src.numel()
    gen = torch.Generator().manual_seed(29)
    bias = torch.randn(E, generator=gen, dtype=torch.float64)
    attr = torch.randn(E, 4, generator=gen, dtype=torch.float64)
    es = EdgeSet(torch.stack([src, dst]), head=head, num_heads=H, bias=bias, edge_attr=attr)
    q, k, v, *_ = inputs(N, H, C, 0, bias_dims=0, weight_dims=0)
    f = torch.randn(E, H, C, generator=gen, dtype=torch.float64).requires_grad_()
    assert fused.unsupported_reason(es, v, "triton") is None
    results = []
    for backend, dev in (("triton", device), ("cpu", "cpu")):
        leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v, f)]
        out, alpha = fused_explicit_attention(*leaves[:3], es.to(dev), N, scale=0.5,
                                              need_alpha=True, backend=backend,
                                              edge_features=leaves[3])
        assert out.device.type == dev
        grads = torch.autograd.grad((out * out).sum(), leaves)
        results.append((out.detach().cpu(), alpha.cpu(), [g.cpu() for g in grads]))
    (out, alpha, grads), (ref, ref_alpha, ref_grads) = results
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-10, atol=1e-12)
    assert ref_grads[3].abs().sum() > 0
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_gradcheck_tiny_graph_with_edge_features(*, device=DEVICE):
    src, dst = random_graph(4, 6, 30, isolated=1)
    graph = build_graph(torch.stack([src, dst]).to(device), 4, 4)
    q, k, v, bias, weight = inputs(4, 1, 2, src.numel(), bias_dims=1, weight_dims=1, device=device)
    ef = torch.randn(src.numel(), 1, 2, dtype=torch.float64).to(device).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, w, f: fused_attention(q, k, v, graph, bias=b, weight=w, backend="triton",
                                                 edge_features=f),
        (q, k, v, bias, weight, ef),
    )
    assert torch.autograd.gradcheck(
        lambda v, w, f: fused_attention(None, None, v, graph, weight=w, softmax=False,
                                        backend="triton", edge_features=f),
        (v, weight, ef),
    )
