r"""Fast paths for structured edge sets.

* :func:`shared_source_attention` — every target of graph :math:`b` attends, in head :math:`h`, to
  the same gathered sources ``sources[b, h]``: queries are padded per graph (query side only), keys
  and values are gathered into ``[B, H, k, C]`` and
  :func:`torch.nn.functional.scaled_dot_product_attention` does the rest.
* :func:`permutation_gather` — one in-edge per (target, head): ``out[t, h] = w[t, h] v[src[t, h], h]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def gather_rows(table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` along the first dimension (``[*index.shape, *table.shape[1:]]``) through
    :func:`torch.index_select`, whose backward (``index_add_``) sums in a fixed order: the backward
    of advanced indexing (``index_put_`` with accumulation) adds with atomics across CPU threads
    above 32k elements, so multi-threaded training would not be reproducible bit for bit."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


def _gather_heads(table: Tensor, index: Tensor) -> Tensor:
    """``table [S, H, C]``, ``index [B, Hs, k]`` → ``[B, H, k, C]`` (``Hs`` = 1 or H)."""
    _B, Hs, _k = index.shape
    H = table.size(1)
    if Hs == 1:
        return gather_rows(table, index[:, 0]).transpose(1, 2)  # [B, k, H, C] -> [B, H, k, C]
    heads = torch.arange(H, device=index.device).view(1, H, 1)
    return gather_rows(table.reshape(-1, table.size(2)), index * H + heads)


def shared_source_attention(
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor,
    sources: Tensor,
    ptr: Tensor,
    batch: Tensor,
    *,
    source_mask: Tensor | None = None,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    mode: str = "attention",
    dropout: float = 0.0,
    scale: float | None = None,
    gathered: bool = False,
) -> Tensor:
    """Attention of every real node over its graph's shared source list.

    Args:
        q: ``[N, H, C]`` queries of the real nodes (``None`` in weighted mode).
        k, v: ``[S, H, C]`` keys / values of all sources (real nodes, then virtual sources), or with
            ``gathered=True`` the keys / values of the slots, ``[B, H, k, C]`` (masked slots may hold
            anything finite).
        sources: ``[B, Hs, k]`` source ids per graph (and head).
        ptr, batch: graph layout of the real nodes (``batch`` sorted).
        source_mask, bias, weight: ``[B, Hs, k]``.

    Returns ``[N, H, C]``; targets of graphs without any valid source get 0.
    """
    N, H, C = batch.numel(), v.size(1), v.size(-1)
    B, Hs, kk = sources.shape
    if N == 0 or kk == 0 or B == 0:
        return v.new_zeros(N, H, C)
    counts = ptr[1:] - ptr[:-1]
    sizes = counts.tolist()  # one host read: the graph sizes
    n_max = max(sizes)
    # equal graph sizes (one graph, or a batch of equal-length sequences): the dense layout is a view
    uniform = B * n_max == N
    all_valid = source_mask is None or bool(source_mask.all())
    if all_valid:
        mask = None
        idx = sources
    else:
        assert source_mask is not None
        any_valid = source_mask.any(-1, keepdim=True)  # [B, Hs, 1]
        # a graph without sources attends to slot 0 (a valid index) and its output is zeroed below
        first = torch.zeros_like(source_mask)
        first[..., 0] = True
        mask = source_mask | (~any_valid & first)
        idx = torch.where(source_mask, sources, torch.zeros_like(sources))

    vd = v if gathered else _gather_heads(v, idx)  # [B, H, k, C]
    if weight is not None:
        w = weight if Hs == H else weight.expand(B, H, kk)
        vd = vd * w.unsqueeze(-1).to(vd.dtype)
    if mode == "attention":
        assert q is not None and k is not None
        kd = k if gathered else _gather_heads(k, idx)
        attn_mask = _attention_mask(mask, bias, q.dtype, q.device)
        classes = padding_classes(sizes, q.device, B * H * n_max * kk)
        if not uniform and sum(len(g) * n for g, n in classes) < PAD_GAIN * B * n_max:
            # ragged sizes: pad each size class to its own largest graph, not to the batch's
            out = _sdpa_by_size_class(q, kd, vd, attn_mask, sizes, classes, ptr, dropout, scale)
            if mask is not None:
                out = out * any_valid[batch].to(out.dtype)
            return out
        if uniform:
            qd = q.reshape(B, n_max, H, C)
        else:  # the queries padded per graph: slot (graph, position in it), zeros elsewhere
            local = torch.arange(N, device=batch.device) - ptr[batch]
            qd = q.new_zeros(B, n_max, H, C).index_put((batch, local), q)
        qd = qd.transpose(1, 2)  # [B, H, n_max, C]
        out = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=attn_mask, dropout_p=dropout, scale=scale
        )
    else:
        keep = None if mask is None else mask.expand(B, H, kk).to(vd.dtype)
        if dropout > 0:
            # each (target, slot) message is dropped independently: per-target coefficients
            drop = F.dropout(vd.new_ones(B, H, n_max, kk), p=dropout)
            if keep is not None:
                drop = drop * keep.unsqueeze(2)
            out = torch.einsum("bhnk,bhkc->bhnc", drop, vd)
        else:
            # weighted: every target of graph b receives sum_slots w * v (identical rows)
            masked = vd if keep is None else vd * keep.unsqueeze(-1)
            out = masked.sum(2, keepdim=True).expand(B, H, n_max, C)  # [B, H, 1 -> n_max, C]
    if mask is not None:
        out = out * any_valid.unsqueeze(-1).to(out.dtype)
    out = out.transpose(1, 2)  # [B, n_max, H, C]
    if uniform:
        return out.reshape(N, H, C)
    local = torch.arange(N, device=batch.device) - ptr[batch]
    return out[batch, local]


#: pad per size class when that computes fewer than this fraction of the batch-padded query rows
PAD_GAIN = 0.7
#: graphs whose sizes differ by less than this factor share one padded block
SIZE_CLASS_RATIO = 1.25


#: on a CUDA device, pad every graph to the batch's largest (one call) unless that computes more than
#: this many padded pairs: there a small model's step is bound by the host's kernel launches (each
#: size class costs ~25 more launches per layer, ~10–30 µs each), not by the padded arithmetic
CUDA_PAD_PAIRS = 2**28


def padding_classes(sizes: list[int], device: torch.device, padded_pairs: int,
                    ratio: float = SIZE_CLASS_RATIO) -> list[tuple[list[int], int]]:
    """The size classes to pad by: :func:`size_classes` on the CPU; on CUDA one class of every
    non-empty graph padded to the largest while the batch-padded work ``padded_pairs`` (e.g.
    :math:`B H n_{max} k` scores) stays under :data:`CUDA_PAD_PAIRS`, else :func:`size_classes`."""
    if device.type == "cuda" and padded_pairs <= CUDA_PAD_PAIRS:
        graphs = [g for g, n in enumerate(sizes) if n > 0]
        return [(graphs, max(sizes))] if graphs else []
    return size_classes(sizes, ratio)


def size_classes(sizes: list[int], ratio: float = SIZE_CLASS_RATIO) -> list[tuple[list[int], int]]:
    r"""Graphs grouped by size (each class's sizes within a factor ``ratio`` of its smallest), as
    ``(graph ids, largest size)``, empty graphs left out. Padding each class to its own largest graph
    instead of the batch's keeps padded work near :math:`\sum_g n_g` (or :math:`\sum_g n_g^2`)
    rather than :math:`B\, n_{max}` (:math:`B\, n_{max}^2`)."""
    order = sorted((n, g) for g, n in enumerate(sizes) if n > 0)
    classes: list[tuple[list[int], int]] = []
    smallest = 0
    for n, g in order:
        if not classes or n > ratio * smallest:
            classes.append(([], n))
            smallest = n
        classes[-1] = (classes[-1][0] + [g], n)
    return classes


def _attention_mask(mask: Tensor | None, bias: Tensor | None, dtype: torch.dtype,
                    device: torch.device) -> Tensor | None:
    """SDPA's ``attn_mask`` ``[B, Hs, 1, k]`` from the slot mask and the bias (``None`` when there is
    neither: SDPA's unmasked, fastest kernel)."""
    attn_mask: Tensor | None = None if mask is None else mask.unsqueeze(2)
    if bias is not None:
        b = bias.unsqueeze(2).to(dtype)
        if attn_mask is None:
            attn_mask = b
        else:
            neg = torch.tensor(float("-inf"), dtype=dtype, device=device)
            attn_mask = torch.where(attn_mask, b, neg)
    return attn_mask


def _sdpa_by_size_class(q: Tensor, kd: Tensor, vd: Tensor, attn_mask: Tensor | None,
                        sizes: list[int], classes: list[tuple[list[int], int]], ptr: Tensor,
                        dropout: float, scale: float | None) -> Tensor:
    """Shared-source attention ``[N, H, C]`` with the queries of each size class padded to the
    class's largest graph: one SDPA call per class on ``[G, H, n_class, C]`` queries and the
    class's ``[G, H, k, C]`` keys and values. Every index size is known on the host (no syncs).

    The queries (and keys, values, mask) of all classes are gathered in one call each and split
    per class: the backward is then one ``index_add`` into one zero tensor per input, not one
    full-size zero tensor and one accumulation per class."""
    N, H, C = q.shape
    dev = q.device
    plans = []
    for graphs, n_c in classes:
        G = len(graphs)
        total = sum(sizes[g] for g in graphs)
        g = torch.tensor(graphs, dtype=torch.long).to(dev)
        cnt = torch.tensor([sizes[i] for i in graphs], dtype=torch.long).to(dev)
        gi = torch.repeat_interleave(torch.arange(G, device=dev), cnt, output_size=total)
        slot = torch.arange(total, device=dev) - (torch.cumsum(cnt, 0) - cnt)[gi]
        plans.append((G, n_c, total, g, gi, slot, ptr[:-1][g][gi] + slot))
    perm = torch.cat([p[6] for p in plans])  # a permutation of the N nodes, class by class
    graph_ids = torch.cat([p[3] for p in plans])
    per_class = [p[0] for p in plans]
    q_parts = gather_rows(q, perm).split([p[2] for p in plans])
    k_parts = gather_rows(kd, graph_ids).split(per_class)
    v_parts = gather_rows(vd, graph_ids).split(per_class)
    m_parts = (None,) * len(plans) if attn_mask is None else \
        gather_rows(attn_mask, graph_ids).split(per_class)
    parts = []
    for (G, n_c, _total, _g, gi, slot, _nodes), qc, kc, vc, mc in zip(
            plans, q_parts, k_parts, v_parts, m_parts, strict=True):
        qd = q.new_zeros(G, n_c, H, C).index_put((gi, slot), qc)
        out = F.scaled_dot_product_attention(qd.transpose(1, 2), kc, vc, attn_mask=mc,
                                             dropout_p=dropout, scale=scale)  # [G, H, n_c, C]
        parts.append(out.transpose(1, 2)[gi, slot])
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(N, device=dev)
    return gather_rows(torch.cat(parts), inverse)


def permutation_gather(
    v: Tensor,
    src: Tensor,
    *,
    weight: Tensor | None = None,
    alpha: Tensor | None = None,
) -> Tensor:
    """``out[t, h] = alpha[t, h] * weight[t, h] * v[src[t, h], h]`` for ``src [N, Hs]``."""
    if src.size(1) == 1:
        out = v[src[:, 0]]
    else:  # gather (backward: scatter-add) is several times faster than v[src, heads] on CPU
        out = v.gather(0, src.unsqueeze(-1).expand(-1, -1, v.size(2)))
    coef = None
    if weight is not None:
        coef = weight
    if alpha is not None:
        coef = alpha if coef is None else coef * alpha
    if coef is not None:
        if coef.is_complex() and not out.is_complex():
            out = out.to(torch.promote_types(out.dtype, coef.dtype))
        out = out * coef.unsqueeze(-1)
    return out
