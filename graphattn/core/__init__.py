"""The core: edge sets (explicit and structured), the attention layer, its dispatch and the
producer contract. Everything else in graphattn builds on these modules; they import nothing
above them (no producer, model, runner or viewer).

Rooms, from the bottom up: :mod:`~graphattn.core.index` (argument checks, CSR pointers, cache
keys), :mod:`~graphattn.core.edgeset` (:class:`BaseEdgeSet`, the explicit :class:`EdgeSet`),
:mod:`~graphattn.core.structured` (the structured kinds, siblings of :class:`EdgeSet`),
:mod:`~graphattn.core.union`, :mod:`~graphattn.core.sparse` (sparse matrices),
:mod:`~graphattn.core.inputs` (what the layer accepts as edges), :mod:`~graphattn.core.contract`
(the producer contract), :mod:`~graphattn.core.dispatch` and :mod:`~graphattn.core.attention`
(the layer). The public names are imported on first use.
"""

from __future__ import annotations

from graphattn._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("BaseEdgeSet", "EdgeSet", "ExplicitOnlyError", "MODES"), "graphattn.core.edgeset"),
    **dict.fromkeys(("OperatorEdgeSet", "PermutationEdgeSet", "SharedSourceEdgeSet",
                     "StructuredEdgeSet"), "graphattn.core.structured"),
    **dict.fromkeys(("featured_rows", "union_edge_sets"), "graphattn.core.union"),
    **dict.fromkeys(("as_edge_set", "check_graph_inputs"), "graphattn.core.inputs"),
    **dict.fromkeys(("cacheable", "derived_edge_sets", "first_occurrences", "is_known_ptr",
                     "known_ptr", "ptr_from_batch", "ptr_from_counts", "sort_rows", "tensor_version",
                     "unique_first"), "graphattn.core.index"),
    **dict.fromkeys(("EdgeProducer", "ProducerContext"), "graphattn.core.contract"),
    "EdgeAttention": "graphattn.core.attention",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("graphattn.core", globals(), _EXPORTS)
