"""graphattn: efficient attention on graphs as edge-set producers and one sparse attention layer.

The public names are imported on first use (PEP 562), so ``import graphattn`` and the command
line's ``--help`` do not pay for importing torch and PyG until something needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphattn._lazy import install_moved_modules, lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "AttentionTrace": "graphattn.tracing",
    "BaseEdgeSet": "graphattn.core.edgeset",
    "EdgeAttention": "graphattn.core.attention",
    "EdgeProducer": "graphattn.producers",
    "EdgeSet": "graphattn.core.edgeset",
    "ExplicitOnlyError": "graphattn.core.edgeset",
    "GraphTransformer": "graphattn.nn",
    "HybridLayer": "graphattn.nn",
    "MemoryBudgetError": "graphattn.memory",
    "OperatorEdgeSet": "graphattn.core.structured",
    "PermutationEdgeSet": "graphattn.core.structured",
    "ProducerContext": "graphattn.producers",
    "SharedSourceEdgeSet": "graphattn.core.structured",
    "StructuredEdgeSet": "graphattn.core.structured",
    "get_memory_budget": "graphattn.memory",
    "memory_budget": "graphattn.memory",
    "origin_code": "graphattn.core.origins",
    "origin_name": "graphattn.core.origins",
    "set_memory_budget": "graphattn.memory",
    "trace": "graphattn.tracing",
    "union_edge_sets": "graphattn.core.union",
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
    from graphattn.core.attention import EdgeAttention
    from graphattn.core.edgeset import BaseEdgeSet, EdgeSet, ExplicitOnlyError
    from graphattn.core.origins import origin_code, origin_name
    from graphattn.core.structured import (
        OperatorEdgeSet,
        PermutationEdgeSet,
        SharedSourceEdgeSet,
        StructuredEdgeSet,
    )
    from graphattn.core.union import union_edge_sets
    from graphattn.memory import MemoryBudgetError, get_memory_budget, memory_budget, set_memory_budget
    from graphattn.nn import GraphTransformer, HybridLayer
    from graphattn.producers import EdgeProducer, ProducerContext
    from graphattn.tracing import AttentionTrace, trace


#: modules moved into graphattn.core (and the Converter's operator into its producer package);
#: the old paths import with a DeprecationWarning until the next release
MOVED_MODULES = {
    **{f"graphattn.{m}": f"graphattn.core.{m}" for m in (
        "attention", "checks", "contract", "dispatch", "origins", "policy", "signals", "structured",
        "syncs")},
    # split into core.edgeset, core.index, core.union and core.inputs: the package exports them all
    "graphattn.edgeset": "graphattn.core",
    "graphattn.operators": "graphattn.producers.converter.chain_operator",
}
install_moved_modules(MOVED_MODULES)

__getattr__, __dir__ = lazy_exports("graphattn", globals(), _EXPORTS, _SUBPACKAGES)
