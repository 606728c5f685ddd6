"""Tests of the SBM-Transformer producer (graphattn/producers/sbm/producer.py) and its samplers
(graphattn/producers/sbm/: model, fastrg, bernoulli, edges, gate).

Statistical tests use fixed seeds (so they are deterministic); each states the false-alarm rate it
would have under fresh randomness. Many independent samples are drawn at once as many identical
graphs of one batch, which also exercises the batching.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from graphattn import EdgeAttention, origin_code
from graphattn.core.edgeset import EdgeSet
from graphattn.nn.model import GraphTransformer
from graphattn.producers import build_producer
from graphattn.producers.sbm import SBMEdges
from graphattn.producers.sbm.bernoulli import bernoulli_sample
from graphattn.producers.sbm.edges import EXPLORATION, SampledEdges, dedupe
from graphattn.producers.sbm.fastrg import fastrg_sample
from graphattn.producers.sbm.gate import edge_gate, edge_probability
from graphattn.producers.sbm.model import block_matrix, expected_num_edges, key_projection
from graphattn.runner.trainer import _density
from tests.helpers import dense_reference, make_batch

f64 = torch.float64


# ------------------------------------------------------------------------------------ helpers
def ptr_of(sizes) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(sizes, dtype=torch.long).cumsum(0)])


def replicate(Y1, Z1, T):
    """``T`` copies of one graph: ``(Y [T n, H, k], Z, ptr)``."""
    n = Y1.size(0)
    return Y1.repeat(T, 1, 1), Z1.repeat(T, 1, 1), torch.arange(T + 1) * n


def cell_counts(edges: SampledEdges, n: int, H: int) -> torch.Tensor:
    """``[H, n, n]`` total multiplicity of (query i, key j) over all copies of an n-node graph."""
    i, j = edges.query % n, edges.key % n
    assert torch.equal(edges.query // n, edges.key // n)  # same copy
    return torch.bincount((edges.head * n + i) * n + j, minlength=H * n * n).view(H, n, n).to(f64)


def random_sbm(n, H, k, seed, b_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    Y = torch.rand(n, H, k, generator=g, dtype=f64)
    Z = torch.rand(n, H, k, generator=g, dtype=f64)
    B = torch.softmax(torch.randn(H, k * k, generator=g, dtype=f64), -1).view(H, k, k) * b_scale
    return Y, B, Z


def dense_p(Y, B, Z):
    """``[H, n, n]`` p_ij = Y_i B Z_j^T of one graph."""
    return torch.einsum("ihu,huv,jhv->hij", Y, B, Z)


def layer_and_sbm(channels=8, heads=2, head_dim=4, **kw):
    layer = EdgeAttention(channels, head_dim, heads=heads).double()
    prod = SBMEdges(heads=heads, head_dim=head_dim, **kw).double()
    return layer, prod


def run_layer(layer, prod, x, batch=None, generator=None):
    """``(out, edge set)`` of one layer call."""
    captured = []
    handle = prod.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        out = layer(x, prod, batch, generator=generator)
    finally:
        handle.remove()
    return out, captured[-1]


def saturate(prod, value=64.0):
    """Memberships exactly 1 (sigmoid(64) == 1.0 in float64) for every node and cluster: p = 1."""
    d = prod.head_dim
    with torch.no_grad():
        prod.proj[2].weight.zero_()
        prod.proj[2].bias.fill_(math.sqrt(value / d))
        prod.clusters.fill_(math.sqrt(value / d))


def fixed_draw(edges: SampledEdges):
    def draw(Y, S, Z, ptr, *, delta, generator, check_memory=None):
        G, H = ptr.numel() - 1, Y.size(1)
        return edges, torch.zeros(G, H, dtype=f64)
    return draw


# ------------------------------------------------------------------------ the SBM parameters
def test_block_matrix_softmax_over_all_entries():
    C = torch.randn(3, 5, 4, dtype=f64)
    S = block_matrix(C)
    assert torch.allclose(S.sum((-1, -2)), torch.ones(3, dtype=f64))
    ref = torch.softmax((C @ C.transpose(1, 2)).reshape(3, -1), -1).view(3, 5, 5)
    assert torch.allclose(S, ref)


def test_expected_count_formula():
    sizes = [5, 1, 0, 9]
    N, H, k = sum(sizes), 2, 3
    g = torch.Generator().manual_seed(0)
    Y = torch.rand(N, H, k, generator=g, dtype=f64) * 2
    Z = torch.rand(N, H, k, generator=g, dtype=f64) * 2
    B = torch.rand(H, k, k, generator=g, dtype=f64)
    ptr = ptr_of(sizes)
    for delta in (0.0, 0.03):
        lam = expected_num_edges(Y, B, Z, ptr, delta)
        for gi, (a, b) in enumerate(zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)):
            brute = dense_p(Y[a:b], B, Z[a:b]).sum((-1, -2)) + delta * (b - a) ** 2
            assert torch.allclose(lam[gi], brute, atol=1e-10, rtol=0)


def initial_sbm(**kw):
    """``(layer, producer, x, (Y, S, Z), mean p per head)`` at initialisation: k = 128, d = 32,
    2 heads, 512 LayerNorm'd nodes, default Linear layers."""
    torch.manual_seed(0)
    layer = EdgeAttention(64, 32, heads=2)
    prod = SBMEdges(heads=2, head_dim=32, num_clusters=128, **kw)
    x = F.layer_norm(torch.randn(512, 64), (64,))
    q, k = layer.lin_query(x).view(-1, 2, 32), layer.lin_key(x).view(-1, 2, 32)
    with torch.no_grad():
        Y, S, Z = prod.sbm(q, k)
        lam = expected_num_edges(Y.double(), S.double(), Z.double(), ptr_of([512]))
    return layer, prod, x, (Y, S, Z), lam / 512**2


def test_p_range_and_init_density():
    """Kaiming-normal clusters (k=128, d=32), LayerNorm'd inputs, default Linear: mean p = 0.25."""
    layer, prod, x, (Y, S, Z), mean_p = initial_sbm()
    assert ((mean_p - 0.25).abs() < 0.01).all(), mean_p
    prod.train()
    with torch.no_grad():
        _, es = run_layer(layer, prod, x)
        p = edge_probability(Y, S, Z, es.edge_index[1], es.edge_index[0], es.head)
    assert ((p > 0) & (p < 1)).all()


@pytest.mark.parametrize("target", [0.02, 0.05, 0.5])
def test_init_density_sets_the_initial_mean_p(target):
    """``init_density``: the same init with the logit offset logit(sqrt(p̄)) gives mean p = p̄ (the
    initial logits are near 0), and the sampled graph's density follows it (fastRG, δ = 0)."""
    layer, prod, x, (Y, S, Z), mean_p = initial_sbm(init_density=target, delta=0.0)
    assert ((mean_p - target).abs() < 0.05 * target).all(), mean_p
    prod.train()
    with torch.no_grad():
        _, es = run_layer(layer, prod, x)
    # fastRG keeps a pair with probability 1 - exp(-p); 2 heads x 512^2 draws, so the sd is tiny
    drawn = es.num_edges / (2 * 512**2)
    expected = float((1 - torch.exp(-dense_p(Y.double(), S.double(), Z.double()))).mean())
    assert abs(drawn - expected) < 0.02 * expected + 1e-3, (drawn, expected)
    assert "init_density=" in repr(prod)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), True, "0.1"])
def test_init_density_is_validated(bad):
    with pytest.raises(ValueError, match="init_density"):
        SBMEdges(init_density=bad)


# --------------------------------------------------------------------- statistical tests
@pytest.mark.parametrize("delta, options", [
    (0.0, {}),
    (0.05, {}),
    # binary search instead of guide tables, many graph blocks, rows split over edge chunks
    (0.0, {"guide": False, "max_table": 50000, "chunk_size": 30000}),
    (0.0, {"guide": True, "max_table": 50000, "chunk_size": 30000}),
])
def test_fastrg_multiplicities_match_lambda(delta, options):
    """Multi-edge counts per cell: mean → λ_ij = p_ij + δ (|err| < 4.5 σ per cell, two-sided
    false alarm 6.8e-6 per cell, < 5e-4 over the 72 cells) and Pearson χ² over the cells below
    its 1 - 1e-4 quantile. Total false-alarm rate < 1e-3 per case."""
    n, H, k, T = 6, 2, 3, 20000
    Y1, B, Z1 = random_sbm(n, H, k, seed=1)
    Y, Z, ptr = replicate(Y1, Z1, T)
    edges, expected = fastrg_sample(Y, B, Z, ptr, delta=delta, generator=torch.Generator().manual_seed(2),
                                    **options)
    lam = dense_p(Y1, B, Z1) + delta
    assert torch.allclose(expected, lam.sum((-1, -2)).expand(T, H))
    assert (edges.kind == EXPLORATION).any() == (delta > 0)
    mean = cell_counts(edges, n, H) / T
    assert ((mean - lam).abs() < 4.5 * (lam / T).sqrt()).all()
    stat = float(((mean - lam) ** 2 / (lam / T)).sum())  # independent Poisson cells
    assert stat < chi2.ppf(1 - 1e-4, df=lam.numel())


#: ragged graphs for the compiled-vs-torch tests: an empty graph and a single node included
RAGGED = [7, 0, 1, 12, 30, 5, 19]


def _native_ops_or_skip():
    from graphattn.producers.sbm import native

    if native.sampler_ops(torch.zeros(1)) is None:
        pytest.skip("the CPU extension is unavailable")
    return native


def _ragged_sbm(seed, H, k, dtype, b_scale=1.0):
    """``(Y, B, Z)`` on the graphs of :data:`RAGGED`; column 1 of Y has no mass in graph 3."""
    g = torch.Generator().manual_seed(seed)
    N = sum(RAGGED)
    Y = torch.rand(N, H, k, generator=g, dtype=dtype)
    Z = torch.rand(N, H, k, generator=g, dtype=dtype)
    Y[8:20, 1] = 0.0  # a column without mass in a graph: uniform, never drawn
    B = torch.softmax(torch.randn(H, k * k, generator=g, dtype=dtype), -1).view(H, k, k) * b_scale
    return Y, B, Z


def _assert_same_draws(draw, native_module, monkeypatch, least_edges):
    """``draw()`` with the compiled loops and with the torch path: the same edges in the same order
    and the same expected counts. Every float operation on the way (products, sequential sums,
    ``ceil``, comparisons) is a correctly rounded IEEE operation in both, none contracted or
    reordered, so the integer edges agree exactly on any x86-64 CPU."""
    native, expected_native = draw()
    monkeypatch.setattr(native_module, "NATIVE_SAMPLERS", False)
    reference, expected_ref = draw()
    assert native.num_edges > least_edges
    for name in ("query", "key", "head", "kind"):
        assert torch.equal(getattr(native, name), getattr(reference, name)), name
    assert torch.equal(expected_native, expected_ref)


@pytest.mark.parametrize("options", [
    {},
    {"guide": False},
    {"guide": True, "max_table": 400, "chunk_size": 97},
    {"guide": False, "max_table": 400, "chunk_size": 97},
])
@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_compiled_fastrg_draws_equal_the_torch_path(options, dtype, monkeypatch):
    """The compiled fastRG (``sbm_node_tables``, ``sbm_fastrg_draws``) gives exactly the torch
    path's edges, in the same order: with and without guide tables, over several graph blocks and
    edge chunks (rows split across chunks), ragged graphs, exploration draws on top."""
    native_module = _native_ops_or_skip()
    Y, B, Z = _ragged_sbm(11, 3, 4, dtype, b_scale=4.0)
    _assert_same_draws(lambda: fastrg_sample(Y, B, Z, ptr_of(RAGGED), delta=0.01,
                                             generator=torch.Generator().manual_seed(5), **options),
                       native_module, monkeypatch, least_edges=100)


@pytest.mark.parametrize("dtype", [torch.float32, f64])
@pytest.mark.parametrize("max_elements", [1 << 24, 500])
def test_compiled_bernoulli_hits_equal_the_torch_path(dtype, max_elements, monkeypatch):
    """The compiled per-pair loop (``sbm_bernoulli_hits``) gives exactly the torch path's edges:
    the same keyed uniforms, compared with the same probabilities in float64, over ragged graphs
    (padding), several heads, blocks of query rows and exploration ``delta``."""
    native_module = _native_ops_or_skip()
    Y, B, Z = _ragged_sbm(12, 2, 3, dtype)
    _assert_same_draws(lambda: bernoulli_sample(Y, B, Z, ptr_of(RAGGED), delta=0.01,
                                                max_elements=max_elements,
                                                generator=torch.Generator().manual_seed(6)),
                       native_module, monkeypatch, least_edges=50)


@pytest.mark.parametrize("with_guide", [False, True])
def test_compiled_node_tables_equal_the_torch_path(with_guide, monkeypatch):
    """The compiled inverse-CDF tables (``sbm_node_tables``): keys, guide and graph bases equal the
    torch path's exactly (ragged graphs, an empty one, a column without mass in a graph)."""
    from graphattn.producers.sbm import fastrg, model

    native_module = _native_ops_or_skip()
    Y, _, _ = _ragged_sbm(13, 3, 4, torch.float32)
    lptr = ptr_of(RAGGED)
    batch = model.graph_of_nodes(lptr)
    native = fastrg._node_tables(Y, lptr, batch, with_guide)
    monkeypatch.setattr(native_module, "NATIVE_SAMPLERS", False)
    reference = fastrg._node_tables(Y, lptr, batch, with_guide)
    for a, b, name in zip(native, reference, native._fields, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b), name


def test_poisson_total_count():
    """Edges per (graph, head), no dedupe: mean within 4σ of Λ (false alarm 6e-5 per head), sample
    variance within 15% of Λ (Poisson dispersion; > 6σ of the variance estimate)."""
    n, H, k, T = 7, 2, 4, 4000
    Y1, B, Z1 = random_sbm(n, H, k, seed=3, b_scale=3.0)
    Y, Z, ptr = replicate(Y1, Z1, T)
    edges, _ = fastrg_sample(Y, B, Z, ptr, generator=torch.Generator().manual_seed(4))
    m = torch.bincount((edges.query // n) * H + edges.head, minlength=T * H).view(T, H).to(f64)
    lam = expected_num_edges(Y1, B, Z1, ptr_of([n]))[0]
    assert ((m.mean(0) - lam).abs() < 4 * (lam / T).sqrt()).all()
    assert ((m.var(0) / lam - 1).abs() < 0.15).all()


def test_fastrg_dedupe_frequency():
    """After de-duplication an edge exists with probability 1 - exp(-(p + δ)) (4.5σ binomial bound
    per cell, < 5e-4 false alarm over the cells)."""
    n, H, k, T, delta = 6, 2, 3, 20000, 0.02
    Y1, B, Z1 = random_sbm(n, H, k, seed=5)
    Y, Z, ptr = replicate(Y1, Z1, T)
    edges, _ = fastrg_sample(Y, B, Z, ptr, delta=delta, generator=torch.Generator().manual_seed(6))
    edges = dedupe(edges, Y.size(0), H)
    freq = cell_counts(edges, n, H) / T
    assert freq.max() <= 1.0
    target = 1 - torch.exp(-(dense_p(Y1, B, Z1) + delta))
    assert ((freq - target).abs() < 4.5 * (target * (1 - target) / T).sqrt()).all()
    # distinct, sorted by (query, head, key), an SBM draw wins over an exploration draw
    key = (edges.query * H + edges.head) * Y.size(0) + edges.key
    assert (key[1:] > key[:-1]).all()


def test_bernoulli_frequency():
    """Dense path: frequency → clamp(p + δ, 0, 1) (4.5σ per cell, < 5e-4 false alarm in total)."""
    n, H, k, T, delta = 6, 2, 3, 20000, 0.01
    Y1, B, Z1 = random_sbm(n, H, k, seed=7)
    Y, Z, ptr = replicate(Y1, Z1, T)
    edges, expected = bernoulli_sample(Y, B, Z, ptr, delta=delta, generator=torch.Generator().manual_seed(8),
                                       max_elements=1 << 16)  # several row blocks
    target = (dense_p(Y1, B, Z1) + delta).clamp(0, 1)
    assert torch.allclose(expected, target.sum((-1, -2)).expand(T, H))
    freq = cell_counts(edges, n, H) / T
    assert ((freq - target).abs() < 4.5 * (target * (1 - target) / T).sqrt()).all()
    assert dedupe(edges, Y.size(0), H).num_edges == edges.num_edges  # never a duplicate


@pytest.mark.parametrize("sampler", ["fastrg", "bernoulli"])
def test_anti_diagonal_block_matrix(sampler):
    """Hard memberships, B = [[0, .5], [.5, 0]]: no edge inside a block; a cross-block pair has
    λ = 0.5 (fastRG multiplicity 0.5, Bernoulli frequency 0.5). The official fastRG gives 0.37 / 0.13
    here (it pairs sources and destinations of different blocks)."""
    n, T = 6, 20000
    Y1 = torch.zeros(n, 1, 2, dtype=f64)
    Y1[:3, 0, 0] = 1
    Y1[3:, 0, 1] = 1
    B = torch.tensor([[[0.0, 0.5], [0.5, 0.0]]], dtype=f64)
    Y, Z, ptr = replicate(Y1, Y1.clone(), T)
    sample = fastrg_sample if sampler == "fastrg" else bernoulli_sample
    edges, _ = sample(Y, B, Z, ptr, generator=torch.Generator().manual_seed(9))
    mean = cell_counts(edges, n, 1)[0] / T
    block = torch.arange(n) // 3
    same = block[:, None] == block[None, :]
    assert (mean[same] == 0).all()
    sd = math.sqrt(0.5 / T) if sampler == "fastrg" else math.sqrt(0.25 / T)
    assert ((mean[~same] - 0.5).abs() < 4.5 * sd).all()


def test_fastrg_edges_follow_memberships():
    """Asymmetric Y ≠ Z: query 0 belongs to cluster 0 only, key 1 to cluster 1 only, B[0, 1] > 0:
    every drawn edge is (query 0, key 1), in every copy."""
    n, T = 4, 50
    Y1 = torch.zeros(n, 1, 2, dtype=f64)
    Z1 = torch.zeros(n, 1, 2, dtype=f64)
    Y1[0, 0, 0] = 1.0
    Z1[1, 0, 1] = 1.0
    B = torch.tensor([[[0.0, 3.0], [0.0, 0.0]]], dtype=f64)
    Y, Z, ptr = replicate(Y1, Z1, T)
    edges, _ = fastrg_sample(Y, B, Z, ptr, generator=torch.Generator().manual_seed(0))
    assert edges.num_edges > T
    assert ((edges.query % n == 0) & (edges.key % n == 1)).all()


# ------------------------------------------------------------------- the producer in a layer
def test_edge_direction_and_empty_queries():
    """A drawn (query 0, key 1) becomes edge_index (1, 0): the message flows 1 → 0; node 1 has no
    sampled key and gets output 0."""
    layer, prod = layer_and_sbm(heads=1)
    x = torch.randn(2, 8, dtype=f64)
    one = torch.tensor([0])
    prod.draw = fixed_draw(SampledEdges(one, one + 1, one * 0, one * 0))
    out, es = run_layer(layer, prod, x)
    assert es.edge_index.tolist() == [[1], [0]]
    v = layer.lin_value(x)
    assert torch.allclose(out[0], v[1])
    assert (out[1] == 0).all()


@pytest.mark.parametrize("sampler", ["fastrg", "bernoulli"])
@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=5), seed=st.integers(0, 50),
       shuffle=st.booleans(), training=st.booleans())
def test_no_cross_graph_edges(sampler, sizes, seed, shuffle, training):
    """No edge joins two graphs (also for an unsorted batch); graphs of 0, 1 and < k nodes; finite
    outputs; valid heads and origins."""
    batch = make_batch(sizes)
    x, b = batch.x, batch.batch
    if shuffle and b.numel() > 1:
        perm = torch.randperm(b.numel(), generator=torch.Generator().manual_seed(seed))
        x, b = x[perm], b[perm]
    layer, prod = layer_and_sbm(num_clusters=16, sampler=sampler, self_loops=seed % 2 == 0)
    layer.train(training)
    prod.train(training)
    out, es = run_layer(layer, prod, x, b, generator=torch.Generator().manual_seed(seed))
    es.validate(x.size(0), b)
    src, dst = es.edge_index
    assert torch.equal(b[src], b[dst])
    assert es.num_edges == 0 or (0 <= int(es.head.min()) and int(es.head.max()) < 2)
    assert torch.isfinite(out).all()
    assert torch.isfinite(es.aux_loss)
    codes = {origin_code(o) for o in ("sampled", "exploration", "self_loop")}
    assert set(es.origin.tolist()) <= codes
    G = int(b.max()) + 1 if b.numel() else 1  # trailing empty graphs are invisible without 'data'
    assert es.stats["per_graph_head"]["sampled_edges"].shape == (G, 2)


@pytest.mark.parametrize("sizes", [[9], [5, 1, 7]])
def test_per_graph_head_counts_are_the_sampled_edges(sizes):
    """The statistics count the sampled and exploration edges (not the added self-loops) of every
    (graph, head), for one graph (no batch gather) and for a batch alike."""
    batch = make_batch(sizes)
    layer, prod = layer_and_sbm()
    prod.train()
    _, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(3))
    drawn = es.origin != origin_code("self_loop")
    cell = batch.batch[es.edge_index[1][drawn]] * 2 + es.head[drawn]
    expected = torch.bincount(cell, minlength=len(sizes) * 2).view(len(sizes), 2)
    counts = es.stats["per_graph_head"]["sampled_edges"]
    assert torch.equal(counts, expected) and es.stats["sampled_edges"] == float(expected.sum())


def test_empty_batch_and_single_node():
    layer, prod = layer_and_sbm()
    prod.train()
    out, es = run_layer(layer, prod, torch.zeros(0, 8, dtype=f64), torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 8) and es.num_edges == 0 and float(es.aux_loss.detach()) == 0.0
    out, es = run_layer(layer, prod, torch.randn(1, 8, dtype=f64))
    assert torch.isfinite(out).all()
    assert es.num_edges == 0 or (es.edge_index == 0).all()
    assert es.stats["per_graph_head"]["density"].shape == (1, 2)


def test_full_attention_limit_bernoulli():
    """Memberships 1 give p = 1: the Bernoulli sampler takes every pair, and the layer equals dense
    softmax attention per graph."""
    batch = make_batch([5, 1, 7])
    layer, prod = layer_and_sbm(sampler="bernoulli")
    saturate(prod)
    prod.train()
    out, es = run_layer(layer, prod, batch.x, batch.batch)
    assert es.num_edges == 2 * (25 + 1 + 49)
    assert es.stats["density"] == 1.0
    x = batch.x
    q, k, v = (lin(x).view(-1, 2, 4) for lin in (layer.lin_query, layer.lin_key, layer.lin_value))
    adj = (batch.batch[:, None] == batch.batch[None, :]).to(f64)
    ref = torch.stack([dense_reference(q[:, h], k[:, h], v[:, h], adj, 0.5) for h in range(2)], 1)
    assert torch.allclose(out, ref.reshape(-1, 8), atol=1e-10)


def test_full_attention_limit_fastrg():
    """λ_ij = 25 everywhere: with de-duplication fastRG returns the complete graph (failure
    probability < 200 e^{-25} ≈ 3e-9), and the layer equals dense attention."""
    sizes, H, k = [6, 2, 5], 2, 3
    N = sum(sizes)
    Y = torch.ones(N, H, k, dtype=f64)
    B = torch.full((H, k, k), 25.0 / k**2, dtype=f64)
    # small tables and chunks: several graph blocks, rows (≈ 25 n draws each) split over chunks
    edges, _ = fastrg_sample(Y, B, Y, ptr_of(sizes), generator=torch.Generator().manual_seed(0),
                             max_table=60, chunk_size=40)
    edges = dedupe(edges, N, H)
    assert edges.num_edges == H * sum(s * s for s in sizes)
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    assert torch.equal(batch[edges.query], batch[edges.key])
    layer = EdgeAttention(8, 4, heads=H).double()
    x = torch.randn(N, 8, dtype=f64)
    es = EdgeSet(torch.stack([edges.key, edges.query]), head=edges.head, num_heads=H)
    out = layer(x, es, batch)
    full = layer(x, build_producer("full"), batch)
    assert torch.allclose(out, full, atol=1e-10)


def test_straight_through_gradients_reach_the_sbm():
    batch = make_batch([6, 9])
    layer, prod = layer_and_sbm(num_clusters=5)
    prod.train()
    out, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(0))
    assert torch.equal(es.bias, torch.zeros_like(es.bias))  # the forward is untouched
    (out.square().sum() + es.aux_loss).backward()
    for p in (prod.clusters, *prod.proj.parameters(), layer.lin_query.weight, layer.lin_key.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("ste", ["logit_bias", "logit_scale"])
@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_straight_through_estimator_is_the_clipped_bias_gradient(ste, scale):
    """∂L/∂p_e = clamp(∂L/∂b_e, ±1) (logit_bias) or clamp(∂L/∂b_e · q·k/√d, ±1) (logit_scale, Eq. 9):
    the gradients of the clusters and the MLP equal those of Σ_e g_e p_e with that g. Loss scale
    1e4 exercises the clip."""
    batch = make_batch([7, 5])
    layer, prod = layer_and_sbm(num_clusters=4, ste=ste)
    prod.train()
    x, b = batch.x, batch.batch
    out, es = run_layer(layer, prod, x, b, generator=torch.Generator().manual_seed(1))
    es.bias.retain_grad()
    target = torch.randn_like(out)
    (scale * (out - target).square().sum()).backward()
    q = layer.lin_query(x).view(-1, 2, 4).detach()
    k = layer.lin_key(x).view(-1, 2, 4).detach()
    src, dst = es.edge_index
    g = es.bias.grad
    if ste == "logit_scale":
        g = g * (q[dst, es.head] * k[src, es.head]).sum(-1) / 2.0
    g = g.clamp(-1, 1)
    if scale > 1:
        assert (g.abs() == 1).any()  # some gradients are clipped
    got = [prod.clusters.grad.clone(), *(p.grad.clone() for p in prod.proj.parameters())]
    prod.zero_grad()
    Y, S, Z = prod.sbm(q, k)
    (g * edge_probability(Y, S, Z, dst, src, es.head)).sum().backward()
    want = [prod.clusters.grad, *(p.grad for p in prod.proj.parameters())]
    for a, w in zip(got, want, strict=True):
        assert torch.allclose(a, w, atol=1e-10, rtol=1e-8)


def test_straight_through_sign():
    """One query, keys 0 and 1, loss ||out_0 - v_1||²: more weight on key 1 helps (∂L/∂p < 0), more on
    key 0 hurts (∂L/∂p > 0)."""
    layer, prod = layer_and_sbm(heads=1, sampler="bernoulli")
    saturate(prod)
    x = torch.randn(2, 8, dtype=f64, generator=torch.Generator().manual_seed(3))
    zero = torch.tensor([0, 0])
    prod.draw = fixed_draw(SampledEdges(zero, torch.tensor([0, 1]), zero, zero))
    out, es = run_layer(layer, prod, x)
    es.bias.retain_grad()
    target = layer.lin_value(x)[1].detach()
    (out[0] - target).square().sum().backward()
    g = dict(zip(es.edge_index[0].tolist(), es.bias.grad.tolist(), strict=True))
    assert g[1] < 0 < g[0]


@pytest.mark.parametrize("native", [True, False])
def test_edge_gate_backward_gradcheck(native, monkeypatch):
    """The gate's chunked backward is the gradient of p_e = Y_r · W_s (gradcheck with the value
    forward, no clip), and the straight-through forward is 1 with the same, clipped, backward:
    the compiled backward (``sbm_gate_backward``) and the sparse products of the torch path."""
    from graphattn.producers.sbm import native as native_module

    monkeypatch.setattr(native_module, "NATIVE_SAMPLERS", native)
    g = torch.Generator().manual_seed(0)
    Y = torch.rand(5, 2, 3, dtype=f64, generator=g, requires_grad=True)
    W = torch.rand(5, 2, 3, dtype=f64, generator=g, requires_grad=True)
    qi, kj, h = torch.tensor([0, 1, 4, 4, 2]), torch.tensor([3, 1, 0, 0, 2]), torch.tensor([0, 1, 1, 1, 0])
    assert torch.autograd.gradcheck(
        lambda a, b: edge_gate(a, b, qi, kj, h, straight_through=False, clip=None, chunk=2), (Y, W))
    gate = edge_gate(Y, W, qi, kj, h, clip=0.5, chunk=3)
    assert torch.equal(gate, torch.ones(5, dtype=f64))
    w = torch.tensor([2.0, -0.1, 0.3, -3.0, 0.0], dtype=f64)
    gY, gW = torch.autograd.grad((gate * w).sum(), (Y, W))
    p = (Y[qi, h] * W[kj, h]).sum(-1)
    rY, rW = torch.autograd.grad((p * w.clamp(-0.5, 0.5)).sum(), (Y, W))
    assert torch.allclose(gY, rY) and torch.allclose(gW, rW)


class _OfficialSTE(torch.autograd.Function):
    """The official SampleGraphSparseGraph with the Bernoulli draw replaced by a given mask."""

    @staticmethod
    def forward(ctx, expA, mask):
        ctx.save_for_backward(mask)
        return mask.clone()

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return F.hardtanh(mask * grad), None


def _official_dense(layer, prod, x, mask):
    """Port of the official SBMAttention dense branch for one sequence, mask [H, n, n] (query, key)."""
    n, H, C = x.size(0), layer.heads, layer.out_channels
    Q, K, V = (lin(x).view(n, H, C).transpose(0, 1) for lin in (layer.lin_query, layer.lin_key,
                                                                 layer.lin_value))
    Cl = prod.clusters
    S = torch.softmax((Cl @ Cl.transpose(1, 2)).reshape(H, -1), -1).view_as(Cl @ Cl.transpose(1, 2))
    Qh = torch.sigmoid(prod.proj(Q) @ Cl.transpose(1, 2))
    Kh = torch.sigmoid(prod.proj(K) @ Cl.transpose(1, 2))
    graph = _OfficialSTE.apply(Qh @ (S @ Kh.transpose(1, 2)), mask)
    attn = F.normalize(torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(C), -1) * graph, p=1, dim=-1)
    out = (attn @ V).transpose(0, 1).reshape(n, H * C)
    sparsity = graph.sum((-1, -2)) / (n * n)  # official: sum over (batch, n, n) → per head
    return out, sparsity.mean()


def test_equivalent_to_official_dense_path_given_the_mask():
    """Same mask, same weights: outputs equal to 1e-10; gradients of clusters, MLP, W_Q, W_K, W_V
    equal (loss scale 1e4, so hardtanh clips, plus the density regulariser)."""
    n, H = 7, 2
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 8, dtype=f64, generator=g)
    mask = (torch.rand(H, n, n, generator=g) < 0.4).to(f64)
    mask[0, 3] = 0  # a query without keys
    layer, prod = layer_and_sbm(heads=H, num_clusters=6)
    h, i, j = mask.nonzero(as_tuple=True)
    prod.draw = fixed_draw(SampledEdges(i, j, h, torch.zeros_like(i)))
    target = torch.randn(n, 8, dtype=f64, generator=g)
    lam = 0.3
    params = [prod.clusters, *prod.proj.parameters(), layer.lin_query.weight, layer.lin_key.weight,
              layer.lin_value.weight]

    out, es = run_layer(layer, prod, x)
    loss = 1e4 * (out - target).square().sum() + lam * es.aux_loss
    ours = torch.autograd.grad(loss, params)
    ref_out, sparsity = _official_dense(layer, prod, x, mask)
    ref_loss = 1e4 * (ref_out - target).square().sum() + lam * sparsity
    theirs = torch.autograd.grad(ref_loss, params)
    assert torch.allclose(out, ref_out, atol=1e-10)
    assert torch.allclose(es.aux_loss, sparsity)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-8, rtol=1e-8)


def test_layer_fast_path_matches_reference_on_sbm_edges():
    """Whatever kernel EdgeAttention picks for per-head SBM edges with a gradient-carrying bias equals
    its explicit reference path: outputs and the gradients of the clusters, the MLP and W_Q (float64)."""
    batch = make_batch([9, 1, 14])
    layer, prod = layer_and_sbm(num_clusters=6)
    layer.train()
    prod.train()
    target = torch.randn(batch.num_nodes, 8, dtype=f64, generator=torch.Generator().manual_seed(0))
    params = [prod.clusters, *prod.proj.parameters(), layer.lin_query.weight, layer.lin_value.weight]
    results = []
    for kernel in ("auto", "reference"):
        layer.kernel = kernel
        out, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(4))
        loss = 10 * (out - target).square().sum() + es.aux_loss
        results.append((out, torch.autograd.grad(loss, params)))
    (o1, g1), (o2, g2) = results
    assert torch.allclose(o1, o2, atol=1e-10)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-9)


def test_density_regulariser_value_and_gradient():
    """aux_loss = #edges / (H Σ n_g²); its gradient gives every sampled p_e exactly λ / (H Σ n_g²)."""
    batch = make_batch([6, 3, 0, 8])
    layer, prod = layer_and_sbm(num_clusters=5, reg_weight=1.0)
    prod.train()
    _, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(2))
    pairs = 36 + 9 + 64
    assert torch.allclose(es.aux_loss, torch.tensor(es.num_edges / (2 * pairs), dtype=f64))
    assert es.stats["density"] == pytest.approx(es.num_edges / (2 * pairs))
    lam = 0.7
    (lam * es.aux_loss).backward()
    got = prod.clusters.grad.clone()
    prod.zero_grad()
    x = batch.x
    q, k = layer.lin_query(x).view(-1, 2, 4).detach(), layer.lin_key(x).view(-1, 2, 4).detach()
    Y, S, Z = prod.sbm(q, k)
    src, dst = es.edge_index
    (lam / (2 * pairs) * edge_probability(Y, S, Z, dst, src, es.head)).sum().backward()
    assert torch.allclose(got, prod.clusters.grad, atol=1e-12)


def test_determinism():
    batch = make_batch([9, 4, 12])
    layer, prod = layer_and_sbm(num_clusters=8)
    prod.train()
    layer.train()

    def sample(seed):
        return run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(seed))

    (o1, e1), (o2, e2), (_, e3) = sample(0), sample(0), sample(1)
    assert torch.equal(e1.edge_index, e2.edge_index) and torch.equal(e1.head, e2.head)
    assert torch.equal(o1, o2)
    assert not (e1.num_edges == e3.num_edges and torch.equal(e1.edge_index, e3.edge_index))
    # evaluation without a generator: a fixed seed (deterministic); eval_seed=None: stochastic
    prod.eval()
    layer.eval()
    a = run_layer(layer, prod, batch.x, batch.batch)[1]
    b = run_layer(layer, prod, batch.x, batch.batch)[1]
    assert torch.equal(a.edge_index, b.edge_index)
    prod.eval_seed = None
    torch.manual_seed(0)
    c = run_layer(layer, prod, batch.x, batch.batch)[1]
    d = run_layer(layer, prod, batch.x, batch.batch)[1]
    assert not (c.num_edges == d.num_edges and torch.equal(c.edge_index, d.edge_index))


def test_exploration_in_eval_is_optional():
    batch = make_batch([10, 10])
    for delta_in_eval in (True, False):
        layer, prod = layer_and_sbm(num_clusters=4, delta=0.5, delta_in_eval=delta_in_eval)
        layer.eval()  # the context's training flag is the layer's
        with torch.no_grad():
            _, es = run_layer(layer, prod, batch.x, batch.batch)
            q = layer.lin_query(batch.x).view(-1, 2, 4)
            k = layer.lin_key(batch.x).view(-1, 2, 4)
            Y, S, Z = prod.sbm(q, k)
        lam = expected_num_edges(Y, S, Z, batch.ptr, 0.5 if delta_in_eval else 0.0)
        assert torch.allclose(es.stats["per_graph_head"]["expected_edges"], lam)
        assert es.bias is None  # no gradient needed: no gate
        explored = (es.origin == origin_code("exploration")).any()
        assert bool(explored) == delta_in_eval


def test_self_loops_and_multi_edges():
    batch = make_batch([5, 4])
    N, H = 9, 2
    layer, prod = layer_and_sbm(num_clusters=4, self_loops=True, delta=0.0)
    prod.train()
    _, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(0))
    src, dst = es.edge_index
    loops = src == dst
    has = torch.zeros(N * H, dtype=torch.bool)
    has[(dst * H + es.head)[loops]] = True
    assert has.all()
    added = es.origin == origin_code("self_loop")
    assert (src[added] == dst[added]).all() and added.any()
    assert es.coalesce().num_edges == es.num_edges
    # added loops carry no gradient; sampled edges do; the regulariser counts sampled edges only
    grad = torch.autograd.grad(es.bias[added].sum() + 0 * es.bias.sum(), prod.clusters, allow_unused=True)[0]
    assert grad is None or (grad == 0).all()
    assert float(es.aux_loss.detach()) == pytest.approx(float((~added).sum()) / (H * (25 + 16)))
    # without dedupe a pair can be drawn several times: each copy is an edge
    layer, prod = layer_and_sbm(num_clusters=4, dedupe=False, delta=2.0)
    prod.train()
    _, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(0))
    assert es.coalesce().num_edges < es.num_edges
    assert float(es.aux_loss.detach()) == pytest.approx(es.num_edges / (H * (25 + 16)))


# ------------------------------------------------------------------------------ integration
def test_model_lazy_parameters_state_dict_and_stats():
    """In a GraphTransformer (lazy head size, incl. an output layer averaging full-width heads):
    forward, backward, aux loss, per-layer scalar stats for the runner; a state dict loads into a
    fresh, unmaterialised model and reproduces its output."""
    batch = make_batch([6, 9, 1], channels=5, dtype=torch.float32)
    kwargs = dict(hidden_channels=16, out_channels=3, num_layers=2, heads=2, head_layers=0,
                  producer={"name": "sbm", "num_clusters": 8})
    torch.manual_seed(0)
    model = GraphTransformer(**kwargs)
    model.train()
    out = model(batch, generator=torch.Generator().manual_seed(0))
    aux = model.aux_loss()
    assert aux is not None
    (out.square().mean() + 1e-2 * aux).backward()
    heads = [layer.producer for layer in model.layers]
    assert heads[0].head_dim == 8 and heads[1].head_dim == 3  # output layer: heads of width 3
    assert all(p.clusters.grad is not None for p in heads)
    stats = _density(model)
    assert all(0 < s["density"] < 1 and "density_head1" in s for s in stats)
    assert all(set(s) >= {"expected_density", "sampled_edges"} and "per_graph_head" not in s for s in stats)
    model.eval()
    fresh = GraphTransformer(**kwargs)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    assert torch.equal(fresh(batch), model(batch))


def test_union_with_window_keeps_the_gate():
    """The GLUE setting: SBM edges ∪ a sliding window; an edge in both keeps the SBM gate."""
    batch = make_batch([12])
    layer = EdgeAttention(8, 4, heads=2).double()
    prod = build_producer({"name": "union", "producers": [
        {"name": "sbm", "num_clusters": 4}, {"name": "window", "window": 2}]}, heads=2).double()
    prod.train()
    out, es = run_layer(layer, prod, batch.x, batch.batch, generator=torch.Generator().manual_seed(0))
    assert es.coalesce().num_edges == es.num_edges
    sampled = es.origin == origin_code("sampled")
    assert sampled.any() and (es.origin == origin_code("window")).any()
    grads = torch.autograd.grad(es.bias[sampled].sum(), prod.parts[0].clusters)
    assert torch.isfinite(grads[0]).all()
    assert es.aux_loss is not None and torch.isfinite(out).all()


def test_validation():
    for kwargs, name in [({"num_clusters": 0}, "num_clusters"), ({"delta": -0.1}, "delta"),
                         ({"sampler": "alias"}, "sampler"), ({"ste": "eq9"}, "ste"),
                         ({"ste_clip": 0.0}, "ste_clip"), ({"reg_weight": float("nan")}, "reg_weight"),
                         ({"heads": 0}, "heads"), ({"eval_seed": 1.5}, "eval_seed")]:
        with pytest.raises(ValueError, match=name):
            SBMEdges(**kwargs)
    _, prod = layer_and_sbm(heads=2, head_dim=4)
    with pytest.raises(ValueError, match="heads"):
        EdgeAttention(8, 4, heads=1).double()(torch.randn(3, 8, dtype=f64), prod)
    with pytest.raises(ValueError, match="query"):
        prod(torch.randn(3, 8, dtype=f64))  # standalone: no layer projections
    with pytest.raises(ValueError, match="'ptr'"):
        fastrg_sample(torch.rand(3, 1, 2), torch.rand(1, 2, 2), torch.rand(3, 1, 2), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="'B'"):
        fastrg_sample(torch.rand(3, 1, 2), torch.rand(2, 2), torch.rand(3, 1, 2), torch.tensor([0, 3]))
    with pytest.raises(FloatingPointError):
        Y = torch.full((3, 1, 2), float("nan"))
        fastrg_sample(Y, torch.rand(1, 2, 2), Y, torch.tensor([0, 3]))
    assert "sampler='fastrg'" in repr(prod) and "num_clusters=128" in repr(prod)


def test_key_projection_matches_dense_p():
    Y, B, Z = random_sbm(5, 2, 3, seed=11)
    W = key_projection(Z, B)
    assert torch.allclose(torch.einsum("ihu,jhu->hij", Y, W), dense_p(Y, B, Z))


@pytest.mark.parametrize("dtype", [torch.float32, f64])
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)])
def test_compiled_gate_backward_equals_the_sparse_products(dtype, need, monkeypatch):
    """``sbm_gate_backward`` against the torch path's two ``torch.sparse.mm`` products, on edges with
    repeats and rows without edges: float64 to rounding, float32 to its precision (the sums run in
    another order); an input that needs no gradient gets none."""
    native_module = _native_ops_or_skip()
    g = torch.Generator().manual_seed(3)
    N, H, k, E = 40, 3, 16, 2000
    Y0 = torch.randn(N, H, k, generator=g, dtype=dtype)
    W0 = torch.randn(N, H, k, generator=g, dtype=dtype)
    qi, kj = torch.randint(0, N - 5, (E,), generator=g), torch.randint(0, N, (E,), generator=g)
    h = torch.randint(0, H, (E,), generator=g)
    w = torch.randn(E, generator=g, dtype=dtype)

    def grads():
        Y, W = Y0.clone().requires_grad_(need[0]), W0.clone().requires_grad_(need[1])
        gate = edge_gate(Y, W, qi, kj, h, clip=0.7)
        gate.backward(w)
        return Y.grad, W.grad

    native = grads()
    monkeypatch.setattr(native_module, "NATIVE_SAMPLERS", False)
    reference = grads()
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == f64 else {"rtol": 1e-5, "atol": 1e-5}
    for a, b, needed in zip(native, reference, need, strict=True):
        assert (a is None) == (b is None) == (not needed)
        if needed:
            assert a.dtype == dtype and torch.allclose(a, b, **tol)
    assert native[0] is None or torch.equal(native[0][N - 5:], torch.zeros_like(native[0][N - 5:]))


def test_compiled_fastrg_draws_equal_the_torch_path_over_many_blocks(monkeypatch):
    """Enough edges (about 40k) that the compiled draws run in several blocks of edges, pieces of
    rows crossing block boundaries: still exactly the torch path's edges, in the same order."""
    native_module = _native_ops_or_skip()
    g = torch.Generator().manual_seed(9)
    sizes, H, k = [150, 3, 120], 2, 3
    N = sum(sizes)
    Y = torch.rand(N, H, k, generator=g, dtype=f64)
    Z = torch.rand(N, H, k, generator=g, dtype=f64)
    B = torch.rand(H, k, k, generator=g, dtype=f64) * 3.0
    _assert_same_draws(lambda: fastrg_sample(Y, B, Z, ptr_of(sizes), delta=0.02, chunk_size=30000,
                                             generator=torch.Generator().manual_seed(2)),
                       native_module, monkeypatch, least_edges=35000)


def test_compiled_dedupe_equals_the_torch_path(monkeypatch):
    """De-duplication through the compiled radix sort (the indices decoded from the sorted keys)
    keeps the same edges, in the same order, with the same kinds, as torch's stable argsort."""
    from graphattn.core import index

    _native_ops_or_skip()
    g = torch.Generator().manual_seed(4)
    sizes, H, k = [60, 1, 45], 2, 3
    Y = torch.rand(sum(sizes), H, k, generator=g, dtype=f64)
    B = torch.rand(H, k, k, generator=g, dtype=f64) * 4.0
    edges, _ = fastrg_sample(Y, B, Y, ptr_of(sizes), delta=0.5,
                             generator=torch.Generator().manual_seed(1))
    assert edges.num_edges > 4 * index.NATIVE_UNIQUE_MIN
    native = dedupe(edges, sum(sizes), H)
    monkeypatch.setattr(index, "NATIVE_UNIQUE_MIN", None)
    reference = dedupe(edges, sum(sizes), H)
    assert native.num_edges < edges.num_edges and (native.kind == EXPLORATION).any()
    for name in ("query", "key", "head", "kind"):
        assert torch.equal(getattr(native, name), getattr(reference, name)), name
