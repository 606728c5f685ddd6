"""The fused CPU kernel (C++/OpenMP extension) against an independent float64 reference.

Outputs and gradients (q, k, v, bias, weight) on random, local, power-law and per-head edge sets
with isolated targets, duplicate edges and self-loops; gradcheck; bit-identical results across runs
and thread counts; the cached graph layout; EdgeAttention's dispatch, dropout and fallback.

The helpers take a ``device``: graphs and inputs are drawn on the CPU (the same values everywhere)
and moved there; the float64 oracle always runs on CPU copies and results are compared on the CPU.
The layer tests also run on CUDA (``device`` fixture), where the fused path is the Triton kernel.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from graphattn.kernels import build_graph, cpu_extension, fused, fused_attention, prepare_graph

from graphattn import EdgeAttention, EdgeSet

# --------------------------------------------------------------------------------- graphs


def random_graph(N: int, E: int, seed: int, isolated: int = 3):
    """Uniform edges into the first N - isolated targets, plus duplicates and self-loops."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, max(N - isolated, 1), (E,), generator=g)
    dup = torch.randint(0, E, (E // 10 + 1,), generator=g)
    loops = torch.arange(0, N - isolated, 3)
    src = torch.cat([src, src[dup], loops])
    dst = torch.cat([dst, dst[dup], loops])
    perm = torch.randperm(src.numel(), generator=g)  # edges in no particular order
    return src[perm], dst[perm]


def local_graph(N: int, width: int, seed: int):
    """Window edges i - width .. i + width (incl. the self-loop), clipped at the ends; shuffled."""
    g = torch.Generator().manual_seed(seed)
    off = torch.arange(-width, width + 1)
    dst = torch.arange(N).repeat_interleave(off.numel())
    src = dst + off.repeat(N)
    keep = (src >= 0) & (src < N)
    src, dst = src[keep], dst[keep]
    perm = torch.randperm(src.numel(), generator=g)
    return src[perm], dst[perm]


def power_law_graph(N: int, E: int, seed: int, exponent: float = 1.3):
    """Zipf-like in-degrees (a hub with a large share of the edges, many isolated targets)."""
    g = torch.Generator().manual_seed(seed)
    prob = (torch.arange(N, dtype=torch.float64) + 1) ** -exponent
    dst = torch.multinomial(prob, E, replacement=True, generator=g)
    dst = torch.randperm(N, generator=g)[dst]  # the hub is not node 0
    src = torch.randint(0, N, (E,), generator=g)
    return src, dst


def per_head_graph(N: int, E: int, H: int, seed: int):
    """Random per-head edges: every (target, head) row has its own in-edges (some none)."""
    src, dst = random_graph(N, E, seed)
    g = torch.Generator().manual_seed(seed + 1)
    head = torch.randint(0, H, (src.numel(),), generator=g)
    return src, dst, head


GRAPHS = {
    "random": lambda: (*random_graph(40, 300, 0), None),
    "local": lambda: (*local_graph(40, 4, 1), None),
    "power_law": lambda: (*power_law_graph(60, 500, 2), None),
    "per_head": lambda: per_head_graph(40, 300, 3, 3),
}

# ---------------------------------------------------------------------- float64 reference


def naive_attention(q, k, v, src, dst, head, bias, weight, scale, N, softmax=True):
    """Per-head scatter implementation (independent of the kernels): ``out [N, H, C]``."""
    H, C = v.size(1), v.size(2)
    outs = []
    for h in range(H):
        sel = torch.ones_like(src, dtype=torch.bool) if head is None else head == h
        s, d = src[sel], dst[sel]

        def field(t, h=h, sel=sel):
            if t is None:
                return None
            return (t if t.dim() == 1 else t[:, h])[sel]

        if softmax:
            logits = (q[d, h] * k[s, h]).sum(-1) * scale
            if bias is not None:
                logits = logits + field(bias)
            m = torch.full((N,), float("-inf"), dtype=logits.dtype)
            m = m.scatter_reduce(0, d, logits.detach(), "amax")
            e = torch.exp(logits - m[d])
            den = torch.zeros(N, dtype=e.dtype).index_add(0, d, e)
            coef = e / den[d]
        else:
            coef = torch.ones(s.numel(), dtype=v.dtype)
        if weight is not None:
            coef = coef * field(weight)
        outs.append(torch.zeros(N, C, dtype=v.dtype).index_add(0, d, coef[:, None] * v[s, h]))
    return torch.stack(outs, 1)


def inputs(N, H, C, E, *, dtype=torch.float64, seed=0, bias_dims=2, weight_dims=1, device="cpu"):
    """Random leaves ``q, k, v [N, H, C]``, ``bias``, ``weight`` (positive) on ``device``; drawn
    on the CPU, so every device gets the same values."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, positive=False):
        t = torch.rand(*shape, generator=g, dtype=dtype) + 0.5 if positive else torch.randn(
            *shape, generator=g, dtype=dtype
        )
        return t.to(device).requires_grad_()

    q, k, v = rnd(N, H, C), rnd(N, H, C), rnd(N, H, C)
    bias = None if bias_dims == 0 else rnd(*((E, H) if bias_dims == 2 else (E,)))
    weight = None if weight_dims == 0 else rnd(*((E, H) if weight_dims == 2 else (E,)), positive=True)
    return q, k, v, bias, weight


def fused_per_head(q, k, v, graph, bias, weight, scale, softmax=True, backend=None):
    """The fused kernel on per-head (virtual-row) graphs: rows ``target * H + head``."""
    N, H, C = v.shape
    out = fused_attention(
        None if q is None else q.reshape(N * H, 1, C),
        None if k is None else k.reshape(N * H, 1, C),
        v.reshape(N * H, 1, C),
        graph,
        bias=bias,
        weight=weight,
        scale=scale,
        softmax=softmax,
        backend=backend,
    )
    return out.view(N, H, C)


def run_both(kind, *, dtype, C, bias_dims, weight_dims, softmax=True, seed=0, graphs=None, H=3,
             isolated=2, backend=None, device="cpu"):
    """The fused kernel (``backend``: default for the device, or ``"triton"``) on ``device`` and the
    float64 oracle (on the CPU) on graph ``kind`` of ``graphs`` (default :data:`GRAPHS`) with
    ``isolated`` extra nodes: ``(out, ref, grads, ref_grads, dst, head, N)``, all on the CPU
    (``dst``, ``head``: the CPU graph)."""
    src, dst, head = (GRAPHS if graphs is None else graphs)[kind]()
    N = int(max(src.max(), dst.max())) + 1 + isolated
    if head is not None:
        bias_dims = min(bias_dims, 1)
        weight_dims = min(weight_dims, 1)
    E = src.numel()
    q, k, v, bias, weight = inputs(N, H, C, E, dtype=dtype, seed=seed, bias_dims=bias_dims,
                                   weight_dims=weight_dims, device=device)
    if not softmax:
        q = k = bias = None
    scale = C**-0.5
    graph = build_graph(torch.stack([src, dst]).to(device), N, N,
                        head=None if head is None else head.to(device), num_heads=H)
    if head is None:
        out = fused_attention(q, k, v, graph, bias=bias, weight=weight, scale=scale, softmax=softmax,
                              backend=backend)
    else:
        out = fused_per_head(q, k, v, graph, bias, weight, scale, softmax, backend)
    assert out.device == v.device
    leaves = [t for t in (q, k, v, bias, weight) if t is not None]
    ref_leaves = [t.detach().cpu().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    rq, rk, rv, rb, rw = (next(it) if t is not None else None for t in (q, k, v, bias, weight))
    ref = naive_attention(rq, rk, rv, src, dst, head, rb, rw, scale, N, softmax)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, go.to(dtype).to(device))
    assert all(g.device == v.device for g in grads)
    ref_grads = torch.autograd.grad(ref, ref_leaves, go)
    return out.cpu(), ref, [g.cpu() for g in grads], ref_grads, dst, head, N


@pytest.mark.parametrize("kind", list(GRAPHS))
@pytest.mark.parametrize("C", [16, 5])
@pytest.mark.parametrize("bias_dims,weight_dims", [(2, 1), (1, 2), (0, 0)])
def test_float64_outputs_and_gradients_match_reference(kind, C, bias_dims, weight_dims, device):
    out, ref, grads, ref_grads, dst, _, N = run_both(
        kind, dtype=torch.float64, C=C, bias_dims=bias_dims, weight_dims=weight_dims, device=device
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11)
    # isolated targets (and empty per-head rows) give exactly 0
    isolated = torch.ones(N, dtype=torch.bool)
    isolated[dst] = False
    assert isolated.any() and torch.all(out[isolated] == 0)


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_float32_matches_float64_reference(kind, device):
    out, ref, grads, ref_grads, *_ = run_both(kind, dtype=torch.float32, C=16, bias_dims=2,
                                              weight_dims=1, device=device)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["random", "per_head"])
def test_weighted_mode_matches_reference(kind, device):
    out, ref, grads, ref_grads, *_ = run_both(kind, dtype=torch.float64, C=4, bias_dims=0,
                                              weight_dims=1, softmax=False, device=device)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_gradcheck_small_graph(device):
    src, dst = random_graph(7, 14, seed=5, isolated=1)
    N, H, C, E = 7, 2, 3, src.numel()
    graph = build_graph(torch.stack([src, dst]).to(device), N, N)
    q, k, v, bias, weight = inputs(N, H, C, E, bias_dims=2, weight_dims=1, seed=1, device=device)

    def fn(q, k, v, bias, weight):
        return fused_attention(q, k, v, graph, bias=bias, weight=weight)

    assert torch.autograd.gradcheck(fn, (q, k, v, bias, weight))

    ph_src, ph_dst, ph_head = per_head_graph(6, 12, H, seed=6)
    ph = build_graph(torch.stack([ph_src, ph_dst]).to(device), 6, 6, head=ph_head.to(device),
                     num_heads=H)
    q, k, v, bias, weight = inputs(6, H, C, ph_src.numel(), bias_dims=1, weight_dims=1, seed=2,
                                   device=device)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, w: fused_per_head(q, k, v, ph, b, w, 0.7), (q, k, v, bias, weight)
    )


def assert_bit_identical_across_runs_and_thread_counts(src, dst, N, H=4, C=16):
    """Outputs and gradients of two runs at 2 threads and one at 1 thread are equal bit for bit;
    returns the graph (its cached layouts tell which kernel ran)."""
    graph = build_graph(torch.stack([src, dst]), N, N)
    q, k, v, bias, weight = inputs(N, H, C, src.numel(), dtype=torch.float32, seed=3)
    go = torch.randn(N, H, C, generator=torch.Generator().manual_seed(4))

    def run():
        out = fused_attention(q, k, v, graph, bias=bias, weight=weight)
        return (out, *torch.autograd.grad(out, (q, k, v, bias, weight), go))

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first, second = run(), run()
        torch.set_num_threads(1)
        single = run()
    finally:
        torch.set_num_threads(threads)
    for a, b, c in zip(first, second, single, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    return graph


@pytest.mark.parametrize("H", [3, 4])
def test_bit_identical_across_runs_and_thread_counts(H):
    """H = 3 runs the general kernel, H = 4 the blocked one (one block; many: test_fused_blocked)."""
    graph = assert_bit_identical_across_runs_and_thread_counts(*power_law_graph(3000, 40000, seed=7),
                                                               3000, H)
    ops = cpu_extension.cpu_ops(warn=False)
    blocked = H == 4 and ops is not None and ops.blocked_supported()
    assert bool(graph._blocked) == blocked


def test_empty_graph_and_no_nodes(device):
    ei = torch.empty(2, 0, dtype=torch.long, device=device)
    graph = build_graph(ei, 4, 4)
    q, k, v, *_ = inputs(4, 2, 3, 0, bias_dims=0, weight_dims=0, device=device)
    out = fused_attention(q, k, v, graph)
    assert torch.equal(out, torch.zeros(4, 2, 3, dtype=torch.float64, device=device))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and torch.equal(v.grad, torch.zeros_like(v))
    none = build_graph(ei, 0, 0)
    empty = torch.empty(0, 2, 3, dtype=torch.float64, device=device)
    assert fused_attention(empty, empty, empty, none).shape == (0, 2, 3)


# ------------------------------------------------------------------------- graph layout


@pytest.mark.parametrize("per_head", [False, True])
def test_graph_layout_matches_torch_construction(per_head):
    if cpu_extension.cpu_ops(warn=False) is None:
        pytest.skip("without the CPU extension both layouts come from torch")
    src, dst, head = per_head_graph(30, 200, 3, seed=8)
    head = head if per_head else None
    graph = build_graph(torch.stack([src, dst]), 30, 32, head=head, num_heads=3)
    rowptr, col, eid = fused._build_csr_torch(src, dst, head, 3, 30, 32)
    assert graph.rowptr.dtype == graph.col.dtype == graph.eid.dtype == torch.int32
    assert torch.equal(graph.rowptr, rowptr) and torch.equal(graph.col, col)
    assert torch.equal(graph.eid, eid)
    csc = graph.csc()
    ref = fused._build_csc_torch(rowptr, col, eid, graph.num_sources)
    for a, b in zip(csc, ref, strict=True):
        assert a.dtype == torch.int32 and torch.equal(a, b)
    # rows are target (* H + head), columns source (* H + head)
    Hm = 3 if per_head else 1
    rows = torch.repeat_interleave(torch.arange(graph.num_rows), (rowptr[1:] - rowptr[:-1]).long())
    h = head[eid.long()] if per_head else 0
    assert torch.equal(rows, dst[eid.long()] * Hm + h)
    assert torch.equal(col.long(), src[eid.long()] * Hm + h)


def test_graph_is_shared_across_edge_sets_of_one_unmodified_tensor():
    """``layer(x, edge_index)`` every step wraps the same tensor in a new EdgeSet: the layout is
    reused; an in-place edit of the tensor invalidates it."""
    src, dst = random_graph(10, 30, seed=12)
    ei = torch.stack([src, dst])
    first = prepare_graph(EdgeSet(ei, num_heads=2), 10, 10)
    assert prepare_graph(EdgeSet(ei, num_heads=2), 10, 10) is first
    ei[0, 0] = (int(ei[0, 0]) + 1) % 10  # in place: the version counter changes
    edited = prepare_graph(EdgeSet(ei, num_heads=2), 10, 10)
    assert edited is not first
    fresh = build_graph(ei, 10, 10)
    assert torch.equal(edited.col, fresh.col) and torch.equal(edited.rowptr, fresh.rowptr)


def test_graph_is_cached_on_the_edge_set_and_checks_indices():
    src, dst = random_graph(10, 30, seed=9)
    es = EdgeSet(torch.stack([src, dst]), num_heads=2)
    assert prepare_graph(es, 10, 10) is prepare_graph(es, 10, 10)
    assert prepare_graph(es, 10, 12) is not prepare_graph(es, 10, 10)
    assert prepare_graph(es.detach(), 10, 10) is not prepare_graph(es, 10, 10)
    with pytest.raises(ValueError, match="source"):
        build_graph(torch.tensor([[10], [0]]), 10, 10)
    with pytest.raises(ValueError, match="target"):
        build_graph(torch.tensor([[0], [-1]]), 10, 10)
    with pytest.raises(ValueError, match="head"):
        build_graph(torch.tensor([[0], [0]]), 10, 10, head=torch.tensor([2]), num_heads=2)


# ------------------------------------------------------------------- EdgeAttention dispatch


def twin_layers(F=6, C=4, H=3, **kwargs):
    torch.manual_seed(0)
    fused_layer = EdgeAttention(F, C, heads=H, kernel="fused", **kwargs).double()
    ref_layer = EdgeAttention(F, C, heads=H, kernel="reference", **kwargs).double()
    ref_layer.load_state_dict(fused_layer.state_dict())
    return fused_layer, ref_layer


def layer_edge_sets(N, H):
    g = torch.Generator().manual_seed(10)
    src, dst = random_graph(N, 5 * N, seed=11)
    E = src.numel()
    ph_src, ph_dst, ph_head = per_head_graph(N, 5 * N, H, seed=12)
    vx = torch.randn(2, 6, generator=g, dtype=torch.float64)
    vsrc = torch.cat([src, torch.tensor([N, N + 1, N])])
    vdst = torch.cat([dst, torch.tensor([0, 1, 2])])
    return {
        "shared": EdgeSet(torch.stack([src, dst]), num_heads=H,
                          bias=torch.randn(E, H, generator=g, dtype=torch.float64),
                          weight=torch.rand(E, generator=g, dtype=torch.float64)),
        "per_head": EdgeSet(torch.stack([ph_src, ph_dst]), head=ph_head, num_heads=H,
                            bias=torch.randn(ph_src.numel(), generator=g, dtype=torch.float64)),
        "virtual": EdgeSet(torch.stack([vsrc, vdst]), num_heads=H, virtual_x=vx),
        "weighted": EdgeSet(torch.stack([src, dst]), num_heads=H, mode="weighted",
                            weight=torch.rand(E, H, generator=g, dtype=torch.float64)),
    }


@pytest.mark.parametrize("name", ["shared", "per_head", "virtual", "weighted"])
def test_layer_fused_equals_reference(name, device):
    """Both layers on ``device`` (on CUDA the fused path is the Triton kernel); compared on the CPU."""
    N, H = 20, 3
    es = layer_edge_sets(N, H)[name].to(device)
    mode = "weighted" if name == "weighted" else "attention"
    fused_layer, ref_layer = (layer.to(device) for layer in twin_layers(H=H, mode=mode))
    x = torch.randn(N, 6, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    results = []
    for layer in (fused_layer, ref_layer):
        xx = x.to(device).requires_grad_()
        fields = {f: getattr(es, f).clone().requires_grad_() for f in ("bias", "weight")
                  if getattr(es, f) is not None}
        out, (ei, alpha) = layer(xx, es.replace(**fields), return_attention_weights=True)
        out.pow(2).sum().backward()
        grads = [xx.grad, *(t.grad for t in fields.values()), *(p.grad for p in layer.parameters())]
        assert all(t.device.type == device for t in (out, ei, alpha, *grads))
        results.append((out.cpu(), ei.cpu(), alpha.cpu(), [g.cpu() for g in grads]))
    (out, ei, alpha, grads), (rout, rei, ralpha, rgrads) = results
    torch.testing.assert_close(out, rout, rtol=1e-10, atol=1e-12)
    assert torch.equal(ei, rei)
    torch.testing.assert_close(alpha, ralpha, rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, rgrads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11)


def test_auto_uses_fused_kernel_where_it_applies():
    N, H = 12, 2
    layer = EdgeAttention(6, 4, heads=H, edge_dim=3).double()
    x = torch.randn(N, 6, dtype=torch.float64)
    src, dst = random_graph(N, 40, seed=14)
    layer(x, torch.stack([src, dst]))
    assert layer.last_kernel == "fused"
    # edge features run inside the CPU kernel too
    layer(x, torch.stack([src, dst]), edge_attr=torch.randn(src.numel(), 3, dtype=torch.float64))
    assert layer.last_kernel == "fused"
    # complex weights → the reference path under "auto", an error under "fused"
    cw = EdgeSet(torch.stack([src, dst]), num_heads=H, mode="weighted",
                 weight=torch.randn(src.numel(), dtype=torch.complex128))
    weighted = EdgeAttention(6, 4, heads=H, mode="weighted").double()
    weighted(x, cw)
    assert weighted.last_kernel == "reference"
    weighted.kernel = "fused"
    with pytest.raises(ValueError, match="complex"):
        weighted(x, cw)
    # PyG message hooks need propagate → the reference path
    layer.kernel = "auto"
    handle = layer.register_message_forward_hook(lambda *a: None)
    layer(x, torch.stack([src, dst]))
    assert layer.last_kernel == "reference"
    handle.remove()
    layer(x, torch.stack([src, dst]))
    assert layer.last_kernel == "fused"
    with pytest.raises(ValueError, match="kernel"):
        EdgeAttention(6, 4, kernel="triton")


def test_dropout_is_a_post_softmax_mask(device):
    """Training-mode dropout = the reference with weight * mask / (1 - p) for the same mask (drawn
    on ``device`` from the global RNG, reseeded alike)."""
    N, H, p = 15, 2, 0.4
    fused_layer, ref_layer = (layer.to(device) for layer in twin_layers(H=H, dropout=p))
    src, dst = random_graph(N, 60, seed=15)
    g = torch.Generator().manual_seed(16)
    w = torch.rand(src.numel(), generator=g, dtype=torch.float64).to(device)
    es = EdgeSet(torch.stack([src, dst]).to(device), num_heads=H, weight=w)
    x = torch.randn(N, 6, generator=g, dtype=torch.float64).to(device)
    torch.manual_seed(123)
    out = fused_layer.train()(x, es)
    torch.manual_seed(123)
    mask = fused.dropout_mask(src.numel(), H, p, x)
    assert mask.device.type == out.device.type == device
    assert (mask == 0).any() and (mask > 1).any()
    ref = ref_layer.eval()(x, es.replace(weight=w[:, None] * mask))
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-10, atol=1e-12)
    # eval mode: no dropout
    torch.testing.assert_close(fused_layer.eval()(x, es).cpu(), ref_layer.eval()(x, es).cpu())


def test_missing_compiler_falls_back_to_reference_with_one_warning(monkeypatch):
    fresh = {"ops": None, "error": None, "tried": False, "warned": False}
    monkeypatch.setattr(cpu_extension, "_state", fresh)
    monkeypatch.setenv("GRAPHATTN_NO_CPU_EXTENSION", "1")
    N, H = 10, 2
    layer = EdgeAttention(6, 4, heads=H).double()
    ref = EdgeAttention(6, 4, heads=H, kernel="reference").double()
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(N, 6, dtype=torch.float64)
    ei = torch.stack(random_graph(N, 30, seed=16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = layer(x, ei)
        layer(x, ei)
    messages = [str(w.message) for w in caught if "fused CPU kernel" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    torch.testing.assert_close(out, ref(x, ei))
    # asked for explicitly, the fused kernel never falls back silently
    fused_only = EdgeAttention(6, 4, heads=H, kernel="fused").double()
    with pytest.raises(ValueError, match=r"kernel='fused' cannot run.*GRAPHATTN_NO_CPU_EXTENSION"):
        fused_only(x, ei)


@pytest.mark.parametrize("H", [3, 4])
@pytest.mark.parametrize("wanted", [("k",), ("v",), ("k", "v"), ("q",), ("bias",)])
def test_gradients_of_some_inputs_only(H, wanted, device):
    """Only some inputs need gradients (CPU, H = 3: general kernel, H = 4: blocked one; CUDA: the
    Triton kernel): the passes that run give the reference's gradients (without a destination
    pass, Dterm comes from dO . o)."""
    src, dst = power_law_graph(60, 500, seed=2)
    N, C = 60, 8
    graph = build_graph(torch.stack([src, dst]).to(device), N, N)
    q, k, v, bias, _ = inputs(N, H, C, src.numel(), dtype=torch.float32, seed=5, weight_dims=0,
                              device=device)
    leaves = {"q": q, "k": k, "v": v, "bias": bias}
    for name, t in leaves.items():
        t.requires_grad_(name in wanted)
    out = fused_attention(q, k, v, graph, bias=bias)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    chosen = [t for t in leaves.values() if t.requires_grad]
    grads = [g.cpu() for g in torch.autograd.grad(out, chosen, go.to(device))]
    ref_leaves = {n: t.detach().cpu().double().requires_grad_(t.requires_grad)
                  for n, t in leaves.items()}
    ref = naive_attention(ref_leaves["q"], ref_leaves["k"], ref_leaves["v"], src, dst, None,
                          ref_leaves["bias"], None, C**-0.5, N)
    ref_grads = torch.autograd.grad(ref, [t for t in ref_leaves.values() if t.requires_grad],
                                    go.double())
    assert len(grads) == len(wanted)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------- edge features in the kernel
@pytest.mark.parametrize("mode", ["attention", "weighted"])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("fields", [False, True])
def test_edge_features_in_the_fused_kernel_match_the_reference(mode, per_head, fields):
    """``k_j + W_E e_ji`` and ``v_j + W_E e_ji`` inside the CPU kernel: outputs, attention weights
    and every gradient (x, W_Q, W_K, W_V, W_E, bias, weight) equal the float64 reference path."""
    N, H, C, F_E = 14, 3, 4, 5
    fused_layer, ref_layer = twin_layers(H=H, C=C, edge_dim=F_E, mode=mode)
    g = torch.Generator().manual_seed(21)
    if per_head:
        src, dst, head = per_head_graph(N, 60, H, seed=22)
    else:
        (src, dst), head = random_graph(N, 60, seed=22), None
    E = src.numel()
    extra = {}
    if fields:
        if mode == "attention":
            extra["bias"] = torch.randn(E, generator=g, dtype=torch.float64).requires_grad_()
        extra["weight"] = (torch.rand(E, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    attr = torch.randn(E, F_E, generator=g, dtype=torch.float64).requires_grad_()
    es = EdgeSet(torch.stack([src, dst]), head=head, num_heads=H, mode=mode, edge_attr=attr, **extra)
    x = torch.randn(N, 6, generator=g, dtype=torch.float64)
    results = []
    for layer in (fused_layer, ref_layer):
        xi = x.clone().requires_grad_()
        leaves = [xi, attr, *extra.values(), *layer.parameters()]
        out, (_, alpha) = layer(xi, es, return_attention_weights=True)
        assert layer.last_kernel == ("fused" if layer is fused_layer else "reference")
        out_plain = layer(xi, es)  # without attention weights: the kernel path alone
        loss = (out_plain * torch.linspace(-1, 1, out_plain.numel(), dtype=torch.float64)
                .view_as(out_plain)).sum()
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        results.append((out, alpha, grads))
    (out, alpha, grads), (rout, ralpha, rgrads) = results
    torch.testing.assert_close(out, rout, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, ralpha, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, rgrads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_edge_feature_gradients_pass_gradcheck():
    N, H, C = 7, 2, 3
    src, dst = random_graph(N, 25, seed=31)
    graph = build_graph(torch.stack([src, dst]), N, N)
    q, k, v, bias, weight = inputs(N, H, C, src.numel(), seed=32)
    ef = torch.randn(src.numel(), H, C, dtype=torch.float64).requires_grad_()

    def fn(q, k, v, bias, weight, ef):
        return fused_attention(q, k, v, graph, bias=bias, weight=weight, edge_features=ef)

    assert torch.autograd.gradcheck(fn, (q, k, v, bias, weight, ef))
    # weighted mode: o_i = sum w (v_j + f_e)
    assert torch.autograd.gradcheck(
        lambda v, weight, ef: fused_attention(None, None, v, graph, weight=weight, softmax=False,
                                              edge_features=ef), (v, weight, ef))


def test_edge_features_match_pyg_transformer_conv():
    """The layer with ``edge_dim`` is PyG's ``TransformerConv(edge_dim=...)`` (without its root
    weight) with the same weights, on the fused kernel."""
    from torch_geometric.nn import TransformerConv

    N, H, C, F, F_E = 15, 2, 4, 6, 3
    torch.manual_seed(41)
    conv = TransformerConv(F, C, heads=H, edge_dim=F_E, root_weight=False).double()
    layer = EdgeAttention(F, C, heads=H, edge_dim=F_E).double()
    for name in ("lin_query", "lin_key", "lin_value", "lin_edge"):
        getattr(layer, name).load_state_dict(getattr(conv, name).state_dict())
    src, dst = random_graph(N, 70, seed=42)
    ei = torch.stack([src, dst])
    x = torch.randn(N, F, dtype=torch.float64, requires_grad=True)
    attr = torch.randn(src.numel(), F_E, dtype=torch.float64)
    ours = layer(x, ei, edge_attr=attr)
    assert layer.last_kernel == "fused"
    theirs = conv(x, ei, edge_attr=attr)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    (gx,) = torch.autograd.grad(ours.sum(), x)
    (rx,) = torch.autograd.grad(theirs.sum(), x)
    torch.testing.assert_close(gx, rx, rtol=1e-9, atol=1e-11)
