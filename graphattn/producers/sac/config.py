r"""SAC's options (:class:`~graphattn.producers.sac.producer.SAC` documents each one).

The constructor takes them flat (``SAC(alpha=2, policy="parallel", decode="beam")``, as configs and
``producer_kwargs`` give them) or grouped in small dataclasses, one per concern:

* :class:`SACPolicyConfig` — the predictor: ``policy``, ``embed_dim``, ``hidden``, ``pg_to_nodes``,
  ``entropy_weight``;
* :class:`SACCandidateConfig` — which edges may be predicted: ``all_nodes``, ``head_adaptive``,
  ``candidates``, ``window``, ``no_repeat``, ``num_candidates``;
* :class:`SACDistanceConfig` — the distance encoding: ``distance``, ``max_distance``;
* :class:`SACDecodeConfig` — evaluation decoding: ``decode``, ``beam_size``, ``seed``;
* :class:`SACOutputConfig` — the attention edges built from the predicted ones: ``undirected``,
  ``coalesce``, ``union_input``, ``self_loops``;
* :class:`SACTrainingConfig` — the training schedule: ``share_structure``, ``warm_start``;
* :class:`SACMemoryConfig` — the memory limits: ``chunk_size``, ``max_dense``.

:func:`resolve_options` merges both forms into the flat options, :func:`validate_options` checks and
normalises them (the producer's attributes), and :class:`SACOptions` is what the algorithm reads.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from graphattn.producers.base import (
    ProducerContext,
    check_int,
    check_number,
    check_positive_int,
    resolve_num_heads,
)

POLICIES = ("lstm", "parallel")
DECODES = ("greedy", "beam", "sample")
DISTANCES = ("none", "input_graph", "sequence", "predicted_so_far", "both")
CANDIDATES = ("all", "causal", "window", "segment", "hops")


# ------------------------------------------------------------------------------ the option groups
@dataclass(frozen=True)
class SACPolicyConfig:
    """The predictor: ``policy`` (``"lstm"`` or ``"parallel"``), the widths ``embed_dim`` and
    ``hidden`` (default ``embed_dim``), whether the policy gradient reaches the node representations
    (``pg_to_nodes``) and the entropy bonus (``entropy_weight``)."""

    policy: str = "lstm"
    embed_dim: int = 64
    hidden: int | None = None
    pg_to_nodes: bool = False
    entropy_weight: float = 0.0


@dataclass(frozen=True)
class SACCandidateConfig:
    """Which edges may be predicted: every node as an origin (``all_nodes``), one edge set per head
    (``head_adaptive``), the candidate pattern (``candidates``, ``window``), repeats (``no_repeat``)
    and the parallel policy's sampled candidate lists (``num_candidates``)."""

    all_nodes: bool = False
    head_adaptive: bool = False
    candidates: str = "all"
    window: int = 1
    no_repeat: bool = True
    num_candidates: int = 0


@dataclass(frozen=True)
class SACDistanceConfig:
    """The distance encoding added to the destination logits (``distance``) and its range
    ``max_distance`` (:math:`K`)."""

    distance: str | None = "input_graph"
    max_distance: int = 3


@dataclass(frozen=True)
class SACDecodeConfig:
    """Evaluation decoding: ``decode`` (``"greedy"``, ``"beam"`` or ``"sample"``), the beam width
    ``beam_size`` and the ``seed`` of evaluation sampling."""

    decode: str = "greedy"
    beam_size: int = 5
    seed: int = 0


@dataclass(frozen=True)
class SACOutputConfig:
    """The attention edges built from the predicted ones: mirrored (``undirected``), de-duplicated
    (``coalesce``), united with the input edges (``union_input``) or with self-loops
    (``self_loops``)."""

    undirected: bool = False
    coalesce: bool = True
    union_input: bool = False
    self_loops: bool = False


@dataclass(frozen=True)
class SACTrainingConfig:
    """The training schedule: one prediction per model forward (``share_structure``), the
    warm-start passes on the input edges (``warm_start``) and the weight of the predictor's
    imitation of those edges during them (``warm_start_imitation``, a deviation)."""

    share_structure: bool = True
    warm_start: int = 0
    warm_start_imitation: float = 0.0


@dataclass(frozen=True)
class SACMemoryConfig:
    """The memory limits: the parallel policy's chunk (``chunk_size``) and the LSTM policy's largest
    ``[B, W, W]`` table (``max_dense``)."""

    chunk_size: int = 1 << 22
    max_dense: int = 1 << 28


#: the constructor's argument of every option group
CONFIG_GROUPS: dict[str, type] = {
    "policy_config": SACPolicyConfig,
    "candidate_config": SACCandidateConfig,
    "distance_config": SACDistanceConfig,
    "decode_config": SACDecodeConfig,
    "output_config": SACOutputConfig,
    "training_config": SACTrainingConfig,
    "memory_config": SACMemoryConfig,
}
#: the group argument of every flat option
FLAT_OPTIONS: dict[str, str] = {f.name: arg for arg, cls in CONFIG_GROUPS.items() for f in fields(cls)}


def resolve_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The flat options of the constructor's keyword arguments ``options``: flat options (``policy``,
    ``decode``, ...) and option groups (``policy_config=SACPolicyConfig(...)`` or a mapping of its
    fields), every option not given at its default. A name that is neither is a ``TypeError``; an
    option given both flat and in its group is a ``ValueError``."""
    unknown = [k for k in options if k not in FLAT_OPTIONS and k not in CONFIG_GROUPS]
    if unknown:
        raise TypeError(f"SAC() got unexpected keyword argument(s) {unknown}")
    flat: dict[str, Any] = {}
    for arg, cls in CONFIG_GROUPS.items():
        group = options.get(arg)
        if group is None:
            group = cls()
        else:
            if isinstance(group, Mapping):
                group = cls(**group)
            elif not isinstance(group, cls):
                raise TypeError(f"'{arg}' must be a {cls.__name__} or a mapping of its fields, got "
                                f"{type(group).__name__}")
            twice = [f.name for f in fields(cls) if f.name in options]
            if twice:
                raise ValueError(f"{twice} given both as keyword arguments and in '{arg}'")
        flat.update((f.name, getattr(group, f.name)) for f in fields(cls))
    flat.update((k, v) for k, v in options.items() if k in FLAT_OPTIONS)
    return flat


def option_groups(source: Any) -> dict[str, Any]:
    """The option groups (constructor argument → dataclass) of the flat options read as attributes
    of ``source`` (a :class:`~graphattn.producers.sac.producer.SAC`)."""
    return {arg: cls(**{f.name: getattr(source, f.name) for f in fields(cls)})
            for arg, cls in CONFIG_GROUPS.items()}


def constructor_signature() -> inspect.Signature:
    """``SAC.__init__``'s signature as callers see it: ``alpha``, the model-supplied ``channels``,
    ``num_heads`` and ``heads``, the option groups and every flat option with its default (what
    :func:`~graphattn.producers.build_producer` checks keyword arguments against, and ``help``
    shows)."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("alpha", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=5.0,
                                annotation="float"),
              inspect.Parameter("channels", kw, default=-1, annotation="int"),
              inspect.Parameter("num_heads", kw, default=None, annotation="int | None"),
              inspect.Parameter("heads", kw, default=None, annotation="int | None")]
    params += [inspect.Parameter(arg, kw, default=None, annotation=f"{cls.__name__} | None")
               for arg, cls in CONFIG_GROUPS.items()]
    params += [inspect.Parameter(f.name, kw, default=f.default, annotation=f.type)
               for cls in CONFIG_GROUPS.values() for f in fields(cls)]
    return inspect.Signature(params, return_annotation="None")


def validate_options(alpha: float, channels: int, num_heads: int | None, heads: int | None,
                     opts: Mapping[str, Any]) -> dict[str, Any]:
    """The checked and normalised options (``ValueError`` naming the first bad one): the producer's
    attributes, every flat option plus ``alpha`` and ``heads`` (the consuming layer's heads, 1 by
    default)."""
    policy, decode, distance = opts["policy"], opts["decode"], opts["distance"]
    all_nodes, candidates, embed_dim = opts["all_nodes"], opts["candidates"], opts["embed_dim"]
    check_number("alpha", alpha, minimum=0, strict=True)
    if policy not in POLICIES:
        raise ValueError(f"'policy' must be one of {POLICIES}, got {policy!r}")
    if (all_nodes or policy == "parallel") and float(alpha) != int(alpha):
        raise ValueError(f"'alpha' must be a whole number (edges per node) with all_nodes=True or "
                         f"policy='parallel', got {alpha!r}")
    if decode not in DECODES:
        raise ValueError(f"'decode' must be one of {DECODES}, got {decode!r}")
    distance = "none" if distance is None else distance
    if distance not in DISTANCES:
        raise ValueError(f"'distance' must be one of {DISTANCES}, got {distance!r}")
    if policy == "parallel" and distance in ("predicted_so_far", "both"):
        raise ValueError("distance='predicted_so_far'/'both' needs policy='lstm' (the parallel "
                         "policy predicts all edges at once)")
    if candidates not in CANDIDATES:
        raise ValueError(f"'candidates' must be one of {CANDIDATES}, got {candidates!r}")
    if not isinstance(channels, int) or isinstance(channels, bool) or (channels < 1 and channels != -1):
        raise ValueError(f"'channels' must be a positive int or -1 (lazy), got {channels!r}")
    entropy_weight = opts["entropy_weight"]
    if not isinstance(entropy_weight, (int, float)) or entropy_weight < 0:
        raise ValueError(f"'entropy_weight' must be a non-negative number, got {entropy_weight!r}")
    imitation = opts["warm_start_imitation"]
    if isinstance(imitation, bool) or not isinstance(imitation, (int, float)) or not imitation >= 0 \
            or imitation == float("inf"):
        raise ValueError(f"'warm_start_imitation' must be a finite non-negative number, got {imitation!r}")
    if imitation > 0:
        if opts["warm_start"] == 0:
            raise ValueError("'warm_start_imitation' trains the predictor during the warm start: it "
                             "needs warm_start > 0")
        if policy != "lstm" or not all_nodes or opts["head_adaptive"]:
            raise ValueError("'warm_start_imitation' needs policy='lstm', all_nodes=True and "
                             "head_adaptive=False (the forced sequence gives every node its input "
                             "neighbours)")
    hidden = opts["hidden"]
    out: dict[str, Any] = {
        "alpha": float(alpha),
        "policy": policy,
        "embed_dim": check_positive_int("embed_dim", embed_dim),
        "hidden": check_positive_int("hidden", hidden) if hidden is not None else embed_dim,
        "all_nodes": bool(all_nodes) or policy == "parallel",
        "head_adaptive": bool(opts["head_adaptive"]),
        "heads": resolve_num_heads(num_heads, heads, "SAC") or 1,
        "distance": distance,
        "max_distance": check_positive_int("max_distance", opts["max_distance"]),
    }
    if out["max_distance"] > 100:
        raise ValueError(f"'max_distance' must be at most 100, got {opts['max_distance']}")
    out.update({
        "candidates": candidates,
        "window": check_positive_int("window", opts["window"], allow_zero=candidates != "segment"),
        "no_repeat": bool(opts["no_repeat"]),
        "decode": decode,
        "beam_size": check_positive_int("beam_size", opts["beam_size"]),
        "undirected": bool(opts["undirected"]),
        "coalesce": bool(opts["coalesce"]),
        "union_input": bool(opts["union_input"]),
        "self_loops": bool(opts["self_loops"]),
        "pg_to_nodes": bool(opts["pg_to_nodes"]),
        "share_structure": bool(opts["share_structure"]),
        "warm_start": check_positive_int("warm_start", opts["warm_start"], allow_zero=True),
        "entropy_weight": float(entropy_weight),
        "warm_start_imitation": float(imitation),
        "num_candidates": check_positive_int("num_candidates", opts["num_candidates"], allow_zero=True),
    })
    if out["num_candidates"] and (policy != "parallel" or candidates != "all"):
        raise ValueError("'num_candidates' needs policy='parallel' and candidates='all'")
    out.update({
        "chunk_size": check_positive_int("chunk_size", opts["chunk_size"]),
        "max_dense": check_positive_int("max_dense", opts["max_dense"]),
        "seed": check_int("seed", opts["seed"]),
    })
    return out


# ------------------------------------------------------------------------- the algorithm's view
class SACOptions(NamedTuple):
    """The producer's (validated) arguments the algorithm reads, see :class:`~graphattn.producers.sac.SAC`;
    ``training`` is the producer's own mode (teacher forcing replays its decoding)."""

    alpha: float
    policy: str
    embed_dim: int
    all_nodes: bool
    head_adaptive: bool
    heads: int
    distance: str
    max_distance: int
    candidates: str
    window: int
    no_repeat: bool
    decode: str
    beam_size: int
    undirected: bool
    coalesce: bool
    union_input: bool
    self_loops: bool
    pg_to_nodes: bool
    entropy_weight: float
    num_candidates: int
    chunk_size: int
    max_dense: int
    seed: int
    training: bool

    @property
    def segments(self) -> int:
        """Head segments of the prediction (``heads`` when head-adaptive, else 1)."""
        return self.heads if self.head_adaptive else 1

    @property
    def needs_hops(self) -> bool:
        """Whether the input graph's hop distances are read (distance encoding or candidates)."""
        return self.distance in ("input_graph", "both") or self.candidates == "hops"

    def mode(self, ctx: ProducerContext) -> str:
        """The decoding mode of a forward pass: sampling in training, ``decode`` in evaluation."""
        return "sample" if ctx.training else self.decode

    def no_repeat_in(self, mode: str) -> bool:
        """Greedy and beam decoding always forbid repeats (else they repeat the argmax)."""
        if mode == "forced":
            return self.no_repeat or (not self.training and self.decode in ("greedy", "beam"))
        return self.no_repeat or mode in ("greedy", "beam")
