r"""Why Sliceformer is not applicable to a node task: the league's Cora model with the Sliceformer
producer, trained in the data set's node order, under a random relabelling of the nodes (the same
split), and with the sorted branch's output zeroed (the model without Sliceformer).

Sliceformer gives slot :math:`r` the :math:`r`-th order statistic of each channel, not a value
computed from node :math:`r`; Planetoid's public split puts the training nodes at indices 0–139
and the test nodes at 1708–2707. Each run prints the epoch with the best validation accuracy and
the training nodes' accuracy in training and in evaluation mode::

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/sliceformer_node_order.py --seeds 0 1

(log: ``benchmarks/results/cpu-2026-11-29/sliceformer_node_order.log``).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from graphattn import GraphTransformer
from graphattn.runner.build import build_configured_task, prepare_task
from graphattn.runner.config import resolve_config
from graphattn.runner.league import league_config


def relabel(data: Data, seed: int) -> Data:
    """``data`` with its nodes in a random order (node ``i`` of the result is node ``perm[i]``)."""
    perm = torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(seed))
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel())
    out = data.clone()
    for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
        out[key] = data[key][perm]
    out.edge_index = inv[data.edge_index]
    return out


def train(data: Data, cfg: dict, seed: int, ablate: bool) -> dict[str, float]:
    torch.manual_seed(seed)
    model = GraphTransformer(cfg["hidden"], int(data.y.max()) + 1, num_layers=cfg["layers"],
                             producer="sliceformer", conv=None, heads=cfg["heads"],
                             dropout=cfg["dropout"], attn_dropout=cfg["attn_dropout"],
                             input_dropout=cfg["input_dropout"], norm=None, act=cfg["act"],
                             node_encoder="linear", head_layers=cfg["head_layers"],
                             residual=cfg["residual"], ffn=cfg["ffn"], task="node",
                             allow_order_dependent=True)
    if ablate:  # the sorted branch's output (before W_O) replaced by zeros
        for layer in model.layers:
            layer.attn.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
    model(data)  # sizes the lazy encoder
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])

    def accuracy(out: torch.Tensor, mask: torch.Tensor) -> float:
        return float((out[mask].argmax(-1) == data.y[mask]).float().mean())

    best: dict[str, float] = {"val": -1.0}
    for epoch in range(1, cfg["epochs"] + 1):
        model.train()
        opt.zero_grad()
        out = model(data)
        F.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            ev = model(data)
        row = {"epoch": epoch, "train (train mode)": accuracy(out, data.train_mask),
               "train (eval mode)": accuracy(ev, data.train_mask),
               "val": accuracy(ev, data.val_mask), "test": accuracy(ev, data.test_mask)}
        if row["val"] > best["val"]:
            best = row
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = resolve_config(league_config("cora", "full", seeds=[0], out="unused"))
    data = prepare_task(build_configured_task(cfg), cfg).graph
    print("| node order | Sliceformer branch | seed | best epoch | train (train mode) | "
          "train (eval mode) | val | test |")
    print("|---|---|---|---|---|---|---|---|")
    for order in ("data set", "random relabelling"):
        for ablate in (False, True):
            for seed in args.seeds:
                graph = data if order == "data set" else relabel(data, 1234)
                r = train(graph, cfg, seed, ablate)
                print(f"| {order} | {'zeroed' if ablate else 'on'} | {seed} | {r['epoch']} | "
                      f"{r['train (train mode)']:.3f} | {r['train (eval mode)']:.3f} | "
                      f"{r['val']:.3f} | {r['test']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
