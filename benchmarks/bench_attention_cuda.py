r"""Sparse multi-head attention on a CUDA GPU: graphattn's Triton kernel against PyG and the reference.

The CUDA counterpart of ``bench_attention.py`` (same inputs, same implementations, imported from
it): for each configuration and implementation, the output and the gradients of ``q, k, v`` are
first checked at the full size against graphattn's pure-torch reference evaluated in float64 on
the same GPU (relative error ``‖out − ref‖ / ‖ref‖``, also of each gradient), then forward +
backward is timed with CUDA events (``triton.testing.do_bench``, median) and the peak extra memory
is read from the caching allocator (``max_memory_allocated`` minus what was allocated before the
call: the output, the activations kept for backward, the gradients and the workspace).
Implementations: ``fused`` (Triton, graph layout cached), ``fused_cold`` (layout rebuilt every
call), ``layer`` (``EdgeAttention`` with its projections), ``reference``, ``pyg_func``
(TransformerConv's message path), ``pyg_conv`` (``TransformerConv``), ``pyg_compiled``
(``torch.compile(pyg_func)``) and, in the ``sweep`` suite, ``sdpa_dense`` (all pairs).

Example (the command in ``benchmarks/gpu_check.sh``)::

    python benchmarks/bench_attention_cuda.py --suite roofline features shapes \
        --out runs/bench_attention/cuda.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as ba

DEFAULT_IMPLS = ("fused", "fused_cold", "layer", "reference", "pyg_func", "pyg_conv", "pyg_compiled")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach()).norm() / b.detach().norm().clamp_min(1e-300))


def check(impl: str, cfg: dict[str, Any], t: dict[str, Any]) -> float | None:
    """Max relative error of the output and the q/k/v gradients against the float64 reference at
    the benchmark's size (``None`` for implementations with their own projections)."""
    from graphattn.kernels import edge_attention

    if impl in ("layer", "pyg_conv", "sdpa_dense"):
        return None
    N, H, D = cfg["N"], cfg["H"], cfg["D"]
    leaves = [t[n].detach().requires_grad_() for n in ("q", "k", "v")]
    tt = {**t, "q": leaves[0], "k": leaves[1], "v": leaves[2]}
    call, _, _ = ba.build_call(impl, cfg, tt, backward=True)
    out = call()
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ei, head = t["edge_index"], t["head"]
    bias = None if t["bias"] is None else t["bias"].double()
    weight = None if t["weight"] is None else t["weight"].double()
    if head is None:
        ref = edge_attention(*ref_leaves, ei, N, bias=bias, weight=weight, scale=D**-0.5)[0]
    else:  # per-head edges: rows target * H + head with one head each
        rows, (qq, kk, vv) = ba.per_head_reference(*ref_leaves, ei, head, N)
        ref = edge_attention(qq, kk, vv, rows, N * H, bias=bias, weight=weight, scale=D**-0.5)[0]
    out = out.reshape(ref.shape)
    go = torch.randn(ref.shape, device=ref.device, dtype=torch.float64,
                     generator=torch.Generator(ref.device).manual_seed(3))
    grads = torch.autograd.grad(out, leaves, go.to(out.dtype))
    ref_grads = torch.autograd.grad(ref, ref_leaves, go)
    return max([_rel(out, ref), *(_rel(g, r) for g, r in zip(grads, ref_grads, strict=True))])


def measure(impl: str, cfg: dict[str, Any], t: dict[str, Any], reps_ms: int) -> dict[str, Any]:
    from triton.testing import do_bench

    call, leaves, info = ba.build_call(impl, cfg, t, backward=True)
    go = None

    def step() -> None:
        nonlocal go
        out = call()
        if go is None:
            go = torch.randn_like(out)
        grads = torch.autograd.grad(out, leaves, go, allow_unused=True)
        del out, grads

    step()  # warm-up: compilation, graph layout, autotuning
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    fwd = do_bench(lambda: call(), warmup=25, rep=reps_ms, return_mode="median")
    both = do_bench(step, warmup=25, rep=reps_ms, return_mode="median")
    return {"fwd_ms": fwd, "fwd_bwd_ms": both, "peak_extra_mib": peak, **info}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", nargs="+", default=["roofline"],
                   choices=["roofline", "features", "shapes", "sweep", "smoke"])
    p.add_argument("--impls", nargs="+",
                   help=f"implementations (default: bench_attention's per suite; roofline: {DEFAULT_IMPLS})")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time (ms)")
    p.add_argument("--out", help="append the rows as JSON lines to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention_cuda.py: error: no CUDA device")
    dev = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, {args.dtype}", file=sys.stderr)
    rows = []
    for suite in args.suite:
        for cfg in ba.suite_configs(suite):
            cpu = ba.make_inputs(cfg, dtype=dtype)
            t = {n: (x.to(dev) if torch.is_tensor(x) else x) for n, x in cpu.items()}
            E = t["edge_index"].size(1)
            impls = list(args.impls or [i for i in ba.default_impls(suite) if i != "sdpa_mask"])
            for impl in impls:
                row: dict[str, Any] = {"suite": suite, **cfg, "E": E, "impl": impl, "dtype": args.dtype}
                try:
                    row["rel_err"] = check(impl, cfg, t)
                    row.update(measure(impl, cfg, t, args.rep_ms))
                    row["medges_per_s"] = E / (row["fwd_bwd_ms"] * 1e3)
                except NotImplementedError as exc:
                    row["skipped"] = str(exc)
                except Exception as exc:  # a failing implementation is a row, not the end of the run
                    row["error"] = f"{type(exc).__name__}: {exc}"[:400]
                torch.cuda.empty_cache()
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
                if args.out:  # row by row: a run cut short keeps what it measured
                    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                    with open(args.out, "a") as f:
                        f.write(json.dumps({**row, "device": torch.cuda.get_device_name(dev),
                                            "torch": torch.__version__}) + "\n")
    print(table(rows))


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| suite | graph | N | E | impl | rel. err | fwd ms | fwd+bwd ms | × PyG conv "
             "| peak extra MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    ref = {(r["suite"], r["graph"], r["N"], r["k"]): r.get("fwd_bwd_ms") for r in rows
           if r["impl"] == "pyg_conv"}
    for r in rows:
        if "fwd_bwd_ms" not in r:
            lines.append(f"| {r['suite']} | {r['graph']} | {r['N']} | {r['E']} | {r['impl']} | "
                         f"{r.get('skipped') or r.get('error', '')[:100]} | | | | |")
            continue
        base = ref.get((r["suite"], r["graph"], r["N"], r["k"]))
        err = "—" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
        speed = f"{base / r['fwd_bwd_ms']:.1f}" if base else "—"
        lines.append(f"| {r['suite']} | {r['graph']} | {r['N']} | {r['E']} | {r['impl']} | {err} | "
                     f"{r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {speed} | {r['peak_extra_mib']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
