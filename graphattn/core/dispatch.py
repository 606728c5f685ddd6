r"""How an edge set is attended: the one place where the attention path is chosen.

:class:`~graphattn.EdgeAttention` builds an :class:`AttentionCall` (the layer's projections, scale,
dropout and its explicit-edge path) and hands it to the edge set's ``attend(call)``. Every edge-set
structure owns its path:

================================  ===================================================  ==========
structure                         ``attend``                                           ``kernel``
================================  ===================================================  ==========
explicit (:class:`EdgeSet`)       the layer's explicit path: the fused kernel          ``"fused"``
                                  (:mod:`graphattn.kernels.fused`) or the reference    or
                                  segment-softmax ``propagate``                        ``"reference"``
shared sources                    keys/values of all sources → batched SDPA            ``"shared_sources"``
                                  or of the gathered slot rows only (:math:`Bk < N`)   ``"shared_slots"``
permutation                       a gather of the values                               ``"permutation"``
operator                          ``matvec`` on the values                             ``"operator"``
================================  ===================================================  ==========

:func:`attend` makes the one choice above the structures: the explicit form (``to_explicit()``) when
the reference path is forced or the caller needs the coefficients (``return_attention_weights``, a
trace, PyG's explain hooks), else the structure's own path; for explicit edges :func:`use_fused`
chooses between the fused kernel and the reference ``propagate``.

The result is an :class:`Attended` ``(out, alpha, kernel)``; the layer exposes ``kernel`` as
``EdgeAttention.last_kernel``. A new structure implements ``attend`` and uses only this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn

from graphattn.core.contract import ProducerContext
from graphattn.kernels.fused import backend_ops, default_backend, unavailable_reason, unsupported_reason

if TYPE_CHECKING:  # pragma: no cover
    from graphattn.core.edgeset import BaseEdgeSet, EdgeSet


class Attended(NamedTuple):
    """What an attention path returns."""

    #: ``[N, H, C]`` per-head outputs (complex for complex weights)
    out: Tensor
    #: ``[E, H]`` (per-head edges: ``[E, 1]``) coefficients in the edge set's order, before dropout;
    #: only from the explicit paths, and only when the call asks for them (else ``None``)
    alpha: Tensor | None
    #: the path that ran: ``"fused"``, ``"reference"``, ``"shared_sources"``, ``"shared_slots"``,
    #: ``"permutation"``, ``"operator"``
    kernel: str


class AttentionCall:
    r"""What an edge set's ``attend`` receives from the layer.

    Args:
        ctx: the layer's :class:`~graphattn.ProducerContext` (its projections are computed once and
            shared with the producer).
        heads, channels: :math:`H` and :math:`C`.
        scale: the logit scale :math:`1/\sqrt{C}`.
        dropout: attention dropout rate in effect (0 outside training).
        attend_keys: whether logits are computed (layer and edge set in ``"attention"`` mode);
            else messages are weighted only.
        lin_key, lin_value: the layer's key and value projections (:math:`W_K` may be ``None``),
            for rows that are not the layer's input (virtual sources, gathered slots).
        explicit: the layer's path for explicit edges (fused kernel or reference).
    """

    def __init__(
        self,
        ctx: ProducerContext,
        *,
        heads: int,
        channels: int,
        scale: float,
        dropout: float,
        attend_keys: bool,
        lin_key: nn.Module | None,
        lin_value: nn.Module,
        explicit: Callable[[EdgeSet], Attended],
    ) -> None:
        self.ctx = ctx
        self.heads = heads
        self.channels = channels
        self.scale = scale
        self.dropout = dropout
        self.attend_keys = attend_keys
        self.lin_key = lin_key
        self.lin_value = lin_value
        self.explicit = explicit

    @property
    def num_nodes(self) -> int:
        return self.ctx.num_nodes

    def query(self) -> Tensor | None:
        """``[N, H, C]`` queries, ``None`` without logits."""
        return self.ctx.query() if self.attend_keys else None

    def value(self) -> Tensor:
        """``[N, H, C]`` values of the real nodes."""
        return self.ctx.value()

    def sources(self, es: BaseEdgeSet, *, keys: bool = True) -> tuple[Tensor | None, Tensor]:
        """``(k, v)`` of every source: the real nodes, then the edge set's virtual sources
        (``[N + n_v, H, C]``; ``k`` is ``None`` without logits or with ``keys=False``)."""
        H, C = self.heads, self.channels
        k = self.ctx.key() if self.attend_keys and keys else None
        v = self.ctx.value()
        if es.virtual_x is not None:
            vx = es.virtual_x.to(v.dtype)
            v = torch.cat([v, self.lin_value(vx).view(-1, H, C)])
            if k is not None:
                assert self.lin_key is not None
                k = torch.cat([k, self.lin_key(vx).view(-1, H, C)])
        return k, v

    def projections_computed(self) -> bool:
        """Whether the keys or values of every node were already computed (e.g. by a producer)."""
        return self.ctx.cached_projection("value") is not None or (
            self.attend_keys and self.ctx.cached_projection("key") is not None)

    def lazy(self) -> bool:
        """Whether a projection is still lazily sized (its width unknown before the first call)."""
        lins = [self.lin_key, self.lin_value] if self.attend_keys else [self.lin_value]
        return any(isinstance(lin.weight, nn.parameter.UninitializedParameter)
                   for lin in lins if lin is not None)

    def project_rows(self, lin: nn.Module, rows: Tensor) -> Tensor:
        r"""``rows [B, Hs, k, F]`` projected per head to ``[B, H, k, C]``: with ``Hs = 1`` every
        head reads the same rows (the layer's own projection); else head :math:`h` reads its rows
        through its slice :math:`W^{(h)}`."""
        B, Hs, k, _ = rows.shape
        H, C = self.heads, self.channels
        if Hs == 1:
            return lin(rows[:, 0]).view(B, k, H, C).transpose(1, 2)
        out = torch.einsum("bhkf,hcf->bhkc", rows, lin.weight.view(H, C, -1))
        return out if lin.bias is None else out + lin.bias.view(1, H, 1, C)


def attend(es: BaseEdgeSet, call: AttentionCall, *, explicit: bool) -> Attended:
    """``es`` attended on its own path, or on the explicit one (``call.explicit`` on
    ``es.to_explicit()``) when ``explicit`` is set: ``kernel="reference"``, or coefficients needed
    (``return_attention_weights``, a trace, PyG explain hooks or explain mode)."""
    return call.explicit(es.to_explicit()) if explicit else es.attend(call)


#: the message-passing hooks of a PyG layer; any registered one needs ``propagate``
PYG_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
             "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks")


def has_pyg_hooks(layer: Any) -> bool:
    """PyG explain mode or message-passing hooks on ``layer`` need ``propagate`` (the reference
    path)."""
    if getattr(layer, "_explain", None):
        return True
    return any(len(getattr(layer, name, ())) for name in PYG_HOOKS)


def use_fused(kernel: str, es: EdgeSet, v: Tensor, layer: Any) -> bool:
    """Whether the explicit edge set ``es`` (values ``v``) runs on the fused kernel under the
    layer's ``kernel`` option: ``"reference"`` never; ``"auto"`` where the kernel supports the
    edge set and is available, and no PyG hook or explain mode on ``layer`` needs ``propagate``
    (:func:`has_pyg_hooks`, read only then);
    ``"fused"`` always, or a :class:`ValueError` saying why it cannot (no silent fallback)."""
    if kernel == "reference":
        return False
    backend = default_backend(v.device)
    reason = unsupported_reason(es, v, backend)
    if kernel == "fused":
        if getattr(layer, "_explain", None):
            reason = ("PyG explain mode multiplies every message by an edge mask, and the "
                      "fused kernel has no message tensor; use kernel='auto' or 'reference'")
        if reason is not None:
            raise ValueError(f"kernel='fused' cannot run this edge set: {reason}")
    elif reason is not None or has_pyg_hooks(layer):
        return False
    if backend_ops(backend, warn=kernel != "fused") is not None:
        return True
    if kernel == "fused":  # asked for explicitly: no silent fallback
        raise ValueError(f"kernel='fused' cannot run: the {backend} kernel is unavailable "
                         f"({unavailable_reason(backend)})")
    return False  # kernel='auto': the reference path (warned once)
