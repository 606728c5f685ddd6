"""EdgeAttention: the reference path against dense attention and PyG, every fast path against the
reference on the same (explicit) edges, outputs and gradients in float64.

The tests taking ``device`` also run on CUDA (marked ``cuda``): the layer, its inputs and its edge
set on the device (explicit edges then take the Triton kernel), the dense oracles on the CPU, and
every comparison on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import TransformerConv

import graphattn as ga
from graphattn import EdgeAttention, EdgeSet, PermutationEdgeSet, SharedSourceEdgeSet
from graphattn.core.union import featured_rows
from tests.core.test_edgeset import _MatrixOperator
from tests.helpers import DEVICES, dense_reference, make_batch


def twin(layer: EdgeAttention, **changes) -> EdgeAttention:
    """A copy of ``layer`` with the same weights and some constructor arguments changed."""
    kw = dict(in_channels=layer.in_channels, out_channels=layer.out_channels, heads=layer.heads,
              concat=layer.concat, edge_dim=layer.edge_dim, mode=layer.mode)
    kw.update(changes)
    other = EdgeAttention(**kw).to(torch.float64)
    other.load_state_dict(layer.state_dict())
    return other


def grads(fn, tensors):
    for t in tensors:
        t.grad = None
    out = fn()
    ramp = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
    (out * ramp).sum().backward()
    return out.detach(), [t.grad.clone() for t in tensors]


def assert_same(a, b, atol=1e-10):
    """``a`` and ``b`` agree to ``atol`` (compared on the CPU, whatever their devices)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max()


@pytest.fixture
def batch():
    return make_batch([5, 1, 0, 7], channels=6)


@pytest.mark.parametrize("device", DEVICES)
def test_reference_equals_dense_masked_softmax(batch, device):
    """The layer (explicit edges: the fused kernel, Triton on CUDA) on ``device`` against dense
    masked softmax on the CPU."""
    torch.manual_seed(0)
    N, H, C = batch.num_nodes, 3, 4
    layer = EdgeAttention(6, C, heads=H).double()
    # duplicates, self-loops, an isolated target (node 5 in graph 1 has no in-edge)
    ei = torch.cat([batch.edge_index, batch.edge_index[:, :3], torch.tensor([[0, 2], [0, 2]])], 1)
    ei = ei[:, ei[1] != 5]
    E = ei.size(1)
    bias = torch.randn(E, H, dtype=torch.float64)
    weight = torch.rand(E, H, dtype=torch.float64) + 0.5
    es = EdgeSet(ei, num_heads=H, bias=bias, weight=weight)
    dev = layer.to(device)
    out = dev(batch.x.to(device), es.to(device), batch.batch.to(device)).view(N, H, C)
    assert out.device.type == device
    out = out.cpu()
    layer = layer.cpu()
    q = layer.lin_query(batch.x).view(N, H, C)
    k = layer.lin_key(batch.x).view(N, H, C)
    v = layer.lin_value(batch.x).view(N, H, C)
    # duplicates of one pair carry different bias/weight, which a dense matrix cannot hold: the
    # reference is a loop over targets, each a softmax over its own in-edges
    src, dst = ei
    for h in range(H):
        ref = torch.zeros(N, C, dtype=torch.float64)
        for i in range(N):
            e = (dst == i).nonzero().view(-1)
            if e.numel():
                logits = (q[i, h] * k[src[e], h]).sum(-1) * C**-0.5 + bias[e, h]
                p = torch.softmax(logits, 0) * weight[e, h]
                ref[i] = (p[:, None] * v[src[e], h]).sum(0)
        assert_same(out[:, h], ref)
    # without per-edge attributes, duplicates are extra softmax terms
    plain = layer.to(device)(batch.x.to(device), ei.to(device), batch.batch.to(device))
    plain = plain.view(N, H, C).cpu()
    cnt = torch.zeros(N, N, dtype=torch.float64)
    cnt.index_put_((ei[1], ei[0]), torch.ones(E, dtype=torch.float64), accumulate=True)
    for h in range(H):
        assert_same(plain[:, h], dense_reference(q[:, h], k[:, h], v[:, h], cnt, C**-0.5))
    assert torch.all(plain[5] == 0)  # no in-edge -> 0


@pytest.mark.parametrize("edge_dim", [None, 3])
def test_reference_equals_pyg_transformer_conv(batch, edge_dim):
    torch.manual_seed(1)
    ei = batch.edge_index
    ea = torch.randn(ei.size(1), 3, dtype=torch.float64) if edge_dim else None
    ours = EdgeAttention(6, 4, heads=2, edge_dim=edge_dim).double()
    ref = TransformerConv(6, 4, heads=2, root_weight=False, edge_dim=edge_dim).double()
    missing, unexpected = ref.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all(m.startswith("lin_skip") for m in missing)  # unused skip
    x1 = batch.x.clone().requires_grad_()
    x2 = batch.x.clone().requires_grad_()
    o1, (e1, a1) = ours(x1, ei, batch.batch, edge_attr=ea, return_attention_weights=True)
    o2, (e2, a2) = ref(x2, ei, edge_attr=ea, return_attention_weights=True)
    assert_same(o1, o2)
    assert torch.equal(e1, e2)
    assert_same(a1, a2)
    o1.pow(2).sum().backward()
    o2.pow(2).sum().backward()
    assert_same(x1.grad, x2.grad)
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert_same(p.grad, ref_params[name].grad)


@pytest.mark.parametrize("device", DEVICES)
def test_per_head_edges_equal_masked_shared(batch, device):
    """Per-head edge sets == head-shared edges whose foreign-head copies are masked out."""
    torch.manual_seed(2)
    H = 2
    batch = batch.to(device)
    layer = EdgeAttention(6, 3, heads=H).double().to(device)
    ei = batch.edge_index
    head = torch.randint(0, H, (ei.size(1),)).to(device)
    out = layer(batch.x, EdgeSet(ei, head=head, num_heads=H), batch.batch).view(-1, H, 3)
    for h in range(H):
        sel = ei[:, head == h]
        ref = layer(batch.x, sel, batch.batch).view(-1, H, 3)[:, h]
        assert_same(out[:, h], ref)


def shared_source_case(batch, H, per_head, with_virtual, with_bias):
    """A SharedSourceEdgeSet over graphs of sizes (5, 1, 0, 7) with padding slots."""
    g = torch.Generator().manual_seed(3)
    ptr = batch.ptr
    B, N = batch.num_graphs, batch.num_nodes
    Hs = H if per_head else 1
    k = 4
    counts = (ptr[1:] - ptr[:-1]).tolist()
    nv = 3 if with_virtual else 0
    sources = torch.zeros(B, Hs, k, dtype=torch.long)
    mask = torch.zeros(B, Hs, k, dtype=torch.bool)
    for b, n in enumerate(counts):
        pool = [int(ptr[b]) + i for i in range(n)] + [N + j for j in range(nv)]
        for h in range(Hs):
            perm = torch.randperm(len(pool), generator=g).tolist()[:k] if pool else []
            for i, p in enumerate(perm):
                sources[b, h, i] = pool[p]
                mask[b, h, i] = True
    bias = torch.randn(B, Hs, k, generator=g, dtype=torch.float64) if with_bias else None
    weight = torch.rand(B, Hs, k, generator=g, dtype=torch.float64) + 0.5 if with_bias else None
    vx = torch.randn(nv, 6, generator=g, dtype=torch.float64) if with_virtual else None
    return SharedSourceEdgeSet(sources, ptr, num_heads=H, source_mask=mask, bias=bias,
                               weight=weight, virtual_x=vx)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("with_virtual", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("mode", ["attention", "weighted"])
@pytest.mark.parametrize("device", DEVICES)
def test_shared_sources_fast_path_equals_reference(batch, per_head, with_virtual, with_bias, mode,
                                                   device):
    torch.manual_seed(4)
    H = 2
    es = shared_source_case(batch, H, per_head, with_virtual, with_bias and mode == "attention")
    if mode == "weighted":
        es = SharedSourceEdgeSet(es.sources, es.ptr, num_heads=H, source_mask=es.source_mask,
                                 mode="weighted", weight=es.slot_weight, virtual_x=es.virtual_x)
    es, batch = es.to(device), batch.to(device)
    assert es.sources.device.type == es.ptr.device.type == device
    fast = EdgeAttention(6, 3, heads=H, mode=mode).double()
    ref = twin(fast, kernel="reference")
    fast, ref = fast.to(device), ref.to(device)
    x1, x2 = batch.x.clone().requires_grad_(), batch.x.clone().requires_grad_()
    o1, g1 = grads(lambda: fast(x1, es, batch.batch), [x1, *fast.parameters()])
    o2, g2 = grads(lambda: ref(x2, es, batch.batch), [x2, *ref.parameters()])
    assert_same(o1, o2)
    for a, b in zip(g1, g2, strict=True):
        assert_same(a, b)
    # graph 2 is empty and graph 1 has sources: nothing NaN anywhere
    assert torch.isfinite(o1).all() and o1.device.type == device


@pytest.mark.parametrize("sizes", [[7], [6, 6, 6], [6, 3]])
@pytest.mark.parametrize("mask_given", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("mode", ["attention", "weighted"])
def test_shared_sources_all_valid_equal_sizes_fast_path(sizes, mask_given, per_head, with_bias,
                                                        mode, monkeypatch):
    """Every slot valid (no mask, or an all-true one), graphs of equal size, few slots per graph:
    the fast path skips the SDPA mask and the padding and projects only the slots' rows; it must
    still equal the reference on the same edges."""
    batch = make_batch(sizes, channels=6)
    g = torch.Generator().manual_seed(5)
    H, k = 2, 3
    Hs = H if per_head else 1
    sources = torch.stack([torch.stack([int(batch.ptr[b]) + torch.randperm(n, generator=g)[:k]
                                        for _ in range(Hs)]) for b, n in enumerate(sizes)])
    mask = torch.ones_like(sources, dtype=torch.bool) if mask_given else None
    extra = {}
    if with_bias:
        key = "bias" if mode == "attention" else "weight"
        extra[key] = torch.randn(len(sizes), Hs, k, generator=g, dtype=torch.float64)
    es = SharedSourceEdgeSet(sources, batch.ptr, num_heads=H, source_mask=mask, mode=mode, **extra)
    fast = EdgeAttention(6, 3, heads=H, mode=mode).double()
    ref = twin(fast, kernel="reference")
    x1, x2 = batch.x.clone().requires_grad_(), batch.x.clone().requires_grad_()
    o1, g1 = grads(lambda: fast(x1, es, batch.batch), [x1, *fast.parameters()])
    o2, g2 = grads(lambda: ref(x2, es, batch.batch), [x2, *ref.parameters()])
    assert fast.last_kernel == "shared_slots"  # the fast layer projected only the slots' rows
    assert ref.last_kernel == "reference"
    assert_same(o1, o2)
    for a, b in zip(g1, g2, strict=True):
        assert_same(a, b)


def test_shared_sources_graph_without_sources_gives_zero(batch):
    es = shared_source_case(batch, 2, False, False, False)
    mask = es.source_mask.clone()
    mask[0] = False
    es = SharedSourceEdgeSet(es.sources, es.ptr, num_heads=2, source_mask=mask)
    layer = EdgeAttention(6, 3, heads=2).double()
    x = batch.x.clone().requires_grad_()
    out = layer(x, es, batch.batch)
    assert torch.all(out[:5] == 0)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert_same(out, twin(layer, kernel="reference")(batch.x, es, batch.batch))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("mode", ["attention", "weighted"])
@pytest.mark.parametrize("device", DEVICES)
def test_permutation_fast_path_equals_reference(batch, per_head, mode, device):
    torch.manual_seed(5)
    H, N = 3, batch.num_nodes
    Hs = H if per_head else 1
    src = torch.empty(N, Hs, dtype=torch.long)
    for b in range(batch.num_graphs):
        s, e = int(batch.ptr[b]), int(batch.ptr[b + 1])
        for h in range(Hs):
            src[s:e, h] = s + torch.randperm(e - s)
    weight = torch.randn(N, Hs, dtype=torch.float64)
    es = PermutationEdgeSet(src, num_heads=H, mode=mode, weight=weight).to(device)
    assert es.src.device.type == device
    batch = batch.to(device)
    fast = EdgeAttention(6, 2, heads=H, mode=mode).double()
    ref = twin(fast, kernel="reference")
    fast, ref = fast.to(device), ref.to(device)
    x1, x2 = batch.x.clone().requires_grad_(), batch.x.clone().requires_grad_()
    o1, g1 = grads(lambda: fast(x1, es, batch.batch), [x1, fast.lin_value.weight])
    o2, g2 = grads(lambda: ref(x2, es, batch.batch), [x2, ref.lin_value.weight])
    assert_same(o1, o2)
    for a, b in zip(g1, g2, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("complex_weights", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_operator_fast_path_equals_reference(batch, complex_weights, device):
    torch.manual_seed(6)
    counts = (batch.ptr[1:] - batch.ptr[:-1]).tolist()
    dtype = torch.complex128 if complex_weights else torch.float64
    mats = [torch.randn(n, n, dtype=dtype).to(device) for n in counts]
    batch = batch.to(device)
    op = _MatrixOperator(mats, batch.ptr, num_heads=2)
    fast = EdgeAttention(6, 3, heads=2, mode="weighted", complex_output="complex").double()
    ref = twin(fast, kernel="reference", complex_output="complex")
    fast, ref = fast.to(device), ref.to(device)
    x1, x2 = batch.x.clone().requires_grad_(), batch.x.clone().requires_grad_()
    o1 = fast(x1, op, batch.batch)
    o2 = ref(x2, op, batch.batch)
    assert_same(o1, o2)
    (o1.abs() ** 2).sum().backward()
    (o2.abs() ** 2).sum().backward()
    assert_same(x1.grad, x2.grad)
    assert o1.device.type == x1.grad.device.type == device
    if complex_weights:
        assert o1.is_complex()
        real = twin(fast).to(device)(batch.x, op, batch.batch)
        assert_same(real, o1.real)


@pytest.mark.parametrize("device", DEVICES)
def test_virtual_sources_are_projected_like_nodes(device):
    """A virtual source with the features of node j acts exactly like node j."""
    torch.manual_seed(7)
    x = torch.randn(4, 5, dtype=torch.float64).to(device)
    layer = EdgeAttention(5, 3, heads=2).double().to(device)
    real = layer(x, torch.tensor([[0, 1, 2], [3, 3, 3]], device=device))
    virt = EdgeSet(torch.tensor([[4, 1, 2], [3, 3, 3]], device=device), num_heads=2,
                   virtual_x=x[:1])
    assert_same(layer(x, virt)[3], real[3])


def test_weighted_mode_allocates_no_query_key():
    layer = EdgeAttention(8, 2, heads=4, mode="weighted")
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"lin_value.weight", "lin_value.bias"}
    x, ei = torch.randn(3, 8), torch.tensor([[0, 2], [1, 1]])
    with pytest.raises(ValueError, match="weighted"):
        layer(x, EdgeSet(ei, num_heads=4))
    # a plain edge_index is an explicit edge set in the layer's mode: a sum of values here
    v = layer.lin_value(x).view(3, 4, 2)
    assert torch.allclose(layer(x, ei).view(3, 4, 2)[1], v[0] + v[2])


@pytest.mark.parametrize("device", DEVICES)
def test_return_attention_weights_per_head_and_structured(batch, device):
    es = shared_source_case(batch, 2, True, True, False).to(device)
    batch = batch.to(device)
    layer = EdgeAttention(6, 3, heads=2).double().to(device)
    out, (edge_index, alpha) = layer(batch.x, es, batch.batch, return_attention_weights=True)
    assert out.device.type == edge_index.device.type == alpha.device.type == device
    out, edge_index, alpha, es, batch = (out.cpu(), edge_index.cpu(), alpha.cpu(), es.to("cpu"),
                                         batch.cpu())
    layer = layer.cpu()
    ex = es.to_explicit()
    assert torch.equal(edge_index, ex.edge_index)
    assert alpha.shape == (ex.num_edges, 2)
    # off-head entries are 0, and every (target, head) with in-edges sums to 1
    assert torch.all(alpha[torch.arange(ex.num_edges), 1 - ex.head] == 0)
    sums = torch.zeros(batch.num_nodes, 2, dtype=torch.float64).index_add_(0, ex.edge_index[1], alpha)
    has = torch.zeros(batch.num_nodes, 2, dtype=torch.bool)
    has[ex.edge_index[1], ex.head] = True
    assert torch.allclose(sums[has], torch.ones_like(sums[has]))
    assert_same(out, layer(batch.x, es, batch.batch))


def test_lazy_init_repr_reset_and_dropout():
    layer = EdgeAttention(-1, 4, heads=2, dropout=0.5)
    x = torch.randn(5, 7)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    layer.train()
    out = layer(x, ei)
    assert out.shape == (5, 8)
    assert repr(layer) == "EdgeAttention(-1, 4, heads=2)"
    layer.eval()
    a = layer(x, ei)
    layer.reset_parameters()
    b = layer(x, ei)
    assert not torch.allclose(a, b)
    assert EdgeAttention(3, 2, heads=1, concat=False)(torch.randn(2, 3), ei[:, :1]).shape == (2, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_bitwise(batch, device):
    layer = EdgeAttention(6, 4, heads=2).to(device)
    batch = batch.to(device)
    x = batch.x.float().requires_grad_()
    ei = batch.edge_index
    a = layer(x, ei, batch.batch)
    (ga,) = torch.autograd.grad(a.square().sum(), x)
    b = layer(x, ei, batch.batch)
    (gb,) = torch.autograd.grad(b.square().sum(), x)
    assert a.device.type == device
    assert torch.equal(a, b) and torch.equal(ga, gb)


def test_producer_inside_layer_sees_projections(batch):
    seen = {}

    class Spy(ga.EdgeProducer):
        def produce(self, ctx):
            seen["q"] = ctx.query()
            seen["v"] = ctx.value()
            return EdgeSet(ctx.attr("edge_index"), num_heads=ctx.num_heads)

    layer = EdgeAttention(6, 3, heads=2).double()
    out = layer(batch.x, Spy(), batch.batch, data=batch)
    assert seen["q"].shape == (batch.num_nodes, 2, 3)
    assert_same(seen["v"], layer.lin_value(batch.x).view(-1, 2, 3))
    assert_same(out, layer(batch.x, batch.edge_index, batch.batch))


def _weighted_cases(batch):
    torch.manual_seed(9)
    N, H = batch.num_nodes, 2
    src = torch.empty(N, 1, dtype=torch.long)
    for b in range(batch.num_graphs):
        s, e = int(batch.ptr[b]), int(batch.ptr[b + 1])
        src[s:e, 0] = s + torch.randperm(e - s)
    shared = shared_source_case(batch, H, False, True, False)
    return {
        "explicit": EdgeSet(batch.edge_index, num_heads=H, mode="weighted"),
        "permutation": PermutationEdgeSet(src, num_heads=H, mode="weighted"),
        "shared_sources": SharedSourceEdgeSet(shared.sources, shared.ptr, num_heads=H,
                                              source_mask=shared.source_mask, mode="weighted",
                                              virtual_x=shared.virtual_x),
    }


@pytest.mark.parametrize("structure", ["explicit", "permutation", "shared_sources"])
@pytest.mark.parametrize("kernel", ["auto", "reference"])
def test_weighted_mode_dropout_is_applied_and_unbiased(batch, structure, kernel):
    """Attention dropout is never silently ignored: in weighted mode it drops whole messages and
    rescales the rest, so training outputs differ from evaluation but agree with it on average."""
    es = _weighted_cases(batch)[structure]
    layer = EdgeAttention(6, 3, heads=2, mode="weighted", dropout=0.5, kernel=kernel).double()
    layer.eval()
    expected = layer(batch.x, es, batch.batch)
    layer.train()
    torch.manual_seed(0)
    draws = torch.stack([layer(batch.x, es, batch.batch) for _ in range(600)])
    assert not torch.allclose(draws[0], expected)
    # each output is a sum of a few messages kept with probability 1/2 and doubled: the mean of
    # 600 draws lies within 6 standard errors of the evaluation output (false alarm < 1e-8)
    se = draws.std(0) / 600**0.5
    assert torch.all((draws.mean(0) - expected).abs() <= 6 * se + 1e-12)


def test_operator_edge_set_refuses_attention_dropout(batch):
    counts = (batch.ptr[1:] - batch.ptr[:-1]).tolist()
    op = _MatrixOperator([torch.randn(n, n, dtype=torch.float64) for n in counts], batch.ptr,
                         num_heads=2)
    layer = EdgeAttention(6, 3, heads=2, mode="weighted", dropout=0.1).double()
    with pytest.raises(ValueError, match="operator edge set"):
        layer(batch.x, op, batch.batch)
    assert EdgeAttention(6, 3, heads=2, mode="weighted").double()(batch.x, op, batch.batch).shape == (
        batch.num_nodes, 6)


def test_edge_features_of_a_union_project_only_the_featured_rows_with_the_same_result():
    """Exphormer's union fills the features of expander / virtual edges with zeros; the layer
    projects the other rows only, with the output and every gradient of the full projection."""
    torch.manual_seed(0)
    N, F_e = 12, 5
    x = torch.randn(N, 8, dtype=torch.float64, requires_grad=True)
    inp = torch.randint(0, N, (2, 15))
    attr = torch.randn(15, F_e, dtype=torch.float64, requires_grad=True)
    extra = torch.randint(0, N, (2, 40))
    layer = EdgeAttention(8, 4, heads=2, edge_dim=F_e, kernel="fused").double()
    if ga.kernels.cpu_extension.cpu_ops(warn=False) is None:
        pytest.skip("the fused CPU kernel is unavailable")

    def run(hint: bool):
        es = ga.union_edge_sets([EdgeSet(inp, num_heads=2, edge_attr=attr),
                                 EdgeSet(extra, num_heads=2)], N, coalesce=True)
        assert featured_rows(es) is not None
        if not hint:
            es._featured = None
        calls = []
        handle = layer.lin_edge.register_forward_hook(lambda m, i, o: calls.append(i[0].size(0)))
        try:
            out = layer(x, es)
        finally:
            handle.remove()
        assert layer.last_kernel == "fused"
        # with the marks, only the featured rows go through the projection
        assert calls == [int(es._featured.sum()) if hint else es.num_edges]
        grads = torch.autograd.grad(out.square().sum(), [x, attr, *layer.parameters()])
        return out, grads

    out_hint, g_hint = run(True)
    out_full, g_full = run(False)
    torch.testing.assert_close(out_hint, out_full, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_hint, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("edge_index, match", [
    ([[0, 1, 2], [1, -2, 3]], "negative node index"),
    ([[0, 1, 2], [1, 7, 3]], "node index 7, out of range"),
])
def test_validate_false_names_a_bad_target_index_on_the_reference_path(edge_index, match):
    """``validate=False`` skips the index checks, but the reference path counts targets anyway:
    a bad index is named there instead of torch's bincount error."""
    conv = EdgeAttention(8, 4, heads=2, validate=False, kernel="reference")
    with pytest.raises(ValueError, match=match):
        conv(torch.randn(5, 8), torch.tensor(edge_index))
