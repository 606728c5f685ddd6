r"""Sparse multi-head attention: graphattn's fused kernel against PyG, dense SDPA and the reference.

Protocol (``docs/kernels.md``): every (implementation, configuration, mode, threads)
runs in a fresh subprocess (isolated peak memory and allocator state) on identical, seeded inputs;
each worker first checks its output (and gradients) against a float64 reference on a small graph of
the same shape, then times ≥ 2 warm-ups and ≥ 5 repetitions (fewer for calls slower than 1.5 s,
recorded) and reports min and median, M edges/s, the effective bandwidth against the min-traffic
roofline, and the peak extra RSS (``ru_maxrss`` minus the RSS after building the inputs). The parent
writes JSON lines and prints a markdown table with ratios against PyG measured in the same run.

Implementations (``--impls``):

* ``fused`` — :func:`graphattn.kernels.fused_attention` on ``q, k, v`` (graph layout cached on the
  edge set, built in the first warm-up; its build time is reported as ``prep_ms``);
* ``fused_general`` — the same with the cache-blocked fp32 kernel switched off (the general kernel
  that fp64, other head counts and per-head edge sets use);
* ``fused_cold`` — the same, rebuilding the graph layout on every call;
* ``layer`` — ``graphattn.EdgeAttention(H·D, D, heads=H)`` (3 Linears + the fused kernel) on a
  cached :class:`~graphattn.EdgeSet`;
* ``reference`` — graphattn's pure-torch reference (:func:`graphattn.kernels.edge_attention`);
* ``pyg_func`` — TransformerConv's message path written out (``index_select`` ×3 → dot →
  ``torch_geometric.utils.softmax`` → mul → ``scatter`` sum), on ``q, k, v``;
* ``pyg_conv`` — ``TransformerConv(H·D, D, heads=H, root_weight=False)`` (3 Linears + message path);
* ``pyg_compiled`` — ``torch.compile(pyg_func)`` (compile time reported as ``compile_ms``);
* ``sdpa_dense`` — ``F.scaled_dot_product_attention`` on ``[1, H, N, D]``, no mask (all pairs);
* ``sdpa_mask`` — the same with the boolean adjacency mask (same math as the sparse methods).

Configurations (``--suite``): ``roofline`` (N = 100k, k = 32 in-edges per target, H = 4, D = 16,
uniform random sources), ``features`` (the same with a logit bias [E, H] and a weight [E]),
``sweep`` (N ∈ {1024, 4096, 16384} × k ∈ {32, 64, 128, 256}, H = 4, D = 32), ``shapes`` (roofline
size: local window, power-law in-degrees, per-head edge sets). Edges are listed sorted by target
(as a k-in-neighbour graph comes), which favours PyG's gathers and scatters of ``q_i`` / ``out_i``.

Example (the command behind docs/kernels.md)::

    THP_MEM_ALLOC_ENABLE=1 python benchmarks/bench_attention.py --suite roofline --threads 1 2 \
        --out runs/bench_attention/roofline.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("fused", "fused_general", "fused_cold", "layer", "reference", "pyg_func", "pyg_conv", "pyg_compiled",
         "sdpa_dense", "sdpa_mask")
STREAM_GBS = 17.0  # measured copy bandwidth of one core of the project's machine (docs/kernels.md)


# ----------------------------------------------------------------------------------- configs
def suite_configs(suite: str) -> list[dict[str, Any]]:
    roof = {"N": 100_000, "k": 32, "H": 4, "D": 16, "graph": "uniform", "bias": False,
            "weight": False}
    if suite == "roofline":
        return [roof]
    if suite == "features":
        return [{**roof, "bias": True, "weight": True}]
    if suite == "sweep":
        return [{"N": n, "k": k, "H": 4, "D": 32, "graph": "uniform", "bias": False, "weight": False}
                for n in (1024, 4096, 16384) for k in (32, 64, 128, 256)]
    if suite == "shapes":
        return [{**roof, "graph": g} for g in ("local", "power_law", "per_head")]
    if suite == "smoke":
        return [{"N": 2000, "k": 8, "H": 2, "D": 16, "graph": "uniform", "bias": True,
                 "weight": True}]
    raise ValueError(f"unknown suite {suite!r}")


def default_impls(suite: str) -> list[str]:
    if suite == "roofline":
        return ["fused", "fused_cold", "layer", "reference", "pyg_func", "pyg_conv", "pyg_compiled"]
    if suite == "sweep":
        return ["fused", "reference", "pyg_func", "sdpa_dense", "sdpa_mask"]
    if suite in ("shapes", "features"):
        return ["fused", "reference", "pyg_func"]
    return ["fused", "layer", "reference", "pyg_func", "pyg_conv", "sdpa_dense"]


# ------------------------------------------------------------------------------------ inputs
def make_graph(cfg: dict[str, Any], seed: int = 0):
    """``(edge_index [2, E] sorted by target, head [E] or None)`` for a configuration."""
    import torch

    g = torch.Generator().manual_seed(seed)
    N, k, H = cfg["N"], cfg["k"], cfg["H"]
    shape = cfg["graph"]
    if shape == "power_law":
        prob = (torch.arange(N, dtype=torch.float64) + 1) ** -1.1
        dst = torch.multinomial(prob, N * k, replacement=True, generator=g)
        dst = torch.randperm(N, generator=g)[dst].sort().values
    else:
        dst = torch.arange(N).repeat_interleave(k)
    if shape == "local":
        off = torch.randint(-128, 129, (N * k,), generator=g)
        src = (dst + off).clamp(0, N - 1)
    else:
        src = torch.randint(0, N, (dst.numel(),), generator=g)
    head = torch.randint(0, H, (dst.numel(),), generator=g) if shape == "per_head" else None
    return torch.stack([src, dst]), head


def make_inputs(cfg: dict[str, Any], dtype=None, seed: int = 0) -> dict[str, Any]:
    import torch

    dtype = dtype or torch.float32
    ei, head = make_graph(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    N, H, D, E = cfg["N"], cfg["H"], cfg["D"], ei.size(1)
    t = {name: torch.randn(N, H, D, generator=g, dtype=dtype) for name in ("q", "k", "v")}
    t["x"] = torch.randn(N, H * D, generator=g, dtype=dtype)
    t["edge_index"], t["head"] = ei, head
    t["bias"] = torch.randn(E, H, generator=g, dtype=dtype) if cfg["bias"] else None
    t["weight"] = torch.rand(E, generator=g, dtype=dtype) + 0.5 if cfg["weight"] else None
    return t


# ---------------------------------------------------------------------------- implementations
def pyg_func(q, k, v, edge_index, N, bias=None, weight=None):
    """TransformerConv's message path, spelled out (gathers, dot, softmax, mul, scatter)."""
    from torch_geometric.utils import scatter, softmax

    src, dst = edge_index
    q_i, k_j, v_j = q.index_select(0, dst), k.index_select(0, src), v.index_select(0, src)
    alpha = (q_i * k_j).sum(-1) / math.sqrt(q.size(-1))
    if bias is not None:
        alpha = alpha + bias
    alpha = softmax(alpha, dst, num_nodes=N)
    if weight is not None:
        alpha = alpha * (weight if weight.dim() == 2 else weight[:, None])
    return scatter(v_j * alpha.unsqueeze(-1), dst, dim=0, dim_size=N, reduce="sum")


def per_head_reference(q, k, v, edge_index, head, N, bias=None, weight=None):
    """Per-head edges on the reference / PyG path: rows ``target * H + head`` with one head."""
    H, D = q.size(1), q.size(2)
    src, dst = edge_index
    ei = torch_stack_rows(src * H + head, dst * H + head)
    return ei, (q.reshape(N * H, 1, D), k.reshape(N * H, 1, D), v.reshape(N * H, 1, D))


def torch_stack_rows(a, b):
    import torch

    return torch.stack([a, b])


def build_call(impl: str, cfg: dict[str, Any], t: dict[str, Any], backward: bool):
    """``(call() -> output tensor, leaves for gradients, extra info)``."""
    import torch

    N, H, D = cfg["N"], cfg["H"], cfg["D"]
    per_head = t["head"] is not None
    q, k, v = t["q"], t["k"], t["v"]
    bias, weight = t["bias"], t["weight"]
    if backward:
        for name in ("q", "k", "v", "x"):
            t[name].requires_grad_(True)
    info: dict[str, Any] = {}
    ei = t["edge_index"]
    if per_head and impl in ("reference", "pyg_func", "pyg_compiled"):
        ei, (q, k, v) = per_head_reference(q, k, v, ei, t["head"], N)
        n_rows = N * H
    else:
        n_rows = N

    if impl in ("fused", "fused_general"):
        from graphattn.kernels import fused, fused_explicit_attention, prepare_graph
        from graphattn.kernels.cpu_extension import cpu_ops

        from graphattn import EdgeSet

        fused.BLOCKED["enabled"] = impl == "fused"
        if q.device.type == "cpu":
            cpu_ops()  # load (or build) the extension outside the timed preparation
        es = EdgeSet(ei, head=t["head"], num_heads=H, bias=bias, weight=weight)
        t0 = time.perf_counter()
        prepare_graph(es, N, N)
        info["prep_ms"] = 1000 * (time.perf_counter() - t0)
        return (lambda: fused_explicit_attention(q, k, v, es, N, scale=D**-0.5)[0]), [q, k, v], info
    if impl == "fused_cold":  # the graph layout (CSR; CSC in the backward) rebuilt on every call
        from graphattn.kernels import build_graph, fused_attention

        def call():
            graph = build_graph(ei, N, N, head=t["head"], num_heads=H)
            if per_head:
                rows = [x.reshape(N * H, 1, D) for x in (q, k, v)]
                return fused_attention(*rows, graph, bias=bias, weight=weight).view(N, H, D)
            return fused_attention(q, k, v, graph, bias=bias, weight=weight)

        return call, [q, k, v], info
    if impl == "layer":
        from graphattn import EdgeAttention, EdgeSet

        layer = EdgeAttention(H * D, D, heads=H, kernel="fused").to(t["x"].device)
        es = EdgeSet(ei, head=t["head"], num_heads=H, bias=bias, weight=weight)
        params = list(layer.parameters())
        return (lambda: layer(t["x"], es)), [t["x"], *params], info
    if impl == "reference":
        from graphattn.kernels import edge_attention

        def call():
            return edge_attention(q, k, v, ei, n_rows, bias=bias, weight=weight, scale=D**-0.5)[0]

        return call, [t["q"], t["k"], t["v"]], info
    if impl in ("pyg_func", "pyg_compiled"):
        fn = pyg_func
        if impl == "pyg_compiled":
            fn = torch.compile(pyg_func, dynamic=False)
            t0 = time.perf_counter()
            out = fn(q, k, v, ei, n_rows, bias, weight)
            if backward:
                out.sum().backward()
            info["compile_ms"] = 1000 * (time.perf_counter() - t0)
        return (lambda: fn(q, k, v, ei, n_rows, bias, weight)), [t["q"], t["k"], t["v"]], info
    if impl == "pyg_conv":
        from torch_geometric.nn import TransformerConv

        if per_head or bias is not None or weight is not None:
            raise NotImplementedError("TransformerConv has no per-head edges, logit bias or weight")
        conv = TransformerConv(H * D, D, heads=H, root_weight=False).to(t["x"].device)
        params = list(conv.parameters())
        return (lambda: conv(t["x"], ei)), [t["x"], *params], info
    if impl in ("sdpa_dense", "sdpa_mask"):
        import torch.nn.functional as F

        if per_head or bias is not None or weight is not None:
            raise NotImplementedError("dense SDPA baseline: head-shared edges without bias/weight")
        mask = None
        if impl == "sdpa_mask":
            mask = torch.zeros(N, N, dtype=torch.bool, device=q.device)
            mask[ei[1], ei[0]] = True

        def call():
            qq, kk, vv = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, N, D]
            return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)

        return call, [t["q"], t["k"], t["v"]], info
    raise ValueError(f"unknown implementation {impl!r}")


# ---------------------------------------------------------------------- correctness gate
def gate(impl: str, cfg: dict[str, Any], backward: bool) -> float:
    """Max relative error (output and gradients) against float64 on a small graph of the shape."""
    import torch

    small = {**cfg, "N": min(cfg["N"], 600), "k": min(cfg["k"], 24)}
    t = make_inputs(small, seed=7)
    t64 = {n: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x)
           for n, x in t.items()}
    for n in ("q", "k", "v"):
        t64[n].requires_grad_(backward)
    call, _, _ = build_call(impl, small, t, backward)
    out = call()
    if impl == "layer" or impl == "pyg_conv":
        return float("nan")  # own parameters: compared through the functional rows
    N = small["N"]
    if impl.startswith("sdpa"):
        if impl == "sdpa_dense":  # all pairs: the oracle is the complete graph
            src = torch.arange(N).repeat(N)
            dst = torch.arange(N).repeat_interleave(N)
            t64["edge_index"] = torch.stack([src, dst])
        out = out[0].transpose(0, 1)
    ref = _oracle(t64, small)
    out = out.reshape(ref.shape)  # per-head rows [N * H, 1, D] on the reference / PyG paths
    err = _rel(out, ref)
    if backward:
        go = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        g = torch.autograd.grad(out, [t["q"], t["k"], t["v"]], go.to(out.dtype))
        r = torch.autograd.grad(ref, [t64["q"], t64["k"], t64["v"]], go)
        err = max([err, *(_rel(a, b) for a, b in zip(g, r, strict=True))])
    return err


def _oracle(t64: dict[str, Any], cfg: dict[str, Any]):
    import torch

    N, H, D = cfg["N"], cfg["H"], cfg["D"]
    q, k, v = t64["q"], t64["k"], t64["v"]
    src, dst = t64["edge_index"]
    head = t64["head"]
    outs = []
    for h in range(H):
        sel = torch.ones_like(src, dtype=torch.bool) if head is None else head == h
        s, d = src[sel], dst[sel]
        logit = (q[d, h] * k[s, h]).sum(-1) * D**-0.5
        if t64["bias"] is not None:
            logit = logit + t64["bias"][sel, h]
        m = torch.full((N,), -math.inf, dtype=logit.dtype).scatter_reduce(0, d, logit.detach(), "amax")
        e = torch.exp(logit - m[d])
        p = e / torch.zeros(N, dtype=e.dtype).index_add(0, d, e)[d]
        if t64["weight"] is not None:
            p = p * t64["weight"][sel]
        outs.append(torch.zeros(N, D, dtype=v.dtype).index_add(0, d, p[:, None] * v[s, h]))
    return torch.stack(outs, 1)


def _rel(a, b) -> float:
    a, b = a.detach().double().reshape(b.shape), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


# -------------------------------------------------------------------------------- worker
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def min_traffic_bytes(cfg: dict[str, Any], backward: bool) -> float:
    """Minimum traffic, fp32: q, k, v, out (+ dO, dq, dk, dv, lse, D) once, int32 CSR (+ CSC)."""
    N, H, D, E = cfg["N"], cfg["H"], cfg["D"], cfg["N"] * cfg["k"]
    node = 4.0 * N * H * D
    fwd = 4 * node + 4 * E + 4 * N + 4 * N * H
    if not backward:
        return fwd
    bwd = 8 * node + 2 * 4 * N * H + 3 * 4 * E + 2 * 4 * N
    return fwd + bwd


def worker(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(job["threads"])
    cfg, impl, backward = job["config"], job["impl"], job["mode"] == "fwd+bwd"
    rec: dict[str, Any] = {**job}
    E = cfg["N"] * cfg["k"]
    if impl in ("pyg_func", "pyg_conv", "pyg_compiled", "reference"):
        predicted = E * cfg["H"] * cfg["D"] * 4 * 6
        if predicted > 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"):
            return {**rec, "status": "skipped_oom"}
    if impl.startswith("sdpa") and cfg["N"] > job.get("dense_max_n", 16384):
        return {**rec, "status": "skipped_dense_too_large"}
    if impl == "sdpa_mask" and cfg["N"] > job.get("mask_max_n", 4096):
        return {**rec, "status": "skipped_dense_too_large"}
    try:
        rec["gate_rel_err"] = gate(impl, cfg, backward)
    except NotImplementedError as exc:
        return {**rec, "status": f"unsupported: {exc}"}
    t = make_inputs(cfg)
    call, leaves, info = build_call(impl, cfg, t, backward)
    rec.update(info)
    base = rss_bytes()
    rec["load_before"] = os.getloadavg()[0]

    def step():
        out = call()
        if backward:
            out.backward(torch.ones_like(out))
            for x in leaves:
                x.grad = None
        return out

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    warm, reps = (2, job["reps"]) if first < 1.5 else (1, max(3, job["reps"] // 2))
    for _ in range(warm - 1):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rec["load_after"] = os.getloadavg()[0]
    times.sort()
    ms_min, ms_med = 1000 * times[0], 1000 * times[len(times) // 2]
    rec.update(
        status="ok", reps=reps, warmups=warm, ms_min=ms_min, ms_median=ms_med,
        medges_per_s=E / ms_med / 1e3, edge_heads_per_s=E * cfg["H"] / (ms_med / 1e3),
        peak_extra_mb=max(peak - base, 0) / 2**20,
        roofline_pct=100 * min_traffic_bytes(cfg, backward) / (STREAM_GBS * 1e9) / (ms_med / 1e3)
        / job["threads"],
    )
    return rec


# -------------------------------------------------------------------------------- parent
def environment() -> dict[str, Any]:
    import torch
    import torch_geometric

    model = flags = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = " ".join(f for f in line.split(":", 1)[1].split()
                                 if f in ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"))
    except OSError:
        pass
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        sha = ""
    return {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__,
            "python": platform.python_version(), "cpu": model, "cpu_flags": flags,
            "nproc": os.cpu_count(), "git": sha,
            "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE", ""),
            "loadavg": os.getloadavg()}


def run_job(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"]),
           "MKL_NUM_THREADS": str(job["threads"])}
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**job, "status": f"timeout>{timeout:.0f}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {**job, "status": "error", "error": (proc.stderr or proc.stdout)[-800:]}
    return json.loads(lines[-1])


def label(cfg: dict[str, Any]) -> str:
    extra = "+bias+weight" if cfg["bias"] or cfg["weight"] else ""
    return f"N={cfg['N']} k={cfg['k']} H={cfg['H']} D={cfg['D']} {cfg['graph']}{extra}"


def markdown(records: list[dict[str, Any]]) -> str:
    rows = ["| config | mode | threads | impl | ms (median / min) | M edges/s | % roofline "
            "| peak extra MB | × faster than pyg_func / pyg_conv | × less memory than pyg_func / "
            "pyg_conv | gate err | load | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in records:
        by_key.setdefault((label(r["config"]), r["mode"], r["threads"]), {})[r["impl"]] = r
    for (cfg, mode, threads), impls in by_key.items():
        base = {b: impls.get(b) for b in ("pyg_func", "pyg_conv")}
        for impl, r in impls.items():
            if r.get("status") != "ok":
                rows.append(f"| {cfg} | {mode} | {threads} | {impl} | — | — | — | — | — | — | — | — "
                            f"| {r.get('status')} |")
                continue
            sp = []
            for b in ("pyg_func", "pyg_conv"):
                br = base[b]
                sp.append(f"{br['ms_median'] / r['ms_median']:.1f}" if br and br.get("status") == "ok"
                          else "—")
            mems = []
            for b in ("pyg_func", "pyg_conv"):
                br = base[b]
                mems.append(f"{br['peak_extra_mb'] / max(r['peak_extra_mb'], 1.0):.0f}"
                            if br and br.get("status") == "ok" else "—")
            mem = " / ".join(mems)
            gate_err = r.get("gate_rel_err")
            gate_txt = "—" if gate_err is None or gate_err != gate_err else f"{gate_err:.0e}"
            note = []
            if "prep_ms" in r:
                note.append(f"graph prep {r['prep_ms']:.0f} ms (once)")
            if "compile_ms" in r:
                note.append(f"compile {r['compile_ms'] / 1000:.0f} s")
            if r.get("contended"):
                note.append("contended")
            if r.get("reps", 5) < 5:
                note.append(f"{r['reps']} reps")
            rows.append(
                f"| {cfg} | {mode} | {threads} | {impl} | {r['ms_median']:.0f} / {r['ms_min']:.0f} "
                f"| {r['medges_per_s']:.2f} | {r['roofline_pct']:.1f} | {r['peak_extra_mb']:.0f} "
                f"| {sp[0]} / {sp[1]} | {mem} | {gate_txt} | {r['load_before']:.1f} "
                f"| {'; '.join(note)} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="roofline",
                    choices=["roofline", "features", "sweep", "shapes", "smoke"])
    ap.add_argument("--impls", nargs="*", default=None, help=f"subset of {IMPLS}")
    ap.add_argument("--graphs", nargs="*", default=None,
                    help="only these graph shapes (uniform, local, power_law, per_head)")
    ap.add_argument("--modes", nargs="*", default=["fwd", "fwd+bwd"])
    ap.add_argument("--threads", nargs="*", type=int, default=[1, os.cpu_count() or 1])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--rerun-contended", action="store_true",
                    help="rerun a job once when the load average exceeds nproc / 2")
    ap.add_argument("--out", type=Path, default=None, help="JSON lines output")
    ap.add_argument("--table", type=Path, default=None,
                    help="print the markdown table of an earlier --out file and exit")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.table:
        recs = [json.loads(line) for line in args.table.read_text().splitlines()]
        print(markdown([r for r in recs if "impl" in r]))
        return
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    impls = args.impls or default_impls(args.suite)
    env = environment()
    print(json.dumps({"environment": env}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    out = open(args.out, "w") if args.out else None
    if out:
        out.write(json.dumps({"environment": env, "argv": sys.argv}) + "\n")
    records = []
    nproc = os.cpu_count() or 1
    for cfg in suite_configs(args.suite):
        if args.graphs and cfg["graph"] not in args.graphs:
            continue
        for threads in args.threads:
            for mode in args.modes:
                for impl in impls:
                    job = {"impl": impl, "config": cfg, "mode": mode, "threads": threads,
                           "reps": args.reps}
                    rec = run_job(job, args.timeout)
                    contended = rec.get("status") == "ok" and max(
                        rec["load_before"], rec["load_after"]) > 0.5 * nproc
                    if contended and args.rerun_contended:
                        again = run_job(job, args.timeout)
                        if again.get("status") == "ok" and again["ms_median"] < rec["ms_median"]:
                            rec = again
                    rec["contended"] = contended
                    records.append(rec)
                    print(json.dumps(rec), flush=True)
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
    print()
    print(markdown(records))


if __name__ == "__main__":
    main()
