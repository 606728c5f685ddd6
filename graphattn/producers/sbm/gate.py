r"""The straight-through edge gate of the SBM-Transformer (:mod:`graphattn.producers.sbm`):
:func:`edge_gate`, a custom autograd function whose backward scatters the gradient of
:math:`p_e = Y_{i_e h_e} B_{h_e} Z_{j_e h_e}^\top` in :math:`O(Ek)` without materialising ``[E, k]``
tensors at once; :func:`edge_probability` is the same :math:`p_e` by plain autograd.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from graphattn.producers.sbm.model import key_projection
from graphattn.producers.sbm.native import sampler_ops


def edge_probability(Y: Tensor, B: Tensor, Z: Tensor, query: Tensor, key: Tensor,
                     head: Tensor) -> Tensor:
    r"""``[E]`` :math:`p_e = Y_{i_e h_e} B_{h_e} Z_{j_e h_e}^\top` (plain autograd, ``O(Ek)`` memory)."""
    W = key_projection(Z, B)
    return (Y[query, head] * W[key, head]).sum(-1)


class _EdgeGate(Function):
    """``forward``: ``1`` (straight-through) or :math:`p_e = Y_{r_e} \\cdot W_{s_e}`; ``backward``: the
    gradient of :math:`p_e` times the (optionally clipped) incoming gradient, as sparse-dense
    products."""

    @staticmethod
    def forward(ctx: Any, Y: Tensor, W: Tensor, rows_q: Tensor, rows_k: Tensor,
                straight_through: bool, clip: float | None, chunk: int) -> Tensor:
        ctx.save_for_backward(Y, W, rows_q, rows_k)
        ctx.clip, ctx.chunk = clip, chunk
        if straight_through:
            return Y.new_ones(rows_q.numel())
        out = Y.new_empty(rows_q.numel())
        for a in range(0, rows_q.numel(), chunk):
            b = a + chunk
            out[a:b] = (Y[rows_q[a:b]] * W[rows_k[a:b]]).sum(-1)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        Y, W, rows_q, rows_k = ctx.saved_tensors
        if ctx.clip is not None:
            grad = grad.clamp(-ctx.clip, ctx.clip)
        # ∂p_e/∂Y[r_e] = W[s_e], ∂p_e/∂W[s_e] = Y[r_e]: two sparse-dense products with the
        # [NH, NH] matrix of the edge gradients (no [E, k] temporaries)
        need_y, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_y or need_w):
            return None, None, None, None, None, None, None
        ops = sampler_ops(Y)
        if ops is not None and hasattr(ops, "sbm_gate_backward"):  # the same sums, compiled
            gY, gW = ops.sbm_gate_backward(Y, W, rows_q, rows_k, grad.to(Y.dtype), need_y, need_w)
        else:
            A = torch.sparse_coo_tensor(torch.stack([rows_q, rows_k]), grad.contiguous(),
                                        (Y.size(0), W.size(0)), check_invariants=False)
            gY = torch.sparse.mm(A, W) if need_y else None
            gW = torch.sparse.mm(A.t(), Y) if need_w else None
        return (gY if need_y else None), (gW if need_w else None), None, None, None, None, None


def edge_gate(
    Y: Tensor,
    W: Tensor,
    query: Tensor,
    key: Tensor,
    head: Tensor,
    *,
    straight_through: bool = True,
    clip: float | None = 1.0,
    chunk: int = 1 << 16,
) -> Tensor:
    r"""The straight-through edge gate ``[E]`` of the SBM edges.

    Forward: :math:`1` per edge (``straight_through=True``; :math:`p_e` itself otherwise). Backward:
    :math:`\partial L / \partial p_e := \operatorname{clamp}(\partial L / \partial \text{gate}_e,
    -\text{clip}, \text{clip})` (hardtanh for ``clip=1``, as the official ``STE.py``), propagated to
    ``Y [N, H, k]`` and ``W = Z B^\top [N, H, k]`` (:func:`key_projection`) through
    :math:`p_e = Y_{i_e h_e} \cdot W_{j_e h_e}` by two sparse-dense products, :math:`O(Ek)` time and no
    ``[E, k]`` temporary (the value forward runs in chunks of ``chunk`` edges).
    """
    N, H, k = Y.shape
    rows_q = query * H + head
    rows_k = key * H + head
    return _EdgeGate.apply(Y.reshape(N * H, k), W.reshape(N * H, k), rows_q, rows_k,
                           straight_through, clip, chunk)
