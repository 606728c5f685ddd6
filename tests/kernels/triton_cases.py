"""Cases for the Triton kernels, run on the CPU by Triton's interpreter (``TRITON_INTERPRET=1``).

Not collected by itself (the name does not match ``test_*.py``): ``test_triton.py`` runs this file
in a subprocess with ``TRITON_INTERPRET=1`` set before anything imports triton (PyG does, at import),
which the interpreter needs. Small graphs only (the interpreter runs every program in numpy):
outputs and gradients against the float64 reference of :mod:`tests.kernels.test_fused`, per-head
rows, the weighted mode, half precision storage, attention probabilities and bit-identical reruns.
On a CUDA machine the same kernels compile for the GPU; these tests check the math, not the speed.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module", autouse=True)
def interpreted():
    """The kernels must be interpreted (``TRITON_INTERPRET=1`` before triton was imported)."""
    from graphattn.kernels import triton_attention

    if type(triton_attention._forward_kernel).__name__ != "InterpretedFunction":
        pytest.fail("run with TRITON_INTERPRET=1 set before triton is imported (see test_triton.py)")
    return triton_attention


SMALL = {
    "random": lambda: (*random_graph(10, 40, 20, isolated=2), None),
    "power_law": lambda: (*power_law_graph(12, 50, 21), None),
    "per_head": lambda: per_head_graph(8, 30, 2, 22),
}


def run(kind, dtype, *, bias_dims=2, weight_dims=1, softmax=True, C=5, seed=0):
    """:func:`tests.kernels.test_fused.run_both` on the Triton kernels and the small graphs."""
    out, ref, grads, ref_grads, dst, _, _ = run_both(
        kind, dtype=dtype, C=C, bias_dims=bias_dims, weight_dims=weight_dims, softmax=softmax,
        seed=seed, graphs=SMALL, H=2, isolated=1, backend="triton")
    return out, ref, grads, ref_grads, dst


@pytest.mark.parametrize("kind", list(SMALL))
def test_float64_outputs_and_gradients(kind):
    out, ref, grads, ref_grads, dst = run(kind, torch.float64)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11)
    isolated = torch.ones(out.size(0), dtype=torch.bool)
    isolated[dst] = False
    assert isolated.any() and torch.all(out[isolated] == 0)


def test_float32_shared_bias_head_and_edge_weight():
    out, ref, grads, ref_grads, _ = run("random", torch.float32, bias_dims=1, weight_dims=2, C=16)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


def test_weighted_mode():
    out, ref, grads, ref_grads, _ = run("random", torch.float64, bias_dims=0, softmax=False)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_half_storage_with_fp32_math():
    out, ref, *_ = run("random", torch.float16, bias_dims=0, weight_dims=0, C=8)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def test_probabilities_and_bit_identical_reruns():
    src, dst = random_graph(10, 40, 23, isolated=2)
    N, H, C = 10, 2, 4
    graph = build_graph(torch.stack([src, dst]), N, N)
    q, k, v, bias, _ = inputs(N, H, C, src.numel(), dtype=torch.float32, bias_dims=2,
                              weight_dims=0)

    def once():
        out, lse = fused_attention(q, k, v, graph, bias=bias, backend="triton", return_lse=True)
        return out, lse, *torch.autograd.grad(out.sum(), (q, k, v, bias))

    first, second = once(), once()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    p = attention_probs(q, k, first[1], graph, bias=bias, backend="triton")
    ref = attention_probs(q, k, first[1], graph, bias=bias, backend="cpu")
    torch.testing.assert_close(p, ref, rtol=1e-5, atol=1e-6)
    sums = torch.zeros(N, H).index_add_(0, dst, p)
    assert torch.allclose(sums[torch.bincount(dst, minlength=N) > 0], torch.tensor(1.0))


def test_layer_path_with_virtual_rows_and_dropout_mask():
    """``fused_explicit_attention`` (EdgeAttention's explicit path) on the Triton backend."""
    from graphattn import EdgeSet

    src, dst, head = per_head_graph(8, 30, 2, 24)
    es = EdgeSet(torch.stack([src, dst]), head=head, num_heads=2,
                 bias=torch.randn(src.numel(), dtype=torch.float64))
    q, k, v, *_ = inputs(8, 2, 3, 0, bias_dims=0, weight_dims=0)
    torch.manual_seed(5)
    out, alpha = fused_explicit_attention(q, k, v, es, 8, scale=0.5, dropout=0.3, need_alpha=True,
                                          backend="triton")
    torch.manual_seed(5)
    ref, ref_alpha = fused_explicit_attention(q, k, v, es, 8, scale=0.5, dropout=0.3,
                                              need_alpha=True, backend="cpu")
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_gradcheck_tiny_graph():
    src, dst = random_graph(4, 6, 25, isolated=1)
    graph = build_graph(torch.stack([src, dst]), 4, 4)
    q, k, v, bias, weight = inputs(4, 1, 2, src.numel(), bias_dims=1, weight_dims=1)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, w: fused_attention(q, k, v, graph, bias=b, weight=w, backend="triton"),
        (q, k, v, bias, weight),
    )
