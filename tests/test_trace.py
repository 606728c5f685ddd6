"""``graphattn.trace`` and the per-layer statistics: every attention layer is recorded, tracing does
not change what the model computes and records nothing when off, and ``AttentionTrace.summary()``
and the viewer's ``layer_stats`` report the same statistics (one function,
:func:`graphattn.attention_stats.layer_statistics`), equal to a float64 reference by hand."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch, Data

import graphattn as ga
from graphattn.attention_stats import layer_statistics, target_entropy
from graphattn.core.attention import EdgeAttention
from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.tracing import AttentionTrace, TraceRecord, is_tracing
from graphattn.viz import build_view, layer_stats
from tests.helpers import make_batch

PRODUCERS = ["input", {"name": "union", "producers": ["input", "virtual"]}, "full"]


def _model(heads: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return ga.GraphTransformer(16, 3, num_layers=len(PRODUCERS), producer=PRODUCERS, heads=heads,
                               conv="gcn").double().eval()


def _plogp_entropy(p: list[float]) -> float:
    """Shannon entropy in nats of a distribution given by hand (float64, 0 log 0 = 0)."""
    return -sum(q * math.log(q) for q in p if q > 0)


def _h(p: float) -> float:
    return _plogp_entropy([p, 1 - p])


# ------------------------------------------------------------------------------ recording
def test_tracing_records_every_attention_layer_in_call_order():
    model = _model()
    batch = make_batch([6, 4])
    with ga.trace(model) as t:
        model(batch)
    attn = [name for name, m in model.named_modules() if isinstance(m, EdgeAttention)]
    assert len(attn) == len(PRODUCERS)
    assert [rec.layer for rec in t] == attn
    assert [rec.index for rec in t] == list(range(len(attn)))
    for rec in t:
        assert rec.alpha.shape == (rec.edges.num_edges, 2) and rec.alpha.device.type == "cpu"
        assert rec.batch.tolist() == batch.batch.tolist()
        assert not rec.alpha.requires_grad
    # the union layer's virtual source is recorded and attended to
    assert set(t.summary()[1]["origin_share"]) == {"input", "virtual"}


def test_tracing_does_not_change_the_outputs():
    model = _model()
    batch = make_batch([6, 4])
    with torch.no_grad():
        before = model(batch)
        with ga.trace(model) as t:
            traced = model(batch)
        after = model(batch)
    assert len(t) == len(PRODUCERS)
    # tracing forces the explicit path: equal up to float64 rounding, and no state left behind
    torch.testing.assert_close(traced, before, rtol=1e-10, atol=1e-12)
    assert torch.equal(after, before)


def test_tracing_off_records_nothing():
    model = _model()
    batch = make_batch([5])
    assert not is_tracing()
    with ga.trace(model) as t:
        assert is_tracing()
    assert not is_tracing() and len(t) == 0
    model(batch)  # after the context: nothing is recorded anywhere
    assert len(t) == 0
    with ga.trace(model) as t2:
        model(batch)
    assert len(t2) == len(PRODUCERS) and len(t) == 0


def test_tracing_stops_when_the_forward_pass_raises():
    model = _model()
    with pytest.raises(ValueError), ga.trace(model) as t:
        model(make_batch([4], dtype=torch.float32))  # a float64 model refuses float32 features
    assert not is_tracing() and len(t) == 0


# ------------------------------------------------------------- statistics against a reference
def _record(src, dst, alpha, *, N, head=None, batch=None, origin=None) -> TraceRecord:
    ei = torch.tensor([src, dst], dtype=torch.long).view(2, -1)
    a = torch.as_tensor(np.asarray(alpha, dtype=np.float64))
    if a.dim() == 1:
        a = a[:, None]
    es = EdgeSet(ei, head=None if head is None else torch.tensor(head), num_heads=a.size(1),
                 origin=None if origin is None else torch.tensor(origin))
    b = torch.zeros(N, dtype=torch.long) if batch is None else torch.tensor(batch)
    return TraceRecord(layer="hand", index=0, edges=es, alpha=a, batch=b)


def test_entropy_of_known_distributions():
    # target 0: uniform over 3 sources (head 0) / one-hot (head 1); target 1: one source;
    # target 2: (1/2, 1/2) / (1/4, 3/4); target 3: no in-edges (no distribution)
    src = [1, 2, 3, 0, 0, 1]
    dst = [0, 0, 0, 1, 2, 2]
    alpha = [[1 / 3, 1.0], [1 / 3, 0.0], [1 / 3, 0.0], [1.0, 1.0], [0.5, 0.25], [0.5, 0.75]]
    s = _record(src, dst, alpha, N=4).statistics()

    h0 = [math.log(3), 0.0, math.log(2)]
    h1 = [0.0, 0.0, _h(0.25)]
    n0 = [math.log(3) / math.log(3), math.log(2) / math.log(2)]  # targets with >= 2 sources
    n1 = [0.0 / math.log(3), _h(0.25) / math.log(2)]
    per_head = [sum(h0) / 3, sum(h1) / 3]
    per_head_norm = [sum(n0) / 2, sum(n1) / 2]
    assert s["entropy_nats_per_head"] == pytest.approx(per_head, rel=1e-12, abs=1e-15)
    assert s["entropy_normalized_per_head"] == pytest.approx(per_head_norm, rel=1e-12)
    assert s["entropy_nats"] == pytest.approx(sum(per_head) / 2, rel=1e-12)
    assert s["entropy_normalized"] == pytest.approx(sum(per_head_norm) / 2, rel=1e-12)
    assert s["edges"] == 6 and s["edges_per_node"] == 6 / 4 and s["edges_per_node_head"] == 6 / 4
    assert s["density"] == pytest.approx(6 / (4 * 4))
    assert s["max_weight"] == pytest.approx(((1 / 3 + 1 + 0.5) / 3 + (1 + 1 + 0.75) / 3) / 2)
    assert s["origin_share"] == {"unknown": 1.0} and s["mass_share"] == {"unknown": 1.0}


@pytest.mark.parametrize("d", [1, 2, 5, 17])
def test_uniform_over_d_sources_is_log_d_and_one_hot_is_zero(d):
    src = list(range(1, d + 1))
    dst = [0] * d
    ent, deg, ok = target_entropy(np.array(src), np.array(dst), np.full(d, 1.0 / d), num_targets=2)
    assert ent[0] == pytest.approx(math.log(d), rel=1e-13, abs=1e-15)
    assert deg.tolist() == [d, 0] and ok.tolist() == [True, False]
    one_hot = np.r_[1.0, np.zeros(d - 1)]
    ent, _, _ = target_entropy(np.array(src), np.array(dst), one_hot, num_targets=2)
    assert ent[0] == 0.0


def test_copies_of_an_edge_are_one_source_and_weights_are_normalised():
    # 1 -> 0 twice (1/4 + 1/4) and 2 -> 0 once (1/2): two sources, each 1/2
    s = _record([1, 1, 2], [0, 0, 0], [0.25, 0.25, 0.5], N=3).statistics()
    assert s["entropy_nats"] == pytest.approx(math.log(2), rel=1e-13)
    assert s["entropy_normalized"] == pytest.approx(1.0, rel=1e-13)
    # unnormalised or signed coefficients ("weighted" mode, edge weights): shares of sum |alpha|
    s = _record([1, 2, 3], [0, 0, 0], [2.0, -2.0, 4.0], N=4).statistics()
    assert s["entropy_nats"] == pytest.approx(_plogp_entropy([0.25, 0.25, 0.5]), rel=1e-13)
    assert s["max_weight"] == 4.0


def test_complex_coefficients_use_their_modulus():
    rec = _record([1, 2], [0, 0], [0.5, 0.5], N=3)
    rec.alpha = torch.tensor([[0.3 + 0.4j], [0.0 - 0.5j]], dtype=torch.complex128)
    assert rec.statistics()["entropy_nats"] == pytest.approx(math.log(2), rel=1e-13)


def test_targets_without_in_edges_and_empty_layers():
    # 10 nodes, only node 0 receives attention: the mean is over targets with a distribution
    s = _record([1, 2], [0, 0], [0.5, 0.5], N=10).statistics()
    assert s["entropy_nats"] == pytest.approx(math.log(2), rel=1e-13)
    s = _record([], [], np.zeros((0, 2)), N=3).statistics()
    assert s["entropy_nats"] is None and s["entropy_normalized"] is None
    assert s["entropy_nats_per_head"] == [None, None] and s["edges"] == 0 and s["density"] == 0.0
    # only single-source targets: the raw entropy is 0, the normalised one undefined
    s = _record([1, 0], [0, 1], [1.0, 1.0], N=2).statistics()
    assert s["entropy_nats"] == 0.0 and s["entropy_normalized"] is None


def test_per_head_edges_and_a_batch_of_graphs():
    # per-head edge set: head 0 uniform over 2 sources at target 0; head 1 uniform over 4 at target 0
    # (one of them virtual source 5) and one source at target 1; graph 1 = nodes 3, 4 with virtual
    # source 7 for target 3
    src = [1, 2, 1, 2, 0, 5, 0, 7]
    dst = [0, 0, 0, 0, 0, 0, 1, 3]
    head = [0, 0, 1, 1, 1, 1, 1, 0]
    alpha = np.zeros((8, 2))
    alpha[[0, 1], 0] = 0.5
    alpha[[2, 3, 4, 5], 1] = 0.25
    alpha[6, 1] = 1.0
    alpha[7, 0] = 1.0
    rec = _record(src, dst, alpha.tolist(), N=5, head=head, batch=[0, 0, 0, 1, 1],
                  origin=[origin_code("input")] * 7 + [origin_code("virtual")])
    s = rec.statistics()
    head0 = [math.log(2), 0.0]  # targets 0 and 3
    head1 = [math.log(4), 0.0]  # targets 0 and 1
    assert s["entropy_nats_per_head"] == pytest.approx([sum(head0) / 2, sum(head1) / 2], rel=1e-13)
    assert s["entropy_normalized_per_head"] == pytest.approx([1.0, 1.0], rel=1e-13)
    assert s["edges_per_node"] == 8 / 5 and s["edges_per_node_head"] == (3 + 5) / 2 / 5
    # possible pairs: graph 0: 3 * (3 + 1 virtual), graph 1: 2 * (2 + 1 virtual)
    assert s["density"] == pytest.approx((3 + 5) / 2 / (12 + 6))
    assert s["origin_share"] == pytest.approx({"input": 7 / 8, "virtual": 1 / 8})  # (edge, head) pairs
    assert s["mass_share"] == pytest.approx({"input": 3 / 4, "virtual": 1 / 4})


def test_uniform_and_one_hot_attention_of_a_real_layer():
    """A layer whose queries are zero attends uniformly (entropy log in-degree); a -1e4 logit bias
    on all but one in-edge makes its attention one-hot (entropy 0)."""
    torch.manual_seed(0)
    layer = EdgeAttention(4, 3, heads=2).double().eval()
    with torch.no_grad():
        layer.lin_query.weight.zero_()
        layer.lin_query.bias.zero_()
    x = torch.randn(5, 4, dtype=torch.float64)
    # in-degrees: node 0 <- 1, 2, 3, 4; node 1 <- 0, 2; node 2 <- 0; nodes 3, 4: none
    ei = torch.tensor([[1, 2, 3, 4, 0, 2, 0], [0, 0, 0, 0, 1, 1, 2]])
    with ga.trace(layer) as t:
        layer(x, EdgeSet(ei, num_heads=2))
    s = t.summary()[0]
    expected = (math.log(4) + math.log(2) + 0.0) / 3
    assert s["entropy_nats"] == pytest.approx(expected, rel=1e-12)
    assert s["entropy_nats_per_head"] == pytest.approx([expected, expected], rel=1e-12)
    assert s["entropy_normalized"] == pytest.approx(1.0, rel=1e-12)

    bias = torch.tensor([0.0, -1e4, -1e4, -1e4, -1e4, 0.0, 0.0], dtype=torch.float64)
    with ga.trace(layer) as t:
        layer(x, EdgeSet(ei, num_heads=2, bias=bias))
    s = t.summary()[0]
    assert s["entropy_nats"] == pytest.approx(0.0, abs=1e-12)
    assert s["entropy_normalized"] == pytest.approx(0.0, abs=1e-12)
    assert s["max_weight"] == pytest.approx(1.0, rel=1e-12)


# -------------------------------------------------------------------- trace == viewer
def _assert_same_stats(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert a[key] == pytest.approx(b[key], rel=1e-9), key
        elif isinstance(a[key], list):
            assert [v is None for v in a[key]] == [v is None for v in b[key]], key
            assert [v for v in a[key] if v is not None] == pytest.approx(
                [v for v in b[key] if v is not None], rel=1e-9), key
        elif isinstance(a[key], float):
            assert a[key] == pytest.approx(b[key], rel=1e-9), key
        else:
            assert a[key] == b[key], key


def test_trace_summary_and_viewer_agree_on_one_graph():
    model = _model()
    data = make_batch([7])
    with torch.no_grad(), ga.trace(model) as t:
        model(data)
    view = build_view(t, data)
    summary = t.summary()
    assert len(summary) == len(view.stats) == len(PRODUCERS)
    for s, v, lay in zip(summary, view.stats, view.layers, strict=True):
        _assert_same_stats(s, v)
        _assert_same_stats(layer_stats(lay, view.num_nodes), s)
    # bounds: 0 <= H <= log(in-degree) <= log(7 real + 1 virtual sources), 0 <= H / log d <= 1
    for s in summary:
        assert 0 <= s["entropy_normalized"] <= 1
        assert 0 <= s["entropy_nats"] <= math.log(7 + 1) + 1e-12


def test_viewer_of_one_graph_equals_the_trace_of_that_graph_alone():
    """In a batch of two graphs the viewer's statistics of graph 1 equal ``summary()`` of a trace of
    graph 1 on its own (the producers here are deterministic and attention stays in its graph)."""
    model = _model()
    batch = make_batch([6, 4], seed=3)
    with torch.no_grad():
        with ga.trace(model) as both:
            model(batch)
        with ga.trace(model) as alone:
            model(Batch.from_data_list([batch.get_example(1)]))
    view = build_view(both, batch, graph=1)
    for s, v in zip(alone.summary(), view.stats, strict=True):
        _assert_same_stats(s, v)


def test_summary_over_a_batch_is_over_every_graph():
    model = _model()
    batch = make_batch([6, 4], seed=3)
    with torch.no_grad(), ga.trace(model) as t:
        model(batch)
    full = t.summary()[2]  # "full": every real pair in its graph
    assert full["edges"] == 6 * 6 + 4 * 4 and full["density"] == pytest.approx(1.0)
    # per-target entropies over both graphs, recomputed from the record in float64
    rec = t[2]
    ei, a = rec.edges.edge_index.numpy(), rec.alpha.double().numpy()
    ref = []
    for h in range(2):
        vals = []
        for i in range(10):
            p = a[ei[1] == i, h]
            p = p / p.sum()
            vals.append(-(p * np.log(p)).sum())
        ref.append(np.mean(vals))
    assert full["entropy_nats"] == pytest.approx(np.mean(ref), rel=1e-12)
    assert full["entropy_nats_per_head"] == pytest.approx(ref, rel=1e-12)


def test_layer_statistics_validates_its_inputs():
    with pytest.raises(ValueError, match="one row per edge"):
        layer_statistics(np.array([0]), np.array([0, 1]), np.ones((1, 1)), num_targets=2)
    with pytest.raises(ValueError, match="target ids"):
        target_entropy(np.array([0]), np.array([5]), np.ones(1), num_targets=2)
    with pytest.raises(ValueError, match="finite"):
        target_entropy(np.array([0]), np.array([0]), np.array([np.nan]), num_targets=1)
    with pytest.raises(ValueError, match="'batch'"):
        layer_statistics(np.array([0]), np.array([0]), np.ones((1, 1)), num_targets=2, batch=np.zeros(3))


def test_empty_trace_summary():
    assert AttentionTrace().summary() == []


def test_data_without_batch_vector():
    model = _model()
    g = make_batch([5]).get_example(0)
    data = Data(x=g.x, edge_index=g.edge_index, num_nodes=5)
    with torch.no_grad(), ga.trace(model) as t:
        model(Batch.from_data_list([data]))
    assert all(s["entropy_nats"] is not None for s in t.summary())


def test_the_statistics_module_imports_no_torch():
    """The viewer's command line may import the statistics without torch (``--help`` stays fast)."""
    code = "import sys, graphattn.attention_stats; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"
