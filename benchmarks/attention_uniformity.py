"""Why the main job's attention is uniform: the Cora hybrid (examples/configs/cora.toml) trained for
300 epochs (full batch, the epoch with the best validation accuracy kept) with three treatments of
weight decay, then its per-layer normalised attention entropy (``H/log d`` of ``trace.summary()``,
1 = uniform over each node's neighbours):

* ``l2``: Adam with L2 5e-4 on every parameter (as shipped);
* ``l2-noqk``: the same without decay on the attention's query and key projections;
* ``adamw``: decoupled weight decay (AdamW, 5e-4) instead of L2.

    python benchmarks/attention_uniformity.py MODE SEED      # one line: val, test, H/log d per layer
"""

from __future__ import annotations

import copy
import sys

import torch

from graphattn.runner.build import build_configured_task, build_model, prepare_task
from graphattn.runner.config import load_config_file, resolve_config
from graphattn.tracing import trace

QK = ("lin_query", "lin_key")


def main(mode: str, seed: int) -> str:
    torch.set_num_threads(1)
    cfg = resolve_config({**load_config_file("examples/configs/cora.toml"), "seeds": [seed]})
    task = prepare_task(build_configured_task(cfg), cfg)
    g = task.graph
    torch.manual_seed(seed)
    model = build_model(cfg, task)
    model.eval()
    model(g)  # sizes the lazy layers
    qk = [p for n, p in model.named_parameters() if any(s in n for s in QK)]
    rest = [p for p in model.parameters() if all(p is not q for q in qk)]
    if mode == "l2":
        opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    elif mode == "l2-noqk":
        opt = torch.optim.Adam([{"params": rest}, {"params": qk, "weight_decay": 0.0}], lr=0.005,
                               weight_decay=5e-4)
    elif mode == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=0.005, weight_decay=5e-4)
    else:
        raise SystemExit(f"MODE must be l2, l2-noqk or adamw, got {mode!r}")
    best: tuple[float, float, dict] = (-1.0, 0.0, {})
    for _ in range(300):
        model.train()
        opt.zero_grad()
        out = model(g)
        torch.nn.functional.cross_entropy(out[g.train_mask], g.y[g.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(g).argmax(-1)
        val = (pred[g.val_mask] == g.y[g.val_mask]).float().mean().item()
        test = (pred[g.test_mask] == g.y[g.test_mask]).float().mean().item()
        if val > best[0]:
            best = (val, test, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    model.eval()
    with torch.no_grad(), trace(model) as t:
        model(g)
    entropy = [round(s["entropy_normalized"], 3) for s in t.summary()]
    return f"{mode} {seed} val {round(best[0], 4)} test {round(best[1], 4)} H/log d {entropy}"


if __name__ == "__main__":
    print(main(sys.argv[1], int(sys.argv[2])), flush=True)
