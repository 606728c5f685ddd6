"""Property tests of the static producers: no cross-graph edge, the promised degrees,
determinism under a generator, and graphs with 0 and 1 nodes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn import EdgeAttention, EdgeProducer, EdgeSet, origin_code
from graphattn.producers import (
    PRODUCERS,
    ExpanderEdges,
    FullAttention,
    GlobalTokens,
    InputEdges,
    KNNEdges,
    RandomEdges,
    SlidingWindow,
    UnionProducer,
    VirtualNodes,
    build_producer,
)
from graphattn.producers.expander import regular_degree
from tests.helpers import make_batch

sizes_st = st.lists(st.integers(0, 14), min_size=1, max_size=5)
HEADS = 2


def produce(producer, batch, generator=None, training=False):
    producer.train(training)
    es = producer(batch.x, batch.batch, data=batch, generator=generator, num_heads=HEADS)
    es.validate(batch.num_nodes, batch.batch)  # includes the cross-graph check
    return es.to_explicit()


def in_degree(es, n):
    return torch.bincount(es.edge_index[1], minlength=n)


def counts_of(batch):
    return (batch.ptr[1:] - batch.ptr[:-1])[batch.batch]


def no_cross_graph(es, batch):
    src, dst = es.edge_index
    real = src < batch.num_nodes
    assert torch.equal(batch.batch[src[real]], batch.batch[dst[real]])


def consumable(producer, batch):
    """The producer's edge set runs through the layer without NaN."""
    layer = EdgeAttention(batch.x.size(1), 3, heads=HEADS).double()
    out = layer(batch.x, producer, batch.batch, data=batch)
    assert torch.isfinite(out).all()


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, loops=st.booleans())
def test_input_edges(sizes, loops):
    batch = make_batch(sizes)
    es = produce(InputEdges(self_loops=loops), batch)
    no_cross_graph(es, batch)
    base = batch.edge_index.size(1)
    assert torch.equal(es.edge_index[:, :base], batch.edge_index)  # order kept
    if loops:
        src, dst = es.edge_index
        has = torch.zeros(batch.num_nodes, dtype=torch.bool)
        has[src[src == dst]] = True
        assert has.all()
        assert (es.origin[base:] == origin_code("self_loop")).all()
    consumable(InputEdges(self_loops=loops), batch)


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st)
def test_full(sizes):
    batch = make_batch(sizes)
    es = produce(FullAttention(), batch)
    no_cross_graph(es, batch)
    assert torch.equal(in_degree(es, batch.num_nodes), counts_of(batch))
    assert es.coalesce().num_edges == es.num_edges  # no duplicates
    consumable(FullAttention(), batch)


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, w=st.integers(0, 4), causal=st.booleans())
def test_window(sizes, w, causal):
    batch = make_batch(sizes)
    es = produce(SlidingWindow(w, causal=causal), batch)
    no_cross_graph(es, batch)
    local = torch.arange(batch.num_nodes) - batch.ptr[batch.batch]
    n = counts_of(batch)
    left = torch.minimum(local, torch.tensor(w))
    right = 0 if causal else torch.minimum(n - 1 - local, torch.tensor(w))
    assert torch.equal(in_degree(es, batch.num_nodes), left + right + 1)
    src, dst = es.edge_index
    off = dst - src
    assert off.abs().max() <= w if es.num_edges else True
    if causal and es.num_edges:
        assert (off >= 0).all()


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, positions=st.lists(st.integers(0, 5), min_size=1, max_size=3),
       to_all=st.booleans(), by_all=st.booleans())
def test_global_tokens(sizes, positions, to_all, by_all):
    if not (to_all or by_all):
        with pytest.raises(ValueError, match="attend_to_all"):
            GlobalTokens(positions, to_all, by_all)
        return
    batch = make_batch(sizes)
    es = produce(GlobalTokens(positions, attend_to_all=to_all, attended_by_all=by_all), batch)
    no_cross_graph(es, batch)
    assert es.coalesce().num_edges == es.num_edges  # each edge once
    local = torch.arange(batch.num_nodes) - batch.ptr[batch.batch]
    n = counts_of(batch)
    tokens = torch.tensor(sorted(set(positions)))
    is_token = (local[:, None] == tokens).any(1)
    tokens_in_graph = (tokens[None, :] < n[:, None]).sum(1)
    # every node's in-edges: the tokens of its graph (if attended by all); a token: its whole graph
    expected = tokens_in_graph if by_all else torch.zeros_like(n)
    if to_all:
        expected = torch.where(is_token, n, expected)
    assert torch.equal(in_degree(es, batch.num_nodes), expected)
    src, dst = es.edge_index
    assert (is_token[src] | is_token[dst]).all()  # nothing but token edges
    assert (es.origin == origin_code("global")).all()
    consumable(GlobalTokens(positions, to_all, by_all), batch)


def test_global_tokens_validate_positions():
    with pytest.raises(ValueError, match="positions"):
        GlobalTokens([])
    with pytest.raises(ValueError, match="positions"):
        GlobalTokens([0, -1])
    assert GlobalTokens(2).positions == (2,)
    assert "positions=[0]" in repr(build_producer({"name": "global"}))


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, k=st.integers(1, 6), loop=st.booleans())
def test_knn(sizes, k, loop):
    batch = make_batch(sizes)
    es = produce(KNNEdges(k, loop=loop), batch)
    no_cross_graph(es, batch)
    n = counts_of(batch)
    expected = torch.minimum(n if loop else n - 1, torch.tensor(k))
    assert torch.equal(in_degree(es, batch.num_nodes), expected)
    src, dst = es.edge_index
    if not loop:
        assert (src != dst).all()
    # they are the nearest: no excluded same-graph node is strictly closer than a chosen one
    d = torch.cdist(batch.pos, batch.pos)
    for i in range(batch.num_nodes):
        chosen = src[dst == i]
        if chosen.numel() == 0:
            continue
        same = (batch.batch == batch.batch[i]).nonzero().view(-1)
        others = same[~torch.isin(same, chosen)]
        if not loop:
            others = others[others != i]
        if others.numel():
            assert d[i, others].min() >= d[i, chosen].max() - 1e-9


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, k=st.integers(1, 8), exclude=st.booleans(), seed=st.integers(0, 99))
def test_random(sizes, k, exclude, seed):
    batch = make_batch(sizes)
    p = RandomEdges(k, exclude_self=exclude)
    es = produce(p, batch, torch.Generator().manual_seed(seed))
    no_cross_graph(es, batch)
    n = counts_of(batch)
    expected = torch.minimum(n - 1 if exclude else n, torch.tensor(k)).clamp(min=0)
    assert torch.equal(in_degree(es, batch.num_nodes), expected)
    assert es.coalesce().num_edges == es.num_edges  # without replacement
    if exclude:
        assert (es.edge_index[0] != es.edge_index[1]).all()
    again = produce(p, batch, torch.Generator().manual_seed(seed))
    assert torch.equal(es.edge_index, again.edge_index)


def test_random_is_uniform():
    """Floyd sampling: every 2-subset of 4 nodes equally likely (chi-square, 1e-3 false alarm)."""
    from graphattn.producers.random import sample_without_replacement

    g = torch.Generator().manual_seed(0)
    R = 60000
    draw = sample_without_replacement(torch.full((R,), 4), 2, g).sort(1).values
    code = draw[:, 0] * 4 + draw[:, 1]
    counts = torch.bincount(code, minlength=16)[[1, 2, 3, 6, 7, 11]].double()
    expected = R / 6
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # chi2(5 dof) 0.999 quantile


def test_random_eval_is_deterministic_and_train_resamples():
    batch = make_batch([30, 20])
    p = RandomEdges(4)
    a = produce(p, batch)
    b = produce(p, batch)
    assert torch.equal(a.edge_index, b.edge_index)
    torch.manual_seed(0)
    c = produce(p, batch, training=True)
    d = produce(p, batch, training=True)
    assert not torch.equal(c.edge_index, d.edge_index)


@settings(max_examples=20, deadline=None)
@given(sizes=sizes_st, d=st.integers(1, 5), seed=st.integers(0, 99))
def test_expander(sizes, d, seed):
    batch = make_batch(sizes)
    p = ExpanderEdges(d)
    es = produce(p, batch, torch.Generator().manual_seed(seed))
    no_cross_graph(es, batch)
    n = counts_of(batch)
    expected = torch.tensor([regular_degree(int(m), d) for m in n], dtype=torch.long)
    assert torch.equal(in_degree(es, batch.num_nodes), expected)
    assert (es.edge_index[0] != es.edge_index[1]).all()
    assert es.coalesce().num_edges == es.num_edges
    again = produce(p, batch, torch.Generator().manual_seed(seed))
    assert torch.equal(es.edge_index, again.edge_index)
    # without a generator the expander of a size is fixed
    assert torch.equal(produce(p, batch).edge_index, produce(p, batch).edge_index)


@settings(max_examples=20, deadline=None)
@given(sizes=sizes_st, m=st.integers(1, 3), pool=st.sampled_from(["mean", "sum", "max", "none"]))
def test_virtual(sizes, m, pool):
    batch = make_batch(sizes)
    p = VirtualNodes(batch.x.size(1), num_virtual=m, pool=pool).double()
    es = produce(p, batch)
    assert torch.equal(in_degree(es, batch.num_nodes), torch.full((batch.num_nodes,), m))
    src, dst = es.edge_index
    assert (src >= batch.num_nodes).all()
    vgraph = es.virtual_batch[src - batch.num_nodes]
    assert torch.equal(vgraph, batch.batch[dst])
    consumable(p, batch)


@settings(max_examples=20, deadline=None)
@given(sizes=sizes_st)
def test_union(sizes):
    batch = make_batch(sizes)
    p = UnionProducer(["input", {"name": "window", "window": 1}, "virtual"],
                      channels=batch.x.size(1)).double()
    es = produce(p, batch)
    no_cross_graph(es, batch)
    assert es.coalesce().num_edges == es.num_edges
    names = {origin_code(n) for n in ("input", "window", "virtual")}
    assert set(es.origin.tolist()) <= names
    consumable(p, batch)


def test_registry_and_errors():
    for name in ("input", "full", "window", "knn", "random", "expander", "virtual", "union"):
        assert name in PRODUCERS
    assert isinstance(build_producer({"name": "knn", "k": 3}), KNNEdges)
    with pytest.raises(ValueError, match="unknown producer"):
        build_producer("nope")
    with pytest.raises(ValueError, match="does not take"):
        build_producer({"name": "knn", "kk": 3})
    with pytest.raises(ValueError, match="'k'"):
        KNNEdges(0)
    with pytest.raises(ValueError, match="pos"):
        KNNEdges(2)(torch.randn(3, 2))
    with pytest.raises(ValueError, match="sorted"):
        FullAttention()(torch.randn(3, 2), torch.tensor([1, 0, 1]))


def test_virtual_nodes_size_themselves_lazily():
    """``channels=-1``: a first layer that reads the raw features (no node encoder) gets virtual
    nodes of that width, learned like any parameter."""
    from graphattn.producers.virtual import VirtualNodes

    p = VirtualNodes(-1, num_virtual=2)
    x = torch.randn(7, 13)
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    es = p(x, batch, num_heads=2)
    assert p.channels == 13 and p.embedding.shape == (2, 13)
    assert es.virtual_x.shape == (4, 13)
    with pytest.raises(ValueError, match="got x of width 5"):
        p(torch.randn(7, 5), batch, num_heads=2)
    with pytest.raises(ValueError, match="'channels' must be a positive int or -1"):
        VirtualNodes(0)


def test_union_of_batch_only_parts_and_virtual_nodes_in_a_model_pass():
    """Inside a forward pass (``edge_cache``) ``input ∪ expander ∪ virtual`` unites the batch-only
    parts once and appends each layer's virtual edges without sorting again: the same edges with
    the same fields as the plain union, and the same output."""
    from torch_geometric.data import Batch, Data

    from graphattn import EdgeAttention, ProducerContext

    g = torch.Generator().manual_seed(0)
    graphs = []
    for n in (6, 1, 9):
        s = torch.arange(n)
        ring = torch.stack([s, (s + 1) % n]) if n > 1 else torch.zeros(2, 0, dtype=torch.long)
        graphs.append(Data(x=torch.randn(n, 8, generator=g), edge_index=torch.cat([ring, ring.flip(0)], 1)))
    data = Batch.from_data_list(graphs)
    union = build_producer({"name": "union", "producers": ["input", {"name": "expander", "degree": 2},
                                                           {"name": "virtual", "channels": 8}]})
    cache: dict = {}
    ctx = ProducerContext(data.x, data.batch, data=data, edge_cache=cache, num_heads=2)
    fast = union(data.x, data.batch, context=ctx)
    plain = union(data.x, data.batch, data=data, num_heads=2)  # no cache: coalesce everything
    assert any(k[0] == "union-prefix" for k in cache)
    assert fast.stats == plain.stats

    def rows(es):
        cols = [es.edge_index[1], es.edge_index[0], es.origin]
        return sorted(zip(*[c.tolist() for c in cols], strict=True))

    assert rows(fast) == rows(plain) and len(set(rows(fast))) == fast.num_edges
    assert torch.equal(fast.virtual_x, plain.virtual_x)
    layer = EdgeAttention(8, 4, heads=2).double()
    x = data.x.double()
    torch.testing.assert_close(layer(x, fast.to(torch.float64), data.batch),
                               layer(x, plain.to(torch.float64), data.batch), rtol=0, atol=1e-12)


def test_knn_pads_each_size_class_to_its_own_largest_graph():
    """Graphs are grouped by size (within a factor 1.25) so that the padded distance blocks stay
    near sum n_g^2; every non-empty graph is in exactly one class; the edges are those of the
    per-graph definition (checked on a batch mixing sizes 1 to 60)."""
    from graphattn.kernels.dense import SIZE_CLASS_RATIO, size_classes

    sizes = [5, 0, 60, 1, 7, 59, 6, 2, 30, 33, 1]
    buckets = size_classes(sizes)
    seen = sorted(g for graphs, _ in buckets for g in graphs)
    assert seen == [g for g, n in enumerate(sizes) if n > 0]
    for graphs, largest in buckets:
        ns = [sizes[g] for g in graphs]
        assert largest == max(ns) and max(ns) <= SIZE_CLASS_RATIO * min(ns)
    padded = sum(len(graphs) * largest**2 for graphs, largest in buckets)
    assert padded <= SIZE_CLASS_RATIO**2 * sum(n * n for n in sizes)
    batch = make_batch([n for n in sizes if n > 0])
    es = produce(KNNEdges(4), batch)
    d = torch.cdist(batch.pos, batch.pos)
    d[batch.batch[:, None] != batch.batch[None, :]] = float("inf")
    d.fill_diagonal_(float("inf"))
    src, dst = es.edge_index
    for i in range(batch.num_nodes):
        k_i = int(torch.isfinite(d[i]).sum().clamp(max=4))
        expected = set(torch.topk(d[i], k_i, largest=False).indices.tolist())
        assert set(src[dst == i].tolist()) == expected


def test_knn_one_padded_class_gives_the_same_edges(monkeypatch):
    """The CUDA plan (every graph padded to the batch's largest) yields exactly the edges of the
    CPU's size classes."""
    from graphattn.kernels import dense

    from graphattn.producers import knn

    batch = make_batch([5, 60, 1, 7, 59, 6, 2, 30, 33, 1])
    classes = produce(KNNEdges(4), batch).edge_index
    real = dense.padding_classes
    monkeypatch.setattr(knn, "padding_classes",
                        lambda sizes, device, pairs: real(sizes, torch.device("cuda"), pairs))
    assert torch.equal(produce(KNNEdges(4), batch).edge_index, classes)


def _ring_batch(sizes=(6, 1, 9), channels=8):
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(0)
    graphs = []
    for n in sizes:
        s = torch.arange(n)
        ring = torch.stack([s, (s + 1) % n]) if n > 1 else torch.zeros(2, 0, dtype=torch.long)
        graphs.append(Data(x=torch.randn(n, channels, generator=g, dtype=torch.float64),
                           edge_index=torch.cat([ring, ring.flip(0)], 1)))
    return Batch.from_data_list(graphs)


EXPHORMER = ["input", {"name": "expander", "degree": 2}, {"name": "virtual", "channels": 8}]


def test_union_origin_bias_adds_the_table_entry_of_each_edge():
    """``origin_bias``: every edge's logit bias is the table's (origin, head) entry; a zero table
    is the plain union's output; the fused kernel and the reference agree on values and on the
    table's gradient (float64)."""
    data = _ring_batch()
    plain = build_producer({"name": "union", "producers": EXPHORMER}, num_heads=2).double()
    biased = build_producer({"name": "union", "producers": EXPHORMER, "origin_bias": True},
                            num_heads=2).double()
    biased.parts.load_state_dict(plain.parts.state_dict())
    assert "origin_bias=True, origin_bias_scale=10" in repr(biased) and biased.origin_table.shape == (32, 2)
    layer = EdgeAttention(8, 4, heads=2).double()
    x = data.x
    out_plain = layer(x, plain(x, data.batch, data=data, num_heads=2), data.batch)
    torch.testing.assert_close(layer(x, biased(x, data.batch, data=data, num_heads=2), data.batch),
                               out_plain, rtol=0, atol=1e-12)
    with torch.no_grad():
        biased.origin_table.copy_(torch.randn(32, 2, generator=torch.Generator().manual_seed(1)))
    es = biased(x, data.batch, data=data, num_heads=2)
    assert es.bias.shape == (es.num_edges, 2)
    torch.testing.assert_close(es.bias, 10.0 * biased.origin_table[es.origin], rtol=0, atol=0)
    assert not torch.allclose(layer(x, es, data.batch), out_plain)  # three origins meet at a node
    grads = []
    for kernel in ("fused", "reference"):
        layer.kernel = kernel
        biased.origin_table.grad = None
        out = layer(x, biased(x, data.batch, data=data, num_heads=2), data.batch)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append((out.detach(), biased.origin_table.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=1e-12)
    used = sorted(set(es.origin.tolist()))
    assert grads[0][1][used].abs().sum() > 0
    unused = [c for c in range(32) if c not in used]
    assert grads[0][1][unused].abs().sum() == 0


def test_union_origin_bias_per_head_parts_and_an_existing_bias():
    """Per-head parts: the bias is ``table[origin, head]`` ([E]), added to the parts' own bias."""
    data = _ring_batch()
    explicit = EdgeSet(torch.tensor([[0, 2], [1, 3]]), head=torch.tensor([1, 0]), num_heads=2,
                       bias=torch.tensor([0.5, -0.25], dtype=torch.float64),
                       origin=torch.full((2,), origin_code("random")))

    class Fixed(EdgeProducer):
        def produce(self, ctx):
            return explicit

    union = UnionProducer([Fixed(), Fixed()], origin_bias=True, origin_bias_scale=2.0,
                          num_heads=2).double()
    with torch.no_grad():
        union.origin_table[origin_code("random")] = torch.tensor([1.0, 2.0], dtype=torch.float64)
    es = union(data.x, data.batch, num_heads=2)
    assert es.num_edges == 2  # coalesced
    order = es.head.argsort()
    torch.testing.assert_close(es.bias[order], torch.tensor([-0.25 + 2.0, 0.5 + 4.0], dtype=torch.float64))


def test_union_origin_bias_one_table_per_layer_in_a_model():
    from graphattn import GraphTransformer

    data = _ring_batch()
    model = GraphTransformer(8, 3, num_layers=2, heads=2, producer={
        "name": "union", "producers": EXPHORMER, "origin_bias": True}).double()
    tables = [n for n, _ in model.named_parameters() if n.endswith("origin_table")]
    assert len(tables) == 2
    model(data).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in model.named_parameters() if n.endswith("origin_table"))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"origin_bias": 1, "num_heads": 2}, "'origin_bias' must be a bool"),
    ({"origin_bias": True}, "needs 'num_heads'"),
    ({"origin_bias": True, "origin_bias_scale": 0, "num_heads": 2}, "'origin_bias_scale' must be"),
])
def test_union_origin_bias_is_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UnionProducer(["input", "random"], **kwargs)
