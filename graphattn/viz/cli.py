"""Draw the attention a trained model uses on one test sample (``graphattn viz``).

Examples::

    graphattn viz runs/cora-union --sample 42 --out cora.html          # node 42's neighbourhood
    graphattn viz runs/peptides/seed0/best.pt --sample 3 --out pep.png --figure all
    graphattn viz runs/listops --sample 0 --out listops.png --figure heatmap --head 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

#: the static figures (``graphattn.viz.api.FIGURES``; listed here so that ``--help`` imports no torch)
FIGURES = ("graph", "heads", "heatmap", "summary")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run directory (runs/<name>) or a checkpoint file (.pt)")
    parser.add_argument("--sample", type=int, default=0,
                        help="test graph index (graph tasks) or node id to focus on (node tasks)")
    parser.add_argument("--out", required=True,
                        help="output file: .html (interactive viewer) or .png/.pdf/.svg (figure)")
    parser.add_argument("--seed", type=int, default=None, help="which seed's checkpoint of a run")
    parser.add_argument("--figure", choices=(*FIGURES, "all"), default="graph",
                        help="static figure to draw ('all' writes <stem>_<figure>.<ext> for each)")
    parser.add_argument("--layer", default="-1", help="layer index (negative from the end) or name")
    parser.add_argument("--head", default="mean", help="head index or 'mean' (mean over heads)")
    parser.add_argument("--top-k", type=_parse_top_k, default="auto",
                        help="in-edges drawn per target: a number, 'all' (or 0), or 'auto' (default: "
                             "by node count, all up to 24 nodes, 3 up to 80, 2 up to 200, else 1)")
    parser.add_argument("--threshold", type=float, default=0.0, help="hide edges with |alpha| below this")
    parser.add_argument("--color-by", choices=("origin", "weight"), default="origin",
                        help="edge colour: the producer that generated the edge, or its weight")
    parser.add_argument("--hops", type=int, default=None, help="attention hops around the focus node")
    parser.add_argument("--focus-k", type=int, default=8, help="strongest sources kept per node and hop")
    parser.add_argument("--max-nodes", type=int, default=60, help="node cap of a focus view")
    parser.add_argument("--device", default="cpu", help="device to run the model on")
    parser.add_argument("--data-root", default=None, help="data root, if not the one the run used")
    parser.add_argument("--dpi", type=int, default=150, help="resolution of PNG figures")


def _parse_top_k(text: str) -> int | str | None:
    if text in ("auto", ""):
        return "auto"
    if text == "all":
        return None
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, 'all' or 'auto', got {text!r}") from None
    if k < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {k}")
    return k or None


def _parse_layer(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text


def _parse_head(text: str) -> int | None:
    if text in ("mean", "all", ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"graphattn viz: --head must be an integer or 'mean', got {text!r}") from None


def _restore(args: argparse.Namespace) -> tuple[Any, Any]:
    try:
        from graphattn.runner import restore
    except ImportError as exc:  # pragma: no cover - the runner ships with the package
        raise SystemExit(f"graphattn viz needs graphattn.runner.restore ({exc})") from None
    kwargs: dict[str, Any] = {"seed": args.seed, "device": args.device}
    if args.data_root is not None:
        kwargs["data_root"] = args.data_root
    return restore(args.run, **kwargs)


def print_summary(view: Any, file: Any = None) -> None:
    """The per-layer statistics (:func:`graphattn.attention_stats.layer_statistics`) as a plain
    table: edges per node and head, density, mean attention entropy in nats (``H nats``) and
    normalised by the log in-degree (``H/log d``), attention mass by origin."""
    file = sys.stdout if file is None else file

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(f"{'layer':<28} {'edges':>9} {'edges/node/head':>15} {'density':>9} {'H nats':>8} "
          f"{'H/log d':>8}  attention mass", file=file)
    for s in view.stats:
        shares = sorted(s["mass_share"].items(), key=lambda kv: -kv[1])
        mass = ", ".join(f"{k} {100 * v:.0f}%" for k, v in shares)
        print(f"{s['layer']:<28} {s['edges']:>9} {s['edges_per_node_head']:>15.2f} {s['density']:>9.3g} "
              f"{num(s['entropy_nats'], '.3f'):>8} {num(s['entropy_normalized'], '.3f'):>8}  {mass}",
              file=file)
    for note in view.notes:
        print(f"note: {note}", file=file)


def main(args: argparse.Namespace) -> int:
    import torch
    from torch_geometric.data import Batch

    from graphattn.viz.api import describe_prediction, describe_producers, write_output
    from graphattn.viz.view import build_view, trace_and_predict

    out = Path(args.out)
    if out.suffix.lower() not in (".html", ".htm", ".png", ".pdf", ".svg"):
        print(f"graphattn viz: --out must end in .html, .png, .pdf or .svg, got {out.name!r}",
              file=sys.stderr)
        return 2
    model, task = _restore(args)
    n = task.num_samples()
    if not 0 <= args.sample < n:
        what = "node" if task.level == "node" else "test sample"
        print(f"graphattn viz: --sample must be a {what} index in [0, {n}), got {args.sample}",
              file=sys.stderr)
        return 2
    data = task.sample(args.sample)
    labels = task.node_labels(data)
    if task.level == "node":
        batch, focus = data, args.sample
    else:
        batch, focus = Batch.from_data_list([data]), None
    with torch.no_grad():
        trace, output = trace_and_predict(model, batch.to(args.device))
    if not len(trace):
        print("graphattn viz: the model ran no attention layer (no producer in any layer)",
              file=sys.stderr)
        return 1
    run_name = Path(args.run).name if Path(args.run).is_dir() else Path(args.run).parent.parent.name
    what = f"node {args.sample}" if focus is not None else f"test sample {args.sample}"
    if isinstance(output, (tuple, list)):
        output = output[0] if output else None
    row = focus if focus is not None else 0
    y = getattr(data, "y", None)
    y = None if y is None else (y[row] if focus is not None else y)
    pred = describe_prediction(y, None if output is None else output[row].detach().cpu(),
                               loss=getattr(task, "loss", ""), class_names=getattr(task, "labels", None))
    title = " · ".join(dict.fromkeys([run_name, task.name, what, *([pred] if pred else [])]))
    title += f"\n{describe_producers(model)}"
    view = build_view(trace, batch.cpu(), focus=focus, kind=task.modality, labels=labels, title=title,
                      hops=args.hops, focus_k=args.focus_k, max_nodes=args.max_nodes)
    paths = write_output(view, out, figure=args.figure, layer=_parse_layer(args.layer),
                         head=_parse_head(args.head), top_k=args.top_k, threshold=args.threshold,
                         color_by=args.color_by, dpi=args.dpi)
    print_summary(view)
    for p in paths:
        print(f"wrote {p}")
    return 0
