"""Argument checks shared by the layers, the producers and the models: each names the argument and
what was expected."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


def all_finite(t: Tensor) -> Tensor:
    """A 0-d bool tensor on ``t``'s device (not read to the host): no NaN and no infinity in ``t``.

    ``torch.isfinite(t).all()`` writes a mask as large as ``t`` first (~4 ns per element on one
    CPU thread); the extremes are one reduction without a temporary, and since ``amin``/``amax``
    propagate NaN, ``amin > -inf and amax < inf`` is false exactly when an entry is NaN or ±inf."""
    if not t.numel() or not (t.is_floating_point() or t.is_complex()):
        return torch.ones((), dtype=torch.bool, device=t.device)
    if t.is_complex():
        return torch.isfinite(t).all()
    lo, hi = torch.aminmax(t.detach())
    return (lo > -math.inf) & (hi < math.inf)


def check_positive_int(name: str, value: Any, *, allow_zero: bool = False) -> int:
    """Validates a producer hyperparameter."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"'{name}' must be a {kind} int, got {value!r}")
    return value


def check_sized_channels(owner: str, channels: Any) -> int:
    """``channels`` of a producer whose parameters need the input width at construction
    (``lazy_channels = False``: SAMSA, the Converter): ``-1`` (lazy) is refused with what to do
    instead, anything else must be a positive int."""
    if channels == -1 and not isinstance(channels, bool):
        raise ValueError(f"{owner} sizes its parameters by the input width: 'channels' = -1 (lazy) is "
                         f"not supported; give the model in_channels= (the raw feature width) or a "
                         f"node encoder")
    return check_positive_int("channels", channels)


def check_int(name: str, value: Any) -> int:
    """Validates an integer argument of any sign (a seed): a bool, a float or a string is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{name}' must be an int, got {value!r}")
    return value


def check_channels(name: str, value: Any, *, lazy: bool = True, optional: bool = False) -> Any:
    """Validates a width: a positive int, ``-1`` for lazy initialisation (PyG's convention) where
    ``lazy``, ``None`` where ``optional``. ``0`` and other negative values are refused (they used
    to pass for lazy)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and not (lazy and value == -1)):
        what = "a positive int" + (" or -1 (lazy)" if lazy else "") + (" or None" if optional else "")
        raise ValueError(f"'{name}' must be {what}, got {value!r}")
    return value


def resolve_num_heads(num_heads: Any, heads: Any, owner: str) -> int | None:
    """The heads a producer is built for: ``num_heads`` (the one spelling of the producer contract)
    or ``heads`` (its older spelling, still accepted); both given must agree. ``None`` if neither."""
    if num_heads is not None and heads is not None and num_heads != heads:
        raise ValueError(f"{owner} got num_heads={num_heads!r} and heads={heads!r}; give 'num_heads' "
                         f"only ('heads' is its older spelling)")
    value = num_heads if num_heads is not None else heads
    return None if value is None else check_positive_int("num_heads", value)


def check_number(name: str, value: Any, *, minimum: float | None = None,
                 strict: bool = False) -> float:
    """Validates a real hyperparameter: a finite int or float (a bool, a string, NaN or inf is
    refused); with ``minimum``, at least ``minimum`` (``strict``: above it)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise ValueError(f"'{name}' must be a finite number{bound}, got {value!r}")
    return float(value)


def check_rate(name: str, value: Any) -> float:
    """Validates a probability (a dropout rate): a real number in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"'{name}' must be a number in [0, 1), got {value!r}")
    return float(value)


def check_node_features(x: Any, in_channels: int, module: nn.Module) -> None:
    """The checks of a layer's node features ``x``: a 2-D floating-point tensor with
    ``in_channels`` columns (any width when ``in_channels`` is ``-1``, lazy) and the dtype of
    ``module``'s parameters (:func:`check_dtype`)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"'x' must be 2-D [N, F], got shape {list(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"'x' must be a floating-point tensor, got {x.dtype}")
    if in_channels > 0 and x.size(1) != in_channels:
        raise ValueError(f"'x' must have in_channels={in_channels} columns, got {x.size(1)}")
    check_dtype("x", x, module, type(module).__name__)


def check_data_attributes(data: Any, num_nodes: int) -> None:
    """Shapes of the per-node and per-edge attributes of ``data`` that producers may read: ``pos``
    (``[N]`` or ``[N, d]``, floating point) and ``edge_attr`` (``[E]`` or ``[E, F]``, one row per
    edge of ``data.edge_index``). Metadata only (no host read); a :class:`ValueError` names
    the attribute. A malformed attribute is refused even where the chosen producer does not read
    it: the same ``data`` would silently feed another producer wrong values."""
    if data is None:
        return
    pos = getattr(data, "pos", None)
    if pos is not None:
        if not isinstance(pos, Tensor) or pos.dim() not in (1, 2) or pos.size(0) != num_nodes:
            shape = list(pos.shape) if isinstance(pos, Tensor) else type(pos).__name__
            raise ValueError(f"'data.pos' must be a tensor [N={num_nodes}] or [N={num_nodes}, d], "
                             f"got {shape}")
        if not pos.is_floating_point():
            raise ValueError(f"'data.pos' must be floating point, got {pos.dtype}")
    edge_attr = getattr(data, "edge_attr", None)
    edge_index = getattr(data, "edge_index", None)
    if edge_attr is not None:
        if not isinstance(edge_attr, Tensor) or edge_attr.dim() not in (1, 2):
            shape = list(edge_attr.shape) if isinstance(edge_attr, Tensor) else type(edge_attr).__name__
            raise ValueError(f"'data.edge_attr' must be a 1-D or 2-D tensor [E, F_e], got {shape}")
        if (isinstance(edge_index, Tensor) and edge_index.dim() == 2
                and edge_attr.size(0) != edge_index.size(1)):
            raise ValueError(f"'data.edge_attr' must have one row per edge of 'data.edge_index' "
                             f"({edge_index.size(1)}), got shape {list(edge_attr.shape)}")


def check_dtype(name: str, x: Tensor, module: nn.Module, what: str) -> None:
    """A clear error when the floating-point ``x`` does not have the dtype of ``module``'s
    parameters (instead of ``mat1 and mat2 must have the same dtype`` deep inside a projection).
    Inputs are not cast: cast ``x`` or the module (``module.to(dtype)``). Under
    :func:`torch.autocast` (mixed precision) the projections cast themselves: no check."""
    if not x.is_floating_point() or torch.is_autocast_enabled(x.device.type):
        return
    param = next((p for p in module.parameters() if p.is_floating_point()), None)
    if param is not None and x.dtype != param.dtype:
        raise ValueError(f"'{name}' has dtype {x.dtype} but {what} has parameters of dtype "
                         f"{param.dtype}; cast one to the other ({name}.to({param.dtype}) or "
                         f"module.to({x.dtype}))")


_CHECKED = threading.local()


@contextmanager
def inputs_checked() -> Iterator[None]:
    """Inside the block the layers (:class:`~graphattn.HybridLayer`,
    :class:`~graphattn.EdgeAttention`) skip the value checks of their inputs: the caller
    (:class:`~graphattn.GraphTransformer`) checked the data once, with one host read, and its layers
    receive what its encoders and earlier layers made of it (a NaN arising in training is caught by
    the trainer's check of the loss)."""
    depth = getattr(_CHECKED, "depth", 0)
    _CHECKED.depth = depth + 1
    try:
        yield
    finally:
        _CHECKED.depth = depth


def inputs_are_checked() -> bool:
    """Whether the caller is inside :func:`inputs_checked`."""
    return bool(getattr(_CHECKED, "depth", 0))
