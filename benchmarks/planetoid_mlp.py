r"""The league's no-graph floor on the citation tasks: a 2-layer MLP on the node features.

A league column means something only when its reference entrant beats what the node features
alone give. This script measures that level on the public Planetoid split with the league's
Cora-protocol training (hidden width 64, ELU, dropout 0.6 on the input and the hidden layer, Adam
at 0.005 with L2 5e-4, 200 epochs, the epoch with the best validation accuracy), and prints one
line per (task, seed) and the mean ± sample std per task::

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/planetoid_mlp.py --tasks cora citeseer --seeds 0 1 2

(log: ``benchmarks/results/cpu-2026-11-29/planetoid_mlp.log``: Cora 0.584, CiteSeer 0.565). The
``full`` floors of :data:`graphattn.runner.protocols.REFERENCES` for ``cora`` and ``citeseer`` (0.55)
sit just under these means.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from graphattn.runner.tasks import build_task


def run(task: str, seed: int, *, hidden: int = 64, epochs: int = 200) -> tuple[float, float]:
    """``(validation, test)`` accuracy of the MLP at the epoch with the best validation accuracy."""
    data = build_task(task).graph
    assert data is not None
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Dropout(0.6), nn.Linear(data.num_features, hidden), nn.ELU(),
                          nn.Dropout(0.6), nn.Linear(hidden, int(data.y.max()) + 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    best = (-1.0, 0.0)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(data.x)[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x).argmax(-1)
        val = (pred[data.val_mask] == data.y[data.val_mask]).float().mean().item()
        test = (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()
        if val > best[0]:
            best = (val, test)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=["cora", "citeseer"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    for task in args.tasks:
        tests = []
        for seed in args.seeds:
            val, test = run(task, seed)
            tests.append(test)
            print(f"{task} seed {seed}: validation {val:.4f}, test {test:.4f}", flush=True)
        spread = statistics.stdev(tests) if len(tests) > 1 else 0.0
        print(f"{task}: test {statistics.mean(tests):.4f} ± {spread:.4f} over seeds {args.seeds}")


if __name__ == "__main__":
    main()
