"""The Triton kernels compiled for a CUDA device (every test here is marked ``cuda``).

* The cases of ``triton_cases.py`` (which ``test_triton.py`` runs on the CPU through Triton's
  interpreter), each with all its parametrisations, called with ``device="cuda"``.
* The kernels at a realistic size: N = 100 000 nodes with 32 random in-edges each (E = 3.2M),
  H = 4 heads of D = 16 channels, forward and backward (q, k, v, bias, weight) against the pure-torch
  reference :func:`graphattn.kernels.edge_attention` in float64 on the same GPU, as relative errors
  ``‖out − ref‖ / ‖ref‖``: below 1e-5 for float32 storage, 1e-2 for float16 / bfloat16 storage;
  head-shared and per-head edge sets, softmax and weighted (``softmax=False``) modes.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from tests.helpers import CUDA_MARKS

pytestmark = [
    *CUDA_MARKS,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]

if importlib.util.find_spec("triton") is not None:
    from tests.kernels import triton_cases as cases
else:  # pragma: no cover - the module is skipped
    cases = None


# ------------------------------------------------------------------- the interpreter's cases
def _case_params() -> list:
    """``(case name, kwargs)`` for every case function of ``triton_cases.py`` and every point of
    its ``parametrize`` grid (read from its marks, so new cases are picked up)."""
    if cases is None:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="triton is not installed"))]
    params = []
    for name in sorted(n for n in vars(cases) if n.startswith("test_")):
        grids = []
        for mark in getattr(getattr(cases, name), "pytestmark", []):
            if mark.name != "parametrize":
                continue
            argnames, values = mark.args[0], mark.args[1]
            names = ([a.strip() for a in argnames.split(",")] if isinstance(argnames, str)
                     else list(argnames))
            points = []
            for v in values:
                v = getattr(v, "values", v)  # a pytest.param
                points.append(dict(zip(names, v if len(names) > 1 else (v,), strict=True)))
            grids.append(points)
        for combo in itertools.product(*grids):
            kwargs = {k: v for point in combo for k, v in point.items()}
            label = "-".join(str(v) for v in kwargs.values())
            params.append(pytest.param(name, kwargs, id=f"{name}[{label}]" if label else name))
    return params


@pytest.mark.parametrize("case, kwargs", _case_params())
def test_triton_case_on_cuda(case: str, kwargs: dict) -> None:
    getattr(cases, case)(**kwargs, device="cuda")


def test_cases_run_compiled_not_interpreted() -> None:
    from graphattn.kernels import triton_attention

    assert cases.DEVICE == "cuda"
    assert type(triton_attention._forward_kernel).__name__ != "InterpretedFunction"


# ---------------------------------------------------------------------------- real size
N, DEG, H, D = 100_000, 32, 4, 16
BOUNDS = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.detach().double() - ref).norm() / ref.norm())


def _real_size_problem(dtype: torch.dtype, *, per_head: bool, softmax: bool, seed: int = 0):
    """Random graph and inputs on the GPU: every node gets ``DEG`` in-edges from uniform sources
    (duplicates and self-loops possible), in shuffled order; per-head edge sets put each edge in
    a uniform head. ``q, k, v`` normal, ``bias`` normal, ``weight`` uniform in [0.5, 1.5)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    E = N * DEG
    dst = torch.arange(N, device="cuda").repeat_interleave(DEG)
    src = torch.randint(0, N, (E,), generator=g, device="cuda")
    perm = torch.randperm(E, generator=g, device="cuda")
    src, dst = src[perm], dst[perm]
    head = torch.randint(0, H, (E,), generator=g, device="cuda") if per_head else None

    def rnd(*shape, positive=False):
        t = (torch.rand(*shape, generator=g, device="cuda") + 0.5 if positive
             else torch.randn(*shape, generator=g, device="cuda"))
        return t.to(dtype).requires_grad_()

    q = rnd(N, H, D) if softmax else None
    k = rnd(N, H, D) if softmax else None
    v = rnd(N, H, D)
    bias = (rnd(E) if per_head else rnd(E, H)) if softmax else None
    weight = rnd(E, positive=True)
    go = torch.randn(N, H, D, generator=g, device="cuda").to(dtype)
    return torch.stack([src, dst]), head, q, k, v, bias, weight, go


def _reference(edge_index, head, q, k, v, bias, weight, go, softmax):
    """:func:`graphattn.kernels.edge_attention` in float64 on the GPU (per head for per-head
    edges): ``(out, grads)`` with grads for the leaves that are not ``None``."""
    from graphattn.kernels import edge_attention

    leaves = [t.detach().double().requires_grad_() if t is not None else None
              for t in (q, k, v, bias, weight)]
    rq, rk, rv, rb, rw = leaves
    mode = "attention" if softmax else "weighted"
    scale = D**-0.5
    if head is None:
        out, _ = edge_attention(rq, rk, rv, edge_index, N, bias=rb, weight=rw, mode=mode,
                                scale=scale)
    else:  # every head on its own edges, one head at a time
        outs = []
        for h in range(H):
            sel = head == h
            hs = slice(h, h + 1)
            o, _ = edge_attention(None if rq is None else rq[:, hs], None if rk is None else rk[:, hs],
                                  rv[:, hs], edge_index[:, sel], N,
                                  bias=None if rb is None else rb[sel], weight=rw[sel], mode=mode,
                                  scale=scale)
            outs.append(o)
        out = torch.cat(outs, 1)
    live = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(out, live, go.double())
    return out.detach(), grads


@pytest.mark.parametrize("dtype, per_head, softmax", [
    (torch.float32, False, True),
    (torch.float16, False, True),
    (torch.bfloat16, False, True),
    (torch.float32, True, True),
    (torch.bfloat16, True, True),
    (torch.float32, False, False),
    (torch.float16, True, False),
], ids=["fp32", "fp16", "bf16", "fp32-per_head", "bf16-per_head", "fp32-weighted",
        "fp16-per_head-weighted"])
def test_real_size_matches_float64_reference(dtype, per_head, softmax):
    from graphattn.kernels import build_graph, fused_attention

    edge_index, head, q, k, v, bias, weight, go = _real_size_problem(dtype, per_head=per_head,
                                                                     softmax=softmax)
    graph = build_graph(edge_index, N, N, head=head, num_heads=H)
    assert graph.rowptr.is_cuda and graph.col.is_cuda and graph.eid.is_cuda
    scale = D**-0.5
    if per_head:  # rows target * H + head, one head of D channels each
        def flat(t):
            return None if t is None else t.reshape(N * H, 1, D)

        out = fused_attention(flat(q), flat(k), flat(v), graph, bias=bias, weight=weight,
                              scale=scale, softmax=softmax, backend="triton").view(N, H, D)
    else:
        out = fused_attention(q, k, v, graph, bias=bias, weight=weight, scale=scale,
                              softmax=softmax, backend="triton")
    assert out.is_cuda and out.dtype == dtype and out.shape == (N, H, D)
    leaves = [t for t in (q, k, v, bias, weight) if t is not None]
    grads = torch.autograd.grad(out, leaves, go)
    ref, ref_grads = _reference(edge_index, head, q, k, v, bias, weight, go, softmax)
    assert torch.isfinite(out).all() and ref.norm() > 0
    bound = BOUNDS[dtype]
    names = [n for n, t in zip("q k v bias weight".split(), (q, k, v, bias, weight), strict=True)
             if t is not None]
    errors = {"out": _rel(out, ref)}
    for name, g, r, leaf in zip(names, grads, ref_grads, leaves, strict=True):
        assert g.is_cuda and g.dtype == leaf.dtype and g.shape == leaf.shape, name
        assert torch.isfinite(g).all() and r.norm() > 0, name
        errors[name] = _rel(g, r)
    print(f"relative errors {dtype} per_head={per_head} softmax={softmax}:",
          {k: f"{e:.2e}" for k, e in errors.items()})
    assert all(e < bound for e in errors.values()), (errors, bound)
