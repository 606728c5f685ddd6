"""Attention kernels (installed as ``graphattn.kernels``).

* :mod:`.reference` — pure-torch SDDMM → segment softmax → SpMM on destination-sorted edges; the
  oracle every fast path is tested against.
* :mod:`.dense` — fast paths for structured edge sets (shared sources via SDPA, permutation gather).
* :mod:`.fused` — the fused kernel for explicit edge sets (cached CSR/CSC, autograd Function):
  a C++/OpenMP extension on CPU (:mod:`.cpu_extension`, built on first use; a cache-blocked,
  head-vectorised variant for fp32 with a multiple of 4 heads), Triton on CUDA
  (:mod:`.triton_attention`).
"""

from .dense import gather_rows, permutation_gather, shared_source_attention
from .fused import (
    FusedGraph,
    attention_probs,
    build_graph,
    fused_attention,
    fused_explicit_attention,
    prepare_graph,
)
from .reference import edge_attention, sddmm, segment_softmax, spmm

__all__ = [
    "FusedGraph",
    "attention_probs",
    "build_graph",
    "edge_attention",
    "fused_attention",
    "fused_explicit_attention",
    "gather_rows",
    "permutation_gather",
    "prepare_graph",
    "sddmm",
    "segment_softmax",
    "shared_source_attention",
    "spmm",
]
