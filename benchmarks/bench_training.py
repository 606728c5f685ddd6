r"""One training step, end to end: graphattn's models against PyG's GPS, GAT, GCN and a plain GINE.

What is timed is what a user runs: ``Trainer.train_step`` of the runner (forward with every
producer, the objective with its auxiliary and policy-gradient terms, backward, gradient clipping,
the optimizer, and the one device-to-host transfer of the losses) for graphattn's models, and the
same loop (forward, loss, one ``.item()``, backward, Adam) for the PyG anchors. Every model runs in
this one process, on the same batches, one after the other; each takes ``--warmup`` steps, then
``--steps`` timed steps (the device synchronised before and after each), and the median is
reported with the ratio against PyG ``GPSConv`` (the dense anchor) and against the plain GINE
model (the floor: message passing with no attention). On CUDA the peak memory of the timed steps
is reported too.

Suites (``--suite``):

* ``peptides`` — LRGB Peptides-func, batches of 128 graphs (first batches of the training split
  in a seeded order), hidden 96, 4 layers, 4 heads, a GINE local branch, atom / bond encoders, no
  positional encoding. graphattn: every registered producer in the hybrid model (SAMSA with
  ``k = 32``, the Exphormer union ``input ∪ expander(3) ∪ virtual``, kNN in feature space, SAC
  with the paper's LSTM decoder and with the parallel policy over all nodes, 32 and 16 candidates), and
  the SAMSA and Converter presets; the README's Peptides-func recipes (GCN+, GCN+ with attention
  over the bonds and a virtual node, and with full attention) at their own width and depth, RWSE
  of 16 steps. Anchors: PyG ``GPSConv(GINEConv, heads=4, multihead)``,
  ``GATConv``, ``GCNConv``, ``GINEConv`` models of the same width and depth.
* ``cora`` — the README's main job (``examples/configs/cora.toml``: GCN branch + attention over the
  input edges, 2 layers) against PyG's GAT (2 layers, 8 heads of 8, as in the GAT paper) and GCN
  (2 layers, 64 hidden).
* ``listops`` — generated ListOps of 1000–2000 tokens, batches of ``--listops-batch`` sequences,
  hidden 64, 4 layers, 4 heads, no local branch: the sequence producers (full, window, global,
  random, samsa, sbm, sliceformer, converter) against PyG ``GPSConv`` without a local branch
  (dense attention over the padded batch).

Peptides batches can be frozen to a file (``--save-batches``) and read back (``--load-batches``)
where the data set cannot be built (no RDKit, no mirror): a file of plain tensors, read with
``torch.load(weights_only=True)``.

Examples (the commands behind the README's table)::

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/bench_training.py --suite peptides cora \
        --threads 2 --out runs/bench_training/cpu.jsonl
    python benchmarks/bench_training.py --suite peptides cora listops --device cuda \
        --load-batches peptides_batches.pt --out runs/bench_training/cuda.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib
import torch
import torch.nn.functional as F
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]

#: the hybrid model's producer specs on each suite (every registered producer that applies)
PEPTIDES_PRODUCERS: dict[str, Any] = {
    "input": "input",
    "full": "full",
    "window": "window",
    "global": "global",
    "knn": {"name": "knn", "attr": "x", "k": 8},
    "random": "random",
    "expander": "expander",
    "virtual": "virtual",
    "union (Exphormer)": {"name": "union",
                          "producers": ["input", {"name": "expander", "degree": 3}, "virtual"]},
    "union (Exphormer, origin bias)": {"name": "union", "origin_bias": True, "producers": [
        "input", {"name": "expander", "degree": 3}, "virtual"]},
    "samsa k=32": {"name": "samsa", "k": 32},
    "sbm": "sbm",
    "sbm (initial density 5%)": {"name": "sbm", "init_density": 0.05},
    "sbm (initial density 5%, 32 clusters)": {"name": "sbm", "init_density": 0.05, "num_clusters": 32},
    "sbm (initial density 2%, 32 clusters)": {"name": "sbm", "init_density": 0.02, "num_clusters": 32},
    "sliceformer": "sliceformer",
    "sac": "sac",
    "sac (parallel policy)": {"name": "sac", "policy": "parallel"},
    "sac (parallel, 32 candidates)": {"name": "sac", "policy": "parallel", "num_candidates": 32},
    "sac (parallel, 16 candidates)": {"name": "sac", "policy": "parallel", "num_candidates": 16},
    "converter": "converter",
}
LISTOPS_PRODUCERS = ("full", "window", "global", "random", "samsa", "sbm", "sliceformer", "converter")
PRESETS = ("samsa", "converter")
#: the Peptides-func recipes of the README's results (their own width, depth and head), run on the
#: benchmark's batches of 128 graphs with its RWSE of 16 steps (the configs read 32)
PEPTIDES_CONFIGS = {"GCN+ recipe": "gcnplus_peptides_func.toml",
                    "GCN+ with attention": "gcnplus_attention_peptides_func.toml",
                    "GCN+ with full attention": ("gcnplus_attention_peptides_func.toml",
                                                 {"producer": "full"})}


# ----------------------------------------------------------------------------- data
def peptides_task(args: argparse.Namespace) -> Any:
    """The Peptides-func task holding the benchmark's batches only (``--load-batches``) or the
    real training split (its first ``--batches`` batches in a seeded order are used)."""
    from graphattn.runner.tasks import Task, build_task

    if args.load_batches:
        from graphattn.data.store import DamagedCacheError, UnreadableDataError, load_cache

        keys = {"meta", "x", "edge_index", "edge_attr", "y", "num_nodes", "num_edges"}
        try:
            blob = load_cache(args.load_batches, lambda b: isinstance(b, dict) and keys <= set(b),
                              "the batches --save-batches writes", kind="--load-batches file",
                              advice="write it again with --save-batches")
        except (DamagedCacheError, UnreadableDataError) as exc:
            raise SystemExit(str(exc)) from None
        meta = json.loads(blob["meta"])
        graphs = _unpack(blob)
        return Task(name=meta["name"], level="graph", modality="molecule", loss=meta["loss"],
                    metric=meta["metric"], out_channels=meta["out_channels"],
                    splits={"train": graphs}, model_defaults=meta["model_defaults"])
    task = build_task("peptides-func", progress=False)
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(task.splits["train"]), generator=gen)[: args.batches * 128]
    task.splits = {"train": [task.splits["train"][int(i)] for i in order]}
    if args.save_batches:
        _save(task, args.save_batches)
    return task


def _save(task: Any, path: str) -> None:
    """The graphs of ``task.splits["train"]`` as plain tensors (small integer dtypes)."""
    from graphattn.data.store import atomic_torch_save

    graphs = task.splits["train"]
    meta = {"name": task.name, "loss": task.loss, "metric": task.metric,
            "out_channels": task.out_channels, "model_defaults": task.model_defaults}
    blob = {
        "meta": json.dumps(meta),
        "x": torch.cat([g.x for g in graphs]).to(torch.uint8),
        "edge_index": torch.cat([g.edge_index for g in graphs], 1).to(torch.int16),
        "edge_attr": torch.cat([g.edge_attr for g in graphs]).to(torch.uint8),
        "y": torch.cat([g.y.view(1, -1) for g in graphs]),
        "num_nodes": torch.tensor([g.num_nodes for g in graphs]),
        "num_edges": torch.tensor([g.edge_index.size(1) for g in graphs]),
    }
    atomic_torch_save(blob, path)
    print(f"saved {len(graphs)} graphs to {path}", file=sys.stderr)


def _unpack(blob: dict[str, Tensor]) -> list[Any]:
    from torch_geometric.data import Data

    xs = blob["x"].long().split(blob["num_nodes"].tolist())
    eis = blob["edge_index"].long().split(blob["num_edges"].tolist(), dim=1)
    eas = blob["edge_attr"].long().split(blob["num_edges"].tolist())
    ys = blob["y"].split(1)
    return [Data(x=x, edge_index=ei, edge_attr=ea, y=y)
            for x, ei, ea, y in zip(xs, eis, eas, ys, strict=True)]


def graph_batches(task: Any, batch_size: int, count: int) -> list[Any]:
    from torch_geometric.loader import DataLoader

    loader = DataLoader(task.splits["train"], batch_size=batch_size, shuffle=False)
    return [b for _, b in zip(range(count), loader, strict=False)]


# ----------------------------------------------------------------------------- anchors
class PygModel(nn.Module):
    """Encoder → ``layers`` × (conv, residual, norm) → read-out, the shape of the GPS paper's
    models; ``kind``: ``"gps"``, ``"gat"``, ``"gcn"``, ``"gine"``."""

    def __init__(self, kind: str, hidden: int, layers: int, heads: int, out: int, *,
                 atom: bool, local: bool = True, num_embeddings: int | None = None,
                 graph_level: bool = True) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv, GINEConv, GPSConv

        self.kind, self.graph_level = kind, graph_level
        if atom:
            from ogb.graphproppred.mol_encoder import AtomEncoder, BondEncoder

            self.enc, self.edge_enc = AtomEncoder(hidden), BondEncoder(hidden)
        else:
            self.enc = nn.Embedding(num_embeddings, hidden) if num_embeddings else nn.LazyLinear(hidden)
            self.edge_enc = None

        def gine() -> nn.Module:
            mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            return GINEConv(mlp)

        convs: list[nn.Module] = []
        for _ in range(layers):
            if kind == "gps":
                convs.append(GPSConv(hidden, gine() if local else None, heads=heads,
                                     attn_type="multihead"))
            elif kind == "gat":
                convs.append(GATConv(hidden, hidden // heads, heads=heads,
                                     edge_dim=hidden if atom else None))
            elif kind == "gcn":
                convs.append(GCNConv(hidden, hidden))
            elif kind == "gine":
                convs.append(gine())
            else:
                raise ValueError(f"unknown anchor {kind!r}")
        self.convs = nn.ModuleList(convs)
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, data: Any) -> Tensor:
        from torch_geometric.nn import global_mean_pool

        x = self.enc(data.x)
        ea = self.edge_enc(data.edge_attr) if self.edge_enc is not None else None
        for conv, norm in zip(self.convs, self.norms, strict=True):
            if self.kind == "gps":
                x = conv(x, data.edge_index, edge_attr=ea, batch=data.batch) if ea is not None else conv(
                    x, data.edge_index, data.batch)
                continue
            if self.kind == "gcn":
                h = conv(x, data.edge_index)
            else:
                h = conv(x, data.edge_index, ea)
            x = x + F.relu(norm(h))
        if self.graph_level:
            x = global_mean_pool(x, data.batch, getattr(data, "num_graphs", None))
        return self.head(x)


class PygGAT(nn.Module):
    """GAT on a citation graph (Veličković et al.: 8 heads of 8, ELU, dropout 0.6; 1 output head)."""

    def __init__(self, in_channels: int, out: int) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv

        self.conv1 = GATConv(in_channels, 8, heads=8, dropout=0.6)
        self.conv2 = GATConv(64, out, heads=1, dropout=0.6)

    def forward(self, data: Any) -> Tensor:
        x = F.dropout(data.x, 0.6, self.training)
        x = F.elu(self.conv1(x, data.edge_index))
        x = F.dropout(x, 0.6, self.training)
        return self.conv2(x, data.edge_index)


class PygGCN(nn.Module):
    """GCN on a citation graph (Kipf & Welling: 64 hidden here, as the hybrid, ReLU, dropout 0.5)."""

    def __init__(self, in_channels: int, out: int) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2 = GCNConv(in_channels, 64), GCNConv(64, out)

    def forward(self, data: Any) -> Tensor:
        x = F.dropout(data.x, 0.5, self.training)
        x = F.dropout(F.relu(self.conv1(x, data.edge_index)), 0.5, self.training)
        return self.conv2(x, data.edge_index)


# ----------------------------------------------------------------------------- steps
def graphattn_step(cfg: dict[str, Any], task: Any,
                   device: torch.device) -> tuple[Callable[[Any], None], int]:
    """The runner's own training step for ``cfg`` (``Trainer.train_step``), and the parameter
    count."""
    from graphattn.runner.config import resolve_config
    from graphattn.runner.trainer import Trainer

    cfg = resolve_config({**cfg, "device": str(device), "progress": False})
    trainer = Trainer(cfg, task, 0, None)
    trainer.model.train()
    node_mask = task.graph.train_mask.to(device) if task.level == "node" else None

    def step(batch: Any) -> None:
        trainer.train_step(batch, node_mask)

    return step, trainer.n_params


def anchor_step(model: nn.Module, task: Any, first: Any, device: torch.device,
                lr: float = 1e-3) -> tuple[Callable[[Any], None], int]:
    from graphattn.runner.metrics import task_loss

    model = model.to(device)
    with torch.no_grad():  # lazy modules
        model.eval()
        model(first)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    node_mask = task.graph.train_mask.to(device) if task.level == "node" else None

    def step(batch: Any) -> None:
        opt.zero_grad(set_to_none=True)
        out = model(batch)
        y = batch.y
        if node_mask is not None:
            out, y = out[node_mask], y[node_mask]
        loss = task_loss(task, out, y)
        if not math.isfinite(loss.item()):
            raise FloatingPointError("non-finite loss")
        loss.backward()
        opt.step()

    return step, sum(p.numel() for p in model.parameters())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step: Callable[[Any], None], batches: list[Any], device: torch.device, warmup: int,
              steps: int, budget_s: float | None = None) -> dict[str, float]:
    """Median (min, IQR) wall time of ``steps`` steps after ``warmup``; with ``budget_s`` a model
    whose steps would take longer than that in all is timed over fewer (at least 3) steps, the
    number estimated from the last warm-up step and stated in the row (``steps``), and its warm-up
    stops once it has taken half the budget."""
    last = spent = 0.0
    for i in range(warmup):
        _sync(device)
        t0 = time.perf_counter()
        step(batches[i % len(batches)])
        _sync(device)
        last = time.perf_counter() - t0
        spent += last
        if budget_s is not None and spent > budget_s / 2:  # a slow model: one warm-up is enough
            break
    if budget_s is not None and warmup and last * steps > budget_s:
        steps = max(3, min(steps, int(budget_s / max(last, 1e-9))))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(steps):
        batch = batches[(warmup + i) % len(batches)]
        _sync(device)
        t0 = time.perf_counter()
        step(batch)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    res = {"median_ms": statistics.median(times), "min_ms": min(times),
           "spread_ms": statistics.quantiles(times, n=4)[2] - statistics.quantiles(times, n=4)[0]
           if len(times) >= 4 else 0.0, "steps": steps}
    if device.type == "cuda":
        res["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return res


def profile_step(step: Callable[[Any], None], batches: list[Any], device: torch.device,
                 label: str, steps: int = 3) -> dict[str, float]:
    """``steps`` steps under :mod:`torch.profiler`: the operators per step, and on CUDA the
    kernels launched and the time the device was busy per step (a step whose wall time is far above
    its busy time is bound by the host: Python, dispatch and launches). The top operators are
    printed to stderr."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for i in range(steps):
            step(batches[i % len(batches)])
        _sync(device)
    events = prof.events()
    out = {"ops_per_step": sum(1 for e in events if "::" in e.name
                               and e.cpu_parent is None) / steps}
    key = "self_cpu_time_total"
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        out["kernels_per_step"] = len(kernels) / steps
        out["busy_ms"] = sum(e.device_time for e in kernels) / 1e3 / steps
        key = "self_device_time_total"
    print(f"--- profile: {label}\n" + prof.key_averages().table(sort_by=key, row_limit=10),
          file=sys.stderr, flush=True)
    return out


# ----------------------------------------------------------------------------- suites
def peptides_models(task: Any) -> list[tuple[str, Callable[[], Any]]]:
    base = {"task": "peptides-func", "conv": "gine", "layers": 4, "hidden": 96, "heads": 4,
            "batch_size": 128, "lr": 1e-3}
    models: list[tuple[str, Any]] = []
    for anchor in ("gps", "gat", "gcn", "gine"):
        models.append((f"PyG {anchor.upper()}", ("anchor", anchor)))
    for name, spec in PEPTIDES_PRODUCERS.items():
        models.append((f"graphattn {name}", ("graphattn", {**base, "producer": spec})))
    for preset in PRESETS:
        models.append((f"graphattn {preset} preset",
                       ("graphattn", {**base, "model": preset, "conv": "none", "producer": preset})))
    for label, spec in PEPTIDES_CONFIGS.items():
        name, changes = spec if isinstance(spec, tuple) else (spec, {})
        cfg = _config(name)
        models.append((f"graphattn {label} ({name})",
                       ("graphattn", {**cfg, "batch_size": 128, "pe_dim": 16, **changes})))
    return models


def _config(name: str) -> dict[str, Any]:
    """A shipped config without the keys that say how long and where a run goes."""
    cfg = tomllib.loads((ROOT / "examples" / "configs" / name).read_text())
    for key in ("seeds", "out", "epochs", "patience", "warmup_epochs"):
        cfg.pop(key, None)
    return cfg


def listops_models() -> list[tuple[str, Any]]:
    base = {"task": "listops", "layers": 4, "hidden": 64, "heads": 4, "conv": "none", "lr": 1e-3}
    models: list[tuple[str, Any]] = [("PyG GPS (no local branch)", ("anchor", "gps"))]
    for name in LISTOPS_PRODUCERS:
        models.append((f"graphattn {name}", ("graphattn", {**base, "producer": name})))
    for preset in PRESETS:
        models.append((f"graphattn {preset} preset",
                       ("graphattn", {**base, "model": preset, "producer": preset})))
    return models


def build_anchor(suite: str, kind: str, task: Any, first: Any) -> nn.Module:
    if suite == "peptides":
        return PygModel(kind, 96, 4, 4, task.out_channels, atom=True)
    if suite == "listops":
        return PygModel(kind, 64, 4, 4, task.out_channels, atom=False, local=False,
                        num_embeddings=task.model_defaults["num_embeddings"])
    in_channels = first.x.size(1)
    return PygGAT(in_channels, task.out_channels) if kind == "gat" else PygGCN(in_channels,
                                                                               task.out_channels)


def suite_setup(suite: str, args: argparse.Namespace) -> tuple[Any, list[Any], list[tuple[str, Any]]]:
    from graphattn.runner.tasks import build_task

    if suite == "peptides":
        from graphattn.nn import positional_encoding

        task = peptides_task(args)
        pe = positional_encoding("random_walk", 16)  # the Peptides default (TASK_DEFAULTS)
        task.splits["train"] = [pe(g) for g in task.splits["train"][: 128 * args.batches]]
        return task, graph_batches(task, 128, args.batches), peptides_models(task)
    if suite == "cora":
        cfg = _config("cora.toml")
        task = build_task("cora")
        models = [("PyG GAT", ("anchor", "gat")), ("PyG GCN", ("anchor", "gcn")),
                  ("graphattn cora.toml (README main job)", ("graphattn", cfg))]
        return task, [task.graph], models
    if suite == "listops":
        task = build_task("listops", num_train=args.listops_batch * args.batches, num_val=1,
                          num_test=1, min_length=1000, max_length=2000, progress=False)
        return task, graph_batches(task, args.listops_batch, args.batches), listops_models()
    raise ValueError(f"unknown suite {suite!r}")


def run_suite(suite: str, args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    task, batches, models = suite_setup(suite, args)
    batches = [b.to(device) for b in batches]
    rows = []
    for label, (kind, what) in models:
        if args.only and not any(s in label for s in args.only):
            continue
        torch.manual_seed(0)
        step = None
        try:
            if kind == "anchor":
                step, n_params = anchor_step(build_anchor(suite, what, task, batches[0]), task,
                                             batches[0], device)
            else:
                step, n_params = graphattn_step(what, task, device)
            res = time_step(step, batches, device, args.warmup, args.steps, args.model_budget)
            if args.profile:
                res.update(profile_step(step, batches, device, label))
            row = {"suite": suite, "model": label, "params": n_params, **res}
        except Exception as exc:  # a failing model is a row, not the end of the run
            row = {"suite": suite, "model": label, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(json.dumps(row), file=sys.stderr, flush=True)
        if args.out:  # row by row: a run cut short keeps what it measured
            with open(args.out, "a") as f:
                f.write(json.dumps({**row, "device": str(device), "threads": args.threads,
                                    "torch": torch.__version__}) + "\n")
        rows.append(row)
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    gps = next((r["median_ms"] for r in rows if r["model"].startswith("PyG GPS") and "median_ms" in r),
               None)
    gine = next((r["median_ms"] for r in rows if r["model"] == "PyG GINE" and "median_ms" in r), None)
    gat = next((r["median_ms"] for r in rows if r["model"] == "PyG GAT" and "median_ms" in r), None)
    for r in rows:
        if "median_ms" in r:
            for key, ref in (("vs_gps", gps), ("vs_gine", gine), ("vs_gat", gat)):
                if ref:
                    r[key] = r["median_ms"] / ref
    return rows


def markdown(rows: list[dict[str, Any]], device: torch.device, args: argparse.Namespace) -> str:
    lines = []
    for suite in dict.fromkeys(r["suite"] for r in rows):
        part = [r for r in rows if r["suite"] == suite]
        ref = "vs_gat" if suite == "cora" else "vs_gps"
        cols = ["model", "params", "ms / step (median)", "spread (IQR)", f"× {ref[3:].upper()}"]
        if suite == "peptides":
            cols.append("× GINE")
        if device.type == "cuda":
            cols.append("peak MiB")
        lines += [f"\n**{suite}** ({device.type}, {args.steps} steps after {args.warmup})\n",
                  "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in part:
            if "error" in r:
                lines.append(f"| {r['model']} | — | failed: {r['error'][:120]} |" + " |" * (len(cols) - 3))
                continue
            ms = f"{r['median_ms']:.1f}"
            if r.get("steps", args.steps) < args.steps:
                ms += f" ({r['steps']} steps)"
            cells = [r["model"], f"{r['params']:,}", ms, f"{r['spread_ms']:.1f}",
                     f"{r.get(ref, float('nan')):.2f}"]
            if suite == "peptides":
                cells.append(f"{r.get('vs_gine', float('nan')):.2f}")
            if device.type == "cuda":
                cells.append(f"{r['peak_mib']:.0f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", nargs="+", default=["peptides", "cora"],
                   choices=["peptides", "cora", "listops"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default: 2)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=11)
    p.add_argument("--batches", type=int, default=4,
                   help="distinct batches cycled through (default: 4)")
    p.add_argument("--listops-batch", type=int, default=8, help="sequences per ListOps batch")
    p.add_argument("--only", nargs="*", help="run the models whose label contains one of these")
    p.add_argument("--model-budget", type=float, default=None, metavar="SECONDS",
                   help="time a model whose steps would take longer than this over fewer steps "
                        "(at least 3; the row states how many)")
    p.add_argument("--profile", action="store_true",
                   help="also profile 3 steps per model: operators (and on CUDA kernels and busy "
                        "time) per step, and the top operators")
    p.add_argument("--save-batches", help="write the Peptides batches to this file")
    p.add_argument("--load-batches", help="read the Peptides batches from this file")
    p.add_argument("--out", help="append the rows as JSON lines to this file")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} threads, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
          file=sys.stderr)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for suite in args.suite:
        rows += run_suite(suite, args, device)
    print(markdown(rows, device, args))


if __name__ == "__main__":
    main()
