"""Sliceformer (Yuan & Xu, arXiv 2310.17683): slicing-sorting attention as permutation edge sets.

* :mod:`~graphattn.producers.sliceformer.producer` — :class:`SliceSortEdges`, registered as
  ``sliceformer``;
* :mod:`~graphattn.producers.sliceformer.sorting` — the per-graph stable sort of every column
  (:func:`slice_sort_src`; ``NATIVE_SORT`` switches the compiled sort off);
* :mod:`~graphattn.producers.sliceformer.max_exchange` — Sliceformer_max's permutation
  (:func:`max_exchange_src`);
* :mod:`~graphattn.producers.sliceformer.interleave` — Sliceformer_interleave's rule
  (:func:`interleave_descending`);
* :mod:`~graphattn.producers.sliceformer.checks` — the input checks.
"""

from graphattn.producers.sliceformer.checks import check_choice
from graphattn.producers.sliceformer.interleave import DIRECTIONS, RULES, SCOPES, TAILS, interleave_descending
from graphattn.producers.sliceformer.max_exchange import max_exchange_src
from graphattn.producers.sliceformer.producer import GROUPS, ORDERS, SliceSortEdges
from graphattn.producers.sliceformer.sorting import METHODS, slice_sort_src, sort_src

__all__ = [
    "DIRECTIONS",
    "GROUPS",
    "METHODS",
    "ORDERS",
    "RULES",
    "SCOPES",
    "TAILS",
    "SliceSortEdges",
    "check_choice",
    "interleave_descending",
    "max_exchange_src",
    "slice_sort_src",
    "sort_src",
]
