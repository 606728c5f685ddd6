"""Attention kernels (installed as ``graphattn.kernels``).

* :mod:`.reference` — pure-torch SDDMM → segment softmax → SpMM on destination-sorted edges; the
  oracle every fast path is tested against.
* :mod:`.dense` — fast paths for structured edge sets (shared sources via SDPA, permutation gather).
"""

from .dense import permutation_gather, shared_source_attention
from .reference import edge_attention, sddmm, segment_softmax, spmm

__all__ = [
    "edge_attention",
    "permutation_gather",
    "sddmm",
    "segment_softmax",
    "shared_source_attention",
    "spmm",
]
