"""Structured fast paths of ``EdgeAttention`` against its explicit reference path, on the same edges.

For each case the same layer (same weights) runs once with ``kernel="auto"`` (the structured fast path:
SDPA over shared sources, a gather for permutations) and once with ``kernel="reference"`` on the
``to_explicit()`` edges (SDDMM → segment softmax → SpMM in plain torch). Reported: forward+backward
time ratio (median of repeats, both measured in the same run, interleaved) and the largest output
difference. The box may be shared: the ratio is the number to read, not the absolute times.

    python benchmarks/bench_structured.py              # default sizes
    python benchmarks/bench_structured.py --quick      # small sizes (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import graphattn as ga
from graphattn.producers import build_producer
from graphattn.producers.base import ProducerContext


def _case(name: str, producer: dict, sizes: list[int], channels: int, heads: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    counts = torch.tensor(sizes)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), counts)
    n = int(counts.sum())
    x = torch.randn(n, channels, generator=gen)
    layer = ga.EdgeAttention(channels, channels // heads, heads=heads)
    prod = build_producer(producer)
    ctx = ProducerContext(x=x, batch=batch, num_heads=heads, generator=torch.Generator().manual_seed(1))
    structured = prod.produce(ctx)
    explicit = structured.to_explicit()

    def run(edges, kernel: str) -> tuple[float, torch.Tensor]:
        layer.kernel = kernel
        xi = x.clone().requires_grad_(True)
        t0 = time.perf_counter()
        out = layer(xi, edges, batch)
        out.square().sum().backward()
        return time.perf_counter() - t0, out.detach()

    run(structured, "auto")
    run(explicit, "reference")
    fast, ref = [], []
    for _ in range(repeats):
        t, out_fast = run(structured, "auto")
        fast.append(t)
        t, out_ref = run(explicit, "reference")
        ref.append(t)
    return {
        "case": name, "nodes": n, "graphs": len(sizes), "edges": explicit.num_edges, "heads": heads,
        "channels": channels, "fast_ms": 1e3 * statistics.median(fast),
        "reference_ms": 1e3 * statistics.median(ref),
        "speedup": statistics.median(ref) / statistics.median(fast),
        "max_abs_diff": float((out_fast - out_ref).abs().max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    scale = 1 if args.quick else 4
    cases = [
        (f"full, 8 graphs x {32 * scale}", {"name": "full"}, [32 * scale] * 8, 64, 4),
        (f"full, 16 ragged graphs of {8 * scale}-{32 * scale}", {"name": "full"},
         [8 * scale * (1 + i % 4) for i in range(16)], 64, 4),
        (f"full, 1 graph of {128 * scale}", {"name": "full"}, [128 * scale], 64, 4),
    ]
    print(json.dumps({"loadavg": os.getloadavg(), "threads": args.threads, "torch": torch.__version__}))
    for name, producer, sizes, channels, heads in cases:
        print(json.dumps(_case(name, producer, sizes, channels, heads, args.repeats)))


if __name__ == "__main__":
    main()
