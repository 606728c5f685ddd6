"""Sliceformer's input checks (:mod:`graphattn.producers.sliceformer`), shared by the sorting
functions and the producer."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """``value`` if it is one of ``allowed``, else a ``ValueError`` naming ``name``."""
    if value not in allowed:
        raise ValueError(f"'{name}' must be one of {allowed}, got {value!r}")
    return value


def check_values(values: Any) -> Tensor:
    """``values`` if it is a 2-D floating-point tensor without NaN (one column per slice)."""
    if not isinstance(values, Tensor) or values.dim() != 2:
        shape = list(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"'values' must be a 2-D tensor [N, C] (one column per slice), got {shape}")
    if not values.is_floating_point():
        raise ValueError(f"'values' must be a floating-point tensor, got {values.dtype}")
    if values.numel() and bool(torch.isnan(values).any()):
        raise ValueError("'values' contains NaN: a sort of NaN has no meaningful order")
    return values


def check_batch(batch: Any, num_nodes: int) -> Tensor | None:
    """``batch`` if it is ``None`` or one non-negative long graph id per node."""
    if batch is None:
        return None
    if not isinstance(batch, Tensor) or batch.dim() != 1 or batch.numel() != num_nodes:
        shape = list(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
        raise ValueError(f"'batch' must be 1-D with one graph id per node [{num_nodes}], got {shape}")
    if batch.dtype != torch.long:
        raise ValueError(f"'batch' must have dtype torch.long, got {batch.dtype}")
    if num_nodes and int(batch.min()) < 0:
        raise ValueError("'batch' must hold non-negative graph ids")
    return batch


def batch_is_sorted(batch: Tensor) -> bool:
    """Whether the graph ids are non-decreasing (a PyG ``Batch``)."""
    return batch.numel() < 2 or bool((batch[1:] >= batch[:-1]).all())


def is_single_graph(batch: Tensor) -> bool:
    """Whether all nodes belong to one graph."""
    return batch.numel() < 2 or bool((batch == batch[0]).all())
