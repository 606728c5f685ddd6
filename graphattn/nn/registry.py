"""Models by name: the runner's ``model`` key picks one here.

Every registered model declares the keyword arguments its constructor takes in ``OPTIONS`` (a
tuple of names), and :func:`create_model` builds it from those only: an option it does not take
is a :class:`ValueError` naming the option and the model, never dropped. (The runner passes the
options its configuration sets: those the user chose, and of the others, the ones the model
takes; see :func:`graphattn.runner.build.build_model`.) A model offers the training interface
the runner uses: ``forward(data, generator=None, return_signals=False)`` (with
``return_signals=True``: ``(out, signals)``, the :class:`~graphattn.core.signals.TrainingSignals`
of the pass) and a ``layers`` list whose items expose ``last_edges``. A mechanism preset (e.g. a
paper's block) is one class registered with::

    @register_model("mine")
    class Mine(GraphModel):
        OPTIONS = ("hidden_channels", "out_channels", "num_layers", "task", ...)

        def __init__(self, hidden_channels, out_channels, num_layers=2, task="graph", ...): ...

(:class:`~graphattn.nn.base.GraphModel`: encoder, layers and read-out; a subclass of
:class:`~graphattn.GraphTransformer` inherits its ``OPTIONS``.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torch import nn

MODELS: dict[str, type[nn.Module]] = {}

M = TypeVar("M", bound=type[nn.Module])


def register_model(name: str) -> Callable[[M], M]:
    """Class decorator registering a model class under ``name``; the class declares the keyword
    arguments its constructor takes in ``OPTIONS`` (a tuple of names)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"model name must be a non-empty string, got {name!r}")

    def deco(cls: M) -> M:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise TypeError(f"@register_model({name!r}) needs an nn.Module subclass")
        options = getattr(cls, "OPTIONS", None)
        if not (isinstance(options, (tuple, list, frozenset, set)) and options
                and all(isinstance(o, str) for o in options)):
            raise TypeError(f"@register_model({name!r}): {cls.__name__} must declare the keyword "
                            f"arguments its constructor takes, e.g. OPTIONS = ('hidden_channels', "
                            f"'out_channels', ...); got OPTIONS={options!r}")
        if name in MODELS and MODELS[name] is not cls:
            raise ValueError(f"a model named {name!r} is already registered ({MODELS[name].__name__})")
        MODELS[name] = cls
        return cls

    return deco


def get_model(name: str) -> type[nn.Module]:
    """The model class registered under ``name`` (a :class:`ValueError` listing the registered
    names otherwise)."""
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise ValueError(f"unknown model {name!r}; registered: {known}") from None


def model_options(name: str) -> frozenset[str]:
    """The keyword arguments the model registered under ``name`` takes (its ``OPTIONS``)."""
    return frozenset(get_model(name).OPTIONS)  # type: ignore[attr-defined]


def check_model_options(name: str, options: Mapping[str, Any],
                        where: Mapping[str, str] | None = None) -> None:
    """A :class:`ValueError` naming every option in ``options`` that the model ``name`` does not
    take, and the model (``where``: option -> where it was set, added to the message)."""
    accepted = model_options(name)
    refused = sorted(set(options) - accepted)
    if not refused:
        return
    said = ", ".join(repr(o) + (f" ({where[o]})" if where and o in where else "") for o in refused)
    cls = get_model(name).__name__
    raise ValueError(f"the {name!r} model ({cls}) does not use {said}: leave "
                     f"{'it' if len(refused) == 1 else 'them'} unset; it takes "
                     f"{', '.join(sorted(accepted))}")


def create_model(name: str, /, **options: Any) -> nn.Module:
    """The model registered under ``name`` built from ``options``, each one it takes
    (:func:`check_model_options`)."""
    check_model_options(name, options)
    return get_model(name)(**options)
