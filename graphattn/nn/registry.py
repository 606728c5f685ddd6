"""Models by name: the runner's ``model`` key picks one here.

Every registered model is built with the keyword arguments of
:class:`~graphattn.GraphTransformer` (widths, layers, producer specs, encoders, task level, ...)
plus the config's ``model_kwargs``, and offers the training interface the runner uses:
``forward(data, generator=None, return_signals=False)`` (with ``return_signals=True``:
``(out, signals)``, the :class:`~graphattn.core.signals.TrainingSignals` of the pass) and a ``layers``
list whose items expose ``last_edges``. A mechanism preset (e.g. a paper's block) is one
class registered with::

    @register_model("mine")
    class Mine(GraphTransformer): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

MODELS: dict[str, type[nn.Module]] = {}

M = TypeVar("M", bound=type[nn.Module])


def register_model(name: str) -> Callable[[M], M]:
    """Class decorator registering a model class under ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name must be a non-empty string, got {name!r}")

    def deco(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@register_model({name!r}) needs an nn.Module subclass")
        if name in MODELS and MODELS[name] is not cls:
            raise ValueError(f"a model named {name!r} is already registered ({MODELS[name].__name__})")
        MODELS[name] = cls
        return cls

    return deco


def get_model(name: str) -> type[nn.Module]:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; registered: {known}") from None
