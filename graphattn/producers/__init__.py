"""Edge-set producers, registered by name in :data:`PRODUCERS`.

Static producers: ``input`` (the data's edges), ``full``, ``window``, ``global``, ``knn``, ``random``,
``expander``, ``virtual`` and ``union``. The mechanism producers register themselves the same way.
"""

from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.producers.expander import ExpanderEdges
from graphattn.producers.full import FullAttention
from graphattn.producers.global_tokens import GlobalTokens
from graphattn.producers.input import InputEdges
from graphattn.producers.knn import KNNEdges
from graphattn.producers.random import RandomEdges
from graphattn.producers.registry import (
    PRODUCERS,
    build_producer,
    get_producer,
    register_producer,
)
from graphattn.producers.union import UnionProducer
from graphattn.producers.virtual import VirtualNodes
from graphattn.producers.window import SlidingWindow

# the mechanism producers (one module each; they register themselves by name)
from graphattn.producers import converter, sac, samsa, sbm, sliceformer  # noqa: F401  isort: skip

__all__ = [
    "PRODUCERS",
    "EdgeProducer",
    "ExpanderEdges",
    "FullAttention",
    "GlobalTokens",
    "InputEdges",
    "KNNEdges",
    "ProducerContext",
    "RandomEdges",
    "SlidingWindow",
    "UnionProducer",
    "VirtualNodes",
    "build_producer",
    "get_producer",
    "register_producer",
]
