r"""The max-exchange permutation of Sliceformer_max (:mod:`graphattn.producers.sliceformer`):
:func:`max_exchange_src`, each column's first node of a graph swapped with its argmax, :math:`O(NC)`,
no sort.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.producers.sliceformer.checks import check_batch, check_values


def max_exchange_src(values: Tensor, batch: Tensor | None = None) -> Tensor:
    r"""Max-exchange permutation (Sliceformer_max) of every column, as gather sources.

    Per graph :math:`g` and column :math:`c`: with :math:`f` the first node of :math:`g` (lowest
    node index) and :math:`m` the node of its maximum (lowest index among ties), the transposition
    :math:`(f\ m)`: ``src[f, c] = m``, ``src[m, c] = f`` and ``src[t, c] = t`` otherwise (the
    identity when :math:`m = f`). :math:`O(NC)` time, no sort.

    Args:
        values (Tensor): ``[N, C]`` floating point, no NaN.
        batch (LongTensor, optional): ``[N]`` graph of each node (any order).

    Returns:
        LongTensor ``[N, C]``.
    """
    values = check_values(values).detach()
    N, C = values.shape
    batch = check_batch(batch, N)
    dev = values.device
    node = torch.arange(N, device=dev)
    src = node[:, None].expand(N, C).clone()
    if N == 0:
        return src
    if batch is None:
        batch = torch.zeros(N, dtype=torch.long, device=dev)
    B = int(batch.max()) + 1
    gid = batch[:, None].expand(N, C)
    vmax = values.new_full((B, C), float("-inf")).scatter_reduce(0, gid, values, "amax")
    cand = torch.where(values == vmax[batch], node[:, None], N)
    argmax = src.new_full((B, C), N).scatter_reduce(0, gid, cand, "amin")
    first = node.new_full((B,), N).scatter_reduce(0, batch, node, "amin")
    present = first < N  # graphs with nodes
    first, argmax = first[present], argmax[present]  # [B'], [B', C]
    src[first] = argmax
    src.scatter_(0, argmax, first[:, None].expand_as(argmax).contiguous())
    return src
