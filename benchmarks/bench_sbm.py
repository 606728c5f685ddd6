"""SBM-Transformer samplers: batched fastRG (linear in the edges) against the dense Bernoulli path.

For each graph size ``n`` and target density ``d`` one SBM is built (``k`` clusters, sigmoid
memberships of random embeddings, block matrix softmax(C Cᵀ) over all k² entries, memberships scaled
so that the mean edge probability is exactly ``d``; no exploration, δ = 0). The same SBM is then
sampled by

* ``fastrg``: :func:`~graphattn.producers.sbm.fastrg.fastrg_sample` (Algorithm 1, multi-edges);
* ``fastrg+dedupe``: the same followed by :func:`~graphattn.producers.sbm.edges.dedupe` (what the
  producer does with ``dedupe=True``; a sort, ``O(E log E)``);
* ``bernoulli``: :func:`~graphattn.producers.sbm.bernoulli.bernoulli_sample` (dense ``n × n``
  probabilities, one Bernoulli draw per pair, the official code's path).

Reported: the median over ``--repeats`` runs after ``--warmup`` runs (the three samplers interleaved)
of the process CPU time (single-threaded torch, so this is the work done, insensitive to other
processes taking the cores; wall time is reported too), edges, CPU time per sampled edge and the
Bernoulli / fastRG ratios. On a shared box read the ratios and the per-edge flatness, and note the
load printed with every row.

    python benchmarks/bench_sbm.py                     # full grid, n up to 16384 (7 min, quiet 2-core box)
    python benchmarks/bench_sbm.py --quick             # n = 1024, 4096 only
    python benchmarks/bench_sbm.py --kernels           # de-duplication and gate backward vs torch
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from graphattn.producers.sbm.bernoulli import bernoulli_sample
from graphattn.producers.sbm.edges import dedupe
from graphattn.producers.sbm.fastrg import fastrg_sample
from graphattn.producers.sbm.model import block_matrix, expected_num_edges


def make_sbm(n: int, density: float, k: int, heads: int, graphs: int, seed: int = 0):
    """``(Y, S, Z, ptr)`` for ``graphs`` graphs of ``n`` nodes with mean edge probability ``density``."""
    g = torch.Generator().manual_seed(seed)
    N = n * graphs
    S = block_matrix(0.3 * torch.randn(heads, k, 32, generator=g))
    Y = torch.sigmoid(2 * torch.randn(N, heads, k, generator=g))
    Z = torch.sigmoid(2 * torch.randn(N, heads, k, generator=g))
    ptr = torch.arange(graphs + 1) * n
    mean_p = expected_num_edges(Y.double(), S.double(), Z.double(), ptr).mean() / n**2
    c = float((density / mean_p).sqrt())
    if c > 1:  # memberships must stay in [0, 1] so that p <= 1 for the Bernoulli sampler
        raise ValueError(f"density {density} is too high for this construction (scale {c:.2f} > 1)")
    return Y * c, S, Z * c, ptr


def timed(fn: Callable[[], int]) -> tuple[float, float, int]:
    """``(cpu seconds, wall seconds, edges)`` of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    edges = fn()
    return time.process_time() - c0, time.perf_counter() - t0, edges


def run_case(n: int, density: float, k: int, heads: int, graphs: int, repeats: int,
             warmup: int) -> dict:
    Y, S, Z, ptr = make_sbm(n, density, k, heads, graphs)
    N = n * graphs
    gen = torch.Generator().manual_seed(1)

    samplers: dict[str, Callable[[], int]] = {
        "fastrg": lambda: fastrg_sample(Y, S, Z, ptr, generator=gen)[0].num_edges,
        "fastrg+dedupe": lambda: dedupe(fastrg_sample(Y, S, Z, ptr, generator=gen)[0], N,
                                        heads).num_edges,
        "bernoulli": lambda: bernoulli_sample(Y, S, Z, ptr, generator=gen)[0].num_edges,
    }
    times: dict[str, list[float]] = {name: [] for name in samplers}
    walls: dict[str, list[float]] = {name: [] for name in samplers}
    edges: dict[str, list[int]] = {name: [] for name in samplers}
    for r in range(warmup + repeats):
        for name, fn in samplers.items():
            t, w, e = timed(fn)
            if r >= warmup:
                times[name].append(t)
                walls[name].append(w)
                edges[name].append(e)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    mean_edges = {name: statistics.mean(es) for name, es in edges.items()}
    row = {
        "n": n, "graphs": graphs, "heads": heads, "k": k, "density": density,
        "expected_edges": float(expected_num_edges(Y.double(), S.double(), Z.double(), ptr).sum()),
        "repeats": repeats,
    }
    for name in samplers:
        row[f"{name}_edges"] = mean_edges[name]
        row[f"{name}_ms"] = 1e3 * med[name]
        row[f"{name}_wall_ms"] = 1e3 * statistics.median(walls[name])
        row[f"{name}_ns_per_edge"] = 1e9 * med[name] / max(mean_edges[name], 1)
    row["speedup_fastrg"] = med["bernoulli"] / med["fastrg"]
    row["speedup_fastrg_dedupe"] = med["bernoulli"] / med["fastrg+dedupe"]
    return row


def compiled_against_torch(n: int, graphs: int, heads: int, k: int, density: float,
                           repeats: int) -> dict:
    """The two CPU kernels of the training step around the sampler, each against its torch path on
    the same edges (the batch's fastRG multi-edges): the de-duplication (compiled radix sort against
    ``torch.argsort(stable=True)``) and the edge gate's backward (compiled loop against two
    ``torch.sparse.mm``). Process CPU time, median of ``repeats``."""
    from graphattn.core import index
    from graphattn.producers.sbm import native
    from graphattn.producers.sbm.gate import edge_gate
    from graphattn.producers.sbm.model import key_projection

    Y, S, Z, ptr = make_sbm(n, density, k, heads, graphs)
    N = n * graphs
    edges, _ = fastrg_sample(Y, S, Z, ptr, generator=torch.Generator().manual_seed(1))
    W = key_projection(Z, S)
    grad = torch.randn(edges.num_edges, generator=torch.Generator().manual_seed(2))

    def dedupe_once() -> int:
        return dedupe(edges, N, heads).num_edges

    def gate_once() -> int:
        y, w = Y.clone().requires_grad_(), W.clone().requires_grad_()
        edge_gate(y, w, edges.query, edges.key, edges.head).backward(grad)
        return edges.num_edges

    out = {"n": n, "graphs": graphs, "heads": heads, "k": k, "density": density,
           "edges": edges.num_edges}
    for name, fn, module, flag, off in (("dedupe", dedupe_once, index, "NATIVE_UNIQUE_MIN", None),
                                        ("gate_backward", gate_once, native, "NATIVE_SAMPLERS",
                                         False)):
        times = {}
        for label in ("compiled", "torch"):
            old = getattr(module, flag)
            if label == "torch":
                setattr(module, flag, off)
            try:
                fn()
                times[label] = statistics.median(timed(fn)[0] for _ in range(repeats))
            finally:
                setattr(module, flag, old)
        out[f"{name}_compiled_ms"] = 1e3 * times["compiled"]
        out[f"{name}_torch_ms"] = 1e3 * times["torch"]
        out[f"{name}_speedup"] = times["torch"] / times["compiled"]
    return out


def markdown(rows: list[dict]) -> str:
    head = ("| n | graphs × heads | density | fastRG edges | fastRG CPU ms | ns/edge | +dedupe CPU ms | "
            "Bernoulli edges | Bernoulli CPU ms | Bernoulli / fastRG | Bernoulli / (fastRG+dedupe) |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['graphs']} × {r['heads']} | {r['density']:.0%} | {r['fastrg_edges']:.3g} | "
            f"{r['fastrg_ms']:.1f} | {r['fastrg_ns_per_edge']:.0f} | {r['fastrg+dedupe_ms']:.1f} | "
            f"{r['bernoulli_edges']:.3g} | {r['bernoulli_ms']:.1f} | {r['speedup_fastrg']:.2f}× | "
            f"{r['speedup_fastrg_dedupe']:.2f}× |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.05, 0.20])
    p.add_argument("--clusters", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-batched", action="store_true",
                   help="skip the batched case (64 graphs of 512 nodes, 2 heads)")
    p.add_argument("--quick", action="store_true", help="sizes 1024 and 4096 only")
    p.add_argument("--kernels", action="store_true",
                   help="only the de-duplication and gate-backward kernels against their torch paths "
                        "(128 graphs of 154 nodes, 4 heads, 23 %% density: a Peptides batch at "
                        "initialisation)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.kernels:
        row = compiled_against_torch(154, 128, 4, args.clusters, 0.23, args.repeats)
        print(json.dumps(row))
        print("\n| kernel | edges | compiled CPU ms | torch CPU ms | speed-up |\n|---|---|---|---|---|")
        for name in ("dedupe", "gate_backward"):
            print(f"| {name} | {row['edges']:.3g} | {row[name + '_compiled_ms']:.1f} | "
                  f"{row[name + '_torch_ms']:.1f} | {row[name + '_speedup']:.2f}× |")
        return
    sizes = [s for s in args.sizes if s <= 4096] if args.quick else args.sizes
    print(json.dumps({"loadavg": os.getloadavg(), "threads": args.threads, "torch": torch.__version__,
                      "cpus": os.cpu_count()}), flush=True)
    cases = [(n, d, 1, 1) for n in sizes for d in args.densities]
    if not args.no_batched:
        cases.append((512, 0.05, 2, 64))
    rows = []
    for n, d, heads, graphs in cases:
        row = run_case(n, d, args.clusters, heads, graphs, args.repeats, args.warmup)
        row["loadavg_1min"] = os.getloadavg()[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    single = [r for r in rows if r["graphs"] == 1 and 1e4 <= r["fastrg_edges"] <= 1e7]
    if single:
        per_edge = [r["fastrg_ns_per_edge"] for r in single]
        print(json.dumps({"fastrg_ns_per_edge_max_over_min_1e4_to_1e7": max(per_edge) / min(per_edge),
                          "cases": len(single)}))
    print()
    print(markdown(rows))


if __name__ == "__main__":
    main()
