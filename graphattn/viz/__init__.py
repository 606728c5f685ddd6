"""The attention-graph viewer: what a model attends to, over generated edge sets.

From a trace (:func:`graphattn.trace`) and the traced sample, :func:`build_view` makes an
:class:`AttentionView` (per layer: edges, per-head coefficients, producer of each edge, in the data's
own layout). Draw it with the static figures (:mod:`graphattn.viz.static`) or write the
self-contained interactive page (:func:`write_html`); :func:`visualize` does all in one call and
``graphattn viz <run> --sample i --out file.html|file.png`` does it for a trained run.
"""

from graphattn.viz.api import describe_producers, visualize, write_output
from graphattn.viz.html import render_html, write_html
from graphattn.viz.static import (
    attention_matrix,
    draw_attention,
    draw_heads,
    draw_heatmap,
    draw_summary,
    origin_color,
    save_figure,
)
from graphattn.viz.view import (
    AttentionView,
    EdgeList,
    LayerAttention,
    build_view,
    layer_stats,
    prune,
    thin_layer,
    trace_sample,
)

__all__ = [
    "AttentionView",
    "EdgeList",
    "LayerAttention",
    "attention_matrix",
    "build_view",
    "describe_producers",
    "draw_attention",
    "draw_heads",
    "draw_heatmap",
    "draw_summary",
    "layer_stats",
    "origin_color",
    "prune",
    "render_html",
    "save_figure",
    "thin_layer",
    "trace_sample",
    "visualize",
    "write_html",
    "write_output",
]
