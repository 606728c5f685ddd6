r"""SAMSA: differentiable top-:math:`k` sampling without replacement (Lenhat et al., 2024).

Every (graph, head) samples :math:`k` key/value sources out of its own nodes plus :math:`2k`
learnable support tokens, by Gumbel-perturbed importance scores; every node of the graph attends to
them (a :class:`~graphattn.SharedSourceEdgeSet`, consumed by the dense SDPA fast path of
:class:`~graphattn.EdgeAttention`). The gradient reaches the importance scores through the authors'
pairwise-sigmoid proxy (their code's §4.2 version, not the paper's Algorithm 2). See
``docs/samsa.md`` for the derivation of the exactness claims below.

The score network is :mod:`graphattn.producers.samsa.scoring`; the Gumbel noise, the relaxed slots
and the selection record are :mod:`graphattn.producers.samsa.sampling`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch_geometric.utils import to_dense_batch

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.core.structured import SharedSourceEdgeSet
from graphattn.kernels import gather_rows
from graphattn.producers.base import (
    EdgeProducer,
    ProducerContext,
    check_dtype,
    check_number,
    check_positive_int,
    check_sized_channels,
)
from graphattn.producers.keyed_random import KeyedRandom
from graphattn.producers.registry import register_producer
from graphattn.producers.samsa.sampling import (
    NODE_TAG,
    SUPPORT_TAG,
    SamsaSelection,
    gumbel_from_uniform,
    hard_slots,
    soft_slots,
)
from graphattn.producers.samsa.scoring import ImportanceScore


@register_producer("samsa")
class SAMSA(EdgeProducer):
    r"""SAMSA sampling: every (graph :math:`b`, head :math:`h`) picks :math:`k` sources by
    Gumbel-perturbed learned importance scores, without replacement; every node of :math:`b`
    attends to them in head :math:`h` (a :class:`~graphattn.SharedSourceEdgeSet`).

    For graph :math:`b` with nodes :math:`V_b` and head :math:`h`:

    .. math::
        z_v = s(x)_{v,h} + g_v \ (v \in V_b), \qquad z_{\sigma} = S^z_{\sigma,h} + g_\sigma
            \ (\sigma < S), \qquad g \sim \operatorname{Gumbel}(0, 1)

        I = \operatorname{ArgTop}_{2k}(z), \quad T = I_{1..k},\quad R = I_{k+1..2k},\qquad
        p_{ij} = \sigma\big((z_{T_i} - z_{R_j})/\tau\big),\quad \bar p_i = \tfrac1k\textstyle\sum_j p_{ij}

    over the :math:`|V_b| + S` candidates: the graph's nodes and :math:`S = 2k` learnable support
    tokens :math:`S^x_{h,\sigma}` with scores :math:`S^z_{\sigma,h}` (so every graph, even an empty
    one, has :math:`\ge 2k` candidates). :math:`s` is :class:`ImportanceScore`. Slot :math:`i` is

    * **hard** (default): forward :math:`\hat x_{T_i}`, the top candidate itself; backward
      straight-through: :math:`\partial\hat x_{T_i} = G_i`, nothing to :math:`\hat x_{R_j}`, and the
      scores get the gradient of the soft slot below with the features held fixed:
      :math:`\partial z_{T_i} = \frac1k\sum_j s'_{ij}\,G_i\cdot(\hat x_{T_i} - \hat x_{R_j})`,
      :math:`\partial z_{R_j} = -\frac1k\sum_i s'_{ij}\,G_i\cdot(\hat x_{T_i} - \hat x_{R_j})`,
      :math:`s'_{ij} = p_{ij}(1-p_{ij})/\tau`;
    * **soft**: :math:`\bar p_i\,\hat x_{T_i} + \frac1k\sum_j (1-p_{ij})\,\hat x_{R_j}` with exact
      autograd (also in evaluation).

    Target :math:`t \in V_b` then attends, in head :math:`h`, to the :math:`k` slots:
    :math:`o_t^h = \sum_i \operatorname{softmax}_i(q_t^h \cdot k^h(\text{slot}_i)/\sqrt{C})\,
    v^h(\text{slot}_i)` — computed by :class:`~graphattn.EdgeAttention`, not here.

    **Emitted sources.** In hard evaluation the sources are the selected real node ids and the
    selected supports as virtual sources (the attention projects them like nodes). In training and
    in soft mode every slot is a virtual source whose feature is the slot above (in the attention's
    input space :math:`\hat x`); its key/value is the layer's affine projection of it. Because the
    mixture weights sum to 1 (:math:`\bar p_i + \frac1k\sum_j(1-p_{ij}) = 1`), the projection of a
    mixture equals the mixture of the projections, biases included; in the hard proxy the bias
    term cancels pair by pair (:math:`G\cdot(Wx_T + b - Wx_R - b) = G\cdot W(x_T - x_R)`), so the
    score gradients equal the official kv-space ones exactly (the slope clamp included).
    Supports live in :math:`\hat x` space (:math:`S^x \in \mathbb{R}^{H \times S \times d}`,
    :math:`\mathcal N(0, 1)` like an RMS-normalised token), a reparametrisation of the official
    kv-space supports through the layer's projections.

    **Randomness.** Gumbel noise is added in training and, if ``eval_noise``, in evaluation (the
    official code's stochastic evaluation). Its uniforms are keyed (:mod:`~graphattn.producers.
    keyed_random`) by graph, node index within the graph (or support slot) and head, with one seed
    per call drawn from the caller's generator, else the global RNG; with a caller's generator a
    graph is named by its size, so its noise never depends on its batch-mates.
    :meth:`fixed_noise` injects noise (used in every mode). Without noise, evaluation is
    deterministic.

    **Clamp.** With ``clamp_sigmoid_grad`` the slopes :math:`s'` are rescaled per head by
    :math:`\min(m_h, 1/4)/\max(m_h, \epsilon)`, :math:`m_h` the largest slope of head :math:`h`
    over the whole batch (official; a no-op for :math:`\tau \ge 1`; it couples the graphs' gradients
    for :math:`\tau < 1`).

    **Degenerate graphs.** With ``num_support < 2k`` a graph may have fewer than :math:`2k` (or
    :math:`k`) candidates: a missing competitor counts as :math:`p_{ij} = 1` (a competitor with
    score :math:`-\infty`: the weights still sum to 1, no gradient), a missing top slot is masked.
    With ``num_support=0`` and :math:`k \ge |V_b|`, hard evaluation is full attention over the graph.

    Needs ``batch`` sorted by graph (a PyG ``Batch``).

    Args:
        channels (int): width :math:`d` of the attention input (and of the score input).
        num_heads (int): :math:`H`; must match the consuming layer's heads.
        k (int): sources per (graph, head).
        tau (float): temperature :math:`\tau` of the pairwise proxy (not of the noise).
        hard (bool): hard (straight-through) or soft slots.
        num_support (int, optional): support tokens :math:`S` per head (default :math:`2k`; 0: none).
        eval_noise (bool): Gumbel noise in evaluation too (official); default off (deterministic).
        clamp_sigmoid_grad (bool): the official slope clamp.
        clamp_eps (float): :math:`\epsilon` of the clamp (guards :math:`m_h = 0`).
        score_from (str, optional): read the score network's input ``[N, d]`` from the caller's
            named input ``score_from`` (:meth:`~graphattn.ProducerContext.input`: the ``inputs``
            of :class:`~graphattn.EdgeAttention`, else ``data.<score_from>``) instead of the
            attention input (the ``samsa`` preset passes its un-normalised residual stream as
            ``"residual"``, as the paper).
        max_pairs (int): guard on the :math:`B \cdot H \cdot k^2` pair tensor of training and soft
            mode; a larger batch raises a :class:`ValueError` (lower the batch size or ``k``).
    """

    lazy_channels: ClassVar[bool] = False  # parameters sized by the input width

    def __init__(
        self,
        channels: int,
        num_heads: int = 1,
        k: int = 32,
        tau: float = 1.0,
        hard: bool = True,
        num_support: int | None = None,
        eval_noise: bool = False,
        clamp_sigmoid_grad: bool = True,
        clamp_eps: float = 1e-12,
        score_from: str | None = None,
        max_pairs: int = 2**28,
    ) -> None:
        super().__init__()
        self.channels = check_sized_channels("SAMSA", channels)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.k = check_positive_int("k", k)
        self.tau = check_number("tau", tau, minimum=0, strict=True)
        self.hard = bool(hard)
        self.num_support = 2 * self.k if num_support is None else check_positive_int(
            "num_support", num_support, allow_zero=True)
        self.eval_noise = bool(eval_noise)
        self.clamp_sigmoid_grad = bool(clamp_sigmoid_grad)
        if not clamp_eps > 0:
            raise ValueError(f"'clamp_eps' must be positive, got {clamp_eps!r}")
        self.clamp_eps = float(clamp_eps)
        if score_from is not None and (not isinstance(score_from, str) or not score_from):
            raise ValueError(f"'score_from' must be a data attribute name or None, got {score_from!r}")
        self.score_from = score_from
        self.max_pairs = check_positive_int("max_pairs", max_pairs)
        self.score = ImportanceScore(channels, num_heads)
        S = self.num_support
        self.support_x = nn.Parameter(torch.empty(num_heads, S, channels))
        self.support_score = nn.Parameter(torch.empty(S, num_heads))
        self._noise: tuple[Tensor, Tensor | None] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.score.reset_parameters()
        nn.init.normal_(self.support_x)
        nn.init.normal_(self.support_score)

    # ----------------------------------------------------------------------------- noise
    @contextmanager
    def fixed_noise(self, node_noise: Tensor, support_noise: Tensor | None = None) -> Iterator[None]:
        """Within the block, use ``node_noise [N, H]`` and ``support_noise [B, S, H]`` (default 0)
        as the Gumbel noise, in every mode (tests, reproducing a draw)."""
        self._noise = (node_noise, support_noise)
        try:
            yield
        finally:
            self._noise = None

    def _draw_noise(self, ctx: ProducerContext, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
        N, B, H, S = ctx.num_nodes, ctx.num_graphs, self.num_heads, self.num_support
        if self._noise is not None:
            node, sup = self._noise
            if not isinstance(node, Tensor) or tuple(node.shape) != (N, H):
                raise ValueError(f"'node_noise' must have shape [{N}, {H}], got "
                                 f"{list(node.shape) if isinstance(node, Tensor) else node!r}")
            if sup is None:
                sup = node.new_zeros(B, S, H)
            if not isinstance(sup, Tensor) or tuple(sup.shape) != (B, S, H):
                raise ValueError(f"'support_noise' must have shape [{B}, {S}, {H}], got "
                                 f"{list(sup.shape) if isinstance(sup, Tensor) else sup!r}")
            return node.to(ctx.device, dtype), sup.to(ctx.device, dtype)
        if not (ctx.training or self.eval_noise):
            return None
        rng = KeyedRandom.for_context(ctx, None)
        dev = ctx.device
        graph = rng.graph_words(ctx.counts)
        heads = torch.arange(H, device=dev)
        node = rng.rows(NODE_TAG, graph[ctx.batch][:, None], ctx.local_index()[:, None], heads[None, :])
        sup = rng.rows(SUPPORT_TAG, graph[:, None, None], torch.arange(S, device=dev)[None, :, None],
                       heads[None, None, :])
        return gumbel_from_uniform(node.uniform(dtype=dtype)), gumbel_from_uniform(sup.uniform(dtype=dtype))

    # ------------------------------------------------------------------------- selection
    def _score_input(self, ctx: ProducerContext) -> Tensor:
        if self.score_from is None:
            xs = ctx.x
        else:
            xs = ctx.input(self.score_from)
            if not isinstance(xs, Tensor) or xs.dim() != 2 or xs.size(0) != ctx.num_nodes:
                raise ValueError(f"the score input {self.score_from!r} must be [N={ctx.num_nodes}, "
                                 f"{self.channels}], got {getattr(xs, 'shape', xs)!r}")
        if xs.size(1) != self.channels:
            raise ValueError(f"SAMSA(channels={self.channels}) got a score input of width "
                             f"{xs.size(1)}")
        name = "x" if self.score_from is None else self.score_from
        if not xs.is_floating_point():
            raise ValueError(f"'{name}' must be a floating-point tensor, got {xs.dtype}")
        check_dtype(name, xs, self, "SAMSA")
        return xs

    def select(self, ctx: ProducerContext, competitors: bool = True) -> SamsaSelection:
        """The top-:math:`k` and the competing :math:`k` candidates of every (graph, head); with
        ``competitors=False`` the top-:math:`k` alone (``bottom`` empty: hard evaluation uses no
        competitor, and a top-:math:`k` is cheaper than a top-:math:`2k`)."""
        if ctx.num_heads != self.num_heads:
            raise ValueError(f"SAMSA(num_heads={self.num_heads}) is used by a layer with "
                             f"{ctx.num_heads} heads")
        if ctx.x.size(1) != self.channels:
            raise ValueError(f"SAMSA(channels={self.channels}) got x of width {ctx.x.size(1)}")
        N, B, H, S = ctx.num_nodes, ctx.num_graphs, self.num_heads, self.num_support
        ptr = ctx.ptr  # raises a ValueError for an unsorted batch
        counts = ptr[1:] - ptr[:-1]
        n_max = int(counts.max()) if B and N else 0
        work = torch.promote_types(ctx.x.dtype, torch.float32)
        neg = torch.finfo(work).min / 2  # padding score: below every finite score, never -inf

        s = self.score(self._score_input(ctx)).to(work)  # [N, H]
        sz = self.support_score.to(work).t().unsqueeze(0).expand(B, H, S)  # [B, H, S]
        noise = self._draw_noise(ctx, work)
        if noise is not None:
            s = s + noise[0]
            sz = sz + noise[1].transpose(1, 2)
        if N == B * n_max:  # graphs of one size (one sequence, fixed-length batches): no padding
            real = s.view(B, n_max, H)
            real_valid = torch.ones(B, n_max, dtype=torch.bool, device=s.device)
        else:
            real, real_valid = to_dense_batch(s, ctx.batch, fill_value=neg, max_num_nodes=n_max,
                                              batch_size=B)  # [B, n_max, H], [B, n_max]
        pool = torch.cat([real.transpose(1, 2), sz], dim=2)  # [B, H, n_max + S]
        valid = torch.cat([real_valid, real_valid.new_ones(B, S)], 1)  # [B, P]
        P = n_max + S
        k = min(self.k, P)
        m = min(2 * k if competitors else k, P)
        z, idx = pool.topk(m, dim=2)  # sorted, descending
        ok = valid[:, None, :].expand(B, H, P).gather(2, idx)
        cand = torch.where(
            idx < n_max,
            ptr[:-1].view(B, 1, 1) + idx,
            N + torch.arange(H, device=ctx.device).view(1, H, 1) * S + (idx - n_max),
        )
        cand = torch.where(ok, cand, torch.full_like(cand, -1))
        if competitors and m < 2 * k:  # fewer than 2k candidates in the pool: missing competitors
            pad = 2 * k - m
            z = torch.cat([z, z.new_full((B, H, pad), neg)], 2)
            cand = torch.cat([cand, cand.new_full((B, H, pad), -1)], 2)
            ok = torch.cat([ok, ok.new_zeros(B, H, pad)], 2)
        return SamsaSelection(
            top=cand[..., :k], bottom=cand[..., k:], top_valid=ok[..., :k],
            bottom_valid=ok[..., k:], z_top=z[..., :k], z_bottom=z[..., k:], num_nodes=N,
            num_support=S,
        )

    # ---------------------------------------------------------------------------- produce
    def _candidate_table(self, x: Tensor) -> Tensor:
        """``[N + H·S + 1, F]``: the nodes, the supports of every head, a zero row (missing)."""
        sup = self.support_x.to(x.dtype).reshape(-1, self.channels)
        return torch.cat([x, sup, x.new_zeros(1, self.channels)])

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        sel = self.select(ctx, competitors=not self.hard or ctx.training)
        B, H, k = sel.top.shape
        N = ctx.num_nodes
        origin = torch.where(sel.top_is_support, origin_code("support"), origin_code("sampled"))
        mask = None if bool(sel.top_valid.all()) else sel.top_valid
        stats = self._stats(ctx, sel)
        if self.hard and not ctx.training:
            return self._real_sources(ctx, sel, origin, mask, stats)
        if B * H * k * k > self.max_pairs:
            raise ValueError(
                f"SAMSA's pair tensor would have B·H·k² = {B * H * k * k} > max_pairs="
                f"{self.max_pairs} entries; lower the batch size or k, or raise max_pairs"
            )
        table = self._candidate_table(ctx.x)
        miss = table.size(0) - 1
        x_top = gather_rows(table, torch.where(sel.top_valid, sel.top, miss))  # [B, H, k, F]
        x_bot = gather_rows(table, torch.where(sel.bottom_valid, sel.bottom, miss))
        slot_fn = hard_slots if self.hard else soft_slots
        slots = slot_fn(x_top, x_bot, sel.z_top, sel.z_bottom, sel.pair_valid, tau=self.tau,
                        clamp=self.clamp_sigmoid_grad, eps=self.clamp_eps)
        sources = N + torch.arange(B * H * k, device=ctx.device).view(B, H, k)
        virtual_batch = torch.arange(B, device=ctx.device).repeat_interleave(H * k)
        return SharedSourceEdgeSet(
            sources, ctx.ptr, num_heads=H, source_mask=mask, origin=origin,
            virtual_x=slots.reshape(B * H * k, self.channels), virtual_batch=virtual_batch,
            stats=stats,
        )

    def _real_sources(self, ctx: ProducerContext, sel: SamsaSelection, origin: Tensor,
                      mask: Tensor | None, stats: dict[str, Any]) -> EdgeSet:
        """Hard evaluation: the selected node ids; the selected supports as virtual sources."""
        N = ctx.num_nodes
        top = torch.where(sel.top_valid, sel.top, torch.zeros_like(sel.top))
        is_sup = sel.top_is_support & sel.top_valid
        virtual_x = None
        if bool(is_sup.any()):
            used, inverse = torch.unique(top[is_sup] - N, return_inverse=True)
            top = top.masked_scatter(is_sup, N + inverse)
            sup = self.support_x.to(ctx.x.dtype).reshape(-1, self.channels)
            virtual_x = sup[used]
        return SharedSourceEdgeSet(
            top, ctx.ptr, num_heads=self.num_heads, source_mask=mask, origin=origin,
            virtual_x=virtual_x, stats=stats,
        )

    def _stats(self, ctx: ProducerContext, sel: SamsaSelection) -> dict[str, Any]:
        counts = ctx.ptr[1:] - ctx.ptr[:-1]
        per_graph = sel.top_valid.sum((1, 2))  # sources per node, all heads
        edges, supports, valid = torch.stack([  # integers, read in one transfer
            (counts * per_graph).sum(), (sel.top_is_support & sel.top_valid).sum(),
            sel.top_valid.sum()]).tolist()
        return {
            "edges_per_node": edges / max(ctx.num_nodes, 1),
            "support_fraction": supports / max(valid, 1),
        }

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, num_heads={self.num_heads}, k={self.k}, "
                f"tau={self.tau}, hard={self.hard}, num_support={self.num_support}, "
                f"eval_noise={self.eval_noise}")
