"""Every registered producer (and model preset) on every device: ``GraphTransformer`` on a batch of
three small random graphs, moved with its data to ``device`` (``"cpu"``, and ``"cuda"`` marked
``cuda``). Training-mode forward and backward: the output, the gradients, the auxiliary loss and the
policy-gradient terms lie on the device and are finite. Evaluation mode: where a producer is
deterministic across devices, the device model's output equals the CPU model's (same state dict)
to 1e-4. A caller's generator (on the CPU or on the device) drives every producer on the device,
reproducibly. Edge sets (explicit and structured) and the fused kernel's graph layout keep their
inputs' device.
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch

from graphattn import EdgeSet, PermutationEdgeSet, SharedSourceEdgeSet
from graphattn.core.union import union_edge_sets
from graphattn.nn.registry import get_model, model_options
from graphattn.runner.choices import MODEL_NAMES, PRODUCER_NAMES
from tests.core.test_edgeset import _MatrixOperator
from tests.helpers import CUDA_MARKS, make_batch

HIDDEN, OUT, HEADS = 16, 3, 2
SIZES = (6, 4, 5)
EDGE_DIM = 4


def case(producer, *, model="hybrid", across_devices=True, eval_generator=False, on_cpu=True,
         **kwargs):
    """A model configuration. ``across_devices``: its evaluation output is the same on every device
    (no draw from a device's generator); ``eval_generator``: evaluate with a caller's CPU generator
    (whose draws are the same on every device); ``on_cpu=False``: CUDA only (a variant whose CPU
    behaviour the producer's own tests cover, kept out of the CPU run for time)."""
    return {"producer": producer, "model": model, "across_devices": across_devices,
            "eval_generator": eval_generator, "on_cpu": on_cpu, "kwargs": kwargs}


#: one or more configurations per producer (the name before ``:``) and model preset
CASES = {
    "input": case({"name": "input", "self_loops": True}, conv="gcn"),
    "input:edge_attr": case("input", conv="gine", edge_encoder="linear"),
    "full": case("full"),
    "window": case({"name": "window", "window": 2}),
    "global": case({"name": "global"}, conv="gcn"),
    "knn": case({"name": "knn", "k": 3}),
    # evaluation draws from a generator of the device unless the caller passes one
    "random": case({"name": "random", "k": 3}, eval_generator=True),
    "expander": case({"name": "expander", "degree": 2}),
    "virtual": case({"name": "virtual", "num_virtual": 2}, conv="gcn"),
    "union": case({"name": "union", "producers": [{"name": "window", "window": 1}, "virtual", "input"]}),
    # GCN+ with a global branch over the bonds (their features too) and a virtual node
    "union:gcnplus_attention": case({"name": "union", "producers": ["input", "virtual"]},
                                    model="gcnplus_attention", node_encoder="linear",
                                    edge_encoder="linear", attn_channels=4, head_layers=2,
                                    attn_edge_features=True),
    "samsa": case({"name": "samsa", "k": 3}),
    "samsa:model": case({"name": "samsa", "k": 3}, model="samsa"),
    # the expected edge counts (float) decide Poisson draws: not the same draws on every device
    "sbm": case({"name": "sbm", "num_clusters": 4}, across_devices=False),
    "sliceformer": case("sliceformer"),
    "sac": case({"name": "sac", "alpha": 2}),
    "sac:shared": case({"name": "sac", "alpha": 2, "shared": True, "decode": "beam"},
                       on_cpu=False),
    "sac:parallel": case({"name": "sac", "alpha": 2, "policy": "parallel"}, on_cpu=False),
    # sampled candidate lists: evaluation draws them from a generator of the device
    "sac:candidates": case({"name": "sac", "alpha": 2, "policy": "parallel", "num_candidates": 2},
                           across_devices=False, on_cpu=False),
    "converter": case("converter"),
    "converter:model": case({"name": "converter"}, model="converter", head_layers=2,
                            node_encoder="linear"),
}


#: node-level models (one output row per node, no attention layers): their own test below
NODE_CASES = {
    "grand": {"producer": "input", "steps": 2, "feature_dropout": 0.5},
    "grand:batch_norm": {"producer": "input", "steps": 2, "norm": "batch_norm"},
}


def name_device_params() -> list:
    """``(name, device)`` for every case: on the CPU (unless ``on_cpu=False``) and on CUDA."""
    params = []
    for name, c in CASES.items():
        if c["on_cpu"]:
            params.append(pytest.param(name, "cpu", id=f"cpu-{name}"))
        params.append(pytest.param(name, "cuda", marks=CUDA_MARKS, id=f"cuda-{name}"))
    return params


def test_every_producer_and_model_has_a_case():
    assert {name.split(":")[0] for name in CASES} == set(PRODUCER_NAMES)
    models = {c["model"] for c in CASES.values()}
    # the anchors have no producer and no edge set: tests/nn/test_baselines.py covers the citation
    # ones (PyG's layers), tests/nn/test_gcn_plus.py GCN+ on every device
    anchors = {m for m in MODEL_NAMES if "producer" not in model_options(m)}
    assert anchors == {"gcn", "gat", "gcnplus"}
    node_models = {name.split(":")[0] for name in NODE_CASES}
    assert models == set(MODEL_NAMES) - anchors - node_models


def data_batch() -> Batch:
    """Three small random graphs (duplicate edges and self-loops included) with node features,
    positions and edge features (float32, on the CPU)."""
    batch = make_batch(SIZES, channels=8, edges_per_node=2, seed=3, dtype=torch.float32)
    g = torch.Generator().manual_seed(4)
    batch.edge_attr = torch.randn(batch.edge_index.size(1), EDGE_DIM, generator=g)
    return batch


def build(name: str) -> torch.nn.Module:
    c = CASES[name]
    torch.manual_seed(0)
    cls = get_model(c["model"])
    heads = {"heads": HEADS} if "heads" in model_options(c["model"]) else {}
    return cls(HIDDEN, OUT, num_layers=2, producer=c["producer"], **heads, **c["kwargs"])


def on(device: str, *tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.device.type == device for t in tensors)


def eval_output(model: torch.nn.Module, data: Batch, name: str) -> torch.Tensor:
    model.eval()
    gen = torch.Generator().manual_seed(5) if CASES[name]["eval_generator"] else None
    with torch.no_grad():
        return model(data, generator=gen)


@pytest.mark.parametrize("name, device", name_device_params())
def test_model_trains_and_evaluates_on_device(name, device):
    data = data_batch()
    # the CPU model: materialises the lazy parameters; its state dict goes to the device model
    model = build(name)
    expected = eval_output(model, data, name)
    if device != "cpu":
        cpu_model, model = model, build(name)
        model.load_state_dict(cpu_model.state_dict())
        model.to(device)
        assert all(on(device, t) for t in (*model.parameters(), *model.buffers()))
        data = data.to(device)
        # evaluation: the CPU's output where the producer draws nothing from the device
        out = eval_output(model, data, name)
        assert out.shape == (len(SIZES), OUT) and on(device, out) and torch.isfinite(out).all()
        if CASES[name]["across_devices"]:
            torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)
    assert expected.shape == (len(SIZES), OUT) and torch.isfinite(expected).all()

    # training: forward, the training signals, backward
    model.train()
    torch.manual_seed(1)
    out = model(data)
    assert out.shape == (len(SIZES), OUT) and on(device, out) and torch.isfinite(out).all()
    # the device of structured edge sets is read from their structure, without enumerating edges
    assert model.edge_sets() and all(es.device.type == device for es in model.edge_sets())
    loss = out.square().mean()
    aux = model.aux_loss()
    if aux is not None:
        assert aux.dim() == 0 and on(device, aux) and torch.isfinite(aux)
        loss = loss + aux
    for log_prob, graph in model.policy_terms():
        assert on(device, log_prob, graph) and torch.isfinite(log_prob).all()
        assert graph.dtype == torch.long and log_prob.shape == graph.shape
        loss = loss + 1e-2 * log_prob.sum()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads
    for n, g in grads.items():
        assert on(device, g) and torch.isfinite(g).all(), n


def build_node_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return get_model(name.split(":")[0])(HIDDEN, OUT, **NODE_CASES[name])


@pytest.mark.parametrize("name", list(NODE_CASES))
def test_node_model_trains_and_evaluates_on_device(name, device):
    """A node-level model on ``device``: its evaluation output equals the CPU model's (same state
    dict), a training pass draws its DropNode masks from a caller's generator reproducibly, and the
    gradients lie on the device and are finite."""
    data = data_batch()
    N = sum(SIZES)
    model = build_node_model(name)
    model.eval()
    with torch.no_grad():
        expected = model(data)
    assert expected.shape == (N, OUT) and torch.isfinite(expected).all()
    if device != "cpu":
        cpu_model, model = model, build_node_model(name)
        model.load_state_dict(cpu_model.state_dict())
        model.to(device).eval()
        data = data.to(device)
        with torch.no_grad():
            out = model(data)
        assert on(device, out)
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)

    model.train()
    outs = []
    for _ in range(2):
        torch.manual_seed(1)  # the dropout layers draw alike
        gen = torch.Generator(device=device).manual_seed(6)
        out, signals = model(data, generator=gen, return_signals=True)
        assert out.shape == (N, OUT) and on(device, out) and torch.isfinite(out).all()
        assert signals.edge_sets and all(es.device.type == device for es in signals.edge_sets)
        outs.append(out)
    torch.testing.assert_close(outs[0], outs[1])
    outs[0].square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads
    for n, g in grads.items():
        assert on(device, g) and torch.isfinite(g).all(), n


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("gen_device", ["cpu", "cuda"], ids=lambda d: f"{d}_generator")
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA_MARKS)])
def test_callers_generator_drives_the_producer_on_device(name, gen_device, device):
    """A training-mode forward on CUDA with a caller's generator (a CPU one, or a CUDA one) runs
    and is reproducible: the same seed gives the same output. (On the CPU the producers' own tests
    check their generators.)"""
    model = build(name).to(device)
    data = data_batch().to(device)
    model.train()
    outs = []
    for _ in range(2):
        torch.manual_seed(2)  # anything else that draws (dropout) draws alike
        gen = torch.Generator(device=gen_device).manual_seed(6)
        out = model(data, generator=gen)
        assert on(device, out) and torch.isfinite(out).all()
        outs.append(out.detach().cpu())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- edge sets
def test_edge_sets_stay_on_their_inputs_device(device):
    g = torch.Generator().manual_seed(7)
    N, H = 9, 2
    batch = torch.tensor([0] * 4 + [1] * 5, device=device)
    ptr = torch.tensor([0, 4, 9], device=device)
    src = torch.tensor([0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 8], device=device)
    dst = torch.tensor([1, 2, 3, 0, 0, 5, 6, 7, 8, 4, 4], device=device)
    E = src.numel()

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device)

    es = EdgeSet(torch.stack([src, dst]), num_heads=H, bias=rnd(E, H), weight=rnd(E).abs(),
                 edge_attr=rnd(E, 3), virtual_x=rnd(1, 4),
                 origin=torch.zeros(E, dtype=torch.long, device=device))
    es.validate(N, batch)
    assert es.device.type == device

    def check(e: EdgeSet) -> None:
        fields = [e.edge_index, e.head, e.bias, e.weight, e.edge_attr, e.origin, e.virtual_x]
        assert on(device, *fields), e

    perm, rowptr, rows = es.csr(N)
    assert on(device, perm, rowptr, rows)
    head = torch.tensor([0, 1] * 5 + [0], device=device)
    per_head = EdgeSet(torch.stack([src, dst]), head=head, num_heads=H, bias=rnd(E))
    for e in (es.coalesce(), es.expand_heads(), es.select(src != dst), es.to("cpu").to(device),
              es.detach(), per_head.coalesce(),
              union_edge_sets([es.replace(edge_attr=None), per_head], N, coalesce=True)):
        check(e)

    # structured edge sets: their explicit edges and checks on the device of their tensors
    sources = torch.tensor([[[0, 1, 2]], [[4, 6, 9]]], device=device)  # 9: the virtual source
    mask = torch.tensor([[[True, True, False]], [[True, True, True]]], device=device)
    shared = SharedSourceEdgeSet(sources, ptr, num_heads=H, source_mask=mask,
                                 bias=rnd(2, 1, 3), virtual_x=rnd(1, 4))
    perm_src = torch.tensor([[1, 0], [2, 3], [3, 1], [0, 2], [5, 8], [4, 6], [7, 5], [8, 4], [6, 7]],
                            device=device)
    permutation = PermutationEdgeSet(perm_src, num_heads=H, weight=rnd(N, H))
    operator = _MatrixOperator([rnd(4, 4).double(), rnd(5, 5).double()], ptr, num_heads=H)
    for s in (shared, permutation, operator):
        s.validate(N, batch)
        ex = s.to_explicit()
        check(ex)
        assert ex.num_edges == s.num_edges
    assert on(device, operator.matvec(rnd(N, H, 2).double()))


def test_fused_graph_layout_stays_on_the_device(device):
    from graphattn.kernels import prepare_graph

    src = torch.tensor([0, 1, 2, 3, 3, 1], device=device)
    dst = torch.tensor([1, 2, 3, 0, 0, 1], device=device)
    head = torch.tensor([0, 1, 1, 0, 1, 0], device=device)
    for es in (EdgeSet(torch.stack([src, dst]), num_heads=2),
               EdgeSet(torch.stack([src, dst]), head=head, num_heads=2)):
        graph = prepare_graph(es, 4, 4)
        assert on(device, graph.rowptr, graph.col, graph.eid, *graph.csc())
        assert graph.rowptr.dtype == graph.col.dtype == torch.int32


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["on_cpu"]] + list(NODE_CASES))
def test_evaluation_under_inference_mode(name):
    """Every producer and model evaluates under :func:`torch.inference_mode` (whose tensors keep no
    in-place version counter, which the edge-set and layout caches read) exactly as under
    :func:`torch.no_grad`, twice in a row (the second call must not reuse a cache keyed by a
    counter that inference tensors lack), and with the batch itself made under inference mode."""
    model = build_node_model(name) if name in NODE_CASES else build(name)
    data = data_batch()
    gen = (lambda: torch.Generator().manual_seed(5)) if CASES.get(name, {}).get("eval_generator") \
        else (lambda: None)
    model(data)  # lazy parameters
    model.eval()
    with torch.no_grad():
        expected = model(data, generator=gen())
    with torch.inference_mode():
        first = model(data, generator=gen())
        second = model(data, generator=gen())
        inference_data = data_batch().clone()
        third = model(inference_data, generator=gen())
    for out in (first, second, third):
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
