"""Size-dependent defaults of the viewer: edges drawn per target, node sizes, self-loops as node
outlines, 3-D point clouds, class names in labels and titles, distinct origin colours, and the
width of written images. Built from synthetic views (no model), so large sizes stay fast."""

from __future__ import annotations

import itertools
import struct

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.legend import Legend
from torch_geometric.data import Data

from graphattn.core.origins import origin_code
from graphattn.viz import auto_top_k, describe_prediction, draw_attention, write_output
from graphattn.viz.html import node_radius, view_payload
from graphattn.viz.layout import node_positions
from graphattn.viz.static import ORIGIN_COLORS, auto_node_size, count_node_size, node_spacing, origin_color
from graphattn.viz.view import MAX_DRAWN, AttentionView, LayerAttention
from tests.viz.test_static import drawn_edges


def synthetic_view(n: int, kind: str, *, per_target: int = 20, heads: int = 2, virtual: int = 0,
                   pos: torch.Tensor | None = None, labels: list[str] | None = None,
                   self_loops: bool = True, seed: int = 0) -> AttentionView:
    """A view of ``n`` nodes in which every target has ``per_target`` random sources (plus a
    self-loop and ``virtual`` virtual sources), random softmax-like coefficients per head."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(0, n, size=(n, per_target))]
    codes = [np.full((n, per_target), origin_code("sampled"))]
    if self_loops:
        src.append(np.arange(n)[:, None])
        codes.append(np.full((n, 1), origin_code("self_loop")))
    if virtual:
        src.append(n + rng.integers(0, virtual, size=(n, 1)))
        codes.append(np.full((n, 1), origin_code("virtual")))
    S = np.concatenate(src, 1)
    D = np.repeat(np.arange(n)[:, None], S.shape[1], 1)
    alpha = rng.dirichlet(np.full(S.shape[1], 0.3), size=(n, heads)).transpose(0, 2, 1)
    lay = LayerAttention("layers.0.attn", heads, S.ravel(), D.ravel(), None,
                         alpha.reshape(-1, heads), np.concatenate(codes, 1).ravel(),
                         num_virtual=virtual)
    if pos is None and kind == "sequence":
        pos = torch.arange(n, dtype=torch.float)[:, None]
    data = Data(num_nodes=n, pos=pos)
    if pos is None:
        g = np.random.default_rng(seed + 1)
        data.edge_index = torch.as_tensor(g.integers(0, n, size=(2, 2 * n)))
    xy = node_positions(data, np.arange(n), kind, num_virtual=virtual,
                        edges=None if pos is not None else data.edge_index.numpy(), layers=[lay])
    return AttentionView(layers=[lay], num_nodes=n, node_index=np.arange(n),
                         labels=labels or [str(i) for i in range(n)] + [f"v{k}" for k in range(virtual)],
                         pos=xy, kind=kind, is_cls=np.zeros(n + virtual, dtype=bool))


@pytest.mark.parametrize(("n", "k"), [(10, None), (24, None), (25, 3), (80, 3), (81, 2), (200, 2),
                                      (201, 1), (1000, 1)])
def test_auto_top_k_by_node_count(n, k):
    assert auto_top_k(n) == k


@pytest.mark.parametrize(("n", "kind"), [(1000, "sequence"), (256, "points"), (60, "graph")])
def test_drawn_edges_bounded_by_default(n, kind):
    pos = torch.randn(n, 3) if kind == "points" else None
    view = synthetic_view(n, kind, per_target=20, virtual=8 if kind == "sequence" else 0, pos=pos)
    total = len(view.edges(0, None))
    assert total > 15 * n
    ax = draw_attention(view, 0, None)
    drawn = drawn_edges(ax)
    k = auto_top_k(n)
    assert drawn <= min(k * n, MAX_DRAWN) and drawn >= n  # every target keeps its strongest
    assert f"of {total} edges" in ax.get_title()
    plt.close(ax.figure)
    # the HTML viewer opens at the same top-k
    assert view_payload(view)["defaultTopK"] == k
    ax = draw_attention(view, 0, None, top_k=None, max_edges=None)  # everything on request
    assert drawn_edges(ax) == total
    plt.close(ax.figure)


def test_global_cap_when_top_1_is_too_many():
    view = synthetic_view(2000, "sequence", per_target=3, heads=1, self_loops=False)
    ax = draw_attention(view, 0, 0)
    assert drawn_edges(ax) == MAX_DRAWN and f"the {MAX_DRAWN} strongest" in ax.get_title()
    plt.close(ax.figure)


def test_long_sequence_is_flat_and_without_arrows():
    view = synthetic_view(1000, "sequence", virtual=8)
    ax = draw_attention(view, 0, None)
    assert ax.get_aspect() == "auto"
    assert not any(p.get_gid() == "edge" for p in ax.patches)  # no per-edge arrows
    plt.close(ax.figure)
    short = synthetic_view(20, "sequence", per_target=3)
    ax = draw_attention(short, 0, None)
    assert ax.get_aspect() == 1.0
    plt.close(ax.figure)


def test_node_size_by_count_and_spacing():
    assert count_node_size(10) == 14.0 and count_node_size(256) == pytest.approx(5.0)
    assert count_node_size(100_000) == 1.5
    sizes = {}
    for n in (30, 256, 1000):
        view = synthetic_view(n, "points", per_target=2, pos=torch.randn(n, 2))
        ax = draw_attention(view, 0, None)
        nodes = next(c for c in ax.collections if c.get_gid() == "nodes")
        sizes[n] = float(nodes.get_sizes()[0])
        assert sizes[n] <= count_node_size(n) ** 2 + 1e-9
        plt.close(ax.figure)
    assert sizes[30] > sizes[256] > sizes[1000]
    # markers never wider than about half the typical spacing of the nodes
    view = synthetic_view(60, "points", per_target=2, pos=torch.randn(60, 2))
    assert auto_node_size(view, points_per_unit=100.0) <= (0.55 * node_spacing(view.pos) * 100.0) ** 2 + 1e-6


def test_self_loops_are_node_outlines_not_rings_around():
    view = synthetic_view(40, "points", per_target=3, pos=torch.randn(40, 2))
    ax = draw_attention(view, 0, None, top_k=None)
    nodes = next(c for c in ax.collections if c.get_gid() == "nodes")
    loops = next(c for c in ax.collections if c.get_gid() == "edge-loops")
    assert loops.get_sizes().max() <= nodes.get_sizes().max()  # on the node, never larger
    loop_edges = view.edges(0, None)
    assert len(loops.get_offsets()) == int((loop_edges.src == loop_edges.dst).sum())
    plt.close(ax.figure)
    # the HTML viewer: radius below a third of the typical spacing, so halos (1.3 R) never touch
    assert 0 < node_radius(view) <= 0.3 * node_spacing(view.pos) + 1e-12
    assert view_payload(view)["nodeRadius"] == pytest.approx(node_radius(view))


def test_3d_point_cloud_is_projected_with_depth():
    g = torch.Generator().manual_seed(0)
    cube = torch.rand(300, 3, generator=g) * torch.tensor([4.0, 2.0, 1.0])
    xy = node_positions(Data(pos=cube, num_nodes=300), np.arange(300), "points")
    assert xy.shape == (300, 2) and np.isfinite(xy).all()
    # an oblique view: the drawing is not just the two principal axes (depth shows)
    c = cube.numpy() - cube.numpy().mean(0)
    _, _, vt = np.linalg.svd(c, full_matrices=False)
    flat = c @ vt[:2].T
    assert not np.allclose(np.abs(xy), np.abs(flat), atol=1e-3)
    # a flat cloud is drawn face on (its own principal plane)
    disc = torch.cat([torch.randn(200, 2, generator=g), torch.zeros(200, 1)], 1)
    xy2 = node_positions(Data(pos=disc, num_nodes=200), np.arange(200), "points")
    d = disc[:, :2].numpy() - disc[:, :2].numpy().mean(0)
    assert np.allclose(np.linalg.svd(xy2, compute_uv=False), np.linalg.svd(d, compute_uv=False), rtol=1e-6)


def test_class_names_label_nodes_and_title():
    names = ["Theory", "Neural_Networks", "Case_Based"]
    torch.manual_seed(0)
    n = 30
    view = synthetic_view(n, "graph", per_target=3, labels=[names[i % 3] for i in range(n)])
    ax = draw_attention(view, 0, None)
    legends = {leg.get_title().get_text(): [t.get_text() for t in leg.get_texts()]
               for leg in ax.get_children() if isinstance(leg, Legend)}
    assert legends["node label"] == sorted(names)
    plt.close(ax.figure)
    payload = view_payload(view)
    assert {c["name"] for c in payload["categories"]} == set(names)
    assert set(payload["nodes"]["label"]) == set(names)

    logits = torch.tensor([0.1, 2.0, -1.0])
    assert describe_prediction(torch.tensor([1]), logits, class_names=names) == (
        "class Neural_Networks · predicted Neural_Networks ✓")
    assert describe_prediction(torch.tensor(0), logits, class_names=names) == (
        "class Theory · predicted Neural_Networks ✗")
    assert describe_prediction(torch.tensor([4]), logits) == "class 4 · predicted 1 ✗"
    assert describe_prediction(None, None) == ""
    assert describe_prediction(torch.tensor([[1, 0, 1]]), torch.tensor([[2.0, -1.0, -3.0]]), loss="bce",
                               class_names=["a", "b", "c"]) == "labels a, c · predicted a"
    assert describe_prediction(torch.tensor([0.3]), torch.tensor([0.2]), loss="l1") == ""


def test_task_class_names():
    from graphattn.data.fashion_mnist import CLASSES as FASHION
    from graphattn.data.planetoid import CLASSES

    assert CLASSES["cora"][3] == "Neural_Networks" and len(CLASSES["cora"]) == 7
    assert len(CLASSES["citeseer"]) == 6 and len(FASHION) == 10


def _lab(color: str) -> np.ndarray:
    rgb = np.array(to_rgb(color))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    M = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = M @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), (24389 / 27 * xyz + 16) / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _deuteranopia(color: str) -> str:
    """Machado et al. (2009) deuteranopia simulation, severity 1, on linear RGB."""
    rgb = np.array(to_rgb(color))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    M = np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                  [-0.011820, 0.042940, 0.968881]])
    o = np.clip(M @ lin, 0, 1)
    s = np.where(o <= 0.0031308, 12.92 * o, 1.055 * o ** (1 / 2.4) - 0.055)
    return "#" + "".join(f"{round(float(v) * 255):02x}" for v in np.clip(s, 0, 1))


def test_origin_colours_all_differ():
    colours = {name: origin_color(name) for name in ORIGIN_COLORS}
    assert len(set(colours.values())) == len(colours)
    for (a, ca), (b, cb) in itertools.combinations(colours.items(), 2):
        assert np.linalg.norm(_lab(ca) - _lab(cb)) > 20, (a, b)
    # origins drawn together stay apart for deuteranopes too
    for group in (("input", "expander", "virtual"), ("window", "full"), ("knn", "full"),
                  ("sampled", "support"), ("input", "random"), ("input", "self_loop")):
        for a, b in itertools.combinations(group, 2):
            d = np.linalg.norm(_lab(_deuteranopia(colours[a])) - _lab(_deuteranopia(colours[b])))
            assert d > 25, (a, b, d)
    assert origin_color(origin_code("expander")) == colours["expander"]


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("figure", ["graph", "heatmap", "heads", "summary"])
def test_written_images_are_at_least_1200_px_wide(figure, tmp_path):
    view = synthetic_view(30, "graph", per_target=3)
    view.stats = [{"layer": "layers.0.attn", "edges": 120, "edges_per_node": 4.0, "edges_per_node_head": 4.0,
                   "density": 0.1, "entropy_nats": 1.0, "entropy_normalized": 0.9, "max_weight": 0.5,
                   "origin_share": {"sampled": 1.0}, "mass_share": {"sampled": 1.0}}]
    path = write_output(view, tmp_path / "x.png", figure=figure, dpi=40)[0]
    assert _png_size(path)[0] >= 1200
