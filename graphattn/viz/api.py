"""One call from a model and a sample to a figure or a viewer page."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from graphattn.viz.view import AttentionView, build_view, trace_sample

FIGURES = ("graph", "heads", "heatmap", "summary")
STATIC_SUFFIXES = (".png", ".pdf", ".svg")


def describe_producers(model: nn.Module) -> str:
    """The producers of a model's attention layers, e.g. ``"union(input+expander+virtual)"``."""
    from graphattn.producers.base import EdgeProducer

    def name(p: EdgeProducer) -> str:
        parts = getattr(p, "parts", None)
        base = p.name or type(p).__name__
        if parts is not None:
            return f"{base}({'+'.join(name(q) for q in parts)})"
        return base

    seen: list[str] = []
    for m in model.modules():
        p = getattr(m, "producer", None)
        if isinstance(p, EdgeProducer) and name(p) not in seen:
            seen.append(name(p))
    return ", ".join(seen) if seen else "no producer"


def _class_name(names: Sequence[str] | None, c: int) -> str:
    return str(names[c]) if names is not None and 0 <= c < len(names) else str(c)


def describe_prediction(y: Any, output: Any, *, loss: str = "ce",
                        class_names: Sequence[str] | None = None) -> str:
    """``"class Trouser · predicted Trouser"`` for one sample: ``y`` its target (class index, or a
    0/1 vector for a multi-label task, ``loss="bce"``), ``output`` the model's logits for it (or
    ``None``). Class indices are named by ``class_names`` where given; ``""`` when there is nothing
    to say (regression, no target and no output)."""
    import torch

    if isinstance(output, (tuple, list)):
        output = output[0] if output else None
    parts = []
    if loss == "bce":
        def names(v: Any) -> str:
            idx = torch.as_tensor(v).reshape(-1).nonzero().reshape(-1).tolist()
            return ", ".join(_class_name(class_names, int(i)) for i in idx) or "none"

        if y is not None:
            parts.append(f"labels {names(torch.as_tensor(y).reshape(-1) > 0.5)}")
        if output is not None:
            parts.append(f"predicted {names(torch.as_tensor(output).float().reshape(-1) > 0)}")
        return " · ".join(parts)
    if loss != "ce":
        return ""
    true = None
    if y is not None and torch.as_tensor(y).numel() == 1:
        true = int(torch.as_tensor(y).reshape(-1)[0])
        parts.append(f"class {_class_name(class_names, true)}")
    if output is not None and torch.as_tensor(output).numel() > 1:
        pred = int(torch.as_tensor(output).float().reshape(-1).argmax())
        mark = "" if true is None else (" ✓" if pred == true else " ✗")
        parts.append(f"predicted {_class_name(class_names, pred)}{mark}")
    return " · ".join(parts)


def write_output(view: AttentionView, out: str | Path, *, figure: str = "graph", layer: int | str = -1,
                 head: int | None = None, top_k: int | str | None = "auto", threshold: float = 0.0,
                 color_by: str = "origin", dpi: int = 150) -> list[Path]:
    """Writes ``view`` to ``out``: ``.html`` = the interactive viewer; ``.png``/``.pdf``/``.svg`` =
    the static ``figure`` (``graph``, ``heads``, ``heatmap``, ``summary`` or ``all``, which writes
    ``<stem>_<figure><suffix>`` for each). Returns the written paths.

    ``top_k``: in-edges drawn per target (``"auto"``: by node count, see
    :func:`~graphattn.viz.view.auto_top_k`; ``None`` or ``0``: all). The heatmap shows every edge
    unless ``top_k`` is a number; the HTML viewer opens at the automatic top-k (or at ``top_k``)."""
    from graphattn.viz import static
    from graphattn.viz.html import write_html

    out = Path(out)
    suffix = out.suffix.lower()
    if suffix in (".html", ".htm"):
        return [write_html(view, out, top_k=top_k)]
    if suffix not in STATIC_SUFFIXES:
        raise ValueError(f"'out' must end in .html, {', '.join(STATIC_SUFFIXES)}; got {out.name!r}")
    if figure not in (*FIGURES, "all"):
        raise ValueError(f"'figure' must be one of {(*FIGURES, 'all')}, got {figure!r}")
    kinds = FIGURES if figure == "all" else (figure,)
    written = []
    for kind in kinds:
        path = out if figure != "all" else out.with_name(f"{out.stem}_{kind}{out.suffix}")
        if kind == "graph":
            ax = static.draw_attention(view, layer, head, top_k=top_k, threshold=threshold,
                                       color_by=color_by)
            if view.title:
                ax.set_title(f"{view.title}\n{ax.get_title()}", fontsize=9)
            fig = ax.figure
        elif kind == "heads":
            fig = static.draw_heads(view, top_k=top_k, threshold=threshold, color_by=color_by)
        elif kind == "heatmap":
            ax = static.draw_heatmap(view, layer, head, top_k=None if top_k == "auto" else top_k,
                                     threshold=threshold)
            if view.title:
                ax.set_title(f"{view.title}\n{ax.get_title()}", fontsize=9)
            fig = ax.figure
        else:
            fig = static.draw_summary(view)
        written.append(static.save_figure(fig, path, dpi=dpi))
    return written


def visualize(model: nn.Module, data: Any, out: str | Path | None = None, *, kind: str | None = None,
              labels: Sequence[str] | None = None, focus: int | None = None, graph: int = 0,
              title: str | None = None, view_kwargs: dict[str, Any] | None = None,
              **output_kwargs: Any) -> AttentionView:
    """Traces ``model(data)`` (eval mode, no gradients), builds the :class:`AttentionView` of graph
    ``graph`` (or of the neighbourhood of node ``focus``) and, if ``out`` is given, writes it
    (:func:`write_output`). ``data`` should be what the model takes (a ``Batch`` for graph models)."""
    trace = trace_sample(model, data)
    if title is None:
        title = describe_producers(model)
    view = build_view(trace, data, graph=graph, focus=focus, kind=kind, labels=labels, title=title,
                      **(view_kwargs or {}))
    if out is not None:
        write_output(view, out, **output_kwargs)
    return view
