"""Sliceformer producer: the spec's tests S1–S12 (specs/sliceformer.md §6) that apply to an edge set.

Exactness against ``torch.sort`` per graph, the gather path against the explicit path (float64,
outputs and gradients), degrees and double stochasticity, gradients, invariance (the producer is
order-dependent, *not* equivariant, so it is deliberately kept out of equivariance tests), the
interleave golden tables, max-exchange, edge cases (ties, 0/1/2-node graphs, non-contiguous batch),
the grouped variant, parameter counts and batch independence.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn import EdgeAttention, GraphTransformer, HybridLayer, PermutationEdgeSet, origin_code
from graphattn.producers import build_producer
from graphattn.producers.sliceformer import SliceSortEdges
from graphattn.producers.sliceformer.interleave import interleave_descending
from graphattn.producers.sliceformer.max_exchange import max_exchange_src
from graphattn.producers.sliceformer.sorting import slice_sort_src
from tests.helpers import make_batch

SIZES = [5, 1, 7, 3]  # S1's batch


# ------------------------------------------------------------------------------------ helpers
def batch_vector(sizes):
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def per_graph_sort(values, batch, descending=False):
    """``cat([torch.sort(V_g, 0).values])`` in graph order (a sorted batch)."""
    parts = [torch.sort(values[batch == g], dim=0, stable=True, descending=descending).values
             for g in range(int(batch.max()) + 1)]
    return torch.cat(parts)


def oracle_src(values, batch, desc):
    """Python lexsort: slot r of graph g (its r-th node in node order) reads g's node with the
    r-th smallest ``(±value, node index)``."""
    N, C = values.shape
    src = torch.empty(N, C, dtype=torch.long)
    for g in batch.unique().tolist():
        nodes = (batch == g).nonzero().flatten().tolist()
        for c in range(C):
            sign = -1.0 if bool(desc[c]) else 1.0
            order = sorted(nodes, key=lambda i, c=c, s=sign: (s * float(values[i, c]), i))
            for slot_node, s in zip(nodes, order, strict=True):
                src[slot_node, c] = s
    return src


def slice_layer(channels_in, channels, producer=None, **kw):
    """EdgeAttention as HybridLayer builds it for Sliceformer: ``channels`` heads of size 1."""
    return EdgeAttention(channels_in, 1, heads=channels, mode="weighted", **kw).double()


def twin(layer, **changes):
    kw = dict(in_channels=layer.in_channels, out_channels=layer.out_channels, heads=layer.heads,
              mode=layer.mode)
    kw.update(changes)
    other = EdgeAttention(**kw).double()
    other.load_state_dict(layer.state_dict())
    return other


def weighted_sum(out):
    return (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()


# Exactness policy. Sorting and gathering copy values, so a comparison of the layer with
# ``torch.sort``/``gather`` of the *same* V tensor (one projection call, same shapes) stays
# bit-exact, as do reruns of one computation. Comparisons of *different* computations -- a graph
# alone vs inside a batch, permuted input rows, the gather path vs the reference kernel -- run the
# projection (and its gradient) as differently shaped or laid-out BLAS calls whose reductions may
# round differently by an ulp across CPUs (e.g. AVX-512), so they use a float64 tolerance. A real
# leak, a wrong order or a wrong gradient is O(1), ten orders of magnitude above it.
F64_TOL = dict(rtol=1e-12, atol=1e-12)


def assert_close64(actual, expected):
    torch.testing.assert_close(actual, expected, **F64_TOL)


# ------------------------------------------------------------------------- S1: exactness
@pytest.mark.parametrize("order", ["ascend", "descend"])
def test_s1_layer_output_equals_torch_sort_per_graph(order):
    torch.manual_seed(0)
    batch = batch_vector(SIZES)
    x = torch.randn(batch.numel(), 5)
    layer = EdgeAttention(5, 1, heads=6, mode="weighted")  # fp32, tie-free random inputs
    out = layer(x, SliceSortEdges(order), batch)
    expected = per_graph_sort(layer.lin_value(x), batch, descending=order == "descend")
    assert torch.equal(out, expected)


def test_s1_every_interleave_mask():
    torch.manual_seed(1)
    batch = batch_vector(SIZES)
    x = torch.randn(batch.numel(), 5)
    C, L = 8, 3
    layer = EdgeAttention(5, 1, heads=C, mode="weighted")
    V = layer.lin_value(x)
    asc, desc = per_graph_sort(V, batch), per_graph_sort(V, batch, descending=True)
    for ell in range(L):
        mask = interleave_descending(C, ell, L)
        out = layer(x, SliceSortEdges("interleave", layer=ell, num_layers=L), batch)
        assert torch.equal(out, torch.where(mask, desc, asc))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=5), C=st.integers(1, 4),
       levels=st.integers(1, 4), seed=st.integers(0, 2**16), shuffle=st.booleans())
def test_src_equals_python_lexsort_with_ties_and_any_batch(sizes, C, levels, seed, shuffle):
    """Ties (few distinct values), empty and single-node graphs, unsorted batches: ``src`` is
    exactly the lexicographic order (graph, ±value, node index), hence deterministic ties."""
    g = torch.Generator().manual_seed(seed)
    batch = batch_vector(sizes)
    if shuffle:
        batch = batch[torch.randperm(batch.numel(), generator=g)]
    N = batch.numel()
    values = torch.randint(0, levels, (N, C), generator=g).double() - levels / 2
    desc = torch.rand(C, generator=g) < 0.5
    src = slice_sort_src(values, batch, desc)
    assert torch.equal(src, oracle_src(values, batch, desc))
    assert torch.equal(slice_sort_src(values, batch, desc, method="lexsort"), src)
    if shuffle and not torch.equal(batch, batch.sort().values):
        with pytest.raises(ValueError, match="sorted"):
            slice_sort_src(values, batch, desc, method="segmented")
    else:  # the exact implementations, whatever the padding
        assert torch.equal(slice_sort_src(values, batch, desc, method="segmented"), src)
        if _compiled_sort_available():
            assert torch.equal(slice_sort_src(values, batch, desc, method="compiled"), src)
    if N:
        assert torch.equal(batch[src], batch[:, None].expand(N, C))  # S9: no cross-graph source
    assert torch.equal(slice_sort_src(values, batch, desc), src)  # deterministic


@pytest.mark.parametrize("method", ["lexsort", "segmented", "compiled"])
def test_infinite_values_and_signed_zeros_keep_the_stable_order(method):
    """Real ±inf values tie with the segmented path's +inf padding and still come first; -0.0 and
    +0.0 tie (node order)."""
    if method == "compiled" and not _compiled_sort_available():
        pytest.skip("the CPU extension is unavailable")
    inf = float("inf")
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    values = torch.tensor([[inf, -inf], [0.0, 1.0], [-0.0, -inf], [inf, 0.0],
                           [-0.0, inf], [0.0, inf], [-inf, -0.0]])
    for desc in (torch.tensor([False, False]), torch.tensor([True, False]),
                 torch.tensor([True, True])):
        src = slice_sort_src(values, batch, desc, method=method)
        assert torch.equal(src, oracle_src(values, batch, desc))


def _compiled_sort_available() -> bool:
    from graphattn.kernels.cpu_extension import cpu_ops

    ops = cpu_ops(warn=False)
    return ops is not None and hasattr(ops, "segmented_argsort")


def torch_per_graph_argsort(key, sizes):
    """``torch.argsort(stable=True)`` of every graph's rows, as global rows (the reference)."""
    out, start = [], 0
    for n in sizes:
        out.append(torch.argsort(key[start:start + n], dim=0, stable=True) + start)
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_sort_equals_torch_sort_on_long_graphs_with_ties(dtype):
    """The radix sort (graphs of 96 rows and more) and the comparison sort (shorter ones) of the
    compiled op give torch's stable permutation: many ties, signed zeros, ±inf, and NaN (after
    +inf, in node order; the producer never sorts NaN, the op's order is still torch's)."""
    if not _compiled_sort_available():
        pytest.skip("the CPU extension is unavailable")
    from graphattn.producers.sliceformer.sorting import sort_src

    g = torch.Generator().manual_seed(3)
    for sizes in ([4096], [95, 96, 97, 0, 1, 700, 2, 383, 384]):
        N, C = sum(sizes), 6
        values = (torch.randn(N, C, generator=g) * 4).round().to(dtype)  # ~30 distinct values
        values[:, 1] = torch.randn(N, generator=g, dtype=dtype)  # almost no ties
        values[::5, 2], values[::3, 2] = -0.0, 0.0
        values[::7, 3], values[::11, 3] = float("inf"), -float("inf")
        values[::13, 4] = float("nan")
        values[:, 5] = -values[:, 5].abs() - 1  # all negative
        batch = batch_vector(sizes)
        for desc in (False, True, torch.tensor([True, False, True, False, True, False])):
            key = values.clone()
            if isinstance(desc, torch.Tensor):
                key[:, desc] = -key[:, desc]
            elif desc:
                key = -key
            got = sort_src(values, batch, desc, method="compiled", single_graph=len(sizes) == 1,
                           is_sorted=True)
            assert torch.equal(got, torch_per_graph_argsort(key, sizes))


def test_compiled_sort_arguments():
    """``method="compiled"`` names what it needs; the op refuses malformed input."""
    values = torch.randn(6, 2)
    if _compiled_sort_available():
        with pytest.raises(ValueError, match="sorted"):
            slice_sort_src(values, torch.tensor([0, 1, 0, 1, 0, 1]), method="compiled")
        from graphattn.kernels.cpu_extension import cpu_ops

        ops = cpu_ops(warn=False)
        with pytest.raises(RuntimeError, match="'ptr' must run from 0"):
            ops.segmented_argsort(values, torch.tensor([0, 5]))
        with pytest.raises(RuntimeError, match="non-decreasing"):
            ops.segmented_argsort(values, torch.tensor([0, 4, 2, 6]))
        with pytest.raises(RuntimeError, match="float32/float64"):
            ops.segmented_argsort(values.half(), torch.tensor([0, 6]))
    with pytest.raises(ValueError, match="method='compiled' needs float32/float64"):
        slice_sort_src(values.bfloat16(), method="compiled")


def test_torch_paths_without_the_compiled_sort(monkeypatch):
    """With the compiled sort switched off, ``"auto"`` (torch's sorts) gives the same ``src``."""
    from graphattn.producers.sliceformer import sorting

    g = torch.Generator().manual_seed(5)
    batch = batch_vector([40, 3, 200, 0, 9])
    values = torch.randn(batch.numel(), 3, generator=g).round()
    desc = torch.tensor([True, False, True])
    expected = oracle_src(values, batch, desc)
    monkeypatch.setattr(sorting, "NATIVE_SORT", False)
    assert torch.equal(slice_sort_src(values, batch, desc), expected)
    assert torch.equal(slice_sort_src(values[:40], None, desc), oracle_src(
        values[:40], torch.zeros(40, dtype=torch.long), desc))


# --------------------------------------------------------- S2: gather path == explicit path
@pytest.mark.parametrize("order", ["ascend", "interleave", "max_exchange"])
def test_s2_gather_path_equals_explicit_path(order):
    torch.manual_seed(2)
    batch = make_batch([6, 0, 1, 4, 9], channels=5)
    C = 4
    prod = SliceSortEdges(order, layer=0, num_layers=3)
    fast = slice_layer(5, C)
    ref = twin(fast, kernel="reference")  # segment path on the to_explicit() edges
    out = []
    for layer in (fast, ref):
        x = batch.x.clone().requires_grad_()
        o = layer(x, prod, batch.batch)
        weighted_sum(o).backward()
        out.append((o.detach(), x.grad, layer.lin_value.weight.grad))
    for a, b in zip(out[0], out[1], strict=True):
        # one in-edge of weight 1: both paths copy values (equal up to BLAS rounding of the
        # projection's gradients, which the two paths may lay out differently)
        assert_close64(a, b)


def test_fast_path_does_not_materialise_edges():
    """The hot path (with validation on) keeps O(N·C) indices, never the C·N explicit edges."""
    batch = make_batch([30, 20], channels=4)
    seen = []
    prod = SliceSortEdges()
    prod.register_forward_hook(lambda _m, _i, es: seen.append(es))
    slice_layer(4, 8, validate=True)(batch.x, prod, batch.batch)
    es = seen[0]
    assert isinstance(es, PermutationEdgeSet) and es.src.shape == (50, 8)
    assert "explicit" not in es._cache
    assert es.slot_origin.stride() == (0, 0)  # the origin code is broadcast, not stored


def test_permutation_validation_catches_cross_graph_sources():
    batch = torch.tensor([0, 0, 1, 1])
    es = PermutationEdgeSet(torch.tensor([[1, 0], [0, 1], [2, 3], [0, 2]]), num_heads=2)
    with pytest.raises(ValueError, match="joins two graphs"):
        es.validate(4, batch)
    with pytest.raises(ValueError, match="src"):
        PermutationEdgeSet(torch.tensor([[4], [0], [1], [2]])).validate(4, batch)
    assert "explicit" not in es._cache


# ------------------------------------------------------------ S3, S4: degrees, permutation
@pytest.mark.parametrize("order", ["ascend", "descend", "interleave", "max_exchange"])
def test_s3_s4_degrees_and_doubly_stochastic(order):
    torch.manual_seed(3)
    batch = make_batch([5, 1, 7, 3], channels=4)
    C, N = 6, batch.num_nodes
    layer = slice_layer(4, C)
    seen = []
    prod = SliceSortEdges(order, layer=1, num_layers=3)
    prod.register_forward_hook(lambda _m, _i, es: seen.append(es))
    out = layer(batch.x, prod, batch.batch)
    ex = seen[0].to_explicit()
    src, dst = ex.edge_index
    assert ex.num_edges == N * C and ex.weight is None and ex.mode == "weighted"
    assert (ex.origin == origin_code("sorted")).all()
    assert torch.equal(batch.batch[src], batch.batch[dst])
    assert torch.equal(src.view(N, C), seen[0].src)  # edges π_c(r) -> r in head c
    assert torch.equal(dst.view(N, C), torch.arange(N)[:, None].expand(N, C))
    assert torch.equal(ex.head.view(N, C), torch.arange(C).expand(N, C))
    V = layer.lin_value(batch.x)
    for c in range(C):
        on = ex.head == c
        ones = torch.ones(N, dtype=torch.long)
        assert torch.equal(torch.bincount(dst[on], minlength=N), ones)  # in-degree 1
        assert torch.equal(torch.bincount(src[on], minlength=N), ones)  # out-degree 1
        P = torch.zeros(N, N, dtype=torch.float64)
        P[dst[on], src[on]] = 1.0
        assert torch.equal(P.sum(0), torch.ones(N, dtype=torch.float64))
        assert torch.equal(P.sum(1), torch.ones(N, dtype=torch.float64))
        assert torch.equal(P @ P.T, torch.eye(N, dtype=torch.float64))
        assert int(torch.linalg.matrix_rank(P)) == N
        assert torch.equal(P @ V[:, c], out[:, c])


# ------------------------------------------------------------------------- S5: gradients
@pytest.mark.parametrize("descending", [False, True])
def test_s5_gradient_equals_torch_sort_autograd(descending):
    torch.manual_seed(4)
    batch = batch_vector(SIZES)
    N, C = batch.numel(), 5
    G = torch.randn(N, C, dtype=torch.float64)
    V1 = torch.randn(N, C, dtype=torch.float64, requires_grad=True)
    src = slice_sort_src(V1, batch, descending)
    (V1.gather(0, src) * G).sum().backward()
    V2 = V1.detach().clone().requires_grad_()
    (per_graph_sort(V2, batch, descending) * G).sum().backward()
    assert torch.equal(V1.grad, V2.grad)
    # dL/dV_c = P_c^T G_c
    expected = torch.zeros_like(G).scatter_add_(0, src, G)
    assert torch.equal(V1.grad, expected)


@pytest.mark.parametrize("descending", [False, True])
def test_s5_s9_ties_route_gradients_as_stable_torch_sort(descending):
    """fp16-rounded inputs with many ties: same values and the same gradient routing as
    ``torch.sort(stable=True)``; indices form a permutation per graph."""
    torch.manual_seed(5)
    batch = batch_vector([40, 25])
    N, C = batch.numel(), 3
    V = (torch.randn(N, C) * 0.01).half().double().requires_grad_()
    assert V.unique().numel() < N * C  # there are ties
    src = slice_sort_src(V, batch, descending)
    G = torch.randn(N, C, dtype=torch.float64)
    out = V.gather(0, src)
    (out * G).sum().backward()
    g1 = V.grad.clone()
    V.grad = None
    ref = per_graph_sort(V, batch, descending)
    (ref * G).sum().backward()
    assert torch.equal(out, ref) and torch.equal(g1, V.grad)
    for c in range(C):
        assert torch.equal(src[:, c].sort().values, torch.arange(N))


def test_s5_gradcheck_finite_differences():
    torch.manual_seed(6)
    batch = batch_vector([4, 3, 5])
    V = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([False, True, False])
    assert torch.autograd.gradcheck(lambda v: v.gather(0, slice_sort_src(v, batch, mask)), (V,))
    assert torch.autograd.gradcheck(lambda v: v.gather(0, max_exchange_src(v, batch)), (V,))


def test_s5_gradient_through_the_layer_reaches_w_v_only_via_gathered_values():
    torch.manual_seed(7)
    batch = make_batch([6, 5], channels=4)
    layer = slice_layer(4, 3)
    out = layer(batch.x, SliceSortEdges(), batch.batch)
    G = torch.randn_like(out)
    (out * G).sum().backward()
    V = (batch.x @ layer.lin_value.weight.T + layer.lin_value.bias).detach().requires_grad_()
    (per_graph_sort(V, batch.batch) * G).sum().backward()
    assert torch.allclose(layer.lin_value.weight.grad, V.grad.T @ batch.x, atol=1e-12)


# --------------------------------------------------------- S6: invariance, not equivariance
def within_graph_permutation(batch, gen, fix_first=False):
    perm = torch.arange(batch.numel())
    for g in batch.unique().tolist():
        nodes = (batch == g).nonzero().flatten()
        start = 1 if fix_first else 0
        nodes_tail = nodes[start:]
        perm[nodes_tail] = nodes_tail[torch.randperm(nodes_tail.numel(), generator=gen)]
    return perm


def test_s6_invariant_not_equivariant():
    # Sliceformer is order-dependent (slot-indexed output): it must never be put into a
    # node-permutation equivariance test; this test pins the property it does have.
    torch.manual_seed(8)
    batch = make_batch(SIZES, channels=4)
    b = batch.batch
    layer = slice_layer(4, 5)
    gen = torch.Generator().manual_seed(0)
    sigma = within_graph_permutation(b, gen)  # new node t is old node sigma[t]
    V = layer.lin_value(batch.x).detach()
    src, src_p = slice_sort_src(V, b), slice_sort_src(V[sigma], b)
    assert torch.equal(sigma[src_p], src)
    out = layer(batch.x, SliceSortEdges(), b)
    out_p = layer(batch.x[sigma], SliceSortEdges(), b)
    assert_close64(out_p, out)  # invariant (permuted rows: a differently ordered matmul)
    assert not torch.allclose(out_p, out[sigma], **F64_TOL)  # not equivariant
    assert not SliceSortEdges.permutation_equivariant


# ---------------------------------------------------------------------- S7: interleave
def desc_set(C, layer, L, **kw):
    return interleave_descending(C, layer, L, **kw).nonzero().flatten().tolist()


def r(a, b):
    return list(range(a, b))


def test_s7_paper_table_c8_l3_and_block_length():
    assert [desc_set(8, ell, 3) for ell in range(3)] == [[2, 3, 6, 7], [4, 5, 6, 7], []]
    assert [desc_set(8, ell, 3, direction="lra_code") for ell in range(3)] == [
        [], [4, 5, 6, 7], [2, 3, 6, 7]]
    # C = 64, L = 6: the first layer alternates in blocks of 2
    assert desc_set(64, 0, 6) == [c for c in range(64) if (c // 2) % 2]
    # the last layer (paper direction) is all ascending, whatever C
    for C in (1, 3, 6, 24, 64):
        assert desc_set(C, 4, 5) == [] and desc_set(C, 0, 5, direction="lra_code") == []


# (C, L) -> per layer (paper direction): rule='block' tail='code' / tail='block' / 'paper_exact'
GOLDEN = {
    (3, 2): ([[1, 2], []], [[1], []], [[1], []]),
    (6, 3): ([[1, 3, 5], [3, 4, 5], []], [[1, 3, 5], [3, 4, 5], []], [[1, 4], [3, 4], []]),
    (10, 3): ([[2, 3, 6, 7, 8, 9], [5, 6, 7, 8, 9], []], [[2, 3, 6, 7], [5, 6, 7, 8, 9], []],
              [[2, 3, 7, 8], [5, 6, 7, 8], []]),
    (24, 5): (
        [r(1, 24)[::2], [3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23], r(6, 12) + r(18, 24),
         r(12, 24), []],
        [r(1, 24)[::2], [3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23], r(6, 12) + r(18, 24),
         r(12, 24), []],
        [[1, 4, 7, 10, 13, 16, 19, 22], [3, 4, 9, 10, 15, 16, 21, 22], r(6, 11) + r(18, 23),
         r(12, 23), []],
    ),
}


@pytest.mark.parametrize("shape", list(GOLDEN))
def test_s7_golden_tables_rule_and_tail(shape):
    C, L = shape
    code, block, exact = GOLDEN[shape]
    assert [desc_set(C, ell, L) for ell in range(L)] == code
    assert [desc_set(C, ell, L, tail="block") for ell in range(L)] == block
    assert [desc_set(C, ell, L, rule="paper_exact") for ell in range(L)] == exact
    # lra_code is the paper's table read from the other end
    assert [desc_set(C, ell, L, direction="lra_code") for ell in range(L)] == code[::-1]


def test_s7_paper_exact_is_the_sign_of_sine_in_exact_arithmetic():
    from fractions import Fraction

    for C in (3, 6, 8, 10, 24):
        for k in range(5):
            # sin(pi x) >= 0  <=>  x mod 2 in [0, 1], x = 2^k i / C, i = c + 1
            want = [c for c in range(C) if Fraction(2**k * (c + 1), C) % 2 > 1]
            assert desc_set(C, 4 - k, 5, rule="paper_exact") == want


def test_s7_head_scope():
    odd = r(1, 24)[::2]
    assert [desc_set(24, ell, 3, scope="head", scope_heads=4) for ell in range(3)] == [
        odd, [3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23], []]
    assert desc_set(24, 0, 2, scope="head", scope_heads=8) == [c for c in range(24) if c % 3]
    assert desc_set(24, 0, 2, scope="head", scope_heads=8, tail="block") == [
        c for c in range(24) if c % 3 == 1]
    with pytest.raises(ValueError, match="scope_heads"):
        interleave_descending(24, 0, 2, scope="head", scope_heads=5)
    with pytest.raises(ValueError, match="scope_heads"):
        interleave_descending(24, 0, 2, scope="head")


def test_s7_model_gives_each_layer_its_direction():
    torch.manual_seed(9)
    C, L = 8, 3
    model = GraphTransformer(C, 2, num_layers=L, producer={"name": "sliceformer",
                                                          "order": "interleave"})
    batch = make_batch([6, 4], channels=C, dtype=torch.float32)
    for ell, layer in enumerate(model.layers):
        assert layer.attn.heads == C and layer.attn.out_channels == 1
        assert (layer.producer.layer, layer.producer.num_layers) == (ell, L)
        out = layer.attn(batch.x, layer.producer, batch.batch)
        V = layer.attn.lin_value(batch.x)
        mask = interleave_descending(C, ell, L)
        expected = torch.where(mask, per_graph_sort(V, batch.batch, True),
                               per_graph_sort(V, batch.batch))
        assert torch.equal(out, expected)
    assert model(batch).shape == (2, 2)


# ------------------------------------------------------------------------ S8: max-exchange
def test_s8_max_exchange():
    torch.manual_seed(10)
    sizes = [5, 1, 7, 3]
    batch = batch_vector(sizes)
    V = torch.randn(batch.numel(), 4, dtype=torch.float64)
    V[6, 2] = 10.0  # graph 2's max of channel 2 sits at its first node: identity there
    src = max_exchange_src(V, batch)
    out = V.gather(0, src)
    ptr = [0, 5, 6, 13, 16]
    for g in range(4):
        s, e = ptr[g], ptr[g + 1]
        for c in range(4):
            m = s + int(V[s:e, c].argmax())
            assert out[s, c] == V[s:e, c].max() and out[m, c] == V[s, c]
            rest = [t for t in range(s, e) if t not in (s, m)]
            assert torch.equal(out[rest, c], V[rest, c])
            moved = int((src[s:e, c] != torch.arange(s, e)).sum())
            assert moved == (0 if m == s else 2)
    assert (src[6:13, 2] == torch.arange(6, 13)).all()
    # equivariant under within-graph permutations that fix each graph's first node
    sigma = within_graph_permutation(batch, torch.Generator().manual_seed(1), fix_first=True)
    assert torch.equal(V[sigma].gather(0, max_exchange_src(V[sigma], batch)), out[sigma])


def test_s8_max_exchange_ties_and_unsorted_batch():
    batch = torch.tensor([1, 0, 1, 0, 1])  # graph 1 = nodes 0, 2, 4; first node 0
    V = torch.tensor([[0.0], [5.0], [3.0], [5.0], [3.0]])
    src = max_exchange_src(V, batch)
    # graph 1: max 3 at nodes 2 and 4 -> the lowest index (2); graph 0: max at its first node 1
    assert src[:, 0].tolist() == [2, 1, 0, 3, 4]


# --------------------------------------------------------------------- S9: edge cases
@pytest.mark.parametrize("order", ["ascend", "descend", "interleave", "max_exchange"])
def test_s9_tiny_and_empty_graphs(order):
    batch = make_batch([0, 1, 2, 0, 1], channels=3)
    layer = slice_layer(3, 4)
    x = batch.x.clone().requires_grad_()
    out = layer(x, SliceSortEdges(order, layer=0, num_layers=2), batch.batch)
    assert out.shape == (4, 4) and torch.isfinite(out).all()
    V = layer.lin_value(batch.x)
    assert torch.equal(out[[0, 3]], V[[0, 3]])  # single-node graphs: identity
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    empty = torch.empty(0, 3, dtype=torch.float64)
    assert slice_layer(3, 4)(empty, SliceSortEdges(order, layer=0, num_layers=2)).shape == (0, 4)


def test_s9_non_contiguous_batch_sorts_each_graph():
    torch.manual_seed(11)
    batch = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 2])
    x = torch.randn(9, 3, dtype=torch.float64)
    layer = slice_layer(3, 4)
    seen = []
    prod = SliceSortEdges("descend")
    prod.register_forward_hook(lambda _m, _i, es: seen.append(es))
    out = layer(x, prod, batch)
    V = layer.lin_value(x)
    src, dst = seen[0].to_explicit().edge_index
    assert torch.equal(batch[src], batch[dst])
    for g in range(3):
        nodes = (batch == g).nonzero().flatten()  # slots in node order
        assert torch.equal(out[nodes], V[nodes].sort(0, descending=True).values)


# ----------------------------------------------------------------- S10: grouped (SWD10)
def test_s10_group_head_shares_one_permutation_per_head():
    torch.manual_seed(12)
    batch = make_batch([6, 4], channels=5)
    H, D = 3, 4
    layer = EdgeAttention(5, D, heads=H, mode="weighted").double()
    seen = []
    prod = SliceSortEdges(group="head")
    assert prod.head_size is None
    prod.register_forward_hook(lambda _m, _i, es: seen.append(es))
    out = layer(batch.x, prod, batch.batch).view(-1, H, D)
    V = layer.lin_value(batch.x).view(-1, H, D)
    src = seen[0].src
    assert src.shape == (batch.num_nodes, H)  # one source per (target, head), for all D channels
    assert torch.equal(src, slice_sort_src(V.sum(-1), batch.batch))
    heads = torch.arange(H)
    assert torch.equal(out, V[src, heads])
    # a per-channel sliceformer refuses heads of size > 1 (it would silently share permutations)
    with pytest.raises(ValueError, match="size 1"):
        layer(batch.x, SliceSortEdges(), batch.batch)


# ----------------------------------------------------------------- S11: parameters
def test_s11_no_query_key_parameters():
    layer = HybridLayer(16, producer="sliceformer", heads=4)
    assert layer.attn.mode == "weighted"
    assert layer.attn.lin_query is None and layer.attn.lin_key is None
    names = [n for n, _ in layer.named_parameters()]
    assert not any("lin_query" in n or "lin_key" in n for n in names)
    assert layer.attn.heads == 16 and layer.attn.out_channels == 1  # head per channel
    assert layer.attn_out is not None  # W_O is kept


def test_s11_parameter_count_drops_by_wq_wk_only():
    """IMDB shape (hidden 256, 6 layers): only W_Q, W_K (with biases) go: 6·2·(256²+256)."""
    def count(producer):
        model = GraphTransformer(256, 2, num_layers=6, producer=producer, heads=8)
        return sum(p.numel() for p in model.layers.parameters())

    assert count("full") - count("sliceformer") == 6 * 2 * (256 * 256 + 256)


# ------------------------------------------------------------- S12: batch independence
@pytest.mark.parametrize("order", ["ascend", "interleave", "max_exchange"])
def test_s12_batch_independence(order):
    torch.manual_seed(13)
    batch = make_batch([5, 8, 3], channels=4)
    layer = slice_layer(4, 6)
    prod = SliceSortEdges(order, layer=0, num_layers=3)
    out = layer(batch.x, prod, batch.batch)
    for g in range(3):
        s, e = int(batch.ptr[g]), int(batch.ptr[g + 1])
        # alone vs in the batch: the projection is a differently shaped matmul (a 1-ulp
        # difference was seen on AVX-512); a cross-graph leak would be O(1)
        assert_close64(layer(batch.x[s:e], prod), out[s:e])


# -------------------------------------------------------- registry, model, validation
def test_registry_model_and_trace():
    prod = build_producer({"name": "sliceformer", "order": "descend"}, channels=8, heads=2,
                          num_heads=2)
    assert isinstance(prod, SliceSortEdges) and prod.mode == "weighted"
    assert "order='descend'" in repr(prod)
    torch.manual_seed(14)
    model = GraphTransformer(8, 3, num_layers=2, producer="sliceformer", pool="cls",
                             node_encoder="linear").double()
    batch = make_batch([4, 1, 6], channels=5)
    out = model(batch)
    assert out.shape == (3, 3) and torch.isfinite(out).all()
    out.sum().backward()
    layer = slice_layer(5, 4)
    o, (ei, alpha) = layer(batch.x, SliceSortEdges(), batch.batch, return_attention_weights=True)
    assert ei.shape == (2, 11 * 4) and alpha.shape == (44, 4)
    assert_close64(o, layer(batch.x, SliceSortEdges(), batch.batch))  # traced == fast path
    # weighted mode, one in-edge per (target, head): its coefficient is exactly 1 (no arithmetic),
    # the other heads' entries exactly 0, so this stays exact
    assert torch.equal(alpha.sum(1), torch.ones(44, dtype=torch.float64))


@pytest.mark.parametrize("kwargs, match", [
    ({"order": "sideways"}, "order"),
    ({"order": "interleave"}, "layer"),
    ({"order": "interleave", "layer": 3, "num_layers": 3}, "layer"),
    ({"group": "channel"}, "group"),
    ({"rule": "sin"}, "rule"),
    ({"tail": "x"}, "tail"),
    ({"direction": "up"}, "direction"),
    ({"scope": "head"}, "scope_heads"),
    ({"num_layers": 0}, "num_layers"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SliceSortEdges(**kwargs)


def test_invalid_values():
    with pytest.raises(ValueError, match="NaN"):
        slice_sort_src(torch.tensor([[0.0], [float("nan")]]))
    with pytest.raises(ValueError, match="values"):
        slice_sort_src(torch.zeros(3))
    with pytest.raises(ValueError, match="floating"):
        max_exchange_src(torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch"):
        slice_sort_src(torch.zeros(3, 2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="descending"):
        slice_sort_src(torch.zeros(3, 2), None, torch.tensor([True]))
    with pytest.raises(ValueError, match="value"):  # standalone: no layer projections
        SliceSortEdges()(torch.zeros(3, 2))
