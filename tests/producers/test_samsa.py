"""SAMSA producer: the spec's tests T1-T19 (specs/samsa.md §6) that apply to the producer.

Everything that compares gradients runs in float64. ``samsa_dense_ref`` restates the official
sampler (§1.5) per graph and head with Python loops, mixing in the layer's *key/value* space (as
the official code), so agreeing with it also checks that mixing features before the layer's
affine projections is exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn import EdgeAttention, SharedSourceEdgeSet, origin_code
from graphattn.nn import HybridLayer
from graphattn.producers import FullAttention, build_producer
from graphattn.producers.base import ProducerContext
from graphattn.producers.samsa import SAMSA, ImportanceScore, RMSNorm
from graphattn.producers.samsa.sampling import gumbel_noise, hard_slots, soft_slots
from tests.helpers import make_batch

F_IN, H, C = 6, 2, 3


def setup(k=4, seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    prod = SAMSA(F_IN, num_heads=H, k=k, **kw).to(dtype)
    layer = EdgeAttention(F_IN, C, heads=H).to(dtype)
    return prod, layer


def noise_for(batch, prod, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    node = scale * torch.randn(batch.num_nodes, H, generator=g, dtype=torch.float64)
    sup = scale * torch.randn(batch.num_graphs, prod.num_support, H, generator=g,
                              dtype=torch.float64)
    return node, sup


def run(layer, prod, batch, x=None, noise=None, train=False, kernel=None):
    layer.train(train)
    prod.train(train)
    if kernel is not None:
        layer.kernel = kernel
    x = batch.x if x is None else x
    try:
        if noise is None:
            return layer(x, prod, batch.batch, data=batch)
        with prod.fixed_noise(*noise):
            return layer(x, prod, batch.batch, data=batch)
    finally:
        layer.kernel = "auto"


def produce(prod, batch, *, train=False, noise=None, generator=None, x=None):
    prod.train(train)
    x = batch.x if x is None else x
    if noise is None:
        return prod(x, batch.batch, data=batch, num_heads=H, generator=generator)
    with prod.fixed_noise(*noise):
        return prod(x, batch.batch, data=batch, num_heads=H, generator=generator)


def select(prod, batch, *, train=False, noise=None):
    ctx = ProducerContext(batch.x, batch.batch, num_heads=H, num_graphs=batch.num_graphs,
                          data=batch, training=train)
    if noise is None:
        return prod.select(ctx)
    with prod.fixed_noise(*noise):
        return prod.select(ctx)


def head_slices(layer, h):
    sl = slice(h * C, (h + 1) * C)
    lq, lk, lv = layer.lin_query, layer.lin_key, layer.lin_value
    return ((lq.weight[sl], lq.bias[sl]), (lk.weight[sl], lk.bias[sl]),
            (lv.weight[sl], lv.bias[sl]))


def samsa_dense_ref(x, batch, prod, layer, noise, *, hard, train):
    """Official SAMSA attention per graph and head (loops), slots mixed in key/value space."""
    node_noise, sup_noise = noise
    score = prod.score(x) + node_noise
    out = x.new_zeros(x.size(0), H, C)
    k, tau = prod.k, prod.tau
    for b in range(batch.num_graphs):
        lo, hi = int(batch.ptr[b]), int(batch.ptr[b + 1])
        if hi == lo:
            continue
        for h in range(H):
            (wq, bq), (wk, bk), (wv, bv) = head_slices(layer, h)
            z = torch.cat([score[lo:hi, h], prod.support_score[:, h] + sup_noise[b, :, h]])
            cand = torch.cat([x[lo:hi], prod.support_x[h]])
            kv = torch.cat([cand @ wk.T + bk, cand @ wv.T + bv], 1)  # official: mix in kv space
            order = torch.argsort(z, descending=True)
            T, R = order[:k], order[k:2 * k]
            p = torch.sigmoid((z[T][:, None] - z[R][None, :]) / tau)
            if hard and train:
                kd = kv.detach()
                soft = p.mean(1, keepdim=True) * kd[T] + ((1 - p) / k) @ kd[R]
                slot = kv[T] + (soft - soft.detach())
            elif hard:
                slot = kv[T]
            else:
                slot = p.mean(1, keepdim=True) * kv[T] + ((1 - p) / k) @ kv[R]
            q = x[lo:hi] @ wq.T + bq
            a = torch.softmax(q @ slot[:, :C].T / math.sqrt(C), dim=1)
            out[lo:hi, h] = a @ slot[:, C:]
    return out.reshape(x.size(0), H * C)


def grads_of(out, tensors, seed=7):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=g, dtype=out.dtype)
    res = torch.autograd.grad((out * w).sum(), tensors, allow_unused=True)
    return [torch.zeros_like(t) if r is None else r for r, t in zip(res, tensors, strict=True)]


# --------------------------------------------------------------------------- T1 / T2 / T18
def test_t1_full_attention_limit():
    """Hard eval, no noise, no supports, k >= every graph: full attention within each graph."""
    batch = make_batch([5, 1, 0, 7], channels=F_IN)
    prod, layer = setup(k=8, num_support=0)
    out = run(layer, prod, batch)
    ref = layer(batch.x, FullAttention(), batch.batch)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)


SIZES_T2 = [1, 3, 0, 3, 4, 13]  # {1, 3, k-1, k, 2k+5} and an empty graph, k = 4


@pytest.mark.parametrize("hard,train", [(True, True), (True, False), (False, True),
                                        (False, False)])
def test_t2_edge_set_equals_dense_reference(hard, train):
    batch = make_batch(SIZES_T2, channels=F_IN, seed=2)
    prod, layer = setup(k=4, hard=hard)
    noise = noise_for(batch, prod)
    x1 = batch.x.clone().requires_grad_()
    x2 = batch.x.clone().requires_grad_()
    params = [*prod.parameters(), *layer.parameters()]
    out = run(layer, prod, batch, x=x1, noise=noise, train=train)
    ref = samsa_dense_ref(x2, batch, prod, layer, noise, hard=hard, train=train)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    got = grads_of(out, [x1, *params])
    want = grads_of(ref, [x2, *params])
    names = ["x", *(n for n, _ in prod.named_parameters()), *(n for n, _ in layer.named_parameters())]
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9, msg=name)
    score_grad = got[1 + [n for n, _ in prod.named_parameters()].index("score.out.weight")]
    # the sampler is differentiated in training and in soft mode, never in hard evaluation
    assert bool(score_grad.abs().sum() > 0) == (train or not hard)


@pytest.mark.parametrize("hard,train", [(True, True), (True, False), (False, True)])
def test_t18_fast_path_equals_explicit_path(hard, train):
    batch = make_batch(SIZES_T2, channels=F_IN, seed=3)
    prod, layer = setup(k=4, hard=hard)
    noise = noise_for(batch, prod, seed=3)
    x1 = batch.x.clone().requires_grad_()
    x2 = batch.x.clone().requires_grad_()
    params = [*prod.parameters(), *layer.parameters()]
    fast = run(layer, prod, batch, x=x1, noise=noise, train=train)
    ref = run(layer, prod, batch, x=x2, noise=noise, train=train, kernel="reference")
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=1e-10)
    for a, b in zip(grads_of(fast, [x1, *params]), grads_of(ref, [x2, *params]), strict=True):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-9)
    # the same edges explicitly: to_explicit() through the reference path
    es = produce(prod, batch, train=train, noise=noise)
    layer.train(train)
    torch.testing.assert_close(layer(batch.x, es.to_explicit(), batch.batch).detach(),
                               fast.detach(), atol=1e-12, rtol=1e-10)


# ------------------------------------------------------------------------------ T3 / T4
def _pairs(seed, B=2, k=3, Fd=4):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return r(B, H, k, Fd), r(B, H, k, Fd), r(B, H, k), r(B, H, k), r(B, H, k, Fd)


@pytest.mark.parametrize("tau", [1.0, 2.5])
def test_t3_straight_through_gradient_closed_form(tau):
    xt, xr, zt, zr, G = _pairs(0)
    k = xt.size(2)
    leaves = [t.clone().requires_grad_() for t in (xt, xr, zt, zr)]
    out = hard_slots(*leaves, tau=tau)
    assert torch.equal(out, xt)  # exact top-k forward
    gxt, gxr, gzt, gzr = torch.autograd.grad(out, leaves, G, allow_unused=True)
    p = torch.sigmoid((zt[..., :, None] - zr[..., None, :]) / tau)
    s = p * (1 - p) / tau
    a = torch.einsum("bhif,bhijf->bhij", G, xt[..., :, None, :] - xr[..., None, :, :])
    torch.testing.assert_close(gzt, (s * a).sum(-1) / k, atol=1e-14, rtol=1e-12)
    torch.testing.assert_close(gzr, -(s * a).sum(-2) / k, atol=1e-14, rtol=1e-12)
    assert torch.equal(gxt, G)
    assert gxr is None  # the bottom candidates get no key/value gradient
    # the equivalent autograd form: x_T + (soft' - soft'.detach()), soft' on detached features
    leaves2 = [t.clone().requires_grad_() for t in (xt, xr, zt, zr)]
    soft = soft_slots(leaves2[0].detach(), leaves2[1].detach(), leaves2[2], leaves2[3], tau=tau)
    ste = leaves2[0] + (soft - soft.detach())
    g2 = torch.autograd.grad(ste, leaves2, G, allow_unused=True)
    for got, want in zip((gxt, gzt, gzr), (g2[0], g2[2], g2[3]), strict=True):
        torch.testing.assert_close(got, want, atol=1e-14, rtol=1e-12)


def test_t4_soft_mode_is_exact_autograd():
    xt, xr, zt, zr, _ = _pairs(1)
    args = [t.clone().requires_grad_() for t in (xt, xr, zt, zr)]
    for clamp in (False, True):  # tau >= 1: the clamp is a no-op
        assert torch.autograd.gradcheck(
            lambda a, b, c, d, cl=clamp: soft_slots(a, b, c, d, tau=1.0, clamp=cl), args)
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: soft_slots(a, b, c, d, tau=0.1, clamp=False), args)


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_t4_clamp_rescales_score_gradients_per_head(mode):
    tau = 0.1
    xt, xr, zt, zr, G = _pairs(2)
    zt, zr = 0.3 * zt, 0.3 * zr  # gaps ~ tau: slopes up to 2.5 > 1/4
    fn = soft_slots if mode == "soft" else hard_slots
    res = {}
    for clamp in (False, True):
        leaves = [t.clone().requires_grad_() for t in (xt, xr, zt, zr)]
        out = fn(*leaves, tau=tau, clamp=clamp)
        res[clamp] = torch.autograd.grad(out, leaves, G, allow_unused=True)
    p = torch.sigmoid((zt[..., :, None] - zr[..., None, :]) / tau)
    m = (p * (1 - p) / tau).amax(dim=(0, 2, 3))  # per head, over the whole batch
    factor = torch.clamp(m, max=0.25) / m
    assert bool((factor < 0.5).all())  # the clamp is active here
    for i in (2, 3):
        torch.testing.assert_close(res[True][i], res[False][i] * factor.view(1, H, 1),
                                   atol=1e-14, rtol=1e-12)
    if mode == "soft":  # feature gradients are not clamped
        torch.testing.assert_close(res[True][0], res[False][0])


def test_t11_clamp_eps_saturated_pairs():
    """Huge score gaps at tau = 0.1: every slope is 0 (max s' = 0); no NaN thanks to the eps."""
    xt, xr, zt, zr, G = _pairs(3)
    zt = zt + 1e4
    for fn in (soft_slots, hard_slots):
        leaves = [t.clone().requires_grad_() for t in (xt, xr, zt, zr)]
        out = fn(*leaves, tau=0.1, clamp=True)
        gz = torch.autograd.grad(out, leaves[2:], G)
        assert all(torch.isfinite(g).all() and torch.all(g == 0) for g in gz)


# --------------------------------------------------------------------------------- T5 / T6
def test_t5_hard_train_forward_equals_hard_eval_forward():
    batch = make_batch(SIZES_T2, channels=F_IN, seed=4)
    prod, layer = setup(k=4)
    noise = noise_for(batch, prod, seed=4)
    tr = produce(prod, batch, train=True, noise=noise)
    ev = produce(prod, batch, train=False, noise=noise)
    N = batch.num_nodes
    table = torch.cat([batch.x, ev.virtual_x])
    eval_rows = table[ev.sources]  # [B, H, k, F] the real/support features eval attends to
    train_rows = tr.virtual_x.view(eval_rows.shape)
    assert torch.equal(train_rows, eval_rows)  # the straight-through term adds exactly 0
    assert torch.equal(tr.slot_origin, ev.slot_origin)
    assert bool((ev.sources[ev.slot_origin == origin_code("sampled")] < N).all())
    out_tr = run(layer, prod, batch, noise=noise, train=True)
    out_ev = run(layer, prod, batch, noise=noise, train=False)
    # (the slots' keys/values come from a separately shaped matmul: equal up to rounding)
    torch.testing.assert_close(out_tr, out_ev, atol=1e-13, rtol=0)


@pytest.mark.parametrize("hard", [True, False])
def test_t6_gradients_reach_score_net_and_supports(hard):
    batch = make_batch([3, 9, 0, 5], channels=F_IN, seed=5)
    prod, layer = setup(k=4, hard=hard)
    out = run(layer, prod, batch, train=True)
    out.pow(2).sum().backward()
    for name, p in prod.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    prod.zero_grad(set_to_none=True)
    if hard:  # hard evaluation: the sampler is not differentiated
        run(layer, prod, batch, train=False).pow(2).sum().backward()
        assert all(p.grad is None for p in prod.score.parameters())
        assert prod.support_score.grad is None


# ------------------------------------------------------------------------------------- T7
def test_t7_eval_determinism_and_eval_noise():
    batch = make_batch([4, 11, 2], channels=F_IN, seed=6)
    prod, layer = setup(k=4)
    a, b = run(layer, prod, batch), run(layer, prod, batch)
    assert torch.equal(a, b)
    prod.eval_noise = True
    torch.manual_seed(10)
    c = run(layer, prod, batch)
    d = run(layer, prod, batch)
    assert not torch.equal(c, d)  # official stochastic evaluation
    layer.eval()
    e1 = layer(batch.x, prod, batch.batch, generator=torch.Generator().manual_seed(3))
    e2 = layer(batch.x, prod, batch.batch, generator=torch.Generator().manual_seed(3))
    assert torch.equal(e1, e2)


def test_t7_training_is_deterministic_under_a_generator():
    batch = make_batch([4, 11, 2], channels=F_IN, seed=7)
    prod, layer = setup(k=4)
    layer.train()
    o1 = layer(batch.x, prod, batch.batch, generator=torch.Generator().manual_seed(5))
    o2 = layer(batch.x, prod, batch.batch, generator=torch.Generator().manual_seed(5))
    o3 = layer(batch.x, prod, batch.batch, generator=torch.Generator().manual_seed(6))
    assert torch.equal(o1, o2) and not torch.equal(o1, o3)


# ------------------------------------------------------------------------------ T8 / T9 / T19
def check_structure(es, batch, prod, train):
    N, k = batch.num_nodes, prod.k
    es.validate(N, batch.batch)  # includes the cross-graph check
    ex = es.to_explicit()
    src, dst = ex.edge_index
    real = src < N
    assert torch.equal(batch.batch[src[real]], batch.batch[dst[real]])
    if train:  # every slot is a virtual source bound to its graph
        assert not bool(real.any())
        assert torch.equal(ex.virtual_batch[src - N], batch.batch[dst])
    # every target has exactly H·k in-edges, k per head (supports guarantee 2k candidates)
    assert ex.num_edges == es.num_edges == H * k * N  # T19
    per = torch.bincount(dst * H + ex.head, minlength=N * H)
    assert bool((per == k).all())
    # T9: within each (graph, head) the k sources are distinct
    assert torch.unique(torch.stack([src, dst, ex.head]), dim=1).size(1) == ex.num_edges


@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=4), k=st.integers(1, 5),
       train=st.booleans(), hard=st.booleans(), seed=st.integers(0, 1000))
def test_t8_t9_t19_structure(sizes, k, train, hard, seed):
    batch = make_batch(sizes, channels=F_IN, seed=seed)
    prod, layer = setup(k=k, hard=hard, seed=seed)
    es = produce(prod, batch, train=train, generator=torch.Generator().manual_seed(seed))
    assert isinstance(es, SharedSourceEdgeSet) and es.sources.shape[1:] == (H, k)
    check_structure(es, batch, prod, train or not hard)
    sel = select(prod, batch, train=train)
    N, S = batch.num_nodes, prod.num_support
    for b in range(sel.top.size(0)):  # (trailing empty graphs are invisible to producers)
        lo, hi = int(batch.ptr[b]), int(batch.ptr[b + 1])
        for h in range(H):
            ids = torch.cat([sel.top[b, h], sel.bottom[b, h]])
            assert ids.unique().numel() == 2 * k  # 2k distinct candidates
            real = ids[ids < N]
            assert bool(((real >= lo) & (real < hi)).all())
            sup = ids[ids >= N] - N - h * S
            assert bool(((sup >= 0) & (sup < S)).all())  # support ids of this head, in [0, 2k)
    out = layer(batch.x, es, batch.batch)
    assert torch.isfinite(out).all()


def test_t19_pair_guard():
    batch = make_batch([6, 6], channels=F_IN)
    prod, _ = setup(k=4, max_pairs=2 * H * 16 - 1)
    with pytest.raises(ValueError, match="max_pairs"):
        produce(prod, batch, train=True)
    produce(prod, batch, train=False)  # hard evaluation builds no pairs


def test_hard_eval_emits_real_sources_and_used_supports_only():
    batch = make_batch([9, 2], channels=F_IN, seed=8)
    prod, _ = setup(k=4)
    es = produce(prod, batch)
    N = batch.num_nodes
    sel = select(prod, batch)
    real = sel.top < N
    assert torch.equal(es.sources[real], sel.top[real])
    nv = es.num_virtual
    assert nv == torch.unique(sel.top[~real]).numel()
    torch.testing.assert_close(
        torch.cat([batch.x, es.virtual_x])[es.sources[~real]],
        prod.support_x.reshape(-1, F_IN)[sel.top[~real] - N])
    assert es.stats["edges_per_node"] == H * 4
    assert 0 < es.stats["support_fraction"] < 1


# ------------------------------------------------------------------------------------ T10
@pytest.mark.parametrize("hard,train", [(True, True), (True, False), (False, True)])
def test_t10_batch_invariance(hard, train):
    sizes = [5, 12, 0, 3]
    batch = make_batch(sizes, channels=F_IN, seed=9)
    prod, layer = setup(k=4, hard=hard)
    node, sup = noise_for(batch, prod, seed=9)
    x = batch.x.clone().requires_grad_()
    out = run(layer, prod, batch, x=x, noise=(node, sup), train=train)
    gx = grads_of(out, [x])[0]
    for b in (0, 1, 3):
        lo, hi = int(batch.ptr[b]), int(batch.ptr[b + 1])
        alone = make_batch([sizes[b]], channels=F_IN)
        alone.x = batch.x[lo:hi].clone().requires_grad_()
        o = run(layer, prod, alone, x=alone.x, noise=(node[lo:hi], sup[b:b + 1]), train=train)
        torch.testing.assert_close(o, out[lo:hi], atol=1e-12, rtol=1e-10)
        g = torch.Generator().manual_seed(7)
        w = torch.randn(out.shape, generator=g, dtype=out.dtype)[lo:hi]
        (ga,) = torch.autograd.grad((o * w).sum(), [alone.x])
        torch.testing.assert_close(ga, gx[lo:hi], atol=1e-11, rtol=1e-9)


# ------------------------------------------------------------------------------------ T11
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("num_support", [None, 0, 3])
@pytest.mark.parametrize("hard", [True, False])
def test_t11_small_and_degenerate_graphs(dtype, num_support, hard):
    k = 5
    batch = make_batch([0, 1, 3, 7, 0], channels=F_IN, dtype=dtype)  # 0, 1, < k, < 2k
    prod, layer = setup(k=k, num_support=num_support, dtype=dtype, hard=hard)
    for train in (True, False):
        x = batch.x.clone().requires_grad_()
        out = run(layer, prod, batch, x=x, train=train)
        assert out.dtype == dtype and torch.isfinite(out).all()
        out.float().pow(2).sum().backward()
        assert torch.isfinite(x.grad).all()
        for p in prod.parameters():
            assert p.grad is None or torch.isfinite(p.grad).all()
        prod.zero_grad(set_to_none=True)
    if num_support == 0:  # a graph with fewer candidates than k: masked slots, no supports
        es = produce(prod, batch)
        assert es.source_mask is not None
        # (a trailing empty graph is invisible to producers: no node names it)
        assert es.source_mask.sum((1, 2)).tolist() == [0, H, 3 * H, k * H]


def test_t11_all_graphs_empty():
    batch = make_batch([0, 0], channels=F_IN)
    prod, layer = setup(k=3)
    for train in (True, False):
        out = run(layer, prod, batch, train=train)
        assert out.shape == (0, H * C)


# ---------------------------------------------------------------------------- T12 / T13 / T14
def test_t12_heads_select_independently():
    batch = make_batch([20], channels=F_IN, seed=11)
    prod, _ = setup(k=4)
    sel = select(prod, batch)
    assert not torch.equal(sel.top[:, 0].sort().values, sel.top[:, 1].sort().values)
    with torch.no_grad():  # identical head scores, identical noise: identical choices
        prod.score.out.weight[1] = prod.score.out.weight[0]
        prod.score.out.bias[1] = prod.score.out.bias[0]
        prod.support_score[:, 1] = prod.support_score[:, 0]
    node, sup = noise_for(batch, prod, seed=12)
    node[:, 1], sup[..., 1] = node[:, 0], sup[..., 0]
    sel = select(prod, batch, noise=(node, sup), train=True)
    N, S = batch.num_nodes, prod.num_support
    as_local = lambda t, h: torch.where(t < N, t, t - h * S)  # noqa: E731  support id per head
    assert torch.equal(as_local(sel.top[:, 0], 0), as_local(sel.top[:, 1], 1))


def test_t13_permutation_equivariance():
    sizes = [7, 10]
    batch = make_batch(sizes, channels=F_IN, seed=13)
    prod, layer = setup(k=4)
    perm = torch.cat([torch.randperm(7), 7 + torch.randperm(10)])
    out = run(layer, prod, batch)
    batch_p = batch.clone()
    batch_p.x = batch.x[perm]
    torch.testing.assert_close(run(layer, prod, batch_p), out[perm], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("sizes", [[9, 2, 14], [7, 7, 7], [11]])
def test_t14_topk_selection_is_argtopk_of_noisy_scores(sizes):
    """Ragged batches (padded scores) and batches of one graph size (no padding: the scores are a
    view), with and without the competitors (hard evaluation asks for the top-k alone)."""
    batch = make_batch(sizes, channels=F_IN, seed=14)
    prod, _ = setup(k=4)
    node, sup = noise_for(batch, prod, seed=14)
    sel = select(prod, batch, noise=(node, sup), train=True)
    ctx = ProducerContext(batch.x, batch.batch, num_heads=H, num_graphs=batch.num_graphs,
                          data=batch, training=True)
    with prod.fixed_noise(node, sup):
        alone = prod.select(ctx, competitors=False)
    assert alone.bottom.shape == (batch.num_graphs, H, 0)
    for name in ("top", "top_valid", "z_top"):
        assert torch.equal(getattr(alone, name), getattr(sel, name)), name
    N, S, k = batch.num_nodes, prod.num_support, prod.k
    with torch.no_grad():
        s = prod.score(batch.x) + node
    for b in range(batch.num_graphs):
        lo, hi = int(batch.ptr[b]), int(batch.ptr[b + 1])
        for h in range(H):
            z = torch.cat([s[lo:hi, h], prod.support_score[:, h].detach() + sup[b, :, h]])
            ids = torch.cat([torch.arange(lo, hi), N + h * S + torch.arange(S)])
            order = ids[torch.argsort(z, descending=True)]
            assert set(sel.top[b, h].tolist()) == set(order[:k].tolist())
            assert set(sel.bottom[b, h].tolist()) == set(order[k:2 * k].tolist())
            torch.testing.assert_close(sel.z_top[b, h].detach(),
                                       z.sort(descending=True).values[:k])


# ------------------------------------------------------------------------------- T15 / T16
def test_t15_soft_tends_to_hard():
    batch = make_batch([6, 13], channels=F_IN, seed=15)
    prod, layer = setup(k=4, tau=1e-3)
    node, sup = noise_for(batch, prod, seed=15, scale=50.0)  # large score gaps
    prod.hard = False
    soft = run(layer, prod, batch, noise=(node, sup))
    prod.hard = True
    hard = run(layer, prod, batch, noise=(node, sup))
    torch.testing.assert_close(soft, hard, atol=1e-6, rtol=0)


def test_t16_gumbel_statistics():
    """10^6 seeded draws; the tolerances are > 7 (mean) and > 4 (variance) standard errors, so
    a correct sampler fails with probability < 1e-4 for an arbitrary seed (the seed is fixed)."""
    g = gumbel_noise((10**6,), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(float(g.mean()) - 0.5772156649) < 1e-2
    assert abs(float(g.var()) - math.pi**2 / 6) < 2e-2


# --------------------------------------------------------------------------- interface
def test_registry_and_repr():
    prod = build_producer({"name": "samsa", "k": 3}, channels=8, heads=2, num_heads=2)
    assert isinstance(prod, SAMSA) and prod.num_heads == 2 and prod.num_support == 6
    assert "k=3" in repr(prod) and "hard=True" in repr(prod)
    assert prod.support_x.shape == (2, 6, 8) and prod.support_score.shape == (6, 2)


@pytest.mark.parametrize("kwargs,match", [
    ({"k": 0}, "k"), ({"tau": 0.0}, "tau"), ({"tau": float("inf")}, "tau"),
    ({"num_support": -1}, "num_support"), ({"clamp_eps": 0.0}, "clamp_eps"),
    ({"score_from": ""}, "score_from"), ({"channels": 0}, "channels"),
])
def test_bad_arguments(kwargs, match):
    args = {"channels": F_IN, "num_heads": H, **kwargs}
    with pytest.raises(ValueError, match=match):
        SAMSA(**args)


def test_bad_inputs():
    batch = make_batch([3, 4], channels=F_IN)
    prod, _ = setup(k=2)
    with pytest.raises(ValueError, match="num_heads"):
        prod(batch.x, batch.batch, num_heads=H + 1)
    with pytest.raises(ValueError, match="channels"):
        prod(batch.x[:, :4], batch.batch, num_heads=H)
    with pytest.raises(ValueError, match="sorted"):
        prod(batch.x, batch.batch.flip(0), num_heads=H)
    with pytest.raises(ValueError, match="node_noise"):
        produce(prod, batch, noise=(torch.zeros(3, H), None))
    with pytest.raises(ValueError, match="support_noise"):
        produce(prod, batch, noise=(torch.zeros(7, H), torch.zeros(1, 2, H)))
    prod.score_from = "residual"
    with pytest.raises(ValueError, match="residual"):
        produce(prod, batch)


def test_score_from_reads_the_data_attribute():
    batch = make_batch([8, 5], channels=F_IN, seed=16)
    prod, _ = setup(k=3, score_from="residual")
    batch.residual = torch.randn_like(batch.x)
    sel = select(prod, batch)
    prod.score_from = None
    ref = select(prod, batch.clone().update({"x": batch.residual}))
    assert torch.equal(sel.top, ref.top)


def test_cross_graph_sources_are_rejected_without_materialising():
    batch = make_batch([3, 4], channels=F_IN)
    es = SharedSourceEdgeSet(torch.tensor([[[0, 1]], [[3, 1]]]), batch.ptr, num_heads=1)
    with pytest.raises(ValueError, match="joins two graphs"):
        es.validate(batch.num_nodes, batch.batch)
    assert "explicit" not in es._cache  # validated without materialising the edges
    with pytest.raises(ValueError, match="joins two graphs"):
        es.to_explicit().validate(batch.num_nodes, batch.batch)
    vb = SharedSourceEdgeSet(torch.tensor([[[7]], [[3]]]), batch.ptr, num_heads=1,
                             virtual_x=torch.zeros(1, F_IN), virtual_batch=torch.tensor([1]))
    with pytest.raises(ValueError, match="joins two graphs"):
        vb.validate(batch.num_nodes, batch.batch)


def test_building_blocks():
    x = torch.randn(5, 8, dtype=torch.float64)
    norm = RMSNorm(8).double()
    torch.testing.assert_close(norm(x), x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-8))
    # the authors' eps sits outside the root (torch.nn.RMSNorm puts it inside): tell them apart
    tiny, wide = 1e-3 * x, RMSNorm(8, eps=0.5).double()
    outside = tiny / (tiny.pow(2).mean(-1, keepdim=True).sqrt() + 0.5)
    inside = tiny / (tiny.pow(2).mean(-1, keepdim=True) + 0.5).sqrt()
    torch.testing.assert_close(wide(tiny), outside)
    assert not torch.allclose(outside, inside, rtol=1e-3)
    net = ImportanceScore(8, 3).double()
    with torch.no_grad():
        net.norm.weight.uniform_(0.5, 1.5)  # a gain other than 1
    # the documented composition, term by term: W_o (x + RMSNorm(W_2 GELU(W_1 x + b_1) + b_2)) + b_o
    z = net.lin2(torch.nn.functional.gelu(net.lin1(x)))
    torch.testing.assert_close(net(x), net.out(x + net.norm(z)), rtol=1e-12, atol=1e-12)
    assert net(x).shape == (5, 3)
    leaf = x[:3].clone().requires_grad_()
    assert torch.autograd.gradcheck(net, (leaf,))


def test_hybrid_alternative_trains():
    """The hybrid alternative: a local conv plus a SAMSA global branch in HybridLayer."""
    batch = make_batch([6, 9], channels=8, dtype=torch.float32)
    torch.manual_seed(0)
    layer = HybridLayer(8, conv="gcn", producer={"name": "samsa", "k": 3}, heads=2,
                        norm_first=True)
    layer.train()
    out = layer(batch.x, batch.edge_index, batch.batch, data=batch)
    out.sum().backward()
    assert isinstance(layer.producer, SAMSA) and layer.producer.num_heads == 2
    assert layer.producer.score.out.weight.grad.abs().sum() > 0
    assert layer.last_edges is not None and layer.last_edges.num_virtual == 2 * 2 * 3


def test_training_gradients_are_reproducible_with_several_threads():
    """The slot gathers sum their gradients in a fixed order (``gather_rows``): two identical
    training steps on 2 threads give bit-identical gradients, also where the gathered tensor is
    far above the 32k elements at which PyTorch's indexing backward switches to atomic adds."""
    from graphattn import EdgeAttention

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batch = make_batch([40] * 16, channels=64)
        grads = []
        for _ in range(2):
            torch.manual_seed(0)
            prod = SAMSA(64, num_heads=4, k=16)
            layer = EdgeAttention(64, 16, heads=4)
            x = batch.x.float().clone().requires_grad_()
            out = run(layer, prod, batch, x=x, train=True)
            params = [x, *prod.parameters(), *layer.parameters()]
            grads.append(torch.autograd.grad((out * out).sum(), params))
        for a, b in zip(*grads, strict=True):
            assert torch.equal(a, b)
    finally:
        torch.set_num_threads(threads)
