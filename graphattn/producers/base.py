"""The producer interface, re-exported for producer modules: :class:`EdgeProducer` and
:class:`ProducerContext` (defined in :mod:`graphattn.core.contract`, which documents the contract) and the
argument checks of :mod:`graphattn.core.checks`."""

from graphattn.core.checks import (
    check_channels,
    check_dtype,
    check_int,
    check_node_features,
    check_number,
    check_positive_int,
    check_rate,
    check_sized_channels,
    resolve_num_heads,
)
from graphattn.core.contract import EdgeProducer, ProducerContext

__all__ = [
    "EdgeProducer",
    "ProducerContext",
    "check_channels",
    "check_dtype",
    "check_int",
    "check_node_features",
    "check_number",
    "check_positive_int",
    "check_rate",
    "check_sized_channels",
    "resolve_num_heads",
]
