"""The attention-graph viewer: what a model attends to, over generated edge sets.

From a trace (:func:`graphattn.trace`) and the traced sample, :func:`build_view` makes an
:class:`AttentionView` (per layer: edges, per-head coefficients, producer of each edge, in the data's
own layout). Draw it with the static figures (:mod:`graphattn.viz.static`) or write the
self-contained interactive page (:func:`write_html`); :func:`visualize` does all in one call and
``graphattn viz <run> --sample i --out file.html|file.png`` does it for a trained run.
"""

from __future__ import annotations

from graphattn._lazy import lazy_exports

# public name -> submodule (imported on first use, PEP 562: the command line's help stays fast)
_EXPORTS = {
    "describe_prediction": "graphattn.viz.api",
    "describe_producers": "graphattn.viz.api",
    "visualize": "graphattn.viz.api",
    "write_output": "graphattn.viz.api",
    "render_html": "graphattn.viz.html",
    "write_html": "graphattn.viz.html",
    "attention_matrix": "graphattn.viz.static",
    "draw_attention": "graphattn.viz.static",
    "draw_heads": "graphattn.viz.static",
    "draw_heatmap": "graphattn.viz.static",
    "draw_summary": "graphattn.viz.static",
    "origin_color": "graphattn.viz.static",
    "save_figure": "graphattn.viz.static",
    "AttentionView": "graphattn.viz.view",
    "EdgeList": "graphattn.viz.view",
    "LayerAttention": "graphattn.viz.view",
    "auto_top_k": "graphattn.viz.view",
    "build_view": "graphattn.viz.view",
    "layer_stats": "graphattn.viz.view",
    "prune": "graphattn.viz.view",
    "thin_layer": "graphattn.viz.view",
    "trace_and_predict": "graphattn.viz.view",
    "trace_sample": "graphattn.viz.view",
}


__all__ = [
    "AttentionView",
    "EdgeList",
    "LayerAttention",
    "attention_matrix",
    "auto_top_k",
    "build_view",
    "describe_prediction",
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
    "trace_and_predict",
    "trace_sample",
    "visualize",
    "write_html",
    "write_output",
]


__getattr__, __dir__ = lazy_exports("graphattn.viz", globals(), _EXPORTS)
