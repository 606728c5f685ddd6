"""The paper mechanisms' subpackages (``graphattn/producers/<paper>/``): the producers register from
there, and the former flat modules keep their import paths for one release, with a
DeprecationWarning, their public names resolving."""

from __future__ import annotations

import importlib
import sys

import pytest

import graphattn.producers as producers

#: the public names of every former module (``graphattn/producers/<module>.py``)
OLD_NAMES = {
    "graphattn.producers.sac_ops": [
        "Actions", "SACOptions", "SACLayout", "Decoded", "SampledEdgeSet", "ForcedActions", "layout",
        "hop_distances", "candidate_rows", "candidate_counts", "predict", "run_lstm", "run_sparse",
        "run_parallel", "input_edges", "warm_start_edges", "check_memory", "assemble", "forced_actions",
        "forced_log_prob"],
    "graphattn.producers.sac_decoder": [
        "NEG_INF", "DecodePlan", "DecodeResult", "Rollout", "row_entropy", "LSTMEdgeDecoder"],
    "graphattn.producers.sac_distances": [
        "bucket_sizes", "HopDistances", "HopCache", "clipped_offsets", "sequence_buckets",
        "predicted_so_far_buckets"],
    "graphattn.producers.sac_policy": ["ParallelEdgePolicy"],
    "graphattn.producers.samsa_ops": [
        "GUMBEL_EPS", "SLOPE_CAP", "gumbel_noise", "gumbel_from_uniform", "NODE_TAG", "SUPPORT_TAG",
        "hard_slots", "soft_slots", "SamsaSelection"],
    "graphattn.producers.sbm_sampling": [  # NATIVE_SAMPLERS lives in graphattn.producers.sbm.native
        "SAMPLED", "EXPLORATION", "SELF_LOOP", "SampledEdges", "block_matrix", "memberships",
        "key_projection", "check_sbm", "graph_sizes", "graph_of_nodes", "column_sums",
        "expected_num_edges", "fastrg_sample", "bernoulli_sample", "dedupe", "add_self_loops",
        "edge_probability", "edge_gate"],
    "graphattn.producers.sliceformer_ops": [  # NATIVE_SORT lives in graphattn.producers.sliceformer.sorting
        "RULES", "TAILS", "SCOPES", "DIRECTIONS", "METHODS", "check_choice", "slice_sort_src", "sort_src",
        "max_exchange_src", "interleave_descending"],
    "graphattn.producers.converter_ops": [
        "KERNELS", "givens", "identity_rotations", "givens_matrix", "dense_givens_chain", "gibbs_damping",
        "chebyshev_phase", "kernel_polynomial_loss", "stride_permutation"],
    "graphattn.producers.converter_operator": ["UnitaryChainOperator"],
}
#: the former producer modules, now the subpackages (the same import paths, no warning)
PACKAGE_NAMES = {
    "graphattn.producers.sac": ["POLICIES", "DECODES", "DISTANCES", "CANDIDATES", "SAC"],
    "graphattn.producers.samsa": ["RMSNorm", "ImportanceScore", "SAMSA"],
    "graphattn.producers.sbm": ["SAMPLERS", "STES", "SBM_EDGE_BYTES", "SBMEdges"],
    "graphattn.producers.sliceformer": ["ORDERS", "GROUPS", "SliceSortEdges"],
    "graphattn.producers.converter": [
        "ANGLE_PARAMS", "PHASE_READOUTS", "READOUT_GAIN", "NUM_ANGLES", "ScaleNorm", "Siren",
        "ConverterProducer"],
}
REGISTERED = {"sac": "SAC", "samsa": "SAMSA", "sbm": "SBMEdges", "sliceformer": "SliceSortEdges",
              "converter": "ConverterProducer"}


def test_every_moved_module_is_checked():
    assert set(producers.MOVED_MODULES) == set(OLD_NAMES)


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_old_module_paths_import_with_a_deprecation_warning(old):
    new = producers.MOVED_MODULES[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    missing = [name for name in OLD_NAMES[old] if not hasattr(module, name)]
    assert not missing, missing


@pytest.mark.parametrize("package", sorted(PACKAGE_NAMES))
def test_the_former_producer_modules_are_the_subpackages(package):
    module = importlib.import_module(package)
    assert module.__path__  # a package
    missing = [name for name in PACKAGE_NAMES[package] if not hasattr(module, name)]
    assert not missing, missing
    assert set(module.__all__) <= set(dir(module))


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_the_subpackages_register_their_producers(name):
    cls = producers.PRODUCERS[name]
    assert cls is getattr(importlib.import_module(f"graphattn.producers.{name}"), REGISTERED[name])
    assert cls.__module__ == f"graphattn.producers.{name}.producer"
