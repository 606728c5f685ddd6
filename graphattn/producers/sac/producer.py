r"""SAC (Sparse Adaptive Connection; Li et al., NeurIPS 2020): attention edges predicted by an LSTM
trained with REINFORCE.

The predictor (:class:`~graphattn.producers.sac.lstm.LSTMEdgeDecoder`) emits, per graph, a sequence
of ``2 · budget`` node ids alternating origin and destination; edge :math:`k` is
:math:`(y_{2k-1}, y_{2k})`, the origin being the query (PyG target, ``edge_index[1]``) and the
destination the key/value source (``edge_index[0]``). The layer attends over the predicted edges; the
edges carry no weight and no gradient. The predictor learns only from the policy gradient

.. math::
    \nabla J(\Theta) = \sum_{a} \nabla \log p(a \mid a_{<}; \Theta)\,(R - b),

which the runner forms from the EdgeSet's ``log_prob`` / ``log_prob_graph`` and a per-graph reward
:math:`R` (log-likelihood of the correct output), see :mod:`graphattn.core.policy`.

Every choice the paper leaves open is an argument here (flat, or grouped in the dataclasses of
:mod:`~graphattn.producers.sac.config`); ``docs/sac.md`` lists them. The algorithm lives beside the
producer: the layout (:mod:`~graphattn.producers.sac.layout`), the candidate sets
(:mod:`~graphattn.producers.sac.candidates`) and distance encodings
(:mod:`~graphattn.producers.sac.distances`), the run paths (:mod:`~graphattn.producers.sac.paths`), the
predictors (:mod:`~graphattn.producers.sac.lstm` with its rollout and beam search, and
:mod:`~graphattn.producers.sac.parallel`), the assembly of the edge set
(:mod:`~graphattn.producers.sac.assembly`) and teacher forcing (:mod:`~graphattn.producers.sac.forcing`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch_geometric.nn import Linear

from graphattn.core.edgeset import EdgeSet
from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.producers.registry import register_producer
from graphattn.producers.sac.assembly import SampledEdgeSet, check_memory, warm_start_edges
from graphattn.producers.sac.config import (
    SACOptions,
    constructor_signature,
    option_groups,
    resolve_options,
    validate_options,
)
from graphattn.producers.sac.distances import HopCache, bucket_sizes
from graphattn.producers.sac.forcing import Actions, forced_actions, forced_log_prob
from graphattn.producers.sac.imitation import imitation_loss
from graphattn.producers.sac.lstm import LSTMEdgeDecoder
from graphattn.producers.sac.parallel import ParallelEdgePolicy
from graphattn.producers.sac.paths import predict


@register_producer("sac")
class SAC(EdgeProducer):
    r"""Sparse Adaptive Connection: an edge predictor trained with REINFORCE.

    Node vectors of the predictor: :math:`w_i = P h_i` (``embed_dim`` wide; :math:`h` = the layer's
    input, detached unless ``pg_to_nodes``). They are the tied output embeddings of every softmax and
    the LSTM's inputs. Per graph with :math:`n` nodes the predictor emits
    :math:`\text{budget} = \operatorname{round}(\alpha n)` edges (≥ 1 for a non-empty graph; with
    ``no_repeat`` at most the number of candidate pairs). With ``policy="lstm"`` (the paper's):

    .. math::
        g_{t+1} = \operatorname{LSTM}(w_{y_t}, g_t), \qquad
        p(y_{t+1} = i) \propto \exp\Big(\tfrac{1}{\sqrt{D}} (W_o g_{t+1})^{\top}
            \big(w_i + [\text{dest. step}]\, u_{\delta(o, i)}\big)\Big),\ i \in \mathcal{C}_t,

    steps alternating origin and destination, :math:`u_\delta` a learned distance embedding between
    the current origin :math:`o` and node :math:`i`. With ``policy="parallel"`` (a **deviation** for
    large graphs) every node draws :math:`\alpha` destinations independently from
    :math:`\operatorname{softmax}_j (W_q w_i)^{\top}(w_j + u_{\delta(i, j)})/\sqrt{D}`.

    Training samples the edges; evaluation decodes them deterministically (``decode``). The EdgeSet
    carries one ``log_prob`` entry per predicted edge (origin step + destination step; the origin
    term is 0 when origins are forced) and ``log_prob_graph``; the attention layer never reads them.

    Args:
        alpha (float): :math:`\alpha`, predicted edges per node on average (an integer for
            ``all_nodes`` and ``policy="parallel"``: edges per node). The :math:`\alpha N` edges are
            checked against the memory budget (:mod:`graphattn.memory`) before predicting.
        policy (str): ``"lstm"`` (the paper's sequential predictor: :math:`2\alpha n` LSTM steps) or
            ``"parallel"`` (per-origin independent draws; labelled deviation).
        channels (int): width of the layer input :math:`h` (``-1``: lazy; supplied by the model).
        embed_dim (int): :math:`D`, width of the node vectors :math:`w_i`.
        hidden (int, optional): LSTM width (default ``embed_dim``).
        all_nodes (bool): the paper's "all nodes connected" variant: every node is fed as the origin
            :math:`\alpha` times (clamped to its number of candidates with ``no_repeat``) and only
            destinations are predicted.
        head_adaptive (bool): one edge set per attention head: the LSTM runs over ``heads``
            consecutive segments of ``budget`` edges, a learned head embedding appended to its input
            (parallel policy: a learned per-head query offset). Edges get ``head`` ids.
        num_heads (int): heads of the consuming layer (supplied by the model; must match the layer;
            default 1). ``heads`` is accepted as its older spelling.
        distance (str): distance encoding added to destination logits: ``"input_graph"`` (hop
            distance in ``data.edge_index``, symmetrised; buckets ``0..K``, far, unreachable),
            ``"sequence"`` (signed offset of the local node order clipped to ``[-K, K]`` plus far),
            ``"predicted_so_far"`` (hop distance in the graph of the edges predicted so far, LSTM
            only; ``0..K`` plus "not within K"), ``"both"`` (input_graph + predicted_so_far, summed)
            or ``"none"``.
        max_distance (int): :math:`K`.
        candidates (str): destinations allowed for origin :math:`o`: ``"all"`` nodes of the graph,
            ``"causal"`` (:math:`j \le o`), ``"window"`` (:math:`|j - o| \le` ``window``),
            ``"segment"`` (same block of ``window`` nodes) or ``"hops"`` (within :math:`K` hops of the
            input graph). Patterns plus ``all_nodes`` and ``no_repeat`` reproduce fixed attention
            patterns exactly (SAC §4.5).
        window (int): window radius / segment length.
        no_repeat (bool): an (origin, destination) pair is never predicted twice within a head
            (masked; the log-probabilities stay exact). Without it, sampling is with replacement.
            Greedy and beam decoding always forbid repeats.
        decode (str): evaluation decoding: ``"greedy"``, ``"beam"`` (``beam_size`` hypotheses, best
            total log-probability; the paper's test-time decoding) or ``"sample"`` (seeded by
            ``seed`` unless a generator is passed).
        beam_size (int): beam width (the paper: 5).
        undirected (bool): also add every predicted edge reversed (``log_prob`` keeps one entry per
            predicted edge).
        coalesce (bool): drop duplicate attention edges (a neighbour set; a duplicate would count
            twice in the softmax).
        union_input (bool): **deviation**: also attend along the input edges.
        self_loops (bool): **deviation**: also add :math:`i \to i` for every node (otherwise nodes no
            predicted edge points to receive a zero message).
        pg_to_nodes (bool): let the policy gradient reach the node representations :math:`h`.
        share_structure (bool): predict once per model forward when one instance serves several
            layers (the paper's setting): inside the model's
            :meth:`~graphattn.producers.EdgeProducer.sharing_scope` (entered by
            :class:`~graphattn.GraphTransformer` for a producer used by several layers), later
            layers reuse the first layer's edges without ``log_prob``, so the policy gradient is
            counted once. Outside a scope every call predicts anew.
        warm_start (int): training forward passes during which the producer returns the input edges
            plus self-loops (GAT-style; also in evaluation) before switching to predicted edges (the
            paper initialises from a trained GAT). Counted in the buffer ``steps`` (saved with the
            model).
        warm_start_imitation (float): **deviation**: weight :math:`\lambda` of the predictor's
            imitation of the input edges during the warm start: every warm-start training pass adds
            :math:`\lambda` times the mean negative log-likelihood of each node's input
            in-neighbours under teacher forcing to ``aux_loss``
            (:mod:`~graphattn.producers.sac.imitation`), so that the first predicted structure
            follows the input graph instead of a uniform policy (0: off, as in the paper; needs
            ``policy="lstm"``, ``all_nodes=True``).
        entropy_weight (float): optional entropy bonus: ``aux_loss = -weight · mean entropy`` of the
            predictor's choices (0: off, as in the paper).
        num_candidates (int): parallel policy only, **deviation** for very large graphs: ``0`` =
            every node of the graph is a candidate (cost :math:`O(N^2 D)` per forward); ``M > 0`` =
            each origin's candidates are itself, its input neighbours and ``M`` nodes of its graph
            drawn uniformly without replacement (fresh every training pass; seeded in evaluation),
            cost :math:`O(N (M + \deg) D)`. The policy is then a softmax over that random candidate
            set (REINFORCE stays unbiased for it); teacher forcing is not available.
        chunk_size (int): parallel policy: origins per chunk is ``chunk_size // (B·W)``.
        max_dense (int): the LSTM policy keeps ``[B, W, W]`` byte tables; larger batches raise a
            ``ValueError`` (use the parallel policy).
        seed (int): seed of evaluation sampling.

    The options after ``heads`` may also be given grouped, one dataclass per concern
    (:mod:`~graphattn.producers.sac.config`): ``policy_config`` (:class:`~graphattn.producers.sac.config.
    SACPolicyConfig`), ``candidate_config``, ``distance_config``, ``decode_config``, ``output_config``,
    ``training_config`` and ``memory_config`` (each a dataclass or a mapping of its fields); an option
    given both flat and in its group is a ``ValueError``. :attr:`config` gives them back.
    """

    mode = "attention"

    #: the validated options (see the arguments above; set by the constructor)
    alpha: float
    policy: str
    embed_dim: int
    hidden: int
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
    share_structure: bool
    warm_start: int
    warm_start_imitation: float
    entropy_weight: float
    num_candidates: int
    chunk_size: int
    max_dense: int
    seed: int

    def __init__(self, alpha: float = 5.0, *, channels: int = -1, num_heads: int | None = None,
                 heads: int | None = None, **options: Any) -> None:
        # the signature callers see (constructor_signature, set below the class) lists every option
        super().__init__()
        values = validate_options(alpha, channels, num_heads, heads, resolve_options(options))
        for name, value in values.items():
            setattr(self, name, value)
        sizes = bucket_sizes(self.distance, self.max_distance)
        segments = self.heads if self.head_adaptive else 0
        self.node_proj = Linear(channels, self.embed_dim, bias=False)
        self.predictor: LSTMEdgeDecoder | ParallelEdgePolicy
        if self.policy == "lstm":
            self.predictor = LSTMEdgeDecoder(self.embed_dim, self.hidden, sizes, segments)
        else:
            self.predictor = ParallelEdgePolicy(self.embed_dim, sizes, segments)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self._shared: tuple[object, EdgeSet] | None = None
        self._hop_cache = HopCache()

    @property
    def config(self) -> dict[str, Any]:
        """The options as their groups (constructor argument → dataclass of
        :mod:`~graphattn.producers.sac.config`), validated: ``SAC(p.alpha, channels=...,
        **p.config)`` builds the same producer."""
        return option_groups(self)

    def reset_parameters(self) -> None:
        self.node_proj.reset_parameters()
        self.predictor.reset_parameters()
        self.steps.zero_()
        self._shared = None

    def policy_parameters(self) -> list[nn.Parameter]:
        """The predictor and its node projection: trained by the policy gradient (and the
        warm-start imitation) only, never by the task loss."""
        return [*self.node_proj.parameters(), *self.predictor.parameters()]

    def in_warm_start(self) -> bool:
        """``True`` while the training forward passes counted in ``steps`` are fewer than
        ``warm_start`` (the next call returns the input edges)."""
        return int(self.steps) < self.warm_start

    # ------------------------------------------------------------------------------ forward
    def produce(self, ctx: ProducerContext) -> EdgeSet:
        shared = self._shared_edges(ctx)
        if shared is not None:
            return shared
        self._materialise(ctx)
        warm = int(self.steps) < self.warm_start
        if ctx.training:
            self.steps += 1
        if warm:
            es = warm_start_edges(ctx)
            if self.warm_start_imitation > 0 and ctx.training and torch.is_grad_enabled():
                assert isinstance(self.predictor, LSTMEdgeDecoder)  # checked by the options
                nll = imitation_loss(ctx, self._options(), self.node_proj, self.predictor, self._hop_cache)
                es.aux_loss = nll * self.warm_start_imitation
                es.stats["imitation_nll"] = float(nll.detach())
        else:
            opt = self._options()
            check_memory(ctx, opt)
            es = self._predict(ctx, opt)
        self._remember(es)
        return es

    def _options(self) -> SACOptions:
        """The arguments the algorithm (:mod:`~graphattn.producers.sac.paths`, ...) reads, as they are now."""
        return SACOptions(
            alpha=self.alpha, policy=self.policy, embed_dim=self.embed_dim, all_nodes=self.all_nodes,
            head_adaptive=self.head_adaptive, heads=self.heads, distance=self.distance,
            max_distance=self.max_distance, candidates=self.candidates, window=self.window,
            no_repeat=self.no_repeat, decode=self.decode, beam_size=self.beam_size,
            undirected=self.undirected, coalesce=self.coalesce, union_input=self.union_input,
            self_loops=self.self_loops, pg_to_nodes=self.pg_to_nodes, entropy_weight=self.entropy_weight,
            num_candidates=self.num_candidates, chunk_size=self.chunk_size, max_dense=self.max_dense,
            seed=self.seed, training=self.training)

    def _predict(self, ctx: ProducerContext, opt: SACOptions, actions: Actions | None = None
                 ) -> SampledEdgeSet:
        return predict(ctx, opt, self.node_proj, self.predictor, self._hop_cache, actions)

    def _materialise(self, ctx: ProducerContext) -> None:
        if is_lazy(self.node_proj.weight):
            with torch.no_grad():
                self.node_proj(ctx.x[:1].to(self.node_proj.weight.dtype))

    def _shared_edges(self, ctx: ProducerContext) -> EdgeSet | None:
        token = self.share_token
        if not self.share_structure or token is None or self._shared is None:
            return None
        owner, es = self._shared
        if owner is not token:  # predicted in an earlier forward pass
            return None
        if es.num_heads != ctx.num_heads:
            raise ValueError(f"a shared SAC structure was predicted for {es.num_heads} heads, but this "
                             f"layer has {ctx.num_heads}")
        out = copy.copy(es)
        out.log_prob, out.log_prob_graph, out.aux_loss = None, None, None
        out.stats = {**es.stats, "shared": 1}
        return out

    def _remember(self, es: EdgeSet) -> None:
        token = self.share_token
        self._shared = (token, es) if self.share_structure and token is not None else None

    # ------------------------------------------------------------------------- teacher forcing
    def log_prob_of(self, x: Tensor, batch: Tensor | None, sampled_edge_index: Tensor,
                    sampled_head: Tensor | None = None, *, data: Any = None, num_heads: int | None = None
                    ) -> Tensor:
        """Teacher forcing: the log-probability of every edge of ``sampled_edge_index`` (as in a
        :class:`~graphattn.producers.sac.assembly.SampledEdgeSet`: graph by graph, in decoding order) under
        the current predictor. Reproduces the ``log_prob`` of the EdgeSet that produced the edges."""
        H = num_heads or (self.heads if self.head_adaptive else 1)
        ctx = ProducerContext(x, batch, num_heads=H, data=data, training=self.training)
        self._materialise(ctx)
        opt = self._options()
        forcing = forced_actions(ctx, opt, sampled_edge_index, sampled_head)
        es = self._predict(ctx, opt, forcing.actions)
        return forced_log_prob(es, forcing, opt, ctx.num_nodes, sampled_edge_index, sampled_head)

    def extra_repr(self) -> str:
        parts = [f"alpha={self.alpha:g}", f"policy={self.policy!r}", f"embed_dim={self.embed_dim}"]
        if self.policy == "lstm":
            parts.append(f"hidden={self.hidden}")
        beam = f"(beam_size={self.beam_size})" if self.decode == "beam" else ""
        parts += [f"distance={self.distance!r}", f"candidates={self.candidates!r}",
                  f"decode={self.decode!r}{beam}"]
        for flag in ("all_nodes", "head_adaptive", "undirected", "union_input", "self_loops", "pg_to_nodes"):
            if getattr(self, flag):
                parts.append(f"{flag}=True")
        if not self.no_repeat:
            parts.append("no_repeat=False")
        if self.warm_start:
            parts.append(f"warm_start={self.warm_start}")
        if self.warm_start_imitation:
            parts.append(f"warm_start_imitation={self.warm_start_imitation:g}")
        return ", ".join(parts)


# build_producer checks keyword arguments against the signature, and help() shows it: every option
SAC.__init__.__signature__ = constructor_signature()
