"""graphattn: efficient attention on graphs as edge-set producers and one sparse attention layer.

The public names are imported on first use (PEP 562), so ``import graphattn`` and the command
line's ``--help`` do not pay for importing torch and PyG until something needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphattn._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "AttentionTrace": "graphattn.tracing",
    "BaseEdgeSet": "graphattn.edgeset",
    "EdgeAttention": "graphattn.attention",
    "EdgeProducer": "graphattn.producers",
    "EdgeSet": "graphattn.edgeset",
    "ExplicitOnlyError": "graphattn.edgeset",
    "GraphTransformer": "graphattn.nn",
    "HybridLayer": "graphattn.nn",
    "MemoryBudgetError": "graphattn.memory",
    "OperatorEdgeSet": "graphattn.structured",
    "PermutationEdgeSet": "graphattn.structured",
    "ProducerContext": "graphattn.producers",
    "SharedSourceEdgeSet": "graphattn.structured",
    "StructuredEdgeSet": "graphattn.structured",
    "get_memory_budget": "graphattn.memory",
    "memory_budget": "graphattn.memory",
    "origin_code": "graphattn.origins",
    "origin_name": "graphattn.origins",
    "set_memory_budget": "graphattn.memory",
    "trace": "graphattn.tracing",
    "union_edge_sets": "graphattn.edgeset",
}
_SUBPACKAGES = ("producers", "nn", "data", "runner", "viz", "kernels", "memory", "interop")

__all__ = [
    "AttentionTrace",
    "BaseEdgeSet",
    "EdgeAttention",
    "EdgeProducer",
    "EdgeSet",
    "ExplicitOnlyError",
    "GraphTransformer",
    "HybridLayer",
    "MemoryBudgetError",
    "OperatorEdgeSet",
    "PermutationEdgeSet",
    "ProducerContext",
    "SharedSourceEdgeSet",
    "StructuredEdgeSet",
    "get_memory_budget",
    "memory",
    "memory_budget",
    "origin_code",
    "origin_name",
    "producers",
    "set_memory_budget",
    "trace",
    "union_edge_sets",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from graphattn import memory, producers
    from graphattn.attention import EdgeAttention
    from graphattn.edgeset import BaseEdgeSet, EdgeSet, ExplicitOnlyError, union_edge_sets
    from graphattn.memory import MemoryBudgetError, get_memory_budget, memory_budget, set_memory_budget
    from graphattn.nn import GraphTransformer, HybridLayer
    from graphattn.origins import origin_code, origin_name
    from graphattn.producers import EdgeProducer, ProducerContext
    from graphattn.structured import (
        OperatorEdgeSet,
        PermutationEdgeSet,
        SharedSourceEdgeSet,
        StructuredEdgeSet,
    )
    from graphattn.tracing import AttentionTrace, trace


__getattr__, __dir__ = lazy_exports("graphattn", globals(), _EXPORTS, _SUBPACKAGES)
