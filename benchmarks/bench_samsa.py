"""SAMSA hard-evaluation attention layer against a dense SDPA attention layer of the same width.

One sequence (one graph) of ``n`` tokens, width ``d``, ``H`` heads, forward only, evaluation mode,
``torch.inference_mode``. Layers measured in the same run, interleaved (one call of each per
repeat), median of ``--repeats`` after ``--warmup`` calls:

* ``dense-sdpa`` (the anchor): q/k/v projections, :func:`torch.nn.functional.scaled_dot_product_attention`
  over all ``n`` tokens (no mask), output projection: a plain dense attention layer;
* ``full (EdgeAttention)``: the library's dense path (``EdgeAttention`` + the ``full`` producer, a
  shared-sources edge set with a padding mask), same projections;
* ``samsa hard-eval``: ``EdgeAttention`` + the ``samsa`` producer (importance MLP, top-2k over the
  ``n`` tokens + 2k supports per head, the selected real node ids as sources) + output projection;
* ``samsa soft-eval``: the same with ``hard=False`` (the k×k slot mixture runs at inference).

With ``--block`` the same comparison is repeated for whole pre-norm blocks (RMSNorm, attention,
output projection, RMSNorm, MLP of width 4d): the SAMSA block is
:class:`~graphattn.producers.samsa.model.SAMSABlock`.

Reported: median milliseconds and the speed-up ``t(dense-sdpa) / t(variant)`` of the medians (the
block rows against the dense block), plus the same ratio of the per-variant minima (less sensitive
to other processes on a shared box), as JSON lines and a markdown table. Sizes whose round is short
get more rounds (``--target-seconds``). The box may be shared: the ratios are the numbers to read.

    python benchmarks/bench_samsa.py                       # 1024, 4096, 16384 tokens, k=128, H=8
    python benchmarks/bench_samsa.py --sizes 1024 --quick  # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import graphattn
from graphattn import EdgeAttention
from graphattn.producers import FullAttention
from graphattn.producers.samsa import SAMSA, RMSNorm
from graphattn.producers.samsa.model import SAMSABlock


class DenseSDPA(nn.Module):
    """The anchor: a plain dense multi-head attention layer over one sequence."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        n, d = x.shape
        H = self.heads
        q, k, v = (lin(x).view(1, n, H, d // H).transpose(1, 2) for lin in (self.q, self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, d))


class LibraryLayer(nn.Module):
    """EdgeAttention + a producer + the output projection."""

    def __init__(self, d: int, heads: int, producer: nn.Module) -> None:
        super().__init__()
        self.attn = EdgeAttention(d, d // heads, heads=heads)
        self.producer = producer
        self.o = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.o(self.attn(x, self.producer, batch=torch.zeros(x.size(0), dtype=torch.long)))


class DenseBlock(nn.Module):
    """Pre-RMSNorm block around :class:`DenseSDPA` (same MLP as :class:`SAMSABlock`)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.attn = DenseSDPA(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SamsaBlockRunner(nn.Module):
    def __init__(self, d: int, heads: int, k: int, hard: bool) -> None:
        super().__init__()
        self.block = SAMSABlock(d, heads, {"name": "samsa", "k": k, "hard": hard},
                                ffn_channels=4 * d)
        self.alpha = torch.ones(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x, torch.zeros(x.size(0), dtype=torch.long), self.alpha, num_graphs=1)


def variants(d: int, heads: int, k: int, block: bool) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    out: dict[str, nn.Module] = {
        "dense-sdpa": DenseSDPA(d, heads),
        "full (EdgeAttention)": LibraryLayer(d, heads, FullAttention()),
        "samsa hard-eval": LibraryLayer(d, heads, SAMSA(d, heads, k=k, hard=True)),
        "samsa soft-eval": LibraryLayer(d, heads, SAMSA(d, heads, k=k, hard=False)),
    }
    if block:
        out["block: dense-sdpa"] = DenseBlock(d, heads)
        out["block: samsa hard-eval"] = SamsaBlockRunner(d, heads, k, hard=True)
    return {name: m.eval() for name, m in out.items()}


def measure(fns: dict[str, Callable[[], Tensor]], warmup: int, repeats: int,
            target_s: float) -> tuple[dict[str, float], dict[str, float], int]:
    """Median and minimum seconds per call; at least ``repeats`` interleaved rounds, more (up to
    100) while a round is short enough to fit ``target_s``."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    per_round = (time.perf_counter() - t0) / max(warmup, 1)
    rounds = max(repeats, min(100, int(target_s / max(per_round, 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    best = {name: min(t) for name, t in times.items()}
    return med, best, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--target-seconds", type=float, default=20.0,
                    help="more rounds (up to 100) for sizes whose rounds are short")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--block", action="store_true", help="also whole pre-norm blocks")
    ap.add_argument("--quick", action="store_true", help="repeats=3, warmup=1")
    # the memory guard counts the full producer's pairs as explicit edges (16 GiB at 16k tokens and
    # 8 heads); its shared-source edge set is never materialised on the dense path measured here
    graphattn.set_memory_budget("off")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.warmup, args.target_seconds = 3, 1, 0.0
    torch.set_num_threads(args.threads)
    env = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "cpu": platform.processor() or platform.machine(),
           "loadavg_start": os.getloadavg()}
    print(json.dumps({"env": env}))
    models = variants(args.width, args.heads, args.k, args.block)
    rows = []
    for n in args.sizes:
        x = torch.randn(n, args.width, generator=torch.Generator().manual_seed(n))
        with torch.inference_mode():
            fns = {name: (lambda m=m, x=x: m(x)) for name, m in models.items()}
            t, best, rounds = measure(fns, args.warmup, args.repeats, args.target_seconds)
        for name, sec in t.items():
            ref = "block: dense-sdpa" if name.startswith("block") else "dense-sdpa"
            row = {"tokens": n, "variant": name, "k": args.k, "heads": args.heads,
                   "width": args.width, "rounds": rounds, "ms": round(1e3 * sec, 2),
                   "speedup_vs_dense": round(t[ref] / sec, 2),
                   "min_ms": round(1e3 * best[name], 2),
                   "min_speedup_vs_dense": round(best[ref] / best[name], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    env["loadavg_end"] = os.getloadavg()
    print(json.dumps({"env": env}))
    print()
    names = list(models)
    print("median ms (speed-up vs dense) [min-of-rounds speed-up]")
    print()
    print("| variant | " + " | ".join(f"{n} tokens" for n in args.sizes) + " |")
    print("|---|" + "---|" * len(args.sizes))
    for name in names:
        cells = [f"{r['ms']:.1f} ({r['speedup_vs_dense']:.2f}×) [{r['min_speedup_vs_dense']:.2f}×]"
                 for r in rows if r["variant"] == name]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
