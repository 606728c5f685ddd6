"""The interactive viewer: one self-contained HTML file.

The page embeds the view as JSON in a ``<script type="application/json">`` element and the viewer's
JS and CSS (``graphattn/viz/assets``) inline; it loads nothing from the network. A Content Security
Policy allows only the page's own script and style (by hash) and ``data:`` images, so an injected
tag could not run even if one slipped through. Labels reach the page only as JSON strings in which
``<``, ``>``, ``&`` and the JS line separators are ``\\u`` escapes, and the script inserts them with
``textContent``: a label such as ``<script>`` is shown as text.

Controls: layer and head (or the head mean), colour by origin or weight, top-k per target (the
page opens at the size-dependent default of the static figures), |α| threshold, origin toggles,
labels, the data's own edges; hover for weights and labels, click a node to highlight its in-edges
(what it attends to) and out-edges (what attends to it), wheel to zoom, drag to pan. Self-loops
are drawn as a halo around the node.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from graphattn.core.origins import origin_name
from graphattn.viz.static import origin_color
from graphattn.viz.view import MAX_DRAWN, AttentionView, resolve_top_k, thin_layer

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _asset(name: str) -> str:
    return resources.files("graphattn.viz").joinpath("assets", name).read_text(encoding="utf-8")


def _floats(a: np.ndarray, digits: int = 5) -> list[float]:
    """Floats rounded to ``digits`` significant digits (short in JSON), vectorised."""
    v = np.asarray(a, dtype=np.float64).ravel()
    if not np.isfinite(v).all():
        raise ValueError("the view holds a non-finite coefficient or coordinate")
    mag = np.floor(np.log10(np.where(v != 0, np.abs(v), 1.0)))
    e = (digits - 1 - mag).astype(np.int64)
    # divide or multiply by an exact power of ten, so the result is the double nearest the decimal
    up = np.where(e >= 0, 10.0 ** np.clip(e, 0, 22), 1.0)
    down = np.where(e < 0, 10.0 ** np.clip(-e, 0, 22), 1.0)
    return (np.round(v * up / down) * down / up).tolist()


def _ints(a: np.ndarray) -> list[int]:
    return np.asarray(a).astype(np.int64).ravel().tolist()


def json_for_script(obj: Any) -> str:
    """JSON that is safe inside an HTML ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_ESCAPES[m.group(0)], text)


def _background(view: AttentionView) -> dict[str, Any] | None:
    if view.background is None:
        return None
    import matplotlib.pyplot as plt

    img, (x0, x1, y0, y1) = view.background
    buf = io.BytesIO()
    finite = np.isfinite(img)
    lo = float(img[finite].min()) if finite.any() else 0.0
    hi = float(img[finite].max()) if finite.any() else 1.0
    plt.imsave(buf, np.nan_to_num(img, nan=lo), cmap="gray_r", vmin=lo, vmax=max(hi, lo + 1e-12),
               format="png")
    href = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
    return {"href": href, "x0": x0, "x1": x1, "y0": y0, "y1": y1}


def node_radius(view: AttentionView) -> float:
    """Node radius of graph and point views in drawing units: 30 % of the typical distance to the
    nearest node (markers and self-loop halos never overlap), at most the static figures' size
    for this node count (:func:`~graphattn.viz.static.count_node_size`) relative to the drawing."""
    from graphattn.viz.static import count_node_size, node_spacing

    total = view.num_nodes + view.num_virtual
    if total == 0:
        return 0.0
    span = float(np.ptp(view.pos, axis=0).max()) if total > 1 else 1.0
    span = span if span > 0 else 1.0
    cap = 0.5 * count_node_size(total) / 650.0 * span  # a 9-inch (650 pt) drawing, as the figures
    spacing = node_spacing(view.pos)
    return float(min(cap, 0.3 * spacing) if spacing > 0 else cap)


def view_payload(view: AttentionView, *, max_edges: int | None = 60_000,
                 max_drawn: int = MAX_DRAWN, top_k: int | str | None = "auto") -> dict[str, Any]:
    """The JSON payload the viewer script reads (see ``assets/viewer.js``).

    ``max_edges``: a layer with more edge-head pairs is thinned to each target's strongest in-edges
    (:func:`~graphattn.viz.view.thin_layer`), which keeps the file small. The page opens with each
    target's ``top_k`` strongest in-edges (``"auto"``: :func:`~graphattn.viz.view.auto_top_k` of the
    node count; ``None``/``0``: all), fewer if a (layer, head) would still draw more than
    ``max_drawn`` edges; the user can change or clear it.
    """
    from graphattn.viz.static import _node_style, node_categories

    n, V = view.num_nodes, view.num_virtual
    types = np.zeros(n + V, dtype=int)
    types[view.is_cls] = 1
    types[n:] = 2
    colors, _ = _node_style(view)
    cats = node_categories(view)
    from matplotlib.colors import to_hex

    layers = []
    biggest = indegree = 0
    notes = list(view.notes)
    for lay in view.layers:
        if max_edges is not None:
            lay, note = thin_layer(lay, max_edges, n)
            notes += [note] if note else []
        alpha = lay.alpha[np.arange(lay.num_edges), lay.head] if lay.head is not None else lay.alpha
        layers.append({
            "name": lay.name,
            "heads": lay.num_heads,
            "complex": lay.complex,
            "numVirtual": lay.num_virtual,
            "src": _ints(lay.src),
            "dst": _ints(lay.dst),
            "head": None if lay.head is None else _ints(lay.head),
            "alpha": _floats(alpha),
            "origin": _ints(lay.origin),
            "prunedFrom": lay.pruned_from,
        })
        for h in range(lay.num_heads):
            el = lay.edges(h)
            biggest = max(biggest, len(el))
            if len(el):
                indegree = max(indegree, int(np.bincount(el.dst).max()))
    codes = sorted({int(c) for lay in view.layers for c in np.unique(lay.origin)})
    default_top_k = (resolve_top_k(top_k, n) or 0) if n else 0
    if biggest > max_drawn and n:
        default_top_k = min(default_top_k or biggest, max(1, max_drawn // n))
    if default_top_k >= indegree:  # nothing to hide
        default_top_k = 0
    if default_top_k:
        notes.append(f"showing each target's top-{default_top_k} in-edges at first (set top-k to 0 "
                     f"for all {biggest})")
    return {
        "title": view.title,
        "kind": view.kind,
        "arcs": view.kind == "sequence" and view.focus is None,
        "numReal": n,
        "focus": view.focus,
        "notes": notes,
        "nodes": {
            "x": _floats(view.pos[:, 0], 7),
            "y": _floats(view.pos[:, 1], 7),
            "label": [str(s) for s in view.labels],
            "type": _ints(types),
            "index": _ints(np.r_[view.node_index, np.full(V, -1)]),
            "hop": None if view.hop is None else _ints(view.hop),
            "color": [to_hex(c) for c in colors],
        },
        "origins": {str(c): {"name": origin_name(c), "color": origin_color(c)} for c in codes},
        "layers": layers,
        "inputEdges": None if view.input_edges is None else [_ints(view.input_edges[0]),
                                                            _ints(view.input_edges[1])],
        "stats": view.stats,
        "background": _background(view),
        "defaultTopK": default_top_k,
        "nodeRadius": node_radius(view) if view.kind not in ("sequence", "image") else None,
        "categories": None if cats is None else [{"name": k, "color": to_hex(c)} for k, c in cats.items()],
        "labelsDefault": (n + V) <= 150 and view.kind != "image" and cats is None,
    }


def _csp(js: str, css: str) -> str:
    def h(s: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode() + "'"

    return (f"default-src 'none'; script-src {h(js)}; style-src {h(css)}; "
            f"img-src data:; base-uri 'none'; form-action 'none'")


def render_html(view: AttentionView, *, title: str | None = None, max_edges: int | None = 60_000,
                max_drawn: int = MAX_DRAWN, top_k: int | str | None = "auto") -> str:
    """The viewer page for ``view`` as a string (``max_edges``, ``max_drawn``, ``top_k``:
    :func:`view_payload`)."""
    from graphattn import __version__

    js, css = _asset("viewer.js"), _asset("viewer.css")
    payload = view_payload(view, max_edges=max_edges, max_drawn=max_drawn, top_k=top_k)
    page_title = title if title is not None else (view.title or "graphattn attention viewer")
    payload["title"] = page_title
    values = {
        "CSP": html.escape(_csp(js, css), quote=True),
        "VERSION": html.escape(__version__),
        "TITLE": html.escape(page_title),
        "CSS": css,
        "JS": js,
        "DATA": json_for_script(payload),
    }
    # one pass, so text inserted for one placeholder is never scanned for another
    return re.sub(r"\{\{(CSP|VERSION|TITLE|CSS|JS|DATA)\}\}", lambda m: values[m.group(1)],
                  _asset("viewer.html"))


def write_html(view: AttentionView, path: str | Path, **kwargs: Any) -> Path:
    """Writes the self-contained viewer page for ``view`` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(view, **kwargs), encoding="utf-8")
    return path
