r"""SAC (Sparse Adaptive Connection; Li et al., NeurIPS 2020): attention edges predicted by an LSTM
trained with REINFORCE.

The predictor (:class:`~graphattn.producers.sac_decoder.LSTMEdgeDecoder`) emits, per graph, a sequence
of ``2 · budget`` node ids alternating origin and destination; edge :math:`k` is
:math:`(y_{2k-1}, y_{2k})`, the origin being the query (PyG target, ``edge_index[1]``) and the
destination the key/value source (``edge_index[0]``). The layer attends over the predicted edges; the
edges carry no weight and no gradient. The predictor learns only from the policy gradient

.. math::
    \nabla J(\Theta) = \sum_{a} \nabla \log p(a \mid a_{<}; \Theta)\,(R - b),

which the runner forms from the EdgeSet's ``log_prob`` / ``log_prob_graph`` and a per-graph reward
:math:`R` (log-likelihood of the correct output), see :mod:`graphattn.policy`.

Every choice the paper leaves open is an argument here; ``docs/sac.md`` lists them.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch_geometric.nn import Linear
from torch_geometric.utils import to_dense_batch

from graphattn.edgeset import EdgeSet, union_edge_sets
from graphattn.memory import EDGE_BYTES, check_edges
from graphattn.origins import origin_code
from graphattn.producers.base import (
    EdgeProducer,
    ProducerContext,
    check_int,
    check_positive_int,
    resolve_num_heads,
)
from graphattn.producers.input import InputEdges
from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.registry import register_producer
from graphattn.producers.sac_decoder import (
    DecodePlan,
    DecodeResult,
    HopDistances,
    LSTMEdgeDecoder,
    ParallelEdgePolicy,
    predicted_so_far_buckets,
    sequence_buckets,
)

POLICIES = ("lstm", "parallel")
DECODES = ("greedy", "beam", "sample")
DISTANCES = ("none", "input_graph", "sequence", "predicted_so_far", "both")
CANDIDATES = ("all", "causal", "window", "segment", "hops")


class SampledEdgeSet(EdgeSet):
    """An explicit attention :class:`~graphattn.EdgeSet` plus the sampled actions behind it.

    Extra attributes: ``sampled_edge_index [2, A]`` and ``sampled_head [A]`` (or ``None``): one
    column per predicted edge, before mirroring, coalescing and unions, in the order that
    ``log_prob [A]`` / ``log_prob_graph [A]`` follow (graph by graph, in decoding order).
    """

    sampled_edge_index: Tensor
    sampled_head: Tensor | None


def _input_edges(ctx: ProducerContext, *, self_loops: bool) -> EdgeSet:
    """The input graph's edges (plus a self-loop for every node without one): the ``input``
    producer, without edge features (predicted edges have none)."""
    return InputEdges(self_loops=self_loops, edge_attr=None).produce(ctx)


#: first key words of SAC's keyed draws (candidate lists; the parallel policy's choices)
_TAG_CANDIDATES, _TAG_DRAWS = 0xCA4D, 0xD4A3

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
    """

    mode = "attention"

    def __init__(
        self,
        alpha: float = 5.0,
        policy: str = "lstm",
        channels: int = -1,
        embed_dim: int = 64,
        hidden: int | None = None,
        all_nodes: bool = False,
        head_adaptive: bool = False,
        num_heads: int | None = None,
        distance: str = "input_graph",
        max_distance: int = 3,
        candidates: str = "all",
        window: int = 1,
        no_repeat: bool = True,
        decode: str = "greedy",
        beam_size: int = 5,
        undirected: bool = False,
        coalesce: bool = True,
        union_input: bool = False,
        self_loops: bool = False,
        pg_to_nodes: bool = False,
        share_structure: bool = True,
        warm_start: int = 0,
        entropy_weight: float = 0.0,
        num_candidates: int = 0,
        chunk_size: int = 1 << 22,
        max_dense: int = 1 << 28,
        seed: int = 0,
        *,
        heads: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 \
                or not math.isfinite(alpha):
            raise ValueError(f"'alpha' must be a positive number, got {alpha!r}")
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
        if not isinstance(entropy_weight, (int, float)) or entropy_weight < 0:
            raise ValueError(f"'entropy_weight' must be a non-negative number, got {entropy_weight!r}")
        self.alpha = float(alpha)
        self.policy = policy
        self.embed_dim = check_positive_int("embed_dim", embed_dim)
        self.hidden = check_positive_int("hidden", hidden) if hidden is not None else embed_dim
        self.all_nodes = bool(all_nodes) or policy == "parallel"
        self.head_adaptive = bool(head_adaptive)
        self.heads = resolve_num_heads(num_heads, heads, "SAC") or 1
        self.distance = distance
        self.max_distance = check_positive_int("max_distance", max_distance)
        if self.max_distance > 100:
            raise ValueError(f"'max_distance' must be at most 100, got {max_distance}")
        self.candidates = candidates
        self.window = check_positive_int("window", window, allow_zero=candidates != "segment")
        self.no_repeat = bool(no_repeat)
        self.decode = decode
        self.beam_size = check_positive_int("beam_size", beam_size)
        self.undirected = bool(undirected)
        self.coalesce = bool(coalesce)
        self.union_input = bool(union_input)
        self.self_loops = bool(self_loops)
        self.pg_to_nodes = bool(pg_to_nodes)
        self.share_structure = bool(share_structure)
        self.warm_start = check_positive_int("warm_start", warm_start, allow_zero=True)
        self.entropy_weight = float(entropy_weight)
        self.num_candidates = check_positive_int("num_candidates", num_candidates, allow_zero=True)
        if self.num_candidates and (policy != "parallel" or candidates != "all"):
            raise ValueError("'num_candidates' needs policy='parallel' and candidates='all'")
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.max_dense = check_positive_int("max_dense", max_dense)
        self.seed = check_int("seed", seed)

        K = self.max_distance
        sizes = {"input_graph": [K + 3], "sequence": [2 * K + 2], "predicted_so_far": [K + 2],
                 "both": [K + 3, K + 2], "none": []}[distance]
        segments = self.heads if self.head_adaptive else 0
        self.node_proj = Linear(channels, self.embed_dim, bias=False)
        if policy == "lstm":
            self.predictor: nn.Module = LSTMEdgeDecoder(self.embed_dim, self.hidden, sizes, segments)
        else:
            self.predictor = ParallelEdgePolicy(self.embed_dim, sizes, segments)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self._shared: tuple[object, EdgeSet] | None = None
        self._hops: tuple[Tensor, Tensor, HopDistances, dict[int, Tensor]] | None = None

    def reset_parameters(self) -> None:
        self.node_proj.reset_parameters()
        self.predictor.reset_parameters()
        self.steps.zero_()
        self._shared = None

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
            es = self._input_edges(ctx)
        else:
            self._check_memory(ctx)
            es = self._predict(ctx)
        self._remember(es)
        return es

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

    def _check_memory(self, ctx: ProducerContext) -> None:
        """The memory guard (:mod:`graphattn.memory`), on a bound from the sizes: per head segment
        at most :math:`\alpha N + B` predicted edges (rounding, at least one per graph), twice with
        ``undirected``, plus the self-loops and input edges. Each predicted edge also keeps its
        actions and log-probabilities, hence twice the bytes of a plain edge."""
        N, B = ctx.num_nodes, ctx.num_graphs
        segments = self.heads if self.head_adaptive else 1
        predicted = (self.alpha * N + B) * segments
        edges = predicted * (2 if self.undirected else 1) + (N if self.self_loops else 0)
        if self.union_input and ctx.data is not None and getattr(ctx.data, "edge_index", None) is not None:
            edges += int(ctx.data.edge_index.size(1))
        check_edges(edges, bytes_per_edge=2 * EDGE_BYTES,
                    what=f"SAC(alpha={self.alpha:g}) on {N:,} nodes", how_to_lower="lower alpha",
                    device=ctx.device)

    def _remember(self, es: EdgeSet) -> None:
        token = self.share_token
        self._shared = (token, es) if self.share_structure and token is not None else None

    def _input_edges(self, ctx: ProducerContext) -> EdgeSet:
        """The warm-start stage: the input edges plus a self-loop per node (GAT-style)."""
        if ctx.data is None or getattr(ctx.data, "edge_index", None) is None:
            raise ValueError("warm_start needs the input edges data.edge_index")
        es = _input_edges(ctx, self_loops=True)
        es.stats["warm_start"] = 1
        return es

    # ---------------------------------------------------------------------------- the layout
    def _layout(self, ctx: ProducerContext) -> dict[str, Any]:
        """Padded node vectors and per-graph sizes: ``emb [B, W, D]``, ``n [B]``, ``ptr``."""
        if self.head_adaptive and ctx.num_heads != self.heads:
            raise ValueError(f"head_adaptive SAC was built for heads={self.heads}, but the layer has "
                             f"num_heads={ctx.num_heads}")
        ptr = ctx.ptr  # raises a ValueError for an unsorted batch
        n = ptr.diff()
        B = ctx.num_graphs
        W = int(n.max()) if B and ctx.num_nodes else 0
        h = ctx.x if self.pg_to_nodes else ctx.x.detach()
        if h.size(-1) != self.node_proj.in_channels:
            raise ValueError(f"SAC was built for inputs of width {self.node_proj.in_channels}, but this "
                             f"layer's input has width {h.size(-1)} (a producer shared by layers of "
                             f"different input widths needs share_structure=True: only the first "
                             f"layer predicts)")
        w = self.node_proj(h.to(self.node_proj.weight.dtype))
        emb, _ = to_dense_batch(w, ctx.batch, batch_size=B, max_num_nodes=max(W, 1))
        return {"emb": emb[:, :W], "w": w, "n": n, "ptr": ptr, "B": B, "W": W}

    def _hop_distances(self, ctx: ProducerContext, ptr: Tensor) -> HopDistances:
        ei = getattr(ctx.data, "edge_index", None) if ctx.data is not None else None
        if ei is None:
            ei = torch.empty(2, 0, dtype=torch.long, device=ctx.device)
        else:
            EdgeSet(ei, num_heads=1).validate(ctx.num_nodes, ctx.batch)
        if self._hops is not None:
            old_ei, old_ptr, hops, _ = self._hops
            if old_ei.shape == ei.shape and old_ptr.shape == ptr.shape and torch.equal(old_ei, ei) \
                    and torch.equal(old_ptr, ptr):
                return hops
        hops = HopDistances(ei, ctx.num_nodes, ptr, self.max_distance)
        self._hops = (ei.clone(), ptr.clone(), hops, {})
        return hops

    def _hop_table(self, hops: HopDistances, B: int, W: int) -> Tensor:
        assert self._hops is not None
        tables = self._hops[3]
        if W not in tables:
            if B * W * W > self.max_dense:
                raise ValueError(f"policy='lstm' keeps [B, W, W] = [{B}, {W}, {W}] distance tables, more "
                                 f"than max_dense={self.max_dense}; use policy='parallel'")
            tables.clear()
            tables[W] = hops.table(B, W)
        return tables[W]

    def _cand_rows(self, o: Tensor, n: Tensor, W: int, hop_rows: Tensor | None) -> Tensor | None:
        """``[B, R, W]`` candidate destinations of the origins ``o [B, R]`` (``None``: all)."""
        j = torch.arange(W, device=o.device)
        kind, w = self.candidates, self.window
        if kind == "all":
            return None
        if kind == "causal":
            return j <= o[..., None]
        if kind == "window":
            return (j - o[..., None]).abs() <= w
        if kind == "segment":
            return torch.div(j, w, rounding_mode="floor") == torch.div(o, w, rounding_mode="floor")[..., None]
        assert hop_rows is not None
        return hop_rows.long() <= self.max_distance

    def _cand_count(self, n: Tensor, W: int, table: Tensor | None) -> Tensor:
        """``[B, W]`` number of candidate destinations of every origin (0 for padding)."""
        o = torch.arange(W, device=n.device)[None]
        nn_ = n[:, None]
        kind, w = self.candidates, self.window
        if kind == "all":
            c = nn_.expand(-1, W)
        elif kind == "causal":
            c = o + 1
        elif kind == "window":
            c = torch.minimum(o + w, nn_ - 1) - (o - w).clamp(min=0) + 1
        elif kind == "segment":
            s = torch.div(o, w, rounding_mode="floor") * w
            c = torch.minimum(s + w, nn_) - s
        else:
            assert table is not None
            real = torch.arange(W, device=n.device)[None, None] < nn_[..., None]
            c = ((table.long() <= self.max_distance) & real).sum(-1)
        return torch.where(o < nn_, c, 0)

    # ----------------------------------------------------------------------------- predicting
    def _predict(self, ctx: ProducerContext, actions: Any = None) -> EdgeSet:
        lay = self._layout(ctx)
        if self.policy == "lstm":
            res, hop_edge = self._run_lstm(ctx, lay, actions)
            return self._assemble(ctx, lay, res.origin, res.dest, res.head, res.log_prob, res.active,
                                  res.entropy, hop_edge)
        o, d, m, lp, act, ent, hop_edge = self._run_parallel(ctx, lay, actions)
        return self._assemble(ctx, lay, o, d, m, lp, act, ent, hop_edge)

    def _needs_hops(self) -> bool:
        return self.distance in ("input_graph", "both") or self.candidates == "hops"

    def _eval_mode(self, ctx: ProducerContext) -> str:
        return "sample" if ctx.training else self.decode

    def _no_repeat(self, mode: str) -> bool:
        """Greedy and beam decoding always forbid repeats (else they repeat the argmax)."""
        if mode == "forced":
            return self.no_repeat or (not self.training and self.decode in ("greedy", "beam"))
        return self.no_repeat or mode in ("greedy", "beam")

    def _run_lstm(self, ctx: ProducerContext, lay: dict[str, Any], actions: Any
                  ) -> tuple[DecodeResult, Tensor | None]:
        emb, n, B, W = lay["emb"], lay["n"], lay["B"], lay["W"]
        K = self.max_distance
        table = None
        if self._needs_hops() and B and W:
            table = self._hop_table(self._hop_distances(ctx, lay["ptr"]), B, W)
        cand_count = self._cand_count(n, W, table)
        segments = self.heads if self.head_adaptive else 1
        mode = "forced" if actions is not None else self._eval_mode(ctx)
        no_repeat = self._no_repeat(mode)
        forced = None
        if self.all_nodes:
            a = cand_count.clamp(max=int(self.alpha)) if no_repeat else \
                torch.where(cand_count > 0, int(self.alpha), 0)
            budget = a.sum(-1)
            forced = _schedule(a, W)
        else:
            budget = torch.floor(self.alpha * n.double() + 0.5).long()
            budget = torch.where(n > 0, budget.clamp(min=1), 0)
            if no_repeat:
                budget = torch.minimum(budget, cand_count.sum(-1))
        bidx = torch.arange(B, device=ctx.device)

        def hop_rows(o: Tensor) -> Tensor:
            assert table is not None
            return table[bidx[:, None], o]

        def candidates(o: Tensor) -> Tensor:
            rows = self._cand_rows(o, n, W, hop_rows(o) if self.candidates == "hops" else None)
            assert rows is not None
            return rows

        def buckets(o: Tensor, hist_o: Tensor, hist_d: Tensor) -> list[Tensor]:
            out = []
            if self.distance in ("input_graph", "both"):
                out.append(hop_rows(o))
            if self.distance == "sequence":
                out.append(sequence_buckets(o, W, K))
            if self.distance in ("predicted_so_far", "both"):
                out.append(predicted_so_far_buckets(o, hist_o, hist_d, W, K))
            return out

        plan = DecodePlan(emb=emb, n=n, budget=budget, segments=segments, forced_origins=forced,
                          candidates=None if self.candidates == "all" else candidates,
                          cand_count=cand_count, buckets=buckets, no_repeat=no_repeat,
                          needs_history=self.distance in ("predicted_so_far", "both"),
                          max_dense=self.max_dense)
        gen = KeyedRandom.for_context(ctx, self.seed) if mode == "sample" else None
        res = self.predictor.decode(plan, mode, generator=gen, beam_size=self.beam_size,
                                    actions=actions, want_entropy=self.entropy_weight > 0)
        hop_edge = None
        if table is not None and res.origin.numel():
            hop_edge = table[bidx[:, None], res.origin, res.dest]
        return res, hop_edge

    def _run_sparse(self, ctx: ProducerContext, lay: dict[str, Any]) -> tuple:
        """The parallel policy over sampled candidate lists (``num_candidates > 0``)."""
        from graphattn.producers.random import sample_without_replacement

        w, n, ptr, B = lay["w"], lay["n"], lay["ptr"], lay["B"]
        pol: ParallelEdgePolicy = self.predictor  # type: ignore[assignment]
        N, A, M = ctx.num_nodes, int(self.alpha), self.num_candidates
        mode = self._eval_mode(ctx)
        no_repeat = self._no_repeat(mode)
        # keyed draws (graphattn.producers.keyed_random): fresh candidates and draws every training
        # pass, fixed ones (``seed``) in evaluation; in a seeded call a graph's draws depend on it only
        rng = KeyedRandom.for_context(ctx, self.seed)
        hops = self._hop_distances(ctx, ptr)
        node = torch.arange(N, device=ctx.device)
        g = ctx.batch
        gw = rng.graph_words(n)[g]
        local = node - ptr[g]
        # candidates: the node itself, its input neighbours, M uniform nodes of its graph (no repeats)
        nptr, ncol = hops.neighbours()
        deg = nptr.diff()
        rnd = sample_without_replacement(n[g], M, rng.rows(_TAG_CANDIDATES, gw, local))
        rnd = torch.where(rnd >= 0, rnd + ptr[g][:, None], -1)
        bk_rnd = hops.pair_buckets(node[:, None].expand_as(rnd), rnd.clamp(min=0))
        rnd = torch.where((rnd >= 0) & (bk_rnd > 1), rnd, -1)  # self / neighbours are listed already
        segments = self.heads if self.head_adaptive else 1
        # origins in order of degree, so that a chunk's neighbour lists pad to a similar length
        perm = torch.argsort(deg, stable=True)
        C = max(1, self.chunk_size // max((M + 32) * self.embed_dim, 1))
        starts = list(range(0, N, C))
        grad = torch.is_grad_enabled()
        K = self.max_distance
        outs = []
        for c0 in starts:
            rows = perm[c0:c0 + C]
            Dm = int(deg[rows].max())
            slot = torch.arange(Dm, device=ctx.device)
            at = (nptr[rows, None] + slot).clamp(max=max(ncol.numel() - 1, 0))
            nb = torch.where(slot < deg[rows, None], ncol[at] if ncol.numel() else at, -1)
            cand = torch.cat([rows[:, None], nb, rnd[rows]], 1)
            bk = torch.cat([torch.zeros(rows.numel(), 1, dtype=torch.uint8, device=ctx.device),
                            torch.ones(rows.numel(), Dm, dtype=torch.uint8, device=ctx.device),
                            bk_rnd[rows]], 1)
            count = (cand >= 0).sum(1)
            per_origin = count.clamp(max=A) if no_repeat else torch.where(count > 0, A, 0)
            buckets = []
            if self.distance == "input_graph":
                buckets = [bk]
            elif self.distance == "sequence":  # offsets of the candidates in the node order
                off = cand.clamp(min=0) - rows[:, None]
                buckets = [torch.where(off.abs() <= K, off + K, 2 * K + 1)]
            for m in range(segments):
                q = pol.query(w[rows])
                if pol.head_q is not None:
                    q = q + pol.head_q[m].to(q.dtype)
                keys = rng.rows(_TAG_DRAWS, gw[rows], m, local[rows]).keys[None] if mode == "sample" else None
                pos, lp, used, ent, _ = pol.run_chunk(
                    q, w, cand, buckets, per_origin, num_draws=A, mode=mode, no_repeat=no_repeat,
                    keys=keys, grad=grad, sparse=True)
                dest = cand.gather(1, pos[0])
                outs.append((rows[:, None].expand_as(dest), dest, torch.full_like(dest, m), lp[0],
                             used[0], ent[0], bk.gather(1, pos[0]).long()))
        if not outs:
            z = torch.zeros(B, 0, dtype=torch.long, device=ctx.device)
            return z, z, z, w.new_zeros(B, 0), z.bool(), None, None
        o, d, mm, lp, used, ent, hop = (torch.cat([x[i] for x in outs]) for i in range(7))
        # back to the per-graph layout [B, T] the assembly expects (local ids): graph, head, origin
        gi = g[o]
        key = ((gi * segments + mm) * max(N, 1) + o) * A + torch.arange(A, device=o.device)
        order = torch.argsort(key.view(-1))
        flat = [t.reshape(-1)[order] for t in (o, d, mm, lp, used, ent, hop)]
        gf = gi.reshape(-1)[order]
        counts = torch.bincount(gf, minlength=B)
        T = int(counts.max()) if gf.numel() else 0
        pos_in = torch.arange(gf.numel(), device=o.device) - (counts.cumsum(0) - counts)[gf]

        def grid(t: Tensor, fill: Any) -> Tensor:
            out = torch.full((B, T), fill, dtype=t.dtype, device=t.device)
            return out.index_put((gf, pos_in), t)

        o_l = grid(flat[0] - ptr[gf], 0)
        d_l = grid(flat[1] - ptr[gf], 0)
        return (o_l, d_l, grid(flat[2], 0), grid(flat[3], 0.0), grid(flat[4], False),
                grid(flat[5], 0.0) if self.entropy_weight > 0 else None, grid(flat[6], 0))

    def _run_parallel(self, ctx: ProducerContext, lay: dict[str, Any], actions: Any) -> tuple:
        if self.num_candidates:
            if actions is not None:
                raise ValueError("teacher forcing is not available with num_candidates > 0 (the "
                                 "candidate sets are random)")
            return self._run_sparse(ctx, lay)
        emb, n, ptr, B, W = lay["emb"], lay["n"], lay["ptr"], lay["B"], lay["W"]
        pol: ParallelEdgePolicy = self.predictor  # type: ignore[assignment]
        K, A = self.max_distance, int(self.alpha)
        hops = self._hop_distances(ctx, ptr) if self._needs_hops() and B and W else None
        mode = "forced" if actions is not None else self._eval_mode(ctx)
        no_repeat = self._no_repeat(mode)
        rng = KeyedRandom.for_context(ctx, self.seed) if mode == "sample" else None
        gw = rng.graph_words(n) if rng is not None else None
        C = max(1, self.chunk_size // max(B * W, 1))
        segments = self.heads if self.head_adaptive else 1
        starts = list(range(0, W, C))
        grad = torch.is_grad_enabled()
        cols = torch.arange(W, device=ctx.device)
        real = cols[None, None] < n[:, None, None]
        outs: list[tuple[Tensor, ...]] = []
        for m in range(segments):
            for c0 in starts:
                c1 = min(W, c0 + C)
                o = torch.arange(c0, c1, device=ctx.device)[None].expand(B, -1)

                def masks(o: Tensor = o) -> tuple[Tensor, list[Tensor], Tensor]:
                    row_real = o < n[:, None]
                    rows = None
                    if hops is not None:
                        glob = (ptr[:-1, None] + o)[row_real]
                        rows = torch.full((B, o.size(1), W), K + 2, dtype=torch.uint8, device=o.device)
                        rows[row_real] = hops.rows(glob, W)
                    buckets = []
                    if self.distance == "input_graph":
                        buckets.append(rows)
                    elif self.distance == "sequence":
                        buckets.append(sequence_buckets(o, W, K))
                    valid = real & row_real[..., None]
                    cand = self._cand_rows(o, n, W, rows)
                    if cand is not None:
                        valid = valid & cand
                    count = valid.sum(-1)
                    a = count.clamp(max=A) if no_repeat else torch.where(count > 0, A, 0)
                    return valid, buckets, a

                q = pol.query(emb[:, c0:c1])
                if pol.head_q is not None:
                    q = q + pol.head_q[m].to(q.dtype)
                forced = None if actions is None else actions[m][:, c0:c1]
                keys = None if rng is None or gw is None else rng.rows(_TAG_DRAWS, gw[:, None], m, o).keys
                draws, lp, slot, ent, hop = pol.run_chunk(
                    q, emb, masks=masks, num_draws=A, mode=mode, no_repeat=no_repeat, keys=keys,
                    forced=forced, grad=grad)
                head = torch.full_like(draws, m)
                outs.append((o[..., None].expand_as(draws), draws, head, lp, slot, ent, hop))
        if not outs:
            z = torch.zeros(B, 0, dtype=torch.long, device=ctx.device)
            return z, z, z, emb.new_zeros(B, 0), z.bool(), None, None
        # per graph: head-major, then origin, then draw (the decoding order of teacher forcing)
        o, d, m, lp, slot, ent, hop = (torch.cat([x[i].reshape(B, -1) for x in outs], 1) for i in range(7))
        ent_out = ent if self.entropy_weight > 0 else None
        return o, d, m, lp, slot, ent_out, hop if self.distance == "input_graph" else None

    # ------------------------------------------------------------------------------ output
    def _assemble(self, ctx: ProducerContext, lay: dict[str, Any], o: Tensor, d: Tensor, m: Tensor,
                  lp: Tensor, active: Tensor, ent: Tensor | None, hop: Tensor | None) -> EdgeSet:
        ptr, B = lay["ptr"], lay["B"]
        g = torch.arange(B, device=ctx.device)[:, None].expand_as(o)
        g, o, d, m, lp = g[active], o[active], d[active], m[active], lp[active]
        src, dst = ptr[g] + d, ptr[g] + o
        sampled = torch.stack([src, dst])
        head = m if self.head_adaptive else None
        ei, eh = sampled, head
        if self.undirected:
            ei = torch.cat([sampled, sampled.flip(0)], 1)
            eh = None if head is None else torch.cat([head, head])
        code = origin_code("sampled")
        parts = [EdgeSet(ei, head=eh, num_heads=ctx.num_heads,
                         origin=torch.full((ei.size(1),), code, dtype=torch.long, device=ctx.device))]
        with_input = (self.union_input and ctx.data is not None
                      and getattr(ctx.data, "edge_index", None) is not None)
        if with_input:
            parts.append(_input_edges(ctx, self_loops=self.self_loops))
        elif self.self_loops:
            loop = torch.arange(ctx.num_nodes, device=ctx.device)
            parts.append(EdgeSet(torch.stack([loop, loop]), num_heads=ctx.num_heads, origin=torch.full(
                (ctx.num_nodes,), origin_code("self_loop"), dtype=torch.long, device=ctx.device)))
        es = parts[0] if len(parts) == 1 else union_edge_sets(parts, ctx.num_nodes)
        if self.coalesce:
            es = es.coalesce()
        aux = None
        if ent is not None and self.entropy_weight > 0:
            ent_mean = ent.sum() / max(int(active.sum()), 1)
            aux = -self.entropy_weight * ent_mean
        A = lp.numel()
        stats: dict[str, Any] = {
            "edges_per_node": es.num_edges / max(ctx.num_nodes, 1),
            "predicted_edges": A,
            "unique_fraction": _unique_pairs(sampled, head, ctx.num_nodes) / max(A, 1),
            "self_fraction": float((src == dst).float().mean()) if A else 0.0,
            "neg_log_prob_per_edge": float(-lp.detach().mean()) if A else 0.0,
        }
        if hop is not None:
            h = hop[active]
            stats["input_edge_fraction"] = float((h == 1).float().mean()) if A else 0.0
            stats["unreachable_fraction"] = float((h == self.max_distance + 2).float().mean()) if A else 0.0
        out = SampledEdgeSet(es.edge_index, head=es.head, num_heads=ctx.num_heads, origin=es.origin,
                             log_prob=lp, log_prob_graph=g, aux_loss=aux, stats=stats)
        out.sampled_edge_index = sampled
        out.sampled_head = head
        return out

    # ------------------------------------------------------------------------- teacher forcing
    def log_prob_of(self, x: Tensor, batch: Tensor | None, sampled_edge_index: Tensor,
                    sampled_head: Tensor | None = None, *, data: Any = None, num_heads: int | None = None
                    ) -> Tensor:
        """Teacher forcing: the log-probability of every edge of ``sampled_edge_index`` (as in a
        :class:`SampledEdgeSet`: graph by graph, in decoding order) under the current predictor.
        Reproduces the ``log_prob`` of the EdgeSet that produced the edges."""
        H = num_heads or (self.heads if self.head_adaptive else 1)
        ctx = ProducerContext(x, batch, num_heads=H, data=data, training=self.training)
        self._materialise(ctx)
        ptr = ctx.ptr
        if sampled_edge_index.dim() != 2 or sampled_edge_index.size(0) != 2:
            raise ValueError(f"'sampled_edge_index' must be [2, A], got {list(sampled_edge_index.shape)}")
        src, dst = sampled_edge_index
        g = ctx.batch[dst]
        if bool((ctx.batch[src] != g).any()):
            raise ValueError("'sampled_edge_index' joins two graphs")
        B = ctx.num_graphs
        W = int(ptr.diff().max()) if B and ctx.num_nodes else 0
        o_loc, d_loc = dst - ptr[g], src - ptr[g]
        order = torch.argsort(g, stable=True)
        counts = torch.bincount(g, minlength=B)
        pos = torch.arange(g.numel(), device=g.device) - (counts.cumsum(0) - counts)[g[order]]
        if self.policy == "lstm":
            T = int(counts.max()) if g.numel() else 0
            ao = torch.zeros(B, T, dtype=torch.long, device=g.device)
            ad = torch.zeros(B, T, dtype=torch.long, device=g.device)
            ao[g[order], pos] = o_loc[order]
            ad[g[order], pos] = d_loc[order]
            es = self._predict(ctx, actions=(ao, ad))
        else:
            segments = self.heads if self.head_adaptive else 1
            m = torch.zeros_like(g) if sampled_head is None else sampled_head
            key = (g * segments + m) * max(W, 1) + o_loc
            rank_order = torch.argsort(key, stable=True)
            k_sorted = key[rank_order]
            first = torch.ones_like(k_sorted, dtype=torch.bool)
            first[1:] = k_sorted[1:] != k_sorted[:-1]
            grp_start = torch.cummax(torch.where(first, torch.arange(k_sorted.numel(), device=g.device), 0),
                                     0).values
            rank = torch.empty_like(key)
            rank[rank_order] = torch.arange(k_sorted.numel(), device=g.device) - grp_start
            A = int(self.alpha)
            forced = torch.zeros(segments, B, W, A, dtype=torch.long, device=g.device)
            forced[m, g, o_loc, rank] = d_loc
            es = self._predict(ctx, actions=forced)
        # the EdgeSet's entries follow (graph, decoding order); map them back to the input order
        assert es.log_prob is not None
        se = es.sampled_edge_index  # type: ignore[attr-defined]
        if se.shape != sampled_edge_index.shape or not torch.equal(
                torch.sort(se[0] * max(ctx.num_nodes, 1) + se[1]).values,
                torch.sort(src * max(ctx.num_nodes, 1) + dst).values):
            raise ValueError("'sampled_edge_index' is not a sequence this predictor can emit (wrong "
                             "budget, order or origins)")
        if self.policy == "lstm":
            out = torch.empty_like(es.log_prob)
            out[order] = es.log_prob
            return out
        return _match_order(es, sampled_edge_index, sampled_head, ctx.num_nodes, segments)

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
        return ", ".join(parts)


def _unique_pairs(edges: Tensor, head: Tensor | None, N: int) -> int:
    key = edges[0] * max(N, 1) + edges[1]
    if head is not None:
        key = key * (int(head.max()) + 1 if head.numel() else 1) + head
    return int(torch.unique(key).numel())


def _schedule(a: Tensor, W: int) -> Tensor:
    """``[B, S]`` forced origins: node ``i`` of graph ``b`` repeated ``a[b, i]`` times, in node order."""
    B = a.size(0)
    S = int(a.sum(-1).max()) if B and a.numel() else 0
    out = torch.zeros(B, max(S, 1), dtype=torch.long, device=a.device)
    if S == 0:
        return out
    flat = a.reshape(-1)
    node = torch.arange(B * W, device=a.device).repeat_interleave(flat)
    g, i = node // W, node % W
    counts = a.sum(-1)
    pos = torch.arange(node.numel(), device=a.device) - (counts.cumsum(0) - counts)[g]
    out[g, pos] = i
    return out


def _match_order(es: EdgeSet, edges: Tensor, head: Tensor | None, N: int, segments: int) -> Tensor:
    """``es.log_prob`` reordered to follow ``edges`` (same multiset of (edge, head, occurrence))."""
    se = es.sampled_edge_index  # type: ignore[attr-defined]
    sh = es.sampled_head if es.sampled_head is not None else torch.zeros_like(se[0])  # type: ignore[attr-defined]
    h = head if head is not None else torch.zeros_like(edges[0])
    n = max(N, 1)

    def occurrence_key(ei: Tensor, hh: Tensor) -> Tensor:
        key = (hh * n + ei[1]) * n + ei[0]
        order = torch.argsort(key, stable=True)
        ks = key[order]
        first = torch.ones_like(ks, dtype=torch.bool)
        first[1:] = ks[1:] != ks[:-1]
        start = torch.cummax(torch.where(first, torch.arange(ks.numel(), device=ks.device), 0), 0).values
        occ = torch.empty_like(key)
        occ[order] = torch.arange(ks.numel(), device=ks.device) - start
        return key * (ks.numel() + 1) + occ

    ka, kb = occurrence_key(se, sh), occurrence_key(edges, h)
    ia, ib = torch.argsort(ka), torch.argsort(kb)
    out = torch.empty_like(es.log_prob)  # type: ignore[arg-type]
    out[ib] = es.log_prob[ia]  # type: ignore[index]
    return out
