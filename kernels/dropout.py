r"""Dropout on the CPU from a counter-based random stream (``kernels/csrc/dropout.cpp``).

.. math::
    \mathrm{dropout}(x)_i = \frac{x_i\,\kappa_i}{1 - p}, \qquad
    \kappa_i = \big[\,u(s, i) \ge \mathrm{round}(p\,2^{32})\,\big],

where :math:`u(s, i)` is a 32-bit hash of the element index :math:`i` keyed by the seed :math:`s`
(two rounds of an integer finalizer: 32-bit multiplies and shifts, which vectorise). The seed is one
int64 drawn from torch's generator per call, so a run is reproducible under ``torch.manual_seed``
and consumes the generator like any other random op. Each element is kept
with probability :math:`1 - p` (up to :math:`2^{-33}`) and the output is unbiased,
:math:`\mathbb{E}[\mathrm{dropout}(x)] = x`. The mask is a function of :math:`(s, i)` alone: it does
not depend on the number of threads, and the backward pass recomputes it from :math:`s` instead of
keeping it (:math:`\partial L / \partial x = \mathrm{dropout}_s(\partial L / \partial y)`, the same
linear map, so gradients of any order are exact).

torch's CPU dropout draws one Bernoulli variate per element from the sequential Mersenne Twister; on
a 2-core CPU that is about 15 ns per element, a sixth of a Peptides training step
(``benchmarks/bench_training.py``). This kernel is vectorisable and runs on every thread.
:func:`dropout` uses it for floating-point CPU tensors when the compiled extension is available,
and :func:`torch.nn.functional.dropout` everywhere else (CUDA has its own counter-based Philox
dropout). The mask differs from torch's for the same seed; the distribution is the same.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .cpu_extension import cpu_ops

#: use the compiled kernel on the CPU when it is available; ``False`` forces ``F.dropout``
NATIVE_DROPOUT = True
_DTYPES = (torch.float32, torch.float64)


def _native_ops(x: Tensor) -> Any | None:
    if not NATIVE_DROPOUT or x.device.type != "cpu" or x.dtype not in _DTYPES:
        return None
    ops = cpu_ops(warn=False)
    return ops if ops is not None and hasattr(ops, "dropout_apply") else None


class _CounterDropout(torch.autograd.Function):
    """``y = dropout_s(x)``; the backward applies the same mask, regenerated from the seed."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, p: float, seed: Tensor) -> Tensor:
        ctx.p = p
        ctx.save_for_backward(seed)
        return torch.ops.graphattn_fused.dropout_apply(x, p, seed)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (seed,) = ctx.saved_tensors
        return _CounterDropout.apply(grad, ctx.p, seed), None, None


def draw_seed(generator: torch.Generator | None = None) -> Tensor:
    """One int64 seed from ``generator`` (default: torch's global CPU generator), as a tensor."""
    return torch.empty((), dtype=torch.int64).random_(generator=generator)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, *,
            generator: torch.Generator | None = None, seed: Tensor | None = None) -> Tensor:
    """Dropout with :func:`torch.nn.functional.dropout`'s meaning (zero each element with
    probability ``p``, scale the rest by :math:`1 / (1 - p)`), by the counter-based kernel on the
    CPU. ``seed`` (a one-element int64 tensor) fixes the mask; otherwise one is drawn from
    ``generator``."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"'p' must be a probability in [0, 1], got {p!r}")
    if not training or p == 0.0:
        return x
    ops = _native_ops(x)
    if ops is None or p == 1.0:
        if generator is not None or seed is not None:
            raise ValueError("'generator' and 'seed' need the compiled CPU kernel "
                             "(a floating-point CPU tensor and the extension)")
        return F.dropout(x, p, True)
    if seed is None:
        seed = draw_seed(generator)
    return _CounterDropout.apply(x, float(p), seed.reshape(()).to(torch.int64))
