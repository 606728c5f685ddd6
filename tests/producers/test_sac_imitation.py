"""SAC's warm-start imitation (``warm_start_imitation``): the forced sequence gives every origin its
input in-neighbours, the loss is their teacher-forced negative log-likelihood (checked against
``SAC.log_prob_of``), it trains the predictor only and towards the input edges, and with the option
off nothing changes."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from graphattn.producers.base import ProducerContext
from graphattn.producers.sac import SAC
from graphattn.producers.sac.imitation import imitation_actions, imitation_loss
from graphattn.producers.sac.layout import layout


def ring(n: int) -> torch.Tensor:
    s = torch.arange(n)
    return torch.stack([torch.cat([s, (s + 1) % n]), torch.cat([(s + 1) % n, s])])


def two_graphs() -> Batch:
    """A ring of 6 and a path of 4 plus an isolated node (degrees 0 to 2, a self-loop on node 1 of
    the path that the imitation must skip)."""
    gen = torch.Generator().manual_seed(0)
    path = torch.tensor([[0, 1, 1, 2, 2, 3, 1], [1, 0, 2, 1, 3, 2, 1]])
    return Batch.from_data_list([
        Data(x=torch.randn(6, 5, generator=gen, dtype=torch.float64), edge_index=ring(6)),
        Data(x=torch.randn(5, 5, generator=gen, dtype=torch.float64), edge_index=path),
    ])


def sac(**kw) -> SAC:
    torch.manual_seed(0)
    kw = {"alpha": 2, "all_nodes": True, "warm_start": 100, "warm_start_imitation": 1.0,
          "distance": "input_graph", **kw}
    return SAC(**kw).double()


def context(p: SAC, batch: Batch, seed: int) -> ProducerContext:
    p.train()
    p._materialise(ProducerContext(batch.x, batch.batch, num_heads=1, data=batch))
    return ProducerContext(batch.x, batch.batch, num_heads=1, data=batch, training=True,
                           generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kw", [{}, {"alpha": 1, "candidates": "hops", "max_distance": 2},
                                {"alpha": 3, "no_repeat": False}])
def test_the_forced_sequence_gives_every_origin_its_input_neighbours(kw):
    batch = two_graphs()
    p = sac(**kw)
    opt = p._options()
    ctx = context(p, batch, 1)
    (origin, dest), weight = imitation_actions(ctx, opt, layout(ctx, p.node_proj, opt), p._hop_cache)
    edges = {tuple(e) for e in batch.edge_index.t().tolist() if e[0] != e[1]}
    A = int(p.alpha)
    for b in range(batch.num_graphs):
        lo, n = int(batch.ptr[b]), int(batch.ptr[b + 1] - batch.ptr[b])
        slots = [(int(o), int(d), bool(w)) for o, d, w in zip(origin[b], dest[b], weight[b], strict=True)]
        for i in range(n):
            mine = [(d, w) for o, d, w in slots if o == i][:A]
            neigh = {s - lo for s, t in edges if t == lo + i}
            chosen = [d for d, w in mine if w]
            assert set(chosen) <= neigh and len(chosen) == len(set(chosen)) == min(len(neigh), A)
            assert all(d < n for d, _ in mine)  # the fillers are nodes of the graph
    assert int(weight.sum()) == sum(min(deg, A) for deg in
                                    torch.bincount(torch.tensor([t for _, t in edges]),
                                                   minlength=batch.num_nodes).tolist())


def test_the_loss_is_the_teacher_forced_nll_of_the_neighbour_slots():
    batch = two_graphs()
    p = sac()
    opt = p._options()
    ctx = context(p, batch, 3)
    (origin, dest), weight = imitation_actions(ctx, opt, layout(ctx, p.node_proj, opt), p._hop_cache)
    loss = imitation_loss(context(p, batch, 3), opt, p.node_proj, p.predictor, p._hop_cache)
    # budgets: 6 x 2 and 5 x 2 (the isolated node keeps its α candidates, as a filler)
    ptr = batch.ptr[:-1, None]
    rows = torch.arange(origin.size(1))[None] < torch.tensor([[12], [10]])
    sampled = torch.stack([(dest + ptr)[rows], (origin + ptr)[rows]])
    lp = p.log_prob_of(batch.x, batch.batch, sampled, data=batch)
    reference = -lp[weight[rows]].mean()
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)


def test_imitation_trains_the_predictor_towards_the_input_edges():
    batch = two_graphs()
    p = sac()
    optim = torch.optim.Adam(p.parameters(), lr=0.03)
    x = batch.x.clone().requires_grad_(True)
    first = None
    for _ in range(80):
        es = p(x, batch.batch, data=batch, num_heads=1, generator=None)
        first = first if first is not None else es.stats["imitation_nll"]
        optim.zero_grad()
        es.aux_loss.backward()
        assert x.grad is None  # the loss reaches the predictor only (pg_to_nodes=False)
        optim.step()
    assert es.stats["imitation_nll"] < 0.3 * first
    p.warm_start = 0  # switch to the predicted edges: the greedy structure follows the input graph
    p.eval()
    es = p(batch.x, batch.batch, data=batch, num_heads=1)
    edges = {tuple(e) for e in batch.edge_index.t().tolist()}
    hits = sum(tuple(e) in edges for e in es.sampled_edge_index.t().tolist())
    # 18 of the 22 slots can hold an input neighbour (the ring: 12; the path: 1 + 2 + 2 + 1)
    assert hits >= 16


def test_without_imitation_nothing_changes_and_no_draw_is_made():
    batch = two_graphs()
    off = sac(warm_start_imitation=0.0)
    off(batch.x, batch.batch, data=batch, num_heads=1)  # the lazy projection draws its weights
    torch.manual_seed(5)
    state = torch.get_rng_state()
    es = off(batch.x, batch.batch, data=batch, num_heads=1)
    assert es.aux_loss is None and "imitation_nll" not in es.stats
    assert torch.equal(torch.get_rng_state(), state)
    on = sac()
    with torch.no_grad():  # no gradient: no loss
        assert on(batch.x, batch.batch, data=batch, num_heads=1).aux_loss is None
    on.eval()
    assert on(batch.x, batch.batch, data=batch, num_heads=1).aux_loss is None
    assert "warm_start_imitation=1" in repr(on)


@pytest.mark.parametrize(("kw", "match"), [
    ({"warm_start": 0}, "needs warm_start > 0"),
    ({"policy": "parallel"}, "policy='lstm'"),
    ({"all_nodes": False}, "all_nodes=True"),
    ({"head_adaptive": True, "heads": 2}, "head_adaptive=False"),
    ({"warm_start_imitation": -1.0}, "warm_start_imitation"),
    ({"warm_start_imitation": True}, "warm_start_imitation"),
    ({"warm_start_imitation": float("nan")}, "warm_start_imitation"),
])
def test_imitation_options_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        sac(**kw)


@pytest.mark.parametrize("sizes", [[1], [1, 1], [2], [0]])
def test_tiny_graphs_without_input_neighbours_give_a_zero_loss(sizes):
    graphs = [Data(x=torch.randn(n, 5, dtype=torch.float64), edge_index=torch.empty(2, 0, dtype=torch.long),
                   num_nodes=n) for n in sizes]
    batch = Batch.from_data_list(graphs)
    p = sac(alpha=1, channels=5)
    es = p(batch.x, batch.batch, data=batch, num_heads=1)
    assert float(es.aux_loss) == 0.0 and es.stats["imitation_nll"] == 0.0
