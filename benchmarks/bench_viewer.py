"""Times the stages of ``graphattn viz`` on a trained run (a benchmark, not a test).

    python benchmarks/bench_viewer.py runs/samsa-listops-1k 0
    python benchmarks/bench_viewer.py runs/geometric-shapes 36

Prints the seconds spent importing, restoring the run, tracing the sample, building the view,
drawing and writing the default PNG figure and the HTML page (written to a temporary folder).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    run, sample = argv[0], int(argv[1]) if len(argv) > 1 else 0
    t0 = time.perf_counter()
    from torch_geometric.data import Batch

    from graphattn.runner import restore
    from graphattn.viz import build_view, trace_and_predict, write_output

    t1 = time.perf_counter()
    model, task = restore(run)
    t2 = time.perf_counter()
    data = task.sample(sample)
    focus = sample if task.level == "node" else None
    batch = data if focus is not None else Batch.from_data_list([data])
    trace, _ = trace_and_predict(model, batch)
    t3 = time.perf_counter()
    view = build_view(trace, batch, focus=focus, kind=task.modality, labels=task.node_labels(data))
    t4 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        write_output(view, Path(tmp) / "graph.png")
        t5 = time.perf_counter()
        write_output(view, Path(tmp) / "page.html")
        t6 = time.perf_counter()
    print(f"{run} sample {sample}: {view.num_nodes} nodes | imports {t1 - t0:.1f} s, restore "
          f"{t2 - t1:.1f} s, trace {t3 - t2:.1f} s | view {t4 - t3:.2f} s + png {t5 - t4:.2f} s = "
          f"{t5 - t3:.2f} s to render; html {t6 - t5:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
