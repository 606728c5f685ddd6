r"""Pure-torch reference kernels for sparse attention on destination-sorted edges (the oracle).

Attention over an explicit edge set is three named steps, as in DGL's sparse graph transformer:

1. **SDDMM** — per-edge logits :math:`s_e = q_{i_e} \cdot k_{j_e} \cdot \text{scale} + b_e`;
2. **segment softmax** — :math:`\alpha_e = \exp(s_e - m_i) / \sum_{e' \to i} \exp(s_{e'} - m_i)`
   within each target segment (max-subtracted; empty segments give nothing);
3. **SpMM** — :math:`o_i = \sum_{e \to i} \alpha_e w_e v_{j_e}` (empty targets give 0).

Edges must be sorted by target; ``ptr`` is the CSR pointer over targets. Every reduction is a
``segment`` reduction over contiguous rows, so results are deterministic (no atomics).
Shapes: ``q [R, H, C]`` (targets), ``k, v [S, H, C]`` (sources), per-edge tensors ``[E, H]``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.utils import segment
from torch_geometric.utils import softmax as pyg_softmax


def sddmm(q_dst: Tensor, k_src: Tensor, scale: float, bias: Tensor | None = None) -> Tensor:
    """Per-edge scaled dot products ``[E, H]`` from gathered ``q_dst, k_src [E, H, C]``."""
    logits = (q_dst * k_src).sum(-1) * scale
    if bias is not None:
        logits = logits + bias
    return logits


def segment_softmax(logits: Tensor, ptr: Tensor) -> Tensor:
    """Softmax of ``logits [E, H]`` within each target segment given by ``ptr``."""
    return pyg_softmax(logits, ptr=ptr)


def spmm(coef: Tensor, v_src: Tensor, ptr: Tensor) -> Tensor:
    """``out[i] = sum_{e in segment i} coef[e, :, None] * v_src[e]`` → ``[R, H, C]``."""
    return segment(coef.unsqueeze(-1) * v_src, ptr, reduce="sum")


def edge_attention(
    q: Tensor | None,
    k: Tensor | None,
    v: Tensor,
    edge_index: Tensor,
    num_targets: int,
    *,
    bias: Tensor | None = None,
    weight: Tensor | None = None,
    mode: str = "attention",
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Functional reference: attention of ``num_targets`` queries over explicit head-shared edges.

    ``edge_index [2, E]`` (row 0 source, row 1 target) in any order; ``bias`` / ``weight`` are
    ``[E]`` or ``[E, H]``. Returns ``(out [num_targets, H, C], coef [E, H])`` where ``coef`` is the
    coefficient of ``v_j`` in ``out_i`` (``alpha * weight``), in the given edge order.
    """
    src, dst = edge_index
    perm = torch.argsort(dst, stable=True)
    src_s, dst_s = src[perm], dst[perm]
    counts = torch.bincount(dst_s, minlength=num_targets)
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    H = v.size(1)

    def per_edge(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        t = t[perm]
        return t[:, None].expand(-1, H) if t.dim() == 1 else t

    w = per_edge(weight)
    if mode == "attention":
        assert q is not None and k is not None
        scale = q.size(-1) ** -0.5 if scale is None else scale
        coef = segment_softmax(sddmm(q[dst_s], k[src_s], scale, per_edge(bias)), ptr)
    else:
        coef = torch.ones(src.numel(), H, dtype=v.dtype, device=v.device)
    if w is not None:
        coef = coef * w
    out = spmm(coef, v[src_s], ptr)
    unsorted = torch.empty_like(coef)
    unsorted[perm] = coef
    return out, unsorted
