"""SAMSA (Lenhat et al., 2024): differentiable top-:math:`k` sampling of attention sources.

* :mod:`~graphattn.producers.samsa.producer` — :class:`SAMSA`, registered as ``samsa``;
* :mod:`~graphattn.producers.samsa.scoring` — the importance-score network (:class:`ImportanceScore`,
  :class:`RMSNorm`);
* :mod:`~graphattn.producers.samsa.sampling` — Gumbel noise, the pairwise-sigmoid slots and the
  selection record (:class:`SamsaSelection`).
"""

from graphattn.producers.samsa.producer import SAMSA
from graphattn.producers.samsa.sampling import (
    GUMBEL_EPS,
    NODE_TAG,
    SLOPE_CAP,
    SUPPORT_TAG,
    SamsaSelection,
    gumbel_from_uniform,
    gumbel_noise,
    hard_slots,
    soft_slots,
)
from graphattn.producers.samsa.scoring import ImportanceScore, RMSNorm

__all__ = [
    "GUMBEL_EPS",
    "NODE_TAG",
    "SAMSA",
    "SLOPE_CAP",
    "SUPPORT_TAG",
    "ImportanceScore",
    "RMSNorm",
    "SamsaSelection",
    "gumbel_from_uniform",
    "gumbel_noise",
    "hard_slots",
    "soft_slots",
]
