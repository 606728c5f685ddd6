"""The compiled loops of the SBM samplers, and the switch that turns them off."""

from __future__ import annotations

from typing import Any

from torch import Tensor

#: use the compiled loops of the samplers (fastRG's per-edge draws, Bernoulli's per-pair uniforms,
#: the edge gate's backward) on the CPU when the extension is available (``False`` forces the torch
#: paths: the same edges, the same gradients up to summation order)
NATIVE_SAMPLERS = True


def sampler_ops(Y: Tensor) -> Any | None:
    """The compiled sampler operations for ``Y``'s device (``None``: use the torch paths, on a GPU,
    without the extension or with :data:`NATIVE_SAMPLERS` off)."""
    if not NATIVE_SAMPLERS or Y.device.type != "cpu":
        return None
    from graphattn.kernels.cpu_extension import cpu_ops

    ops = cpu_ops(warn=False)
    return ops if ops is not None and hasattr(ops, "sbm_node_tables") else None
