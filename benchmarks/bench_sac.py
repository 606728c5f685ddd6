"""Cost of SAC's edge predictors on the citation graphs, against the attention layer itself.

For each configuration, on one graph, median wall time (after one warm-up) of

* ``train``: one training forward of the producer (rollout + differentiable scoring) plus the
  backward of ``log_prob.sum()`` (the policy-gradient part of a training step);
* ``eval``: one evaluation forward (no gradient; greedy, beam or top-alpha decoding).

The anchor is one forward + backward of :class:`graphattn.EdgeAttention` (8 heads x 8 channels) over
the input edges with self-loops (a GAT layer's attention) on the same graph; every time is also given
as a ratio to it, and per predicted edge.

    OMP_NUM_THREADS=1 python benchmarks/bench_sac.py --graphs cora pubmed --repeats 3 \
        --out benchmarks/results/sac.jsonl

Prints JSON lines and a markdown table. Needs the Planetoid files (``GRAPHATTN_MIRROR``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from graphattn import EdgeAttention
from graphattn.producers import InputEdges
from graphattn.producers.sac import SAC
from graphattn.runner.tasks import build_task

CONFIGS: dict[str, list[dict[str, Any]]] = {
    "cora": [
        {"policy": "lstm", "alpha": 1, "all_nodes": True},
        {"policy": "lstm", "alpha": 1},
        {"policy": "lstm", "alpha": 2, "all_nodes": True},
        {"policy": "lstm", "alpha": 1, "all_nodes": True, "decode": "beam", "beam_size": 5},
        {"policy": "parallel", "alpha": 5},
        {"policy": "parallel", "alpha": 5, "num_candidates": 64},
    ],
    "citeseer": [
        {"policy": "lstm", "alpha": 1, "all_nodes": True},
        {"policy": "parallel", "alpha": 5, "num_candidates": 64},
    ],
    "pubmed": [
        # the faithful predictor: a small budget, no distance tables ([N, N] would not fit)
        {"policy": "lstm", "alpha": 0.05, "distance": "none"},
        {"policy": "parallel", "alpha": 2, "num_candidates": 64},
        {"policy": "parallel", "alpha": 5, "num_candidates": 64},
    ],
}


def timed(fn, repeats: int) -> float:
    fn()  # warm-up (also builds cached distance tables)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def anchor_time(graph, repeats: int) -> float:
    layer = EdgeAttention(graph.x.size(1), 8, heads=8)
    es = InputEdges(self_loops=True)(graph.x, None, data=graph, num_heads=8)

    def step() -> None:
        layer.zero_grad()
        layer(graph.x, es).square().sum().backward()

    return timed(step, repeats)


def bench(graph, cfg: dict[str, Any], repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    p = SAC(heads=8, **cfg)
    edges = {}

    def train() -> None:
        p.train()
        p.zero_grad()
        es = p(graph.x, None, data=graph, num_heads=8)
        es.log_prob.sum().backward()
        edges["train"] = es.log_prob.numel()

    def evaluate() -> None:
        p.eval()
        with torch.no_grad():
            es = p(graph.x, None, data=graph, num_heads=8)
        edges["eval"] = es.log_prob.numel()

    row = {"train_s": timed(train, repeats), "eval_s": timed(evaluate, repeats)}
    row["edges"] = edges["train"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", nargs="+", default=["cora", "pubmed"], choices=sorted(CONFIGS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also append the JSON lines to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.graphs:
        graph = build_task(name).graph
        anchor = anchor_time(graph, args.repeats)
        rows.append({"graph": name, "config": "anchor: EdgeAttention fwd+bwd on input edges",
                     "train_s": anchor, "eval_s": None, "edges": int(graph.edge_index.size(1))})
        print(json.dumps(rows[-1]), flush=True)
        for cfg in CONFIGS[name]:
            r = bench(graph, cfg, args.repeats)
            rows.append({"graph": name, "config": cfg, **r, "train_x": r["train_s"] / anchor,
                         "eval_x": r["eval_s"] / anchor,
                         "train_ms_per_edge": 1e3 * r["train_s"] / max(r["edges"], 1),
                         "eval_ms_per_edge": 1e3 * r["eval_s"] / max(r["edges"], 1)})
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("\n| graph | config | predicted edges | train fwd+bwd (s) | × anchor | ms / edge | eval (s) "
          "| × anchor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cfg = r["config"] if isinstance(r["config"], str) else \
            ", ".join(f"{k}={v}" for k, v in r["config"].items())
        if r["eval_s"] is None:
            print(f"| {r['graph']} | {cfg} | – | {r['train_s']:.4f} | 1 | – | – | – |")
            continue
        print(f"| {r['graph']} | {cfg} | {r['edges']} | {r['train_s']:.2f} | {r['train_x']:.0f} | "
              f"{r['train_ms_per_edge']:.3f} | {r['eval_s']:.2f} | {r['eval_x']:.0f} |")


if __name__ == "__main__":
    main()
