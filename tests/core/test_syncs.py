"""Host synchronisations: the counter itself, and the pinned count of one training step.

On a GPU every host synchronisation stalls the Python thread until the device is idle. The counts
below are those of one training step (forward, backward, Adam) of a 4-layer hybrid model on a batch
of 8 graphs; they are pinned so that a change that adds a synchronisation to the hot path fails
here (lower them when a change removes some)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from graphattn import GraphTransformer
from graphattn.core.syncs import count_host_syncs, cpu_only

#: producer spec → the most host synchronisations one training step may make (measured)
PINNED = {
    "input": 8,
    "expander": 10,
    "virtual": 15,
    "union": 22,
    "full": 18,
    "samsa": 39,
}
SPECS = {
    "input": "input",
    "expander": "expander",
    "virtual": "virtual",
    "union": {"name": "union", "producers": ["input", {"name": "expander", "degree": 3}, "virtual"]},
    "full": "full",
    "samsa": {"name": "samsa", "k": 4},
}


def test_the_counter_sees_every_kind_of_sync():
    x = torch.arange(6.0)
    with count_host_syncs() as syncs:
        x.sum().item()
        int(x[0])
        bool(x[1] > 0)
        x.tolist()
        x[x > 2]
        x.nonzero()
        torch.bincount(torch.tensor([0, 1, 1]))
        torch.repeat_interleave(torch.tensor([1, 2]))
    assert syncs.total == 8, syncs
    with count_host_syncs() as syncs:
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        torch.where(x > 2, x, -x)
        x[torch.tensor([0, 2])]
    assert syncs.total == 0, syncs


def test_cpu_only_branches_are_not_counted():
    """A block that only CPU tensors take (e.g. the layer's projection of featured edge rows)
    makes no sync on a GPU, so the count, which is the GPU's, leaves it out; nesting works."""
    x = torch.arange(6.0)
    with count_host_syncs() as syncs:
        with cpu_only():
            x.nonzero()
            with cpu_only():
                x[x > 2]
            x.sum().item()
        x.nonzero()
    assert syncs.total == 1, syncs


def test_optimizer_step_counters_are_not_device_syncs():
    w = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.Adam([w])
    w.sum().backward()
    with count_host_syncs() as syncs:
        opt.step()
    assert syncs.total == 0, syncs


def _batch(num_graphs: int = 8, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(6, 14, (1,), generator=g))
        src = torch.arange(n - 1)
        ei = torch.cat([torch.stack([src, src + 1]), torch.stack([src + 1, src])], 1)
        graphs.append(Data(x=torch.randn(n, 5, generator=g), edge_index=ei,
                           edge_attr=torch.randn(ei.size(1), 3, generator=g),
                           y=torch.randn(1, 2, generator=g)))
    return Batch.from_data_list(graphs)


@pytest.mark.parametrize("name", list(PINNED))
def test_training_step_host_syncs_are_pinned(name):
    torch.manual_seed(0)
    model = GraphTransformer(32, 2, num_layers=4, producer=SPECS[name], conv="gine", heads=4,
                             edge_encoder="linear", task="graph")
    batch = _batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = (model(batch) - batch.y).abs().mean()
        loss.backward()
        opt.step()

    step()  # lazy parameters, the fused kernel's first load
    with count_host_syncs(sites=True) as syncs:
        step()
    sites = "\n".join(f"  {n} × {s}" for s, n in syncs.by_site.most_common())
    assert syncs.total <= PINNED[name], f"{syncs.total} host syncs (pinned {PINNED[name]}):\n{sites}"
