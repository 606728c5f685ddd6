r"""Why the SBM-Transformer's citation cells draw the same graph in every seed: its league cell
(``benchmarks/results/league/<task>/sbm/config.json``: Adam at 0.005 with L2 5e-4 on every
parameter, as GAT) trained for a few epochs under three treatments of weight decay, printing after
every epoch the standard deviation of each layer's cluster embeddings :math:`C` and query
projection :math:`W_Q`, and the first layer's sampled and expected density of the training step:

* ``l2``: the league's optimiser, L2 5e-4 on every parameter (as the cells were trained);
* ``l2-nosbm``: the same without decay on the SBM's own parameters (clusters, membership MLP) and
  on the attention's query and key projections, from which the memberships are computed;
* ``adamw``: decoupled weight decay 5e-4 (AdamW) on every parameter, what
  ``--set '{"optimizer": "adamw"}'`` trains.

At initialisation the memberships are :math:`\sigma(\cdot) \approx 1/2` and the expected density
:math:`1/4 + \delta`; a model whose memberships learn nothing stays there.

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/sbm_citation_decay.py MODE SEED EPOCHS [TASK]

(one JSON line per epoch; ``TASK`` is ``cora`` (default) or ``citeseer``).
"""

from __future__ import annotations

import json
import sys

import torch

from graphattn.producers import EdgeProducer
from graphattn.runner.build import build_configured_task, prepare_task
from graphattn.runner.config import load_config_file, resolve_config
from graphattn.runner.folders import _run_config
from graphattn.runner.trainer import Trainer

QK = ("lin_query", "lin_key")
MODES = ("l2", "l2-nosbm", "adamw")


def main(mode: str, seed: int, epochs: int, task_name: str = "cora") -> None:
    if mode not in MODES:
        raise SystemExit(f"MODE must be one of {MODES}, got {mode!r}")
    torch.set_num_threads(1)
    league = load_config_file(f"benchmarks/results/league/{task_name}/sbm/config.json")
    cfg = resolve_config(_run_config(league))  # what the cell computes, not how it was run
    task = prepare_task(build_configured_task(cfg), cfg)
    trainer = Trainer(cfg, task, seed, None)
    model = trainer.model
    if mode == "l2-nosbm":
        free = {id(p) for m in model.modules() if isinstance(m, EdgeProducer) for p in m.parameters()}
        free |= {id(p) for n, p in model.named_parameters() if any(s in n for s in QK)}
        groups = [{"params": [p for p in model.parameters() if id(p) not in free]},
                  {"params": [p for p in model.parameters() if id(p) in free], "weight_decay": 0.0}]
        trainer.optimizer = torch.optim.Adam(groups, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    if mode == "adamw":
        trainer.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"],
                                              weight_decay=cfg["weight_decay"])
    if mode != "l2":
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, trainer._lr_factor)
    for epoch in range(1, epochs + 1):
        loss = trainer.train_epoch()
        stats = model.layers[0].last_edges.stats
        row = {"mode": mode, "seed": seed, "task": task_name, "epoch": epoch, "loss": round(loss, 4),
               "density": round(float(stats["density"]), 4),
               "expected_density": round(float(stats["expected_density"]), 4)}
        for name, p in model.named_parameters():
            if name.endswith("producer.clusters") or name.endswith("lin_query.weight"):
                row[name] = round(float(p.detach().std()), 5)
        if epoch == epochs:
            row.update({k: round(v, 4) for k, v in trainer.evaluate(("val", "test")).items()})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5])
