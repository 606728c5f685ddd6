r"""Phases of the fused CPU kernel: the general kernel against the cache-blocked one at several block
sizes, on the roofline graph (N = 100k targets, k = 32 uniform random in-edges, H = 4, D = 16, fp32).

Times the forward, the backward destination pass and the backward source pass separately, each
variant in turn within every repetition (so that a slow spell of a shared machine hits all of them),
and prints the minimum over the repetitions in milliseconds. ``--graph local`` uses sources within
±128 of the target instead: the rows then come from cache, which separates arithmetic from memory
stalls.

Example (the command behind docs/kernels.md)::

    python benchmarks/bench_blocked.py --threads 2 --budgets-mib 2 4 8 16 1000
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from graphattn.kernels import build_graph, fused
from graphattn.kernels.cpu_extension import cpu_ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budgets-mib", type=float, nargs="*", default=[4, 8, 16])
    ap.add_argument("--graph", choices=["uniform", "local"], default="uniform")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--N", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_ops()
    if ops is None or not ops.blocked_supported():
        raise SystemExit("the blocked kernel needs the CPU extension built with AVX2/FMA")
    N, K, H, D = args.N, args.k, 4, 16
    g = torch.Generator().manual_seed(0)
    dst = torch.arange(N).repeat_interleave(K)
    if args.graph == "uniform":
        src = torch.randint(0, N, (N * K,), generator=g)
    else:
        src = (dst + torch.randint(-128, 129, (N * K,), generator=g)).clamp(0, N - 1)
    q, k, v = (torch.randn(N, H, D, generator=g) for _ in range(3))
    graph = build_graph(torch.stack([src, dst]), N, N)
    scale = D**-0.5
    out, lse = ops.forward(q, k, v, graph.rowptr, graph.col, graph.eid, None, None, scale, True)
    dout = torch.randn(out.shape, generator=g)
    dterm = (dout * out).sum(-1)

    variants: dict[str, dict] = {
        "general": {
            "fwd": lambda: ops.forward(q, k, v, graph.rowptr, graph.col, graph.eid, None, None,
                                       scale, True),
            "dst": lambda: ops.backward_dst(q, k, v, out, dout, lse, graph.rowptr, graph.col,
                                            graph.eid, None, None, scale, True, True, False, False),
            "src": lambda: ops.backward_src(q, k, v, dout, lse, dterm, *graph.csc(), None, None,
                                            scale, True, True, True),
        }
    }
    for mib in args.budgets_mib:
        fused.BLOCKED["block_bytes"] = int(mib * 2**20)
        src_rows, dst_rows = fused.blocked_rows(ops, q, v, True)
        fl = graph.blocked_layout(src_rows, by_target=True, edge_ids=False)
        sl = graph.blocked_layout(dst_rows, by_target=False, edge_ids=False)
        name = f"blocked {mib:g} MiB (B = {fl[0].shape[0]} / {sl[0].shape[0]})"
        variants[name] = {
            "fwd": lambda fl=fl: ops.blocked_forward(q, k, v, *fl, None, None, scale),
            "dst": lambda fl=fl: ops.blocked_backward_dst(q, k, v, out, dout, lse, *fl, None, None,
                                                          scale, True, False, False),
            "src": lambda sl=sl: ops.blocked_backward_src(q, k, v, dout, lse, dterm, *sl, None,
                                                          None, scale, True, True),
        }
    best = {(name, phase): float("inf") for name in variants for phase in ("fwd", "dst", "src")}
    for fns in variants.values():  # warm-up
        for fn in fns.values():
            fn()
    for _ in range(args.reps):
        for name, fns in variants.items():
            for phase, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[name, phase] = min(best[name, phase], time.perf_counter() - t0)
    print(f"| {args.graph}, {args.threads} thread(s) | forward | destination pass | source pass | "
          "total |\n|---|---|---|---|---|")
    for name in variants:
        ms = [1000 * best[name, p] for p in ("fwd", "dst", "src")]
        print(f"| {name} | {ms[0]:.0f} | {ms[1]:.0f} | {ms[2]:.0f} | {sum(ms):.0f} |")
        print(json.dumps({"variant": name, "threads": args.threads, "graph": args.graph,
                          "ms_min": dict(zip(("fwd", "dst", "src"), ms, strict=True))}))


if __name__ == "__main__":
    main()
