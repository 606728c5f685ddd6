"""AttentionView: the edges per (layer, head) equal the trace's, pruning, graph selection, virtual
slots, focus neighbourhoods, thinning, layouts and input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

from graphattn.core.origins import origin_name
from graphattn.viz import EdgeList, build_view, prune, thin_layer, trace_sample
from graphattn.viz.layout import image_background, node_positions
from tests.viz.samples import (
    expected_count,
    image_sample,
    molecule_sample,
    node_sample,
    sequence_sample,
)


@pytest.fixture(scope="module")
def mol():
    return molecule_sample()


def test_counts_equal_trace_per_head_and_mean(mol):
    view = build_view(mol.trace, mol.data, kind="molecule", labels=mol.labels)
    assert view.num_layers == len(mol.trace)
    for rec, lay in zip(mol.trace, view.layers, strict=True):
        for h in range(lay.num_heads):
            assert lay.count(h) == expected_count(rec, None, h)
        assert lay.count(None) == expected_count(rec, None, None)
    # the per-head layer really has different edges per head and duplicates
    per_head = view.layers[1]
    assert per_head.head is not None and per_head.count(0) != per_head.count(1)


def test_weights_are_the_traced_coefficients(mol):
    view = build_view(mol.trace, mol.data)
    for rec, lay in zip(mol.trace, view.layers, strict=True):
        N = rec.batch.numel()
        ei = rec.edges.edge_index
        for h in range(lay.num_heads):
            el = lay.edges(h)
            m = torch.ones(ei.size(1), dtype=torch.bool)
            if rec.edges.head is not None:
                m = rec.edges.head == h
            np.testing.assert_allclose(el.weight, rec.alpha[m, h].double().numpy(), rtol=1e-12)
            # attention mode: each target's coefficients of one head sum to 1
            sums = np.bincount(el.dst, weights=el.weight, minlength=N)
            has = np.bincount(el.dst, minlength=N) > 0
            np.testing.assert_allclose(sums[has], 1.0, atol=1e-5)


def test_mean_over_heads_sums_duplicates(mol):
    view = build_view(mol.trace, mol.data)
    lay = view.layers[1]
    rec = mol.trace[1]
    H = lay.num_heads
    ref: dict[tuple[int, int], float] = {}
    for (s, t), a in zip(rec.edges.edge_index.T.tolist(), rec.alpha.sum(1).tolist(), strict=True):
        ref[(s, t)] = ref.get((s, t), 0.0) + a / H
    el = lay.edges(None)
    got = {(int(s), int(t)): float(w) for s, t, w in zip(el.src, el.dst, el.weight, strict=True)}
    assert got.keys() == ref.keys()
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-9)


def test_prune_matches_brute_force():
    g = np.random.default_rng(0)
    E = 300
    el = EdgeList(g.integers(0, 20, E), g.integers(0, 15, E), g.normal(size=E), g.integers(0, 3, E))
    for k in (1, 2, 5):
        for thr in (0.0, 0.5):
            out = prune(el, top_k=k, threshold=thr)
            keep = []
            for t in range(15):
                idx = [e for e in range(E) if el.dst[e] == t and abs(el.weight[e]) >= thr]
                idx.sort(key=lambda e: (-abs(el.weight[e]), e))
                keep += idx[:k]
            keep.sort()
            ref = el.select(np.array(keep, dtype=int))
            assert sorted(zip(out.src, out.dst, out.weight, strict=True)) == sorted(
                zip(ref.src, ref.dst, ref.weight, strict=True))
    assert len(prune(el, threshold=10.0)) == 0
    with pytest.raises(ValueError, match="top_k"):
        prune(el, top_k=0)
    with pytest.raises(ValueError, match="threshold"):
        prune(el, threshold=-1)


def test_origin_filter_and_names(mol):
    view = build_view(mol.trace, mol.data)
    assert view.origin_names() == ["input", "expander", "virtual", "sampled"]
    el = view.edges(0, 0, origins=["virtual"])
    assert len(el) == mol.data.num_nodes  # one virtual node, every atom attends to it
    assert {origin_name(int(c)) for c in el.origin} == {"virtual"}


def test_graph_selection_and_virtual_slots():
    torch.manual_seed(0)
    from tests.viz.samples import _model

    graphs = [Data(x=torch.randn(n, 8), edge_index=torch.randint(0, n, (2, 2 * n)), num_nodes=n)
              for n in (5, 7, 4)]
    batch = Batch.from_data_list(graphs)
    model = _model([{"name": "union", "producers": ["input", {"name": "virtual", "num_virtual": 2}]}])
    tr = trace_sample(model, batch)
    for gi, n in enumerate((5, 7, 4)):
        view = build_view(tr, batch, graph=gi)
        assert view.num_nodes == n and view.num_virtual == 2
        assert view.node_index.tolist() == list(range(int(batch.ptr[gi]), int(batch.ptr[gi + 1])))
        lay = view.layers[0]
        virt = lay.src >= n
        assert set(lay.src[virt].tolist()) == {n, n + 1}
        assert (lay.dst < n).all()
        assert lay.count(0) == expected_count(tr[0], torch.arange(int(batch.ptr[gi]),
                                                                  int(batch.ptr[gi + 1])), 0)
        assert view.pos.shape == (n + 2, 2) and np.isfinite(view.pos).all()
        assert view.labels[n:] == ["v0", "v1"]
    # a graph without edges still gives a view
    empty = Batch.from_data_list([Data(x=torch.randn(1, 8), edge_index=torch.empty(2, 0, dtype=torch.long),
                                       num_nodes=1)])
    view = build_view(trace_sample(_model(["input"]), empty), empty)
    assert view.num_nodes == 1 and view.layers[0].num_edges == 0 and view.edges(0, None).src.size == 0


def test_focus_neighbourhood():
    s = node_sample()
    view = build_view(s.trace, s.data, focus=s.focus, focus_k=3, max_nodes=12, labels=s.labels)
    assert view.focus == 0 and view.node_index[0] == s.focus
    assert view.num_nodes <= 12
    assert view.hop is not None and view.hop[0] == 0 and set(view.hop[1:view.num_nodes].tolist()) <= {1, 2}
    # hop-1 nodes include the focus node's 3 strongest sources (max |alpha| over layers and heads)
    best: dict[int, float] = {}
    for rec in s.trace:
        ei, a = rec.edges.edge_index, rec.alpha.abs().max(1).values
        for (j, t), w in zip(ei.T.tolist(), a.tolist(), strict=True):
            if t == s.focus and j != s.focus:
                best[j] = max(best.get(j, -1.0), w)
    top3 = [j for j, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:3]]
    assert view.node_index[1:4].tolist() == top3
    # edges are the traced edges among the kept nodes
    kept = torch.as_tensor(view.node_index)
    for rec, lay in zip(s.trace, view.layers, strict=True):
        ei = rec.edges.edge_index
        inside = torch.isin(ei[0], kept) & torch.isin(ei[1], kept)
        assert lay.num_edges == int(inside.sum())
        assert (view.node_index[lay.dst] >= 0).all()
    # the statistics cover the whole graph, not the neighbourhood
    assert view.stats[1]["edges"] == s.data.num_nodes ** 2
    assert any("neighbourhood" in n for n in view.notes)


def test_thinning_for_size_is_recorded():
    s = sequence_sample()
    view = build_view(s.trace, s.data, max_edges=60)
    full = view.layers[1]  # full attention: 14 * 14 edges, 2 heads
    assert full.pruned_from == [196, 196]
    assert full.num_edges < 196
    k = max(1, 60 // (14 * 2))
    for h in range(2):
        # every target keeps at least its top-k in this head
        counts = np.bincount(full.edges(h).dst, minlength=14)
        assert (counts >= k).all()
    assert any("thinned" in n for n in view.notes)
    assert view.stats[1]["edges"] == 196  # statistics from the untouched trace
    # by default nothing is thinned; thin_layer works on a copy
    whole = build_view(s.trace, s.data)
    assert whole.layers[1].num_edges == 196 and whole.layers[1].pruned_from is None
    thin, note = thin_layer(whole.layers[1], 60, 14)
    assert thin.num_edges == full.num_edges and whole.layers[1].num_edges == 196 and "thinned" in note
    assert thin_layer(whole.layers[0], 10_000, 14) == (whole.layers[0], "")


def test_layouts_from_data_positions():
    seq = sequence_sample()
    v = build_view(seq.trace, seq.data, kind="sequence")
    assert v.is_cls.tolist()[:2] == [True, False]
    np.testing.assert_array_equal(v.pos[:14, 0], seq.data.pos[:, 0].numpy())
    np.testing.assert_array_equal(v.pos[:14, 1], 0.0)

    img = image_sample()
    v = build_view(img.trace, img.data, kind="image")
    np.testing.assert_array_equal(v.pos[:, 0], img.data.pos[:, 1].numpy())
    np.testing.assert_array_equal(v.pos[:, 1], -img.data.pos[:, 0].numpy())
    bg, extent = v.background
    np.testing.assert_allclose(bg, img.data.image.numpy(), rtol=1e-6)  # rebuilt from patches
    assert extent == (-0.5, 3.5, -3.5, 0.5)

    # 3-D points: PCA keeps pairwise distances within the cloud's main plane
    g = torch.Generator().manual_seed(0)
    flat = torch.randn(30, 2, generator=g) * torch.tensor([3.0, 1.0])
    pts = torch.cat([flat, 0.01 * torch.randn(30, 1, generator=g)], 1)
    rot = torch.linalg.qr(torch.randn(3, 3, generator=g)).Q
    d = Data(pos=pts @ rot.T, num_nodes=30)
    xy = node_positions(d, np.arange(30), "points")
    assert xy.shape == (30, 2)
    np.testing.assert_allclose(torch.cdist(torch.as_tensor(xy), torch.as_tensor(xy)).numpy(),
                               torch.cdist(flat.double(), flat.double()).numpy(), atol=0.1)
    # 2-D points are drawn as they are
    d2 = Data(pos=flat, num_nodes=30)
    np.testing.assert_allclose(node_positions(d2, np.arange(30), "points"), flat.numpy(), rtol=1e-6)
    # no positions: one layout per connected component, components side by side, never overlapping
    ring = torch.stack([torch.arange(6), (torch.arange(6) + 1) % 6])
    ei = torch.cat([ring, ring + 6, torch.tensor([[12], [13]])], 1)  # two rings, one edge, one isolated
    xy = node_positions(Data(edge_index=ei, num_nodes=15), np.arange(15), "graph", edges=ei.numpy())
    assert np.isfinite(xy).all()
    boxes = [(xy[i].min(0), xy[i].max(0)) for i in (np.arange(6), np.arange(6, 12), [12, 13], [14])]
    for a in range(4):
        for b in range(a + 1, 4):
            (lo1, hi1), (lo2, hi2) = boxes[a], boxes[b]
            assert (hi1 < lo2).any() or (hi2 < lo1).any()
    span = xy.max(0) - xy.min(0)
    assert span.max() < 4 * np.sqrt(15)  # isolated nodes are not flung away
    # features that are not pixels give no background
    assert image_background(Data(x=torch.randn(4, 3), pos=torch.zeros(4, 2)), np.arange(4)) is None


def test_invalid_arguments(mol):
    with pytest.raises(ValueError, match="'graph'"):
        build_view(mol.trace, mol.data, graph=3)
    with pytest.raises(ValueError, match="'focus'"):
        build_view(mol.trace, mol.data, focus=10_000)
    with pytest.raises(ValueError, match="'labels'"):
        build_view(mol.trace, mol.data, labels=["C"])
    with pytest.raises(ValueError, match="'kind'"):
        build_view(mol.trace, mol.data, kind="video")
    other = Batch.from_data_list([Data(x=torch.randn(3, 9), num_nodes=3)])
    with pytest.raises(ValueError, match="trace the same data"):
        build_view(mol.trace, other)
    view = build_view(mol.trace, mol.data)
    with pytest.raises(ValueError, match="'layer'"):
        view.edges(5)
    with pytest.raises(ValueError, match="no traced layer"):
        view.edges("nope")
    with pytest.raises(ValueError, match="'head'"):
        view.edges(0, 2)


MECHANISMS = [{"name": "samsa", "k": 4}, {"name": "sbm"}, "sliceformer", {"name": "sac"}, "converter"]


@pytest.mark.parametrize("spec", MECHANISMS, ids=lambda s: s if isinstance(s, str) else s["name"])
def test_mechanism_producers_are_viewable(spec, tmp_path):
    """The viewer draws what every paper producer really generated: sampled (SBM, SAC), virtual
    support tokens (SAMSA), per-channel sort heads (Sliceformer), complex shift weights (Converter)."""
    import matplotlib

    matplotlib.use("Agg")
    from graphattn.viz import draw_attention, write_html
    from tests.viz.samples import TOKENS, _model, sequence_tokens

    toks = sequence_tokens()
    ids = torch.tensor([TOKENS.index(t) for t in toks])
    n = ids.numel()
    d = Data(x=ids, pos=torch.arange(n, dtype=torch.float)[:, None], num_nodes=n)
    batch = Batch.from_data_list([d, d])
    model = _model([spec, spec], node_encoder="embedding", num_embeddings=len(TOKENS))
    trace = trace_sample(model, batch)
    for graph in (0, 1):
        view = build_view(trace, batch, kind="sequence", labels=toks + toks, graph=graph)
        nodes = torch.arange(graph * n, (graph + 1) * n)
        for rec, lay in zip(trace, view.layers, strict=True):
            assert lay.count(None) == expected_count(rec, nodes, None) > 0
            for h in range(lay.num_heads):
                assert lay.count(h) == expected_count(rec, nodes, h)
                assert np.isfinite(lay.edges(h).weight).all()
            assert lay.complex == rec.alpha.is_complex()
    assert view.layers[0].complex == (spec == "converter")
    draw_attention(view, layer=-1, head=0)
    out = tmp_path / "page.html"
    write_html(view, out)
    assert out.stat().st_size > 0
