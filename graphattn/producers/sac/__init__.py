"""SAC (Sparse Adaptive Connection; Li et al., NeurIPS 2020): attention edges predicted by an LSTM
trained with REINFORCE.

* :mod:`~graphattn.producers.sac.producer` — :class:`SAC`, registered as ``sac``;
* :mod:`~graphattn.producers.sac.config` — its options, flat or grouped (:class:`SACPolicyConfig`,
  :class:`SACCandidateConfig`, :class:`SACDistanceConfig`, :class:`SACDecodeConfig`,
  :class:`SACOutputConfig`, :class:`SACTrainingConfig`, :class:`SACMemoryConfig`), and the
  algorithm's view of them (:class:`SACOptions`);
* the policies: :mod:`~graphattn.producers.sac.lstm` (the paper's :class:`LSTMEdgeDecoder`, with its
  :mod:`~graphattn.producers.sac.rollout` and :mod:`~graphattn.producers.sac.beam` search and the
  records of :mod:`~graphattn.producers.sac.decoding`) and :mod:`~graphattn.producers.sac.parallel`
  (:class:`ParallelEdgePolicy`);
* the candidate sets and distances: :mod:`~graphattn.producers.sac.candidates`,
  :mod:`~graphattn.producers.sac.distances`;
* one prediction: :mod:`~graphattn.producers.sac.layout` (the padded per-graph layout),
  :mod:`~graphattn.producers.sac.paths` (the run paths), :mod:`~graphattn.producers.sac.assembly`
  (the edge set) and :mod:`~graphattn.producers.sac.forcing` (teacher forcing).

The names of the former modules ``sac_ops`` and ``sac_decoder`` are all exported here.
"""

from graphattn.producers.sac.assembly import (
    SampledEdgeSet,
    assemble,
    check_memory,
    input_edges,
    warm_start_edges,
)
from graphattn.producers.sac.beam import BeamSearch
from graphattn.producers.sac.candidates import (
    candidate_counts,
    candidate_rows,
    hop_distances,
    origin_schedule,
)
from graphattn.producers.sac.config import (
    CANDIDATES,
    DECODES,
    DISTANCES,
    POLICIES,
    SACCandidateConfig,
    SACDecodeConfig,
    SACDistanceConfig,
    SACMemoryConfig,
    SACOptions,
    SACOutputConfig,
    SACPolicyConfig,
    SACTrainingConfig,
)
from graphattn.producers.sac.decoding import (
    NEG_INF,
    DecodePlan,
    DecodeResult,
    Rollout,
    row_entropy,
    schedule_tables,
)
from graphattn.producers.sac.distances import (
    HopCache,
    HopDistances,
    bucket_sizes,
    clipped_offsets,
    predicted_so_far_buckets,
    sequence_buckets,
)
from graphattn.producers.sac.forcing import Actions, ForcedActions, forced_actions, forced_log_prob
from graphattn.producers.sac.layout import Decoded, SACLayout, layout
from graphattn.producers.sac.lstm import LSTMEdgeDecoder
from graphattn.producers.sac.parallel import ParallelEdgePolicy
from graphattn.producers.sac.paths import predict, run_lstm, run_parallel, run_sparse
from graphattn.producers.sac.producer import SAC
from graphattn.producers.sac.rollout import LSTMRollout

__all__ = [
    "CANDIDATES",
    "DECODES",
    "DISTANCES",
    "NEG_INF",
    "POLICIES",
    "SAC",
    "Actions",
    "BeamSearch",
    "DecodePlan",
    "DecodeResult",
    "Decoded",
    "ForcedActions",
    "HopCache",
    "HopDistances",
    "LSTMEdgeDecoder",
    "LSTMRollout",
    "ParallelEdgePolicy",
    "Rollout",
    "SACCandidateConfig",
    "SACDecodeConfig",
    "SACDistanceConfig",
    "SACLayout",
    "SACMemoryConfig",
    "SACOptions",
    "SACOutputConfig",
    "SACPolicyConfig",
    "SACTrainingConfig",
    "SampledEdgeSet",
    "assemble",
    "bucket_sizes",
    "candidate_counts",
    "candidate_rows",
    "check_memory",
    "clipped_offsets",
    "forced_actions",
    "forced_log_prob",
    "hop_distances",
    "input_edges",
    "layout",
    "origin_schedule",
    "predict",
    "predicted_so_far_buckets",
    "row_entropy",
    "run_lstm",
    "run_parallel",
    "run_sparse",
    "schedule_tables",
    "sequence_buckets",
    "warm_start_edges",
]
