r"""The mixed-membership stochastic block model of the SBM-Transformer (:mod:`graphattn.producers.sbm`).

A model per graph :math:`g` and head :math:`h` is given by non-negative memberships
:math:`Y, Z \in \mathbb{R}_+^{n_g \times k}` (queries, keys) and a block matrix
:math:`B \in \mathbb{R}_+^{k \times k}`; the expected adjacency is :math:`\mathbb{E}[M] = Y B Z^\top`,
i.e. :math:`\lambda_{ij} = \sum_{u,v} Y_{iu} B_{uv} Z_{jv}`. Batched over graphs and heads:
``Y, Z [N, H, k]`` for all nodes of a batch whose graphs are contiguous, ``ptr [G + 1]``,
``B [H, k, k]``.

* :func:`block_matrix`, :func:`memberships`, :func:`key_projection` — the model from the layer's
  queries, keys and cluster embeddings;
* :func:`check_sbm` / :func:`check_values` — the samplers' input checks;
* :func:`graph_sizes`, :func:`graph_of_nodes`, :func:`column_sums` — per-graph bookkeeping;
* :func:`expected_num_edges` — :math:`\sum_{i, j \in g} (p_{ij} + \delta)` per (graph, head).

The samplers are :mod:`~graphattn.producers.sbm.fastrg` and :mod:`~graphattn.producers.sbm.bernoulli`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.core.index import need_float, need_long, need_tensor


def block_matrix(clusters: Tensor) -> Tensor:
    r"""``S [H, k, k]`` = :math:`\operatorname{softmax}(C_h C_h^\top)` over **all** :math:`k^2` entries
    of each head (so :math:`\sum_{u,v} S_{uv} = 1`), from ``clusters [H, k, d]``."""
    H, k, _ = clusters.shape
    logits = torch.einsum("hud,hvd->huv", clusters, clusters)
    return torch.softmax(logits.reshape(H, k * k), dim=-1).view(H, k, k)


def memberships(x: Tensor, proj: torch.nn.Module, clusters: Tensor, offset: float = 0.0) -> Tensor:
    r"""``[N, H, k]`` = :math:`\sigma(\operatorname{MLP}(x_h) C_h^\top + b)` for ``x [N, H, d]`` (one MLP
    shared by all heads, per-head clusters ``[H, k, d]``, a constant logit offset :math:`b`, 0 in the
    paper)."""
    logits = torch.einsum("nhd,hkd->nhk", proj(x), clusters)
    return torch.sigmoid(logits + offset if offset else logits)


def key_projection(Z: Tensor, B: Tensor) -> Tensor:
    r"""``W [N, H, k]`` with :math:`W_{j,u} = \sum_v B_{uv} Z_{jv}` (:math:`Z B^\top`), so that
    :math:`p_{ij} = Y_i \cdot W_j`."""
    return torch.einsum("nhv,huv->nhu", Z, B)


def check_sbm(Y: Tensor, B: Tensor, Z: Tensor, ptr: Tensor) -> None:
    """Validates the sampler inputs (shapes, dtypes, a CSR ``ptr`` over the ``N`` nodes) with the
    EdgeSet validators."""
    for name, t in (("Y", Y), ("Z", Z), ("B", B)):
        need_float(name, need_tensor(name, t, dims=3))
    if Y.shape != Z.shape:
        raise ValueError(f"'Y' and 'Z' must have the same shape [N, H, k], got {list(Y.shape)} and "
                         f"{list(Z.shape)}")
    N, H, k = Y.shape
    if B.shape != (H, k, k):
        raise ValueError(f"'B' must have shape [H={H}, k={k}, k={k}], got {list(B.shape)}")
    need_long("ptr", need_tensor("ptr", ptr, dims=1))
    if ptr.numel() < 1 or int(ptr[0]) != 0 or int(ptr[-1]) != N or bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError(f"'ptr' must be non-decreasing from 0 to N={N}, got {ptr.tolist()[:8]}...")


def check_values(Y: Tensor, B: Tensor, Z: Tensor) -> None:
    """Refuses NaN, infinite or negative entries in ``Y``, ``B`` or ``Z`` (the samplers' draws)."""
    for name, t in (("Y", Y), ("B", B), ("Z", Z)):
        if t.numel() == 0:
            continue
        if not bool(torch.isfinite(t.sum())):  # one reduction catches NaN and inf
            raise FloatingPointError(f"SBM '{name}' contains NaN or infinite values (diverged "
                                     f"cluster embeddings or memberships?)")
        if float(t.min()) < 0:
            raise ValueError(f"SBM '{name}' must be non-negative")


def graph_sizes(ptr: Tensor) -> Tensor:
    """``[G]`` node counts from a CSR pointer."""
    return ptr[1:] - ptr[:-1]


def graph_of_nodes(ptr: Tensor) -> Tensor:
    """``[N]`` graph id of each node from a CSR pointer."""
    G = ptr.numel() - 1
    return torch.repeat_interleave(torch.arange(G, device=ptr.device), graph_sizes(ptr))


def column_sums(Y: Tensor, ptr: Tensor) -> Tensor:
    """``[G, H, k]`` per-graph column sums of ``Y [N, H, k]`` (differentiable)."""
    G = ptr.numel() - 1
    out = Y.new_zeros((G, *Y.shape[1:]))
    return out.index_add(0, graph_of_nodes(ptr), Y)


def expected_num_edges(Y: Tensor, B: Tensor, Z: Tensor, ptr: Tensor, delta: float = 0.0) -> Tensor:
    r"""``[G, H]`` expected number of drawn edges (multi-edges counted, before de-duplication):
    :math:`\Lambda_{gh} = y_{gh} B_h z_{gh}^\top + \delta n_g^2 = \sum_{i, j \in g} (p_{ij} + \delta)`,
    in :math:`O(NHk + GHk^2)` (differentiable in ``Y, B, Z``)."""
    check_sbm(Y, B, Z, ptr)
    ys, zs = column_sums(Y, ptr), column_sums(Z, ptr)
    lam = torch.einsum("ghu,huv,ghv->gh", ys, B, zs)
    if delta:
        n = graph_sizes(ptr).to(lam.dtype)
        lam = lam + delta * (n * n)[:, None]
    return lam
