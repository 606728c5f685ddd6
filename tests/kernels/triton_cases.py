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
