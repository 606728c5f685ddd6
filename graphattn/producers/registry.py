"""Producers by name: the CLI, the configs and :class:`~graphattn.HybridLayer` build them here.

A new producer needs one line::

    @register_producer("mine")
    class MyProducer(EdgeProducer): ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from graphattn.producers.base import EdgeProducer

PRODUCERS: dict[str, type[EdgeProducer]] = {}

P = TypeVar("P", bound=type[EdgeProducer])


def register_producer(name: str) -> Callable[[P], P]:
    """Class decorator registering an :class:`EdgeProducer` subclass under ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"producer name must be a non-empty string, got {name!r}")

    def deco(cls: P) -> P:
        if not (isinstance(cls, type) and issubclass(cls, EdgeProducer)):
            raise TypeError(f"@register_producer({name!r}) needs an EdgeProducer subclass")
        if name in PRODUCERS and PRODUCERS[name] is not cls:
            raise ValueError(f"a producer named {name!r} is already registered "
                             f"({PRODUCERS[name].__name__})")
        PRODUCERS[name] = cls
        cls.name = name
        return cls

    return deco


def get_producer(name: str) -> type[EdgeProducer]:
    try:
        return PRODUCERS[name]
    except KeyError:
        known = ", ".join(sorted(PRODUCERS))
        raise ValueError(f"unknown producer {name!r}; registered: {known}") from None


def build_producer(spec: Any, **defaults: Any) -> EdgeProducer:
    """Builds a producer from a name, a ``{"name": ..., **kwargs}`` mapping or an instance.

    ``defaults`` (e.g. ``channels``, ``heads`` supplied by the model) are passed only to producers
    whose constructor accepts them; keyword arguments in ``spec`` must all be accepted.
    """
    if isinstance(spec, EdgeProducer):
        return spec
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, Mapping):
        if "name" not in spec:
            raise ValueError(f"a producer spec mapping needs a 'name' key, got {dict(spec)}")
        kwargs = {k: v for k, v in spec.items() if k != "name"}
        name = spec["name"]
    else:
        raise ValueError(
            f"a producer must be given as a name, a mapping with 'name', or an EdgeProducer, "
            f"got {type(spec).__name__}"
        )
    cls = get_producer(name)
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in kwargs if k not in params and not takes_any]
    if unknown:
        raise ValueError(f"producer {name!r} does not take argument(s) {unknown}; "
                         f"it takes {[p for p in params if p != 'self']}")
    merged = {k: v for k, v in defaults.items() if k in params or takes_any}
    merged.update(kwargs)
    return cls(**merged)
