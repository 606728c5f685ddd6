"""Static figures for a node task, a graph task, a sequence and an image: files are written, and
the drawing holds exactly the edges of the chosen layer and head."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.legend import Legend
from matplotlib.patches import FancyArrowPatch
from matplotlib.text import Annotation

from graphattn.viz import (
    attention_matrix,
    build_view,
    draw_attention,
    draw_heads,
    draw_heatmap,
    draw_summary,
    write_output,
)
from graphattn.viz.static import origin_color
from tests.viz.samples import image_sample, molecule_sample, node_sample, sequence_sample

SAMPLES = {"node": node_sample, "graph": molecule_sample, "sequence": sequence_sample, "image": image_sample}


@pytest.fixture(scope="module", params=list(SAMPLES))
def view(request):
    s = SAMPLES[request.param]()
    kw = {"focus": s.focus, "focus_k": 4, "max_nodes": 20} if s.focus is not None else {}
    return build_view(s.trace, s.data, kind=s.kind, labels=s.labels, title=request.param, **kw)


def drawn_edges(ax) -> int:
    """Edges an Axes shows: arrows + line and arc collection members + self-loop rings."""
    n = sum(p.get_gid() == "edge" for p in ax.patches)
    for c in ax.collections:
        if c.get_gid() == "edge-lines":
            n += len(c.get_segments())
        elif c.get_gid() == "edge-arcs":
            n += len(c.get_paths())
        elif c.get_gid() == "edge-loops":
            n += len(c.get_offsets())
    return n


def _png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


@pytest.mark.parametrize("head", [None, 0, 1])
def test_graph_figure_draws_every_edge(view, head):
    for layer in range(view.num_layers):
        ax = draw_attention(view, layer, head, arrows=False, top_k=None)
        assert drawn_edges(ax) == len(view.edges(layer, head))
        plt.close(ax.figure)
    ax = draw_attention(view, 0, head, arrows=True, top_k=0)
    assert drawn_edges(ax) == len(view.edges(0, head))
    plt.close(ax.figure)


def test_pruned_figure(view):
    el = view.edges(-1, 0, top_k=2, threshold=0.01)
    ax = draw_attention(view, -1, 0, top_k=2, threshold=0.01)
    assert drawn_edges(ax) == len(el)
    counts = np.bincount(el.dst)
    assert counts.max() <= 2
    plt.close(ax.figure)
    ax = draw_attention(view, -1, 0, max_edges=view.num_nodes)  # one edge per target at most
    assert drawn_edges(ax) <= view.num_nodes and "top-1" in ax.get_title()
    plt.close(ax.figure)


def test_origin_colours_and_legend(view):
    ax = draw_attention(view, 0, None, arrows=True, color_by="origin", top_k=None)
    el = view.edges(0, None)
    legends = {leg.get_title().get_text(): [t.get_text() for t in leg.get_texts()]
               for leg in ax.get_children() if isinstance(leg, Legend)}
    legend = legends["edge origin"]
    from graphattn.core.origins import origin_name

    codes, counts = np.unique(el.origin, return_counts=True)
    loops = int((el.src == el.dst).sum())
    assert legend == [f"{origin_name(int(c))} ({int(k)})" for c, k in zip(codes, counts, strict=True)] + (
        [f"outline: self-loop ({loops})"] if loops else [])
    if view.kind == "graph":  # a node task: node colours name the classes
        assert legends["node label"] == sorted(set(view.labels[: view.num_nodes]))
    if view.kind == "molecule":  # atom colours name the elements present
        assert legends["atom"] == sorted(set(view.labels[: view.num_nodes]))
    colours = {tuple(np.round(p.get_edgecolor()[:3], 3)) for p in ax.patches
               if isinstance(p, FancyArrowPatch)}
    from matplotlib.colors import to_rgb

    assert colours <= {tuple(np.round(to_rgb(origin_color(int(c))), 3)) for c in codes}
    plt.close(ax.figure)
    ax = draw_attention(view, 0, None, color_by="weight")
    assert len(ax.figure.axes) == 2  # the colour bar
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="color_by"):
        draw_attention(view, 0, None, color_by="size")


def test_labels_drawn_as_given(view):
    ax = draw_attention(view, 0, 0, labels=True)
    texts = [a.get_text() for a in ax.texts if isinstance(a, Annotation) and a.get_gid() != "focus-label"]
    assert texts == view.labels
    plt.close(ax.figure)


def test_heads_heatmap_summary(view):
    fig = draw_heads(view)
    H = max(lay.num_heads for lay in view.layers)
    panels = [ax for ax in fig.axes if ax.axison or ax.get_title()]
    assert len(panels) == view.num_layers * (H + 1)
    plt.close(fig)

    M = attention_matrix(view, 1, 0)
    el = view.edges(1, 0)
    assert M.shape == (view.num_nodes, view.num_nodes + view.num_virtual)
    assert M.sum() == pytest.approx(el.weight.sum())
    ax = draw_heatmap(view, 1, 0)
    assert ax.images[0].get_array().shape == M.shape
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    if view.kind == "graph":  # a node task: the labels are classes, repeated; the ids tell nodes apart
        n = view.num_nodes
        assert len(set(view.labels[:n])) < n
        assert ticks[:n] == [f"{int(view.node_index[i])}\n{view.labels[i]}" for i in range(n)]
        assert len(set(ticks[:n])) == n
    else:  # tokens, atoms, patches: their own labels
        assert ticks == view.labels
    plt.close(ax.figure)

    fig = draw_summary(view)
    bars = fig.axes[0].patches
    assert [b.get_height() for b in bars] == pytest.approx([s["edges_per_node_head"] for s in view.stats])
    bars = fig.axes[2].patches
    assert [b.get_height() for b in bars] == pytest.approx([s["entropy_nats"] for s in view.stats])
    plt.close(fig)


def test_write_output_all_figures(view, tmp_path):
    paths = write_output(view, tmp_path / "out.png", figure="all", dpi=40)
    assert [p.name for p in paths] == ["out_graph.png", "out_heads.png", "out_heatmap.png",
                                       "out_summary.png"]
    for p in paths:
        _png(p)
    svg = write_output(view, tmp_path / "one.svg", figure="heatmap", head=0)[0]
    assert svg.read_text().lstrip().startswith("<?xml")
    with pytest.raises(ValueError, match="'out'"):
        write_output(view, tmp_path / "x.gif")
    with pytest.raises(ValueError, match="'figure'"):
        write_output(view, tmp_path / "x.png", figure="movie")
