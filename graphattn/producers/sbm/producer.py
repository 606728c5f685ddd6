r"""SBM-Transformer (Cho et al., NeurIPS 2022): per-head attention graphs sampled from a
mixed-membership stochastic block model whose memberships are computed from the layer's queries and
keys; a straight-through gate carries the task gradient back to the model.

The model (memberships, block matrix) is :mod:`graphattn.producers.sbm.model`, the samplers
:mod:`~graphattn.producers.sbm.fastrg` and :mod:`~graphattn.producers.sbm.bernoulli`, the drawn edges
(de-duplication, self-loops) :mod:`~graphattn.producers.sbm.edges` and the straight-through gate
:mod:`~graphattn.producers.sbm.gate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from graphattn.core.edgeset import EdgeSet
from graphattn.core.index import sort_rows
from graphattn.core.origins import origin_code
from graphattn.memory import check_edges, within_budget
from graphattn.producers.base import (
    EdgeProducer,
    ProducerContext,
    check_number,
    check_positive_int,
    resolve_num_heads,
)
from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.registry import register_producer
from graphattn.producers.sbm.bernoulli import bernoulli_sample
from graphattn.producers.sbm.edges import SELF_LOOP, SampledEdges, add_self_loops, dedupe
from graphattn.producers.sbm.fastrg import fastrg_sample
from graphattn.producers.sbm.gate import edge_gate
from graphattn.producers.sbm.model import block_matrix, graph_sizes, key_projection, memberships

SAMPLERS = ("fastrg", "bernoulli")
STES = ("logit_bias", "logit_scale")
_KIND_ORIGINS = ("sampled", "exploration", "self_loop")  # indexed by SAMPLED, EXPLORATION, SELF_LOOP
#: bytes per drawn edge for the memory guard: the draws (query, key, head, kind), the de-duplication's
#: keys and permutation, and the EdgeSet (edge_index, head, origin, gate bias)
SBM_EDGE_BYTES = 96


@register_producer("sbm")
class SBMEdges(EdgeProducer):
    r"""Attention edges sampled per (graph, head) from a stochastic block model (SBM-Transformer).

    With the consuming layer's per-head queries and keys :math:`Q_h, K_h \in \mathbb{R}^{n \times d}`
    (read from the :class:`~graphattn.producers.ProducerContext`: the producer runs inside
    :class:`~graphattn.EdgeAttention` after the projections), per-head cluster embeddings
    :math:`C_h \in \mathbb{R}^{k \times d}` and **one** 2-layer MLP shared by all heads and by
    queries and keys (as in the official code):

    .. math::
        S_h = \operatorname{softmax}_{(u,v)}(C_h C_h^\top), \qquad
        \hat Q_h = \sigma(\operatorname{MLP}(Q_h) C_h^\top + b), \qquad
        \hat K_h = \sigma(\operatorname{MLP}(K_h) C_h^\top + b), \qquad
        p_{ij}^h = \hat Q_{h,i}\, S_h\, \hat K_{h,j}^\top \in (0, 1),

    the softmax running over all :math:`k^2` entries (:math:`\sum_{uv} S_{uv} = 1`) and :math:`b` a
    constant logit offset, 0 in the paper (see ``init_density``). Within every graph,
    query :math:`i` attends to the sampled keys :math:`j` (edge :math:`j \to i` in head :math:`h`):

    * ``sampler="fastrg"`` — exact fastRG (Alg. 1), linear in the number of edges: multiplicities
      :math:`N_{ij} \sim \operatorname{Poisson}(p_{ij} + \delta)`, so after de-duplication
      :math:`P(j \to i) = 1 - e^{-(p_{ij} + \delta)}` (never full attention);
    * ``sampler="bernoulli"`` — the official code's dense path,
      :math:`P(j \to i) = \operatorname{clamp}(p_{ij} + \delta, 0, 1)`, :math:`O(n^2 k)`.

    The forward pass is plain masked softmax attention over the sampled keys (:math:`p` does not enter
    it). The straight-through gate :math:`\text{gate}_e = 1` enters the logit as the additive bias
    :math:`b_e = \text{gate}_e - 1 = 0` (``ste="logit_bias"``, the official code's estimator), so
    :math:`\partial L / \partial p_e = \operatorname{clamp}(\partial L / \partial b_e, \pm c)`;
    ``ste="logit_scale"`` uses the paper's Eq. 9 instead, :math:`b_e = (\text{gate}_e - 1)\, q_i \cdot
    k_j / \sqrt{d}`, i.e. :math:`\partial L / \partial p_e = \operatorname{clamp}(\partial L / \partial
    b_e \cdot q_i \cdot k_j / \sqrt{d}, \pm c)`. Unsampled pairs get no gradient. The gradient
    reaches :math:`C`, the MLP and :math:`W_Q, W_K`.

    The density regulariser (the EdgeSet's ``aux_loss``, scaled by the trainer's ``aux_weight``
    :math:`\lambda`) is the sampled-edge count through the same gates,

    .. math::
        L_s = \frac{1}{H} \sum_h \frac{\sum_{e \in h} \text{gate}_e}{\sum_g n_g^2}
            \qquad (\text{value: edges} / (H \sum_g n_g^2)),

    so each sampled :math:`p_e` receives :math:`\lambda / (H \sum_g n_g^2)`; the clip applies to the
    sum of task and regulariser gradients, as in the code.

    ``stats`` (logged, never read by the math): scalars ``density`` (:math:`L_s`'s value),
    ``expected_density``, ``graph_density`` (mean over non-empty graphs and heads), ``density_head<h>``,
    ``sampled_edges``, ``expected_edges``, ``edges_per_node``; and ``per_graph_head``, a dict of
    ``[G, H]`` tensors ``sampled_edges``, ``expected_edges`` (fastRG: :math:`\mathbb{E}` of the drawn
    multi-edge count, :math:`\hat y S \hat z^\top + \delta n_g^2`; Bernoulli:
    :math:`\sum \operatorname{clamp}(p + \delta, 0, 1)`) and ``density``. Edge ``origin``:
    ``"sampled"``, ``"exploration"`` (drawn only by the :math:`\delta` term, fastRG), ``"self_loop"``
    (added loops).

    Memory guard: before drawing, the expected edge count :math:`\sum (p_{ij} + \delta)` is checked
    against the memory budget (:mod:`graphattn.memory`); at initialisation :math:`p \approx 0.25`, so
    large graphs are refused with a :class:`~graphattn.MemoryBudgetError` rather than drawn.

    Randomness: every draw is keyed by its graph, head, block and draw number
    (:mod:`~graphattn.producers.keyed_random`). One seed per call: from the caller's generator if
    given; otherwise from the global RNG in training and, in evaluation, ``eval_seed`` (``None``:
    the global RNG, i.e. stochastic evaluation as in the paper — then seed it yourself). In a
    seeded call (a generator, or ``eval_seed``) a graph is named by its size and a fingerprint of
    its raw features, so its edges never depend on its batch-mates; unseeded calls name graphs by
    position (every graph of the batch draws independently).

    Args:
        num_heads (int, optional): number of heads :math:`H` (checked against the layer; inferred
            if ``None``). ``heads`` is accepted as its older spelling.
        head_dim (int, optional): head size :math:`d` (inferred from the queries on the first call if
            ``None``; the parameters are created then).
        num_clusters (int): :math:`k` (128 in the paper).
        delta (float): exploration rate :math:`\delta` added to every :math:`p_{ij}` (0.01 in the paper).
        delta_in_eval (bool): also explore in evaluation (the official code does; the paper says
            training only).
        sampler (str): ``"fastrg"`` or ``"bernoulli"``.
        dedupe (bool): fastRG: a pair drawn several times is one edge (``False``: each copy is a term
            of the softmax, like a duplicated key, and counts in :math:`L_s`).
        self_loops (bool): add :math:`i \to i` in every head (the paper's "+I" variant); added loops
            carry no gate, a loop that was also sampled keeps its gate.
        ste (str): ``"logit_bias"`` or ``"logit_scale"`` (see above).
        ste_clip (float, optional): clip :math:`c` of the straight-through gradient (``None``: no clip).
        reg_weight (float): multiplies :math:`L_s` in ``aux_loss`` (e.g. ``1 / num_layers`` for the
            code's mean over layers).
        eval_seed (int, optional): seed of the evaluation generator.
        init_density (float, optional): the mean edge probability :math:`\bar p` at initialisation,
            in :math:`(0, 1)`. ``None`` (the paper): :math:`b = 0`, so :math:`\hat Q \approx \hat K
            \approx 1/2` and :math:`\bar p \approx 1/4`. Otherwise :math:`b =
            \operatorname{logit}(\bar p^{1/2})`, so :math:`\hat Q \approx \hat K \approx \bar p^{1/2}`
            (the initial logits :math:`\operatorname{MLP}(x) C^\top` are near 0). A departure from the
            paper, for speed: at :math:`\bar p = 1/4` the sampled graph holds a quarter of all pairs,
            which costs more than dense attention; the model can still learn any density, the MLP's
            bias cancelling :math:`b`. :math:`\delta` is added on top.
        chunk_size (int): fastRG draws (and gate-backward edges) processed at once.
    """

    def __init__(
        self,
        num_heads: int | None = None,
        head_dim: int | None = None,
        num_clusters: int = 128,
        delta: float = 0.01,
        delta_in_eval: bool = True,
        sampler: str = "fastrg",
        dedupe: bool = True,
        self_loops: bool = False,
        ste: str = "logit_bias",
        ste_clip: float | None = 1.0,
        reg_weight: float = 1.0,
        eval_seed: int | None = 0,
        chunk_size: int = 1 << 20,
        init_density: float | None = None,
        *,
        heads: int | None = None,
    ) -> None:
        super().__init__()
        self.heads = resolve_num_heads(num_heads, heads, "SBMEdges")
        self.head_dim = None if head_dim is None else check_positive_int("head_dim", head_dim)
        self.num_clusters = check_positive_int("num_clusters", num_clusters)
        self.delta = check_number("delta", delta, minimum=0)
        self.delta_in_eval = bool(delta_in_eval)
        if sampler not in SAMPLERS:
            raise ValueError(f"'sampler' must be one of {SAMPLERS}, got {sampler!r}")
        self.sampler = sampler
        self.dedupe = bool(dedupe)
        self.self_loops = bool(self_loops)
        if ste not in STES:
            raise ValueError(f"'ste' must be one of {STES}, got {ste!r}")
        self.ste = ste
        self.ste_clip = (None if ste_clip is None
                         else check_number("ste_clip", ste_clip, minimum=0, strict=True))
        self.reg_weight = check_number("reg_weight", reg_weight, minimum=0)
        if eval_seed is not None and (isinstance(eval_seed, bool) or not isinstance(eval_seed, int)):
            raise ValueError(f"'eval_seed' must be an int or None, got {eval_seed!r}")
        self.eval_seed = eval_seed
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        if init_density is not None:
            init_density = check_number("init_density", init_density, minimum=0, strict=True)
            if init_density >= 1:
                raise ValueError(f"'init_density' must be in (0, 1), got {init_density!r}")
        self.init_density = init_density
        root = 0.5 if init_density is None else math.sqrt(init_density)
        self.logit_offset = math.log(root / (1 - root))  # b; 0 for the paper's init
        self.register_parameter("clusters", None)
        self.register_module("proj", None)
        if self.heads is not None and self.head_dim is not None:
            self._build(self.heads, self.head_dim)
        self._register_load_state_dict_pre_hook(self._build_from_state_dict)

    # ------------------------------------------------------------------ parameters
    def _build(self, heads: int, head_dim: int, device: Any = None, dtype: Any = None) -> None:
        self.heads, self.head_dim = heads, head_dim
        self.clusters = nn.Parameter(
            torch.empty(heads, self.num_clusters, head_dim, device=device, dtype=dtype))
        self.proj = nn.Sequential(
            nn.Linear(head_dim, head_dim, device=device, dtype=dtype),
            nn.ReLU(),
            nn.Linear(head_dim, head_dim, device=device, dtype=dtype),
        )
        self.reset_parameters()

    def _build_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        key = prefix + "clusters"
        if self.clusters is None and key in state_dict:
            H, k, d = state_dict[key].shape
            if k != self.num_clusters:
                raise ValueError(f"the state dict has {k} clusters, this producer num_clusters="
                                 f"{self.num_clusters}")
            self._build(H, d, device=state_dict[key].device, dtype=state_dict[key].dtype)

    def reset_parameters(self) -> None:
        r"""Kaiming-normal clusters on the 3-D tensor (fan-in :math:`k d`, so
        :math:`S \approx 1/k^2` and :math:`p \approx 0.25` at init) and default ``nn.Linear`` MLP."""
        if self.clusters is None:
            return
        nn.init.kaiming_normal_(self.clusters)
        for layer in self.proj:  # type: ignore[union-attr]
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    def _materialise(self, heads: int, head_dim: int, ref: Tensor) -> None:
        if self.heads is not None and self.heads != heads:
            raise ValueError(f"SBMEdges was built for heads={self.heads}, the layer has {heads}")
        if self.head_dim is not None and self.head_dim != head_dim:
            raise ValueError(f"SBMEdges was built for head_dim={self.head_dim}, the layer's queries "
                             f"have {head_dim} channels per head")
        if self.clusters is None:
            dtype = ref.dtype if ref.dtype in (torch.float32, torch.float64) else torch.float32
            self._build(heads, head_dim, device=ref.device, dtype=dtype)

    # ---------------------------------------------------------------------- model
    def sbm(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""``(Q̂ [N, H, k], S [H, k, k], K̂ [N, H, k])`` from ``q, k [N, H, d]``."""
        if self.clusters is None:
            self._materialise(q.size(1), q.size(2), q)
        assert self.proj is not None
        C = self.clusters
        b = self.logit_offset
        return memberships(q, self.proj, C, b), block_matrix(C), memberships(k, self.proj, C, b)

    def draw(self, Y: Tensor, S: Tensor, Z: Tensor, ptr: Tensor, *, delta: float,
             generator: torch.Generator | KeyedRandom | None,
             check_memory: Callable[[float], None] | None = None) -> tuple[SampledEdges, Tensor]:
        """The sampling step on graph-sorted nodes: ``(edges, expected [G, H])`` (see
        :func:`~graphattn.producers.sbm.fastrg.fastrg_sample` / ``bernoulli_sample``)."""
        if self.sampler == "fastrg":
            return fastrg_sample(Y, S, Z, ptr, delta=delta, generator=generator,
                                 chunk_size=self.chunk_size, check_memory=check_memory)
        return bernoulli_sample(Y, S, Z, ptr, delta=delta, generator=generator, check_memory=check_memory)

    # -------------------------------------------------------------------- produce
    def produce(self, ctx: ProducerContext) -> EdgeSet:
        q, k = ctx.query(), ctx.key()
        if q.dim() != 3 or q.shape != k.shape or q.size(0) != ctx.num_nodes:
            raise ValueError(f"SBMEdges needs the layer's queries and keys [N={ctx.num_nodes}, H, d], "
                             f"got {list(q.shape)} and {list(k.shape)}")
        N, H, d = q.shape
        self._materialise(H, d, q)
        if q.dtype not in (torch.float32, torch.float64):
            q, k = q.float(), k.float()  # the SBM and the sampler run in fp32 under AMP
        with torch.autocast(q.device.type, enabled=False):
            Y, S, Z = self.sbm(q, k)
        perm, ptr = _graph_sorted(ctx)
        explore = self.delta > 0 and (ctx.training or self.delta_in_eval)
        Ys, Zs = Y.detach(), Z.detach()
        if perm is not None:
            Ys, Zs = Ys[perm], Zs[perm]
        delta = self.delta if explore else 0.0
        drawn, expected = self.draw(Ys, S.detach(), Zs, ptr, delta=delta, generator=self._generator(ctx),
                                    check_memory=self._memory_check(ctx, H, delta))
        if perm is not None:
            drawn = drawn._replace(query=perm[drawn.query], key=perm[drawn.key])
        if self.self_loops:
            drawn = add_self_loops(drawn, N, H, dedupe_edges=self.dedupe)
        elif self.dedupe and self.sampler == "fastrg":
            drawn = dedupe(drawn, N, H)

        gated = drawn.kind != SELF_LOOP
        bias, count = self._gate(q, k, Y, S, Z, drawn, gated)
        sizes = graph_sizes(ptr)
        pairs = float((sizes.to(torch.float64) ** 2).sum())
        reg = count / (H * pairs) if pairs else count * 0.0
        origin_table = torch.tensor([origin_code(o) for o in _KIND_ORIGINS], device=q.device)
        return EdgeSet(
            torch.stack([drawn.key, drawn.query]),
            head=drawn.head,
            num_heads=H,
            bias=bias,
            origin=origin_table[drawn.kind],
            aux_loss=reg * self.reg_weight,
            stats=_stats(ctx, drawn, gated, expected, sizes, H),
        )

    def _memory_check(self, ctx: ProducerContext, H: int, delta: float) -> Callable[[float], None] | None:
        r"""The memory guard (:mod:`graphattn.memory`) on the number of drawn edges. As
        :math:`p_{ij} < 1`, the expectation :math:`\sum_{g,h} \sum_{i,j \in g} (p_{ij} + \delta)` is
        at most :math:`(1 + \delta) H N^2`, a bound from the sizes: when it fits, no check (``None``).
        Otherwise the sampler calls the returned check with its expected edge count (fastRG: the
        exact expectation, read with the finiteness check it makes anyway; Bernoulli: the number
        of pairs) before drawing."""
        N = ctx.num_nodes
        if within_budget((1 + delta) * H * N * N * SBM_EDGE_BYTES, ctx.device):
            return None
        def check(edges: float) -> None:
            check_edges(edges, bytes_per_edge=SBM_EDGE_BYTES, device=ctx.device,
                        what=f"SBMEdges (delta={delta:g}, {H} heads) on {N:,} nodes, expected from the "
                        f"current memberships,",
                        how_to_lower="use smaller graphs or batches or fewer heads, lower delta, or train "
                        "towards sparser graphs (reg_weight) or start sparser (init_density); at "
                        "initialisation about init_density (default a quarter) of all pairs is drawn")

        return check

    def _gate(self, q: Tensor, k: Tensor, Y: Tensor, S: Tensor, Z: Tensor, drawn: SampledEdges,
              gated: Tensor) -> tuple[Tensor | None, Tensor]:
        """``(bias [E] or None, differentiable count of the gated edges)``."""
        needs_grad = torch.is_grad_enabled() and (Y.requires_grad or Z.requires_grad or S.requires_grad)
        if not needs_grad:
            return None, gated.sum().to(Y.dtype)
        mask = gated.to(Y.dtype)
        gate = edge_gate(Y, key_projection(Z, S), drawn.query, drawn.key, drawn.head,
                         clip=self.ste_clip, chunk=max(1, self.chunk_size >> 4)) * mask
        bias = gate - mask  # forward value exactly 0
        if self.ste == "logit_scale":
            score = (q[drawn.query, drawn.head] * k[drawn.key, drawn.head]).sum(-1).detach()
            bias = bias * (score / math.sqrt(q.size(-1)))
        return bias, gate.sum()

    def _generator(self, ctx: ProducerContext) -> KeyedRandom:
        """The call's keyed draws: the caller's generator wins; else the global RNG in training and
        in the paper's stochastic evaluation (``eval_seed=None``), ``eval_seed`` otherwise."""
        return KeyedRandom.for_context(ctx, self.eval_seed)

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, num_clusters={self.num_clusters}, "
                f"sampler={self.sampler!r}, delta={self.delta}, dedupe={self.dedupe}, "
                f"self_loops={self.self_loops}, ste={self.ste!r}"
                + ("" if self.init_density is None else f", init_density={self.init_density}"))


def _graph_sorted(ctx: ProducerContext) -> tuple[Tensor | None, Tensor]:
    """``(perm, ptr)``: ``perm`` sorts the nodes by graph (``None`` if ``batch`` is sorted), ``ptr``
    is the CSR pointer of the sorted order."""
    if ctx.is_sorted:
        return None, ctx.ptr
    return sort_rows(ctx.batch, ctx.num_graphs)


def _stats(ctx: ProducerContext, drawn: SampledEdges, gated: Tensor, expected: Tensor,
           sizes: Tensor, H: int) -> dict[str, Any]:
    G = sizes.numel()
    n2 = sizes.to(torch.float64) ** 2
    pairs = float(n2.sum())
    if G == 1:  # one graph: the (graph, head) cell is the head (no gather of the batch vector)
        gh = drawn.head[gated]
    else:
        gh = ctx.batch[drawn.query[gated]] * H + drawn.head[gated]
    sampled = torch.bincount(gh, minlength=G * H).view(G, H)
    density = torch.where(n2[:, None] > 0, sampled / n2[:, None].clamp(min=1), torch.zeros_like(n2[:, None]))
    nonempty = sizes > 0
    graph_density = density[nonempty].mean() if G else density.new_zeros(())
    # one host transfer for every scalar
    total, exp_total, gd, *per_head = torch.stack([
        sampled.sum().to(torch.float64), expected.sum().to(torch.float64),
        torch.nan_to_num(graph_density.to(torch.float64)), *sampled.sum(0).to(torch.float64)]).tolist()
    denom = H * pairs if pairs else 1.0
    stats: dict[str, Any] = {
        "density": total / denom,
        "expected_density": exp_total / denom,
        "graph_density": gd,
        "sampled_edges": total,
        "expected_edges": exp_total,
        "edges_per_node": drawn.num_edges / max(ctx.num_nodes, 1),
    }
    for h, count in enumerate(per_head):
        stats[f"density_head{h}"] = count / (pairs or 1.0)
    # the [G, H] tensors, grouped (loggers of scalar statistics skip non-scalar values)
    stats["per_graph_head"] = {"sampled_edges": sampled, "expected_edges": expected, "density": density}
    return stats
