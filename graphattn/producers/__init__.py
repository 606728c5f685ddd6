"""Edge-set producers, registered by name in :data:`PRODUCERS`.

Static producers: ``input`` (the data's edges), ``full``, ``window``, ``global``, ``knn``, ``random``,
``expander``, ``virtual`` and ``union``. The mechanism producers register themselves the same way, one
subpackage per paper, each holding its producer and its operations: :mod:`~graphattn.producers.sac`,
:mod:`~graphattn.producers.samsa`, :mod:`~graphattn.producers.sbm`,
:mod:`~graphattn.producers.sliceformer` and :mod:`~graphattn.producers.converter`.

For writing a producer: :class:`EdgeProducer`, :class:`ProducerContext`, :func:`register_producer`,
:func:`explicit_edge_set` (an edge set whose edges all come from one named origin),
:func:`producer_generator` (the generator of a seeded producer) and :class:`KeyedRandom` (random
numbers keyed by graph and draw, so that a graph's draws never depend on its batch-mates).
"""

from graphattn._lazy import install_moved_modules
from graphattn.producers._util import explicit_edge_set, producer_generator
from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.producers.expander import ExpanderEdges
from graphattn.producers.full import FullAttention
from graphattn.producers.global_tokens import GlobalTokens
from graphattn.producers.input import InputEdges
from graphattn.producers.keyed_random import KeyedRandom
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

# the mechanism producers (one subpackage per paper; they register themselves by name)
from graphattn.producers import converter, sac, samsa, sbm, sliceformer  # noqa: F401  isort: skip

#: old module paths of the mechanisms' modules (before one subpackage per paper) → new ones, kept
#: for one release (importing an old path warns with a DeprecationWarning). A module whose names were
#: split over several new modules maps to its subpackage, which exports them all.
MOVED_MODULES = {
    "graphattn.producers.sac_ops": "graphattn.producers.sac",
    "graphattn.producers.sac_decoder": "graphattn.producers.sac",
    "graphattn.producers.sac_distances": "graphattn.producers.sac.distances",
    "graphattn.producers.sac_policy": "graphattn.producers.sac.parallel",
    "graphattn.producers.samsa_ops": "graphattn.producers.samsa.sampling",
    "graphattn.producers.sbm_sampling": "graphattn.producers.sbm",
    "graphattn.producers.sliceformer_ops": "graphattn.producers.sliceformer",
    "graphattn.producers.converter_ops": "graphattn.producers.converter",
    "graphattn.producers.converter_operator": "graphattn.producers.converter.chain_operator",
}
install_moved_modules(MOVED_MODULES)

__all__ = [
    "PRODUCERS",
    "EdgeProducer",
    "ExpanderEdges",
    "FullAttention",
    "GlobalTokens",
    "InputEdges",
    "KNNEdges",
    "KeyedRandom",
    "ProducerContext",
    "RandomEdges",
    "SlidingWindow",
    "UnionProducer",
    "VirtualNodes",
    "build_producer",
    "explicit_edge_set",
    "get_producer",
    "producer_generator",
    "register_producer",
]
