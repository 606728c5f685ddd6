"""The cache-blocked CPU kernel (``kernels/csrc/edge_attention_blocked.cpp``) against the float64
reference: outputs and gradients with one block and with many (small ``block_bytes``), its layouts
against a torch construction, bit-identical results across runs and thread counts, and when it is
(not) used."""

from __future__ import annotations

import pytest
import torch
from graphattn.kernels import build_graph, cpu_extension, fused, fused_attention

from .test_fused import (
    GRAPHS,
    assert_bit_identical_across_runs_and_thread_counts,
    inputs,
    layer_edge_sets,
    naive_attention,
    power_law_graph,
    twin_layers,
)

pytestmark = pytest.mark.skipif(
    cpu_extension.cpu_ops(warn=False) is None
    or not cpu_extension.cpu_ops(warn=False).blocked_supported(),
    reason="the blocked kernel needs the CPU extension built with AVX2/FMA",
)


@pytest.fixture
def block_bytes(monkeypatch):
    """Sets ``fused.BLOCKED['block_bytes']`` for one test."""

    def set_bytes(n: int) -> None:
        monkeypatch.setitem(fused.BLOCKED, "block_bytes", n)

    return set_bytes


def run_blocked(kind, H, C, bias_dims, weight_dims, seed=0, isolated=2):
    src, dst, _ = GRAPHS[kind]()
    N = int(max(src.max(), dst.max())) + 1 + isolated
    q, k, v, bias, weight = inputs(N, H, C, src.numel(), dtype=torch.float32, seed=seed,
                                   bias_dims=bias_dims, weight_dims=weight_dims)
    graph = build_graph(torch.stack([src, dst]), N, N)
    scale = C**-0.5
    out = fused_attention(q, k, v, graph, bias=bias, weight=weight, scale=scale)
    leaves = [t for t in (q, k, v, bias, weight) if t is not None]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    rq, rk, rv, rb, rw = (next(it) if t is not None else None for t in (q, k, v, bias, weight))
    ref = naive_attention(rq, rk, rv, src, dst, None, rb, rw, scale, N)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, go.float())
    ref_grads = torch.autograd.grad(ref, ref_leaves, go)
    return out, ref, grads, ref_grads, graph


def blocks_used(graph) -> dict[bool, int]:
    """Number of blocks of the layouts the kernel built: {by_target: B}."""
    return {key[0]: layout[0].shape[0] for key, layout in graph._blocked.items()}


@pytest.mark.parametrize("kind", ["random", "local", "power_law"])
@pytest.mark.parametrize("H,C", [(4, 16), (8, 8), (4, 32), (4, 64)])
@pytest.mark.parametrize("bias_dims,weight_dims", [(2, 1), (1, 2), (0, 0)])
@pytest.mark.parametrize("budget", [8 << 20, 1000])
def test_matches_float64_reference(kind, H, C, bias_dims, weight_dims, budget, block_bytes):
    block_bytes(budget)
    out, ref, grads, ref_grads, graph = run_blocked(kind, H, C, bias_dims, weight_dims)
    used = blocks_used(graph)
    assert set(used) == {True, False}, "the blocked kernel did not run"
    if budget == 1000:  # 1000 bytes hold a few rows: many blocks on both sides
        assert used[True] > 2 and used[False] > 2
    else:
        assert used == {True: 1, False: 1}
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


def test_masking_bias_in_some_blocks(block_bytes):
    """-inf logits (masked edges) in some blocks of a row; every row keeps a finite edge."""
    block_bytes(600)
    N, H, C = 50, 4, 8
    g = torch.Generator().manual_seed(3)
    dst = torch.arange(N).repeat_interleave(12)
    src = torch.randint(0, N, (dst.numel(),), generator=g)
    q, k, v, bias, _ = inputs(N, H, C, src.numel(), dtype=torch.float32, seed=4, bias_dims=2,
                              weight_dims=0)
    with torch.no_grad():
        masked = torch.rand(src.numel(), H, generator=g) < 0.5
        masked[::12] = False  # the first edge of every row stays
        bias[masked] = float("-inf")
    graph = build_graph(torch.stack([src, dst]), N, N)
    out = fused_attention(q, k, v, graph, bias=bias)
    assert blocks_used(graph)[True] > 2
    ref = naive_attention(q.double(), k.double(), v.double(), src, dst, None, bias.double(), None,
                          C**-0.5, N)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_bit_identical_across_runs_and_thread_counts(block_bytes):
    block_bytes(64 << 10)
    src, dst = power_law_graph(3000, 40000, seed=7)
    graph = assert_bit_identical_across_runs_and_thread_counts(src, dst, 3000)
    assert min(blocks_used(graph).values()) > 2


@pytest.mark.parametrize("by_target", [True, False])
@pytest.mark.parametrize("edge_ids", [True, False])
def test_layout_matches_torch_construction(by_target, edge_ids):
    src, dst = power_law_graph(70, 600, seed=11)
    R, S, block = 70, 70, 9
    graph = build_graph(torch.stack([src, dst]), R, S)
    bptr, idx, eid = graph.blocked_layout(block, by_target=by_target, edge_ids=edge_ids)
    # the expected order: CSR edges (row, source) stably sorted by (block, row) / (block, source)
    rows = torch.repeat_interleave(torch.arange(R), (graph.rowptr[1:] - graph.rowptr[:-1]).long())
    col = graph.col.long()
    block_of = col // block if by_target else rows // block
    key_row = rows if by_target else col
    n_rows = R if by_target else S
    order = torch.argsort(block_of * n_rows + key_row, stable=True)
    expected_idx = (col if by_target else rows)[order]
    B = -(-(S if by_target else R) // block)
    counts = torch.bincount(block_of * n_rows + key_row, minlength=B * n_rows).view(B, n_rows)
    flat = torch.cat([torch.zeros(1, dtype=torch.long), counts.flatten().cumsum(0)])
    expected_ptr = flat[torch.arange(B)[:, None] * n_rows + torch.arange(n_rows + 1)]
    assert bptr.dtype == idx.dtype == torch.int32
    assert torch.equal(bptr.long(), expected_ptr)
    assert torch.equal(idx.long(), expected_idx)
    if edge_ids:
        assert torch.equal(eid.long(), graph.eid.long()[order])
    else:
        assert eid.numel() == 0
    # a layout with edge ids serves later calls without them
    if edge_ids:
        assert graph.blocked_layout(block, by_target=by_target, edge_ids=False)[2] is eid


def test_edge_ids_required_for_bias():
    ops = cpu_extension.cpu_ops()
    src, dst = power_law_graph(20, 80, seed=1)
    graph = build_graph(torch.stack([src, dst]), 20, 20)
    q, k, v, bias, _ = inputs(20, 4, 8, src.numel(), dtype=torch.float32, bias_dims=2,
                              weight_dims=0)
    layout = graph.blocked_layout(5, by_target=True, edge_ids=False)
    with pytest.raises(RuntimeError, match="edge ids"):
        ops.blocked_forward(q.detach(), k.detach(), v.detach(), *layout, bias.detach(), None, 0.3)


@pytest.mark.parametrize(
    "H,C,dtype,enabled",
    [(3, 16, torch.float32, True), (4, 5, torch.float32, True), (4, 16, torch.float64, True),
     (4, 16, torch.float32, False)],
)
def test_not_used_where_it_does_not_apply(H, C, dtype, enabled, monkeypatch):
    """Other head counts, channel sizes, dtypes (or the switch off) run the general kernel."""
    monkeypatch.setitem(fused.BLOCKED, "enabled", enabled)
    src, dst = power_law_graph(30, 200, seed=2)
    graph = build_graph(torch.stack([src, dst]), 30, 30)
    q, k, v, bias, weight = inputs(30, H, C, src.numel(), dtype=dtype)
    out = fused_attention(q, k, v, graph, bias=bias, weight=weight)
    out.sum().backward()
    assert graph._blocked == {}
    ref = naive_attention(q.double(), k.double(), v.double(), src, dst, None, bias.double(),
                          weight.double(), C**-0.5, 30)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_empty_rows_and_no_edges(block_bytes):
    block_bytes(1000)
    q, k, v, *_ = inputs(6, 4, 8, 0, dtype=torch.float32, bias_dims=0, weight_dims=0)
    graph = build_graph(torch.empty(2, 0, dtype=torch.long), 6, 6)
    out = fused_attention(q, k, v, graph)
    assert torch.equal(out, torch.zeros(6, 4, 8))
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(q.grad, torch.zeros_like(q))
    assert set(blocks_used(graph)) == {True, False}  # both blocked layouts were used


@pytest.mark.parametrize("name", ["shared", "virtual"])
def test_layer_on_blocked_kernel_matches_float64_reference(name, block_bytes, monkeypatch):
    """EdgeAttention in float32 with 4 heads (the blocked kernel, many blocks) against the float64
    reference layer: outputs, attention weights and gradients of x, parameters, bias, weight."""
    block_bytes(2000)
    chosen = []
    original = fused.blocked_rows

    def spy(*args):
        chosen.append(original(*args))
        return chosen[-1]

    monkeypatch.setattr(fused, "blocked_rows", spy)
    N, H = 40, 4
    es = layer_edge_sets(N, H)[name]
    fused_layer, ref_layer = twin_layers(F=6, C=8, H=H)
    x = torch.randn(N, 6, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    results = []
    for layer, dtype in ((fused_layer.float(), torch.float32), (ref_layer, torch.float64)):
        xx = x.to(dtype).requires_grad_()
        fields = {f: getattr(es, f).to(dtype).requires_grad_() for f in ("bias", "weight")
                  if getattr(es, f) is not None}
        extra = {"virtual_x": es.virtual_x.to(dtype)} if es.virtual_x is not None else {}
        out, (_, alpha) = layer(xx, es.replace(**fields, **extra), return_attention_weights=True)
        out.pow(2).sum().backward()
        grads = [xx.grad, *(t.grad for t in fields.values()), *(p.grad for p in layer.parameters())]
        results.append((out, alpha, grads))
    (out, alpha, grads), (rout, ralpha, rgrads) = results
    torch.testing.assert_close(out.double(), rout, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alpha.double(), ralpha, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, rgrads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)
    assert chosen and all(c is not None and c[0] < N for c in chosen)  # blocked, several blocks
