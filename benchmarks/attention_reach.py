r"""How far each league entrant's first attention layer reaches: the share of a node's attention
output that depends on the nodes at each distance from it in the sequence.

For a node :math:`i` of one ListOps test sequence, the sensitivity of the first attention layer's
output :math:`o_i` to its input :math:`x_j` is :math:`s_j = \lVert \partial (\sum_c o_{ic}) /
\partial x_j \rVert`; the script prints :math:`\sum_{j : |i-j| \in D} s_j / \sum_j s_j` for the
distance bins :math:`D`, for the CLS node (:math:`i = 0`, what the read-out sees) and for the
middle node, at initialisation and, given run folders, for their trained models (the epoch with
the best validation metric)::

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/attention_reach.py --entrants full converter \
        --runs benchmarks/results/league/listops/converter benchmarks/results/league/listops/full

The checkpoints are not committed (a run folder keeps its config and results); rerun the cells to
read trained models. Log: ``benchmarks/results/cpu-2026-11-29/attention_reach.log``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch_geometric.data import Batch, Data

from graphattn.runner.build import build_configured_task, build_model, prepare_task
from graphattn.runner.checkpoint import restore
from graphattn.runner.config import resolve_config
from graphattn.runner.league import league_config

BINS = ((0, 1), (1, 5), (5, 20), (20, 50), (50, 10**9))


def reach(model: nn.Module, graph: Data) -> dict[int, dict[str, float]]:
    """``{node: {distance bin: share of the sensitivity}}`` of the first attention layer."""
    cap: dict[str, torch.Tensor] = {}
    attn = model.layers[0].attn  # type: ignore[index]

    def pre(mod: nn.Module, args: tuple, kwargs: dict) -> tuple:
        x = args[0].detach().requires_grad_(True)
        cap["x"] = x
        return (x, *args[1:]), kwargs

    def post(mod: nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        cap["out"] = out[0] if isinstance(out, tuple) else out  # type: ignore[assignment]

    handles = [attn.register_forward_pre_hook(pre, with_kwargs=True),
               attn.register_forward_hook(post, with_kwargs=True)]
    try:
        model.eval()
        model(Batch.from_data_list([graph]))
    finally:
        for h in handles:
            h.remove()
    x, out = cap["x"], cap["out"]
    n = x.size(0)
    dist = torch.arange(n)
    shares = {}
    for node in (0, n // 2):
        (grad,) = torch.autograd.grad(out[node].sum(), x, retain_graph=True)
        s = grad.norm(dim=-1)
        s = s / s.sum()
        d = (dist - node).abs()
        shares[node] = {f"{a}–{min(b, n) - 1}": float(s[(d >= a) & (d < b)].sum()) for a, b in BINS
                        if a < n}
    return shares


def _print(name: str, graph: Data, shares: dict[int, dict[str, float]]) -> None:
    for node, bins in shares.items():
        text = ", ".join(f"{k}: {v:.3f}" for k, v in bins.items())
        print(f"| {name} | {graph.num_nodes} | {node} | {text} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entrants", nargs="+", default=["full", "converter"])
    p.add_argument("--runs", nargs="*", default=[], help="league run folders (trained models)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = resolve_config(league_config("listops", "full", seeds=[0], out="unused"))
    task = prepare_task(build_configured_task(cfg), cfg)
    graph = max((task.splits["test"][i] for i in range(50)), key=lambda g: g.num_nodes)
    print("| model | nodes | node | share of the sensitivity by distance |")
    print("|---|---|---|---|")
    for entrant in args.entrants:
        torch.manual_seed(args.seed)
        cfg_e = resolve_config(league_config("listops", entrant, seeds=[0], out="unused"))
        model = build_model(cfg_e, task)
        _print(f"{entrant}, initialisation (seed {args.seed})", graph, reach(model, graph))
    for run in args.runs:
        for seed_dir in sorted(Path(run).glob("seed*")):
            if not (seed_dir / "best.pt").is_file():
                continue
            model, _ = restore(seed_dir / "best.pt")
            _print(f"{Path(run).name}, trained ({seed_dir.name})", graph, reach(model, graph))


if __name__ == "__main__":
    main()
