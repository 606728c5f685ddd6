"""Converter's exact unitary shift: the O(N D) operator against its dense materialisation.

For each length ``N`` one graph gets random full-range Givens angles and eigen-phases (complex64),
and ``S v`` is computed for real values ``v [N, 1, D]`` (what ``EdgeAttention`` hands the operator)
by

* ``operator``   — :meth:`UnitaryChainOperator.matvec`: four linear scans, never forming ``S``;
* ``dense``      — materialise ``S`` (``to_dense()``: the same scans on the ``N`` columns of the
                   identity, the cheapest exact way to get the ``N x N`` matrix, :math:`O(N^2)`)
                   and multiply ``S @ v`` (:math:`O(N^2 D)`), which is what any explicit path has to
                   do every step, because ``S`` depends on the input;
* ``dense_apply``— ``S @ v`` alone with ``S`` given (a lower bound for the dense path);
* ``sdpa``       — for scale, single-head softmax attention ``scaled_dot_product_attention`` on
                   real ``[1, 1, N, D]`` tensors (what Converter replaces).

Forward times (no autograd) and forward+backward times (from the angles, phases and values with
``requires_grad``, loss ``sum |S v|^2``) are medians of ``--repeats`` runs after one warm-up, all
paths of one ``N`` interleaved in the same loop. Both wall-clock and process CPU time are
recorded; on a shared machine the CPU time is the steadier number (``--clock``). ``saved_mib`` is
the memory autograd keeps for the backward (tensors packed by ``saved_tensors_hooks``). The dense
path is measured up to ``--dense-max`` nodes (its ``N x N`` complex64 matrix takes ``8 N^2`` bytes,
2 GiB at 16384) and its backward up to ``--dense-backward-max``.

    python benchmarks/bench_converter.py                      # N = 512 ... 32768, D = 64
    python benchmarks/bench_converter.py --sizes 512 1024 --repeats 3   # quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from graphattn.producers.converter.chain import givens
from graphattn.producers.converter.chain_operator import UnitaryChainOperator


def _inputs(n: int, d: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "angles": torch.rand(6, max(n - 1, 0), generator=g) * 2 * math.pi,
        "phase": torch.rand(n, generator=g) * 2 * math.pi,
        "theta": torch.rand(n, generator=g) * 2 * math.pi,
        "v": torch.randn(n, 1, d, generator=g),
    }


def _operator(angles: torch.Tensor, theta: torch.Tensor, phase: torch.Tensor) -> UnitaryChainOperator:
    n = phase.numel()
    a = angles
    rot_l = givens((a[0] + a[1]) / 2, (a[0] - a[1]) / 2, a[2] / 2)
    rot_u = givens((a[3] + a[4]) / 2, (a[3] - a[4]) / 2, a[5] / 2)
    diag = torch.polar(torch.ones_like(theta), theta)
    eig = torch.polar(torch.ones_like(phase), phase)
    return UnitaryChainOperator(rot_l, rot_u, diag, eig, torch.tensor([0, n]))


def _leaves(inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.clone().requires_grad_(True) for k, t in inp.items()}


def _op_forward(inp: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return _operator(inp["angles"], inp["theta"], inp["phase"]).matvec(inp["v"])


def _dense_forward(inp: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        S = _operator(inp["angles"], inp["theta"], inp["phase"]).to_dense()
        return torch.einsum("ij,jhc->ihc", S, inp["v"].to(S.dtype))


def _op_backward(inp: dict[str, torch.Tensor]) -> torch.Tensor:
    leaf = _leaves(inp)
    out = _operator(leaf["angles"], leaf["theta"], leaf["phase"]).matvec(leaf["v"])
    loss = out.abs().square().sum()
    loss.backward()
    return loss.detach()


def _dense_backward(inp: dict[str, torch.Tensor]) -> torch.Tensor:
    leaf = _leaves(inp)
    S = _operator(leaf["angles"], leaf["theta"], leaf["phase"]).to_dense()
    out = torch.einsum("ij,jhc->ihc", S, leaf["v"].to(S.dtype))
    loss = out.abs().square().sum()
    loss.backward()
    return loss.detach()


def _sdpa(inp: dict[str, torch.Tensor], backward: bool) -> torch.Tensor:
    v = inp["v"].transpose(0, 1)[None]  # [1, 1, N, D]
    if not backward:
        with torch.no_grad():
            return F.scaled_dot_product_attention(v, v, v)
    q = v.clone().requires_grad_(True)
    out = F.scaled_dot_product_attention(q, q, q)
    out.square().sum().backward()
    return out.detach()


def _saved_mib(fn: Callable[[], object]) -> float:
    """MiB of tensors autograd saves for the backward while ``fn`` builds its graph."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            key = t.untyped_storage().data_ptr()
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except RuntimeError:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values()) / 2**20


def _time(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    wall: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in cases.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    return {k: {"wall_ms": 1e3 * statistics.median(wall[k]), "cpu_ms": 1e3 * statistics.median(cpu[k])}
            for k in cases}


def _case(n: int, d: int, repeats: int, dense_max: int, dense_bwd_max: int) -> dict[str, object]:
    inp = _inputs(n, d)
    fwd: dict[str, Callable[[], object]] = {"operator": lambda: _op_forward(inp)}
    bwd: dict[str, Callable[[], object]] = {"operator": lambda: _op_backward(inp)}
    if n <= dense_max:
        S = _operator(inp["angles"], inp["theta"], inp["phase"]).to_dense()
        vc = inp["v"].to(S.dtype)
        fwd["dense"] = lambda: _dense_forward(inp)
        fwd["dense_apply"] = lambda: torch.einsum("ij,jhc->ihc", S, vc)
        fwd["sdpa"] = lambda: _sdpa(inp, backward=False)
        err = (_op_forward(inp) - torch.einsum("ij,jhc->ihc", S, vc)).abs().max().item()
    else:
        err = None
    if n <= dense_bwd_max:
        bwd["dense"] = lambda: _dense_backward(inp)
        bwd["sdpa"] = lambda: _sdpa(inp, backward=True)
    row: dict[str, object] = {"nodes": n, "channels": d, "max_abs_diff_vs_dense": err}
    for name, t in _time(fwd, repeats).items():
        row[f"fwd_{name}"] = t
    for name, t in _time(bwd, repeats).items():
        row[f"fwdbwd_{name}"] = t
    row["saved_mib_operator"] = _saved_mib(lambda: _op_backward(inp))
    if n <= dense_bwd_max:
        row["saved_mib_dense"] = _saved_mib(lambda: _dense_backward(inp))
    return row


def _table(rows: list[dict], clock: str, anchor: int) -> str:
    key = f"{clock}_ms"
    base = next((r for r in rows if r["nodes"] == anchor), None)

    def ms(r: dict, name: str) -> str:
        t = r.get(name)
        return f"{t[key]:.1f}" if t else "—"

    def ratio(r: dict, num: str, den: str) -> str:
        a, b = r.get(num), r.get(den)
        if not (a and b):
            return "—"
        r = a[key] / b[key]
        return f"{r:.0f}×" if r >= 10 else f"{r:.1f}×"

    lines = [
        f"| N | operator fwd ({clock} ms) | dense fwd | dense / operator | S@v alone / operator | "
        f"SDPA fwd | operator fwd+bwd | dense fwd+bwd | dense / operator (fwd+bwd) | "
        f"t(N) / t({anchor}) operator fwd | saved MiB operator / dense |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        scale = (f"{r['fwd_operator'][key] / base['fwd_operator'][key]:.2f}" if base else "—")
        saved = f"{r['saved_mib_operator']:.1f} / " + (f"{r['saved_mib_dense']:.0f}"
                                                      if "saved_mib_dense" in r else "—")
        lines.append(
            f"| {r['nodes']} | {ms(r, 'fwd_operator')} | {ms(r, 'fwd_dense')} | "
            f"{ratio(r, 'fwd_dense', 'fwd_operator')} | {ratio(r, 'fwd_dense_apply', 'fwd_operator')} | "
            f"{ms(r, 'fwd_sdpa')} | {ms(r, 'fwdbwd_operator')} | {ms(r, 'fwdbwd_dense')} | "
            f"{ratio(r, 'fwdbwd_dense', 'fwdbwd_operator')} | {scale} | {saved} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+",
                   default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dense-max", type=int, default=8192)
    p.add_argument("--dense-backward-max", type=int, default=4096)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="the first table's clock")
    p.add_argument("--anchor", type=int, default=4096)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps({"loadavg": os.getloadavg(), "threads": args.threads, "torch": torch.__version__,
                      "channels": args.channels, "repeats": args.repeats}), flush=True)
    rows = []
    for n in args.sizes:
        row = _case(n, args.channels, args.repeats, args.dense_max, args.dense_backward_max)
        row["loadavg"] = os.getloadavg()
        rows.append(row)
        print(json.dumps(row), flush=True)
    for clock in (args.clock, "wall" if args.clock == "cpu" else "cpu"):
        print()
        print(_table(rows, clock, args.anchor))


if __name__ == "__main__":
    main()
