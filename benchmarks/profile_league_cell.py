r"""Where one training epoch of a league cell spends its time: the cell's configuration
(``benchmarks/results/league/<task>/<entrant>/config.json``, as the league trained it), seed 0,
one thread; one epoch to warm up (and build the fused kernel), then ``EPOCHS`` epochs under
``torch.profiler``, printing each epoch's wall time and the operators with the most self CPU time.

    GRAPHATTN_MIRROR=../shared/datasets python benchmarks/profile_league_cell.py TASK ENTRANT [EPOCHS] [ROWS]

e.g. ``cora sbm`` (the SBM at its initial density of 1/4) against ``cora full`` (dense attention).
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from graphattn.runner.build import build_configured_task, prepare_task
from graphattn.runner.config import load_config_file, resolve_config
from graphattn.runner.folders import _run_config
from graphattn.runner.trainer import Trainer


def main(task_name: str, entrant: str, epochs: int = 1, rows: int = 20) -> None:
    torch.set_num_threads(1)
    league = load_config_file(f"benchmarks/results/league/{task_name}/{entrant}/config.json")
    cfg = resolve_config(_run_config(league))  # what the cell computes, not how it was run
    trainer = Trainer(cfg, prepare_task(build_configured_task(cfg), cfg), 0, None)
    start = time.perf_counter()
    trainer.train_epoch()
    print(f"warm-up epoch: {time.perf_counter() - start:.2f} s", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for epoch in range(1, epochs + 1):
            start = time.perf_counter()
            trainer.train_epoch()
            print(f"profiled epoch {epoch}: {time.perf_counter() - start:.2f} s", flush=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4, 5):
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
