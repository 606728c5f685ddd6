"""Sliceformer against dense SDPA attention of the same width, at growing sequence lengths.

One graph of ``N`` tokens (a sequence), width ``C``. Measured in the same run, interleaved, median of
``--repeats`` after one warm-up, at two scopes:

* ``attn``: the global branch only, projections + attention + ``W_O``:
  dense = ``EdgeAttention(C, C/H, heads=H)`` on the ``full`` producer (its SDPA fast path);
  sliceformer = ``EdgeAttention(C, 1, heads=C, mode="weighted")`` on ``SliceSortEdges`` (sort +
  gather); sliceformer-explicit = the same edges through the generic segment path
  (``kernel="reference"`` on the ``to_explicit()`` C·N edges);
* ``layer``: the whole :class:`~graphattn.HybridLayer` (pre-norm, FFN ratio 2) with either producer.

Each is timed in inference (forward under ``torch.no_grad``) and training (forward + backward of a
fixed random projection of the output). Reported as ratios ``dense / sliceformer`` (higher =
Sliceformer faster), plus the index memory of the edge set: ``src [N, C]`` int64 for the gather path
against the explicit ``edge_index [2, C·N]`` + ``head [C·N]``.

    python benchmarks/bench_sliceformer.py                      # N = 1024, 4096, 16384; C = 64
    python benchmarks/bench_sliceformer.py --quick              # small sizes (seconds)
    python benchmarks/bench_sliceformer.py --sizes 4096 --channels 128 --heads 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from graphattn import EdgeAttention, HybridLayer
from graphattn.producers import FullAttention
from graphattn.producers.sliceformer import SliceSortEdges


class AttnBlock(torch.nn.Module):
    """Projections + attention + ``W_O`` (the part a producer replaces)."""

    def __init__(self, attn: EdgeAttention, producer: torch.nn.Module, channels: int) -> None:
        super().__init__()
        self.attn, self.producer = attn, producer
        self.out = torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return self.out(self.attn(x, self.producer, batch=batch))


def build(scope: str, impl: str, C: int, H: int) -> torch.nn.Module:
    if scope == "layer":
        prod = "full" if impl == "dense" else "sliceformer"
        kw = {"kernel": "reference"} if impl == "sliceformer-explicit" else None
        return HybridLayer(C, producer=prod, heads=H, norm_first=True, attn_kwargs=kw)
    if impl == "dense":
        return AttnBlock(EdgeAttention(C, C // H, heads=H), FullAttention(), C)
    kernel = "reference" if impl == "sliceformer-explicit" else "auto"
    attn = EdgeAttention(C, 1, heads=C, mode="weighted", kernel=kernel)
    return AttnBlock(attn, SliceSortEdges(), C)


def timer(fn: Callable[[torch.nn.Module], None], model: torch.nn.Module) -> float:
    t0 = time.perf_counter()
    fn(model)
    return time.perf_counter() - t0


def run_size(N: int, C: int, H: int, repeats: int, impls: list[str], scopes: list[str],
             max_dense_train: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, C, generator=gen)
    batch = torch.zeros(N, dtype=torch.long)
    proj = torch.randn(N, C, generator=gen)
    rows = []
    for scope in scopes:
        torch.manual_seed(0)
        models = {impl: build(scope, impl, C, H) for impl in impls}

        def infer(m: torch.nn.Module) -> None:
            with torch.no_grad():
                m(x, batch)

        def train(m: torch.nn.Module) -> None:
            xi = x.clone().requires_grad_(True)
            (m(xi, batch) * proj).sum().backward()

        for mode, fn in (("forward", infer), ("forward+backward", train)):
            active = [i for i in impls
                      if not (i == "dense" and mode != "forward" and N > max_dense_train)]
            times: dict[str, list[float]] = {i: [] for i in active}
            for i in active:  # warm-up
                fn(models[i])
            for _ in range(repeats):  # interleaved
                for i in active:
                    times[i].append(timer(fn, models[i]))
            med = {i: statistics.median(t) for i, t in times.items()}
            for i in active:
                rows.append({
                    "scope": scope, "mode": mode, "impl": i, "tokens": N, "channels": C,
                    "dense_heads": H, "ms": 1e3 * med[i],
                    "speedup_vs_dense": med["dense"] / med[i] if "dense" in med else None,
                    "repeats": repeats,
                })
    return rows


def index_memory(N: int, C: int) -> dict:
    return {"tokens": N, "channels": C, "gather_src_bytes": 8 * N * C,
            "explicit_edge_bytes": 24 * N * C, "fp32_values_bytes": 4 * N * C}


def check_equal(C: int, H: int) -> float:
    """The three Sliceformer paths agree (same weights) on a small input: max |difference|."""
    torch.manual_seed(1)
    x, batch = torch.randn(300, C), torch.zeros(300, dtype=torch.long)
    fast = build("attn", "sliceformer", C, H)
    ref = build("attn", "sliceformer-explicit", C, H)
    ref.load_state_dict(fast.state_dict())
    with torch.no_grad():
        return float((fast(x, batch) - ref(x, batch)).abs().max())


def _cell(by: dict[str, dict], impl: str) -> tuple[str, str]:
    r = by.get(impl)
    if r is None:
        return "—", "—"
    s = r["speedup_vs_dense"]
    return f"{r['ms']:.1f}", ("—" if s is None or impl == "dense" else f"{s:.1f}×")


def markdown(rows: list[dict]) -> str:
    lines = ["| scope | mode | tokens | dense SDPA ms | sliceformer ms | speed-up | "
             "sliceformer (explicit path) ms | speed-up |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    keys = sorted({(r["scope"], r["mode"], r["tokens"]) for r in rows},
                  key=lambda k: (k[0] != "attn", k[1], k[2]))
    for scope, mode, n in keys:
        by = {r["impl"]: r for r in rows if (r["scope"], r["mode"], r["tokens"]) == (scope, mode, n)}
        d, _ = _cell(by, "dense")
        s, ss = _cell(by, "sliceformer")
        e, es = _cell(by, "sliceformer-explicit")
        lines.append(f"| {scope} | {mode} | {n} | {d} | {s} | {ss} | {e} | {es} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4, help="heads of the dense baseline")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--scopes", nargs="+", default=["attn", "layer"], choices=["attn", "layer"])
    ap.add_argument("--no-explicit", action="store_true", help="skip the explicit-path rows")
    ap.add_argument("--max-dense-train", type=int, default=1 << 30,
                    help="skip dense forward+backward above this many tokens")
    ap.add_argument("--quick", action="store_true", help="sizes 256 and 1024, 3 repeats")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes, repeats = (([256, 1024], 3) if args.quick else (args.sizes, args.repeats))
    impls = ["dense", "sliceformer"] + ([] if args.no_explicit else ["sliceformer-explicit"])
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
           "check_max_abs_diff_fast_vs_explicit": check_equal(args.channels, args.heads)}
    print(json.dumps({"env": env}))
    rows = []
    for n in sizes:
        for row in run_size(n, args.channels, args.heads, repeats, impls, args.scopes,
                            args.max_dense_train):
            print(json.dumps(row), flush=True)
            rows.append(row)
        print(json.dumps({"memory": index_memory(n, args.channels)}))
    print(json.dumps({"loadavg_end": os.getloadavg()}))
    print()
    print(markdown(rows))


if __name__ == "__main__":
    main()
