r"""Dropout on the CPU: graphattn's counter-based kernel (``graphattn.kernels.dropout``) against
:func:`torch.nn.functional.dropout` (one Bernoulli draw per element from torch's Mersenne Twister).

For each thread count, forward alone and forward + backward (``y.sum().backward()``) on a
``[rows, cols]`` float32 tensor (default: a Peptides batch's hidden states, 19290 × 96), median of
``--reps`` calls after 3 warm-ups, both in this one process.

Example (the command behind the ratio in ``docs/kernels.md``)::

    python benchmarks/bench_dropout.py --threads 1 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from graphattn.kernels.cpu_extension import cpu_ops
from graphattn.kernels.dropout import dropout


def median_ms(fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rows", type=int, default=19290)
    p.add_argument("--cols", type=int, default=96)
    p.add_argument("--p", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args(argv)
    if cpu_ops(warn=False) is None:
        raise SystemExit("bench_dropout.py: the compiled CPU extension is unavailable")
    x = torch.randn(args.rows, args.cols)
    xr = x.clone().requires_grad_()
    print(f"# [{args.rows}, {args.cols}] float32, p = {args.p}, torch {torch.__version__}")
    print("| threads | pass | torch F.dropout ms | graphattn ms | × faster |")
    print("|---|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        cases = {
            "forward": (lambda: F.dropout(x, args.p, True), lambda: dropout(x, args.p)),
            "forward + backward": (lambda: F.dropout(xr, args.p, True).sum().backward(),
                                   lambda: dropout(xr, args.p).sum().backward()),
        }
        for name, (theirs, ours) in cases.items():
            a, b = median_ms(theirs, args.reps), median_ms(ours, args.reps)
            print(f"| {threads} | {name} | {a:.2f} | {b:.2f} | {a / b:.1f} |", flush=True)


if __name__ == "__main__":
    main()
