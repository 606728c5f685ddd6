"""SBM-Transformer (Cho et al., NeurIPS 2022): attention graphs sampled from a mixed-membership
stochastic block model.

* :mod:`~graphattn.producers.sbm.producer` — :class:`SBMEdges`, registered as ``sbm``;
* :mod:`~graphattn.producers.sbm.model` — the block model (memberships, block matrix, expected edges);
* :mod:`~graphattn.producers.sbm.fastrg` — the exact sampler linear in the edges (fastRG);
* :mod:`~graphattn.producers.sbm.bernoulli` — the dense sampler of the official code;
* :mod:`~graphattn.producers.sbm.edges` — the drawn edges (:class:`SampledEdges`), de-duplication and
  self-loops;
* :mod:`~graphattn.producers.sbm.gate` — the straight-through edge gate;
* :mod:`~graphattn.producers.sbm.native` — the switch of the compiled sampler loops
  (``NATIVE_SAMPLERS``).
"""

from graphattn.producers.sbm.bernoulli import bernoulli_sample
from graphattn.producers.sbm.edges import (
    EXPLORATION,
    SAMPLED,
    SELF_LOOP,
    SampledEdges,
    add_self_loops,
    dedupe,
)
from graphattn.producers.sbm.fastrg import fastrg_sample
from graphattn.producers.sbm.gate import edge_gate, edge_probability
from graphattn.producers.sbm.model import (
    block_matrix,
    check_sbm,
    column_sums,
    expected_num_edges,
    graph_of_nodes,
    graph_sizes,
    key_projection,
    memberships,
)
from graphattn.producers.sbm.producer import SAMPLERS, SBM_EDGE_BYTES, STES, SBMEdges

__all__ = [
    "EXPLORATION",
    "SAMPLED",
    "SAMPLERS",
    "SBM_EDGE_BYTES",
    "SELF_LOOP",
    "STES",
    "SBMEdges",
    "SampledEdges",
    "add_self_loops",
    "bernoulli_sample",
    "block_matrix",
    "check_sbm",
    "column_sums",
    "dedupe",
    "edge_gate",
    "edge_probability",
    "expected_num_edges",
    "fastrg_sample",
    "graph_of_nodes",
    "graph_sizes",
    "key_projection",
    "memberships",
]
