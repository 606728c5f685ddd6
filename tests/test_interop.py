"""Interop (:mod:`graphattn.interop`): traces as networkx graphs, EdgeAttention under PyG's
``Explainer``, and edge sets as sparse matrices. Tiny graphs with hand-built expectations; every
edge list is deliberately not sorted by target."""

from __future__ import annotations

import sys

import networkx as nx
import pytest
import torch
from graphattn.kernels.fused import backend_ops
from torch import nn
from torch_geometric.data import Data
from torch_geometric.explain import Explainer
from torch_geometric.explain.algorithm import AttentionExplainer
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

import graphattn as ga
from graphattn.core.attention import EdgeAttention
from graphattn.core.edgeset import EdgeSet, ExplicitOnlyError
from graphattn.core.origins import origin_code
from graphattn.core.structured import SharedSourceEdgeSet
from graphattn.interop import from_sparse_tensor, from_torch_sparse, to_sparse_tensor, to_torch_sparse
from graphattn.viz import build_view

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta",
                                        "ignore:Sparse invariant checks are implicitly disabled")

FUSED_CPU = backend_ops("cpu", warn=False) is not None
KERNELS = ["auto", "reference",
           pytest.param("fused", marks=pytest.mark.skipif(not FUSED_CPU, reason="no CPU kernel"))]

# two graphs: nodes 0-2 (graph 0) and 3-4 (graph 1); one virtual source 5 bound to graph 1
X = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
BATCH = torch.tensor([0, 0, 0, 1, 1])
EDGES = torch.tensor([[2, 0, 1, 0, 4, 3, 5],
                      [0, 1, 2, 1, 3, 4, 3]])
#: one graph, every target with two or more sources of distinct scores, not sorted by target
EXPLAIN_EDGES = torch.tensor([[3, 0, 4, 1, 2, 0, 3, 4, 2],
                              [0, 2, 1, 0, 4, 1, 2, 0, 3]])
ORIGINS = ["input", "input", "expander", "expander", "input", "input", "virtual"]


def _edge_set(**changes) -> EdgeSet:
    fields = dict(num_heads=2, origin=torch.tensor([origin_code(o) for o in ORIGINS]),
                  virtual_x=torch.randn(1, 4, generator=torch.Generator().manual_seed(1)),
                  virtual_batch=torch.tensor([1]))
    fields.update(changes)
    return EdgeSet(EDGES, **fields)


def _layer(heads: int = 2, **kwargs) -> EdgeAttention:
    torch.manual_seed(0)
    return EdgeAttention(4, 3, heads=heads, **kwargs).eval()


def _traced(es: EdgeSet, heads: int = 2):
    layer = _layer(heads)
    with ga.trace() as t:
        _, (edge_index, alpha) = layer(X, es, BATCH, return_attention_weights=True)
    assert torch.equal(edge_index, es.edge_index)
    return t, alpha


def _edges(G) -> list[tuple]:
    """``(u, v, attrs)`` sorted by edge_id (the traced position)."""
    return sorted(G.edges(data=True), key=lambda e: e[2]["edge_id"])


# ------------------------------------------------------------------------------------- networkx
def test_to_networkx_weights_are_the_returned_attention_weights():
    t, alpha = _traced(_edge_set())
    for head in (0, 1):
        G = t.to_networkx(0, head=head)
        # 0 -> 1 twice (input and expander): one parallel edge each, nothing merged
        assert isinstance(G, nx.MultiDiGraph)
        assert G.graph["head"] == head and G.graph["num_heads"] == 2
        assert [(u, v, a["origin"]) for u, v, a in _edges(G)] == [
            (2, 0, "input"), (0, 1, "input"), (1, 2, "expander"), (0, 1, "expander"),
            (4, 3, "input"), (3, 4, "input"), (5, 3, "virtual")]
        assert [a["weight"] for _, _, a in _edges(G)] == alpha[:, head].tolist()
    G = t.to_networkx(0)  # head=None: the mean over heads of every traced edge
    assert [a["weight"] for _, _, a in _edges(G)] == pytest.approx(alpha.mean(1).tolist())
    # the two copies of 0 -> 1 share the softmax of target 1 equally: 1/2 each, in every head
    assert [a["weight"] for a in G.get_edge_data(0, 1).values()] == pytest.approx([0.5, 0.5])
    assert dict(G.nodes(data="graph")) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    assert dict(G.nodes(data="virtual")) == {i: i == 5 for i in range(6)}
    assert dict(G.nodes(data="index")) == {i: i for i in range(6)}
    # the same through the record, by position and by name
    assert nx.utils.edges_equal(t[0].to_networkx().edges, G.edges)
    assert nx.utils.edges_equal(t.to_networkx(t[0].layer).edges, G.edges)


def test_to_networkx_without_duplicates_is_a_digraph():
    t, alpha = _traced(_edge_set().coalesce())
    G = t.to_networkx(0, head=1)
    assert type(G) is nx.DiGraph and G.number_of_edges() == 6
    ei = t[0].edges.edge_index
    for e in range(6):
        assert G.edges[int(ei[0, e]), int(ei[1, e])]["weight"] == float(alpha[e, 1])


def test_to_networkx_one_graph_is_relabelled():
    t, alpha = _traced(_edge_set())
    G = t.to_networkx(0, head=0, graph=1)
    assert type(G) is nx.DiGraph
    assert dict(G.nodes(data=True)) == {
        0: {"index": 3, "graph": 1, "virtual": False},
        1: {"index": 4, "graph": 1, "virtual": False},
        2: {"index": 5, "graph": 1, "virtual": True}}
    assert {(u, v): (a["weight"], a["origin"]) for u, v, a in G.edges(data=True)} == {
        (1, 0): (float(alpha[4, 0]), "input"),
        (0, 1): (float(alpha[5, 0]), "input"),
        (2, 0): (float(alpha[6, 0]), "virtual")}
    G0 = t.to_networkx(0, graph=0)
    assert sorted(G0.nodes) == [0, 1, 2] and G0.number_of_edges() == 4


def test_to_networkx_per_head_edges():
    # per-head edges: 0 -> 1 in heads 0 and 1, 2 -> 1 in head 1 only
    es = EdgeSet(torch.tensor([[0, 2, 0], [1, 1, 1]]), head=torch.tensor([0, 1, 1]), num_heads=2)
    layer = _layer()
    with ga.trace() as t:
        _, (_, alpha) = layer(X, es, return_attention_weights=True)
    G1 = t.to_networkx(0, head=1)
    assert type(G1) is nx.DiGraph
    assert {(u, v): a["weight"] for u, v, a in G1.edges(data=True)} == {
        (2, 1): float(alpha[1, 1]), (0, 1): float(alpha[2, 1])}
    assert G1.edges[0, 1]["head"] == 1
    G = t.to_networkx(0)  # head mean: 0 -> 1 once per head, parallel edges summing to the mean
    assert isinstance(G, nx.MultiDiGraph)
    total = sum(a["weight"] for a in G.get_edge_data(0, 1).values())
    assert total == pytest.approx((float(alpha[0, 0]) + float(alpha[2, 1])) / 2)
    assert float(alpha[0, 0]) == pytest.approx(1.0)  # alone in head 0


def test_to_networkx_rejects_bad_arguments():
    t, _ = _traced(_edge_set())
    with pytest.raises(ValueError, match=r"'head'.*2 head"):
        t.to_networkx(0, head=2)
    with pytest.raises(ValueError, match=r"'graph'.*2 graph"):
        t.to_networkx(0, graph=2)
    with pytest.raises(ValueError, match="'graph'"):
        t.to_networkx(0, graph=True)
    with pytest.raises(ValueError, match="'layer'"):
        t.to_networkx(3)
    with pytest.raises(ValueError, match="'layer' 'nope'"):
        t.to_networkx("nope")


def test_view_to_networkx_follows_the_viewer_rules():
    es = _edge_set()
    t, alpha = _traced(es)
    data = Data(x=X, edge_index=EDGES[:, :6], batch=BATCH)
    view = build_view(t, data, graph=0)
    G = view.to_networkx(0, head=0)  # one head: duplicates kept apart
    assert isinstance(G, nx.MultiDiGraph) and G.number_of_edges() == 4
    assert dict(G.nodes(data="index")) == {0: 0, 1: 1, 2: 2}
    Gm = view.to_networkx(0)  # head mean: one edge per pair, the copies' weights summed
    assert type(Gm) is nx.DiGraph
    assert Gm.edges[0, 1]["weight"] == pytest.approx(float(alpha[[1, 3]].sum(0).mean()))
    assert Gm.edges[0, 1]["origin"] == "input"  # the first copy's


# ------------------------------------------------------------------------------------ explain
class _Net(nn.Module):
    """A user's model of EdgeAttention layers taking ``(x, edge_index)``."""

    def __init__(self, kernel: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = EdgeAttention(4, 3, heads=2, kernel=kernel)
        self.conv2 = EdgeAttention(6, 3, heads=1, kernel=kernel)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index).log_softmax(-1)


def _explainer(model, reduce: str = "max", return_type: str = "log_probs") -> Explainer:
    return Explainer(model, algorithm=AttentionExplainer(reduce=reduce), explanation_type="model",
                     edge_mask_type="object", node_mask_type=None,
                     model_config=dict(mode="multiclass_classification", task_level="node",
                                       return_type=return_type))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_attention_explainer_sees_weights_in_input_order(kernel, reduce):
    model = _Net(kernel).eval()
    edge_index = EXPLAIN_EDGES
    before = model(X, edge_index)
    explanation = _explainer(model, reduce)(X, edge_index)
    # the expectation: return_attention_weights, in the input order, reduced like the explainer
    h, (ei1, a1) = model.conv1(X, edge_index, return_attention_weights=True)
    _, (ei2, a2) = model.conv2(h.relu(), edge_index, return_attention_weights=True)
    assert torch.equal(ei1, edge_index) and torch.equal(ei2, edge_index)
    def red(t):
        r = getattr(torch, reduce)(t, dim=-1)
        return r[0] if isinstance(r, tuple) else r

    expected = red(torch.stack([red(a1), red(a2)], -1))
    torch.testing.assert_close(explanation.edge_mask, expected)
    # registering (and removing) the hooks changed nothing
    torch.testing.assert_close(model(X, edge_index), before)
    assert not model.conv1._message_forward_hooks


@pytest.mark.parametrize("kernel", KERNELS)
def test_message_hook_alpha_in_input_order(kernel):
    layer = _layer(kernel=kernel)
    seen = []

    def hook(module, msg_kwargs, out):
        seen.append(msg_kwargs[0].get("alpha", module._alpha).detach().clone())

    es = EdgeSet(EXPLAIN_EDGES, num_heads=2,
                 weight=torch.rand(9, 2, generator=torch.Generator().manual_seed(2)))
    expected_out, (_, expected) = layer(X, es, return_attention_weights=True)
    handle = layer.register_message_forward_hook(hook)
    out = layer(X, es)
    handle.remove()
    assert layer.last_kernel == ("fused" if kernel == "fused" else "reference")
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], expected)
    torch.testing.assert_close(out, expected_out)
    assert layer._alpha is None


def test_message_hook_per_head_edges_and_structured_sets():
    layer = _layer()
    seen = []
    layer.register_message_forward_hook(lambda m, kw, out: seen.append(m._alpha.detach().clone()))
    es = EdgeSet(torch.tensor([[2, 0, 1, 0], [1, 0, 1, 1]]), head=torch.tensor([1, 0, 0, 1]),
                 num_heads=2)
    layer(X, es)
    _, (_, alpha) = layer(X, es, return_attention_weights=True)
    # per-head edges: [E, 1], the coefficient in the edge's own head
    torch.testing.assert_close(seen[0][:, 0], alpha[torch.arange(4), es.head])


def test_fused_hook_cannot_replace_messages():
    if not FUSED_CPU:
        pytest.skip("no CPU kernel")
    layer = _layer(kernel="fused")
    layer.register_message_forward_hook(lambda m, kw, out: torch.zeros(1))
    with pytest.raises(ValueError, match="replacement messages"):
        layer(X, EDGES[:, :6])


def test_explain_mode_mask_follows_input_order():
    """Mask explainers (GNNExplainer) multiply message j -> i by its edge's mask entry: for the
    layer that is the edge weight, in the order of the edges given."""
    edge_index = EXPLAIN_EDGES
    mask = torch.rand(9, generator=torch.Generator().manual_seed(3))
    layer = _layer()
    expected = layer(X, EdgeSet(edge_index, num_heads=2, weight=mask))
    set_masks(layer, nn.Parameter(mask), edge_index, apply_sigmoid=False)
    torch.testing.assert_close(layer(X, edge_index), expected)
    with pytest.raises(ValueError, match=r"edge mask has 9 entries.*8 edges"):
        layer(X, edge_index[:, :8])
    clear_masks(layer)
    torch.testing.assert_close(layer(X, edge_index, return_attention_weights=True)[0],
                               layer(X, EdgeSet(edge_index, num_heads=2)))
    fused = _layer(kernel="fused")
    set_masks(fused, nn.Parameter(mask), edge_index, apply_sigmoid=False)
    with pytest.raises(ValueError, match="explain mode"):
        fused(X, edge_index)


def test_graph_transformer_recipe_under_attention_explainer():
    """GraphTransformer reads a Data object: wrap it to take (x, edge_index). With the "input"
    producer the attention's first E edges are the input edges, in their order."""

    class Wrapped(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, x, edge_index):
            return self.model(Data(x=x, edge_index=edge_index))

    torch.manual_seed(0)
    model = ga.GraphTransformer(8, 3, num_layers=2, producer="input", heads=2, task="node",
                                conv=None).eval()
    edge_index = EXPLAIN_EDGES
    explanation = _explainer(Wrapped(model), return_type="raw")(X, edge_index)
    with ga.trace(model) as t:
        model(Data(x=X, edge_index=edge_index))
    assert len(t) == 2
    expected = torch.stack([rec.alpha.max(-1).values for rec in t], -1).max(-1).values
    torch.testing.assert_close(explanation.edge_mask, expected)


# ------------------------------------------------------------------------------- sparse matrices
def _plain(**changes) -> EdgeSet:
    """No duplicates, not sorted, a weight per head."""
    w = torch.rand(6, 2, generator=torch.Generator().manual_seed(4))
    fields = dict(num_heads=2, weight=w)
    fields.update(changes)
    return EdgeSet(torch.tensor([[2, 0, 1, 4, 3, 1], [0, 1, 2, 3, 4, 0]]), **fields)


def _same_edges(a: EdgeSet, b: EdgeSet) -> None:
    assert torch.equal(a.edge_index, b.edge_index)
    for name in ("weight", "bias", "edge_attr", "origin"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert (ta is None) == (tb is None), name
        if ta is not None:
            torch.testing.assert_close(ta, tb)


def test_sparse_tensor_round_trip():
    torch_sparse = pytest.importorskip("torch_sparse")
    es = _plain()
    adj_t = to_sparse_tensor(es)
    assert isinstance(adj_t, torch_sparse.SparseTensor)
    assert adj_t.sparse_sizes() == (5, 5)
    dense = adj_t.to_dense()  # [targets, sources, heads]
    for e in range(es.num_edges):
        j, i = es.edge_index[:, e].tolist()
        torch.testing.assert_close(dense[i, j], es.weight[e])
    back = from_sparse_tensor(adj_t, num_heads=2)
    _same_edges(back, es.coalesce())
    # PyG's orientation: adj_t @ v is the weighted sum of the sources' values, per head
    v = torch.randn(5, 3)
    expected = torch.zeros(5, 3)
    expected.index_add_(0, es.edge_index[1], es.weight[:, :1] * v[es.edge_index[0]])
    torch.testing.assert_close(to_sparse_tensor(from_sparse_tensor(adj_t, num_heads=2),
                                                value=es.coalesce().weight[:, 0]) @ v, expected)


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_torch_sparse_round_trip(layout):
    es = _plain(bias=torch.randn(6, generator=torch.Generator().manual_seed(5)))
    t = to_torch_sparse(es, layout)
    assert t.layout == layout and t.shape == (5, 5, 2)
    _same_edges(from_torch_sparse(t, num_heads=2, bias=es.coalesce().bias),
                es.coalesce())
    tb = to_torch_sparse(es, layout, value="bias")
    assert tb.shape == (5, 5)
    back = from_torch_sparse(tb, value_as="bias", num_heads=2)
    _same_edges(back, es.coalesce().replace(weight=None))
    # no values: ones, which value_as=None drops
    ones = to_torch_sparse(es.replace(weight=None), layout)
    assert torch.equal(ones.to_dense(), torch.sparse_coo_tensor(
        es.edge_index.flip(0), torch.ones(6), (5, 5)).to_dense())
    _same_edges(from_torch_sparse(ones, value_as=None), es.coalesce().replace(
        weight=None, bias=None))
    # a CSC tensor and an uncoalesced COO tensor are read too
    csc = to_torch_sparse(es, torch.sparse_coo, value="bias").to_sparse_csc()
    _same_edges(from_torch_sparse(csc, value_as="bias"),
                es.coalesce().replace(weight=None))
    raw = torch.sparse_coo_tensor(es.edge_index.flip(0), es.bias, (5, 5))
    _same_edges(from_torch_sparse(raw, value_as="bias"),
                es.coalesce().replace(weight=None))


def test_sparse_values_fields_and_virtual_sources():
    es = _edge_set().coalesce()  # with a virtual source (column 5) and origins
    with pytest.raises(ValueError, match="'num_nodes'"):
        to_torch_sparse(es)
    t = to_torch_sparse(es, torch.sparse_coo, value="origin", num_nodes=5)
    assert t.shape == (5, 6) and t.dtype == torch.long
    with pytest.raises(ValueError, match="virtual_x with 1 rows"):
        from_torch_sparse(t, value_as="origin")
    back = from_torch_sparse(t, value_as="origin", num_heads=2, virtual_x=es.virtual_x,
                                     virtual_batch=es.virtual_batch)
    _same_edges(back, es)
    # an explicit value tensor, e.g. the attention weights
    _, (_, alpha) = _layer()(X, es, BATCH, return_attention_weights=True)
    dense = to_torch_sparse(es, value=alpha, num_nodes=5).to_dense()
    torch.testing.assert_close(dense.sum(1), torch.ones(5, 2))  # each target's softmax sums to 1


def test_sparse_duplicates_are_refused_kept_or_summed():
    es = EdgeSet(torch.tensor([[0, 1, 0], [1, 2, 1]]), weight=torch.tensor([0.25, 0.5, 2.0]))
    with pytest.raises(ValueError, match=r"1 duplicate.*duplicates='first'"):
        to_torch_sparse(es)
    first = from_torch_sparse(to_torch_sparse(es, duplicates="first"))
    _same_edges(first, es.coalesce())
    summed = from_torch_sparse(to_torch_sparse(es, duplicates="sum"))
    assert summed.edge_index.tolist() == [[0, 1], [1, 2]]
    assert summed.weight.tolist() == [2.25, 0.5]
    raw = torch.sparse_coo_tensor(es.edge_index.flip(0), es.weight, (3, 3))  # uncoalesced
    with pytest.raises(ValueError, match="'t' holds 1 duplicate"):
        from_torch_sparse(raw)
    assert from_torch_sparse(raw, duplicates="sum").weight.tolist() == [2.25, 0.5]


def test_sparse_bad_input_is_named():
    es = _plain()
    with pytest.raises(ValueError, match="'layout'"):
        to_torch_sparse(es, torch.strided)
    with pytest.raises(ValueError, match="'value'"):
        to_torch_sparse(es, value="nope")
    with pytest.raises(ValueError, match=r"'value'.*E=6"):
        to_torch_sparse(es, value=torch.ones(5))
    with pytest.raises(ValueError, match="'duplicates'"):
        to_torch_sparse(es, duplicates="max")
    with pytest.raises(ValueError, match="'num_nodes'"):
        to_torch_sparse(es, num_nodes=-1)
    with pytest.raises(ValueError, match="out of range for num_nodes=3"):
        to_torch_sparse(es, num_nodes=3)
    with pytest.raises(ValueError, match="per-head"):
        to_torch_sparse(EdgeSet(es.edge_index, head=torch.zeros(6, dtype=torch.long)))
    shared = SharedSourceEdgeSet(torch.tensor([[[0, 1]]]), torch.tensor([0, 2]))
    with pytest.raises(ExplicitOnlyError, match="to_explicit"):
        to_torch_sparse(shared)
    back = from_torch_sparse(to_torch_sparse(shared.to_explicit()), value_as=None)
    assert torch.equal(back.edge_index, shared.to_explicit().coalesce().edge_index)
    with pytest.raises(ValueError, match="'t' must be a torch sparse tensor"):
        from_torch_sparse(torch.ones(2, 2))
    with pytest.raises(ValueError, match="'value_as'"):
        from_torch_sparse(to_torch_sparse(es), value_as="nope")
    with pytest.raises(ValueError, match="'weight' is given twice"):
        from_torch_sparse(to_torch_sparse(es), weight=torch.ones(6))


def test_sparse_tensor_import_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_sparse", None)
    with pytest.raises(ImportError, match="'torch_sparse'"):
        to_sparse_tensor(_plain())


@pytest.mark.parametrize("form", ["sparse_tensor", "csr", "coo"])
def test_layer_on_sparse_derived_edges_equals_the_original(form):
    if form == "sparse_tensor":
        pytest.importorskip("torch_sparse")
    es = _plain()
    matrix = to_sparse_tensor(es) if form == "sparse_tensor" else to_torch_sparse(
        es, torch.sparse_csr if form == "csr" else torch.sparse_coo)
    convert = from_sparse_tensor if form == "sparse_tensor" else from_torch_sparse
    layer = _layer()
    expected = layer(X, es)
    torch.testing.assert_close(layer(X, convert(matrix, num_heads=2)), expected)
    # the layer takes the matrix itself, like PyG's convs take adj_t
    out, (edge_index, _) = layer(X, matrix, return_attention_weights=True)
    torch.testing.assert_close(out, expected)
    assert torch.equal(edge_index, es.coalesce().edge_index)
    with pytest.raises(ValueError, match="'edge_attr' cannot be given with a sparse"):
        layer(X, matrix, edge_attr=torch.ones(6, 2))


# ---------------------------------------------------------------------------------------- DGL
def test_dgl_conversion_names_the_missing_package_where_dgl_does_not_import():
    import importlib.util

    from graphattn.interop import to_dgl

    if importlib.util.find_spec("dgl") is not None:
        pytest.skip("DGL is installed here")
    with pytest.raises(ImportError, match="pip install dgl"):
        to_dgl(EdgeSet(torch.tensor([[0, 1], [1, 0]])))


def test_dgl_round_trip_keeps_every_edge_and_field():
    dgl = pytest.importorskip("dgl")  # no DGL release installs with torch >= 2.5
    from graphattn.interop import from_dgl, to_dgl

    ei = torch.tensor([[0, 2, 1, 2, 3], [1, 1, 0, 1, 4]])  # a duplicate 2 -> 1, unsorted
    es = EdgeSet(ei, weight=torch.rand(5), origin=torch.tensor([0, 1, 0, 1, 2]),
                 edge_attr=torch.randn(5, 3))
    g = to_dgl(es, num_nodes=6)
    assert isinstance(g, dgl.DGLGraph) and g.num_nodes() == 6 and g.num_edges() == 5
    src, dst = g.edges(order="eid")
    assert torch.equal(torch.stack([src, dst]), ei)
    back = from_dgl(g)
    assert torch.equal(back.edge_index, ei)
    for name in ("weight", "origin", "edge_attr"):
        assert torch.equal(getattr(back, name), getattr(es, name)), name
    g.edata["other"] = torch.zeros(5)
    with pytest.raises(ValueError, match="other"):
        from_dgl(g)
