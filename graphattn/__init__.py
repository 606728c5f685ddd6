"""graphattn: efficient attention on graphs as edge-set producers and one sparse attention layer."""

from graphattn import producers
from graphattn.attention import EdgeAttention
from graphattn.edgeset import EdgeSet, union_edge_sets
from graphattn.nn import GraphTransformer, HybridLayer
from graphattn.origins import origin_code, origin_name
from graphattn.producers import EdgeProducer, ProducerContext
from graphattn.structured import OperatorEdgeSet, PermutationEdgeSet, SharedSourceEdgeSet
from graphattn.trace import AttentionTrace, trace

__version__ = "0.1.0"

__all__ = [
    "AttentionTrace",
    "EdgeAttention",
    "EdgeProducer",
    "EdgeSet",
    "GraphTransformer",
    "HybridLayer",
    "OperatorEdgeSet",
    "PermutationEdgeSet",
    "ProducerContext",
    "SharedSourceEdgeSet",
    "origin_code",
    "origin_name",
    "producers",
    "trace",
    "union_edge_sets",
]
