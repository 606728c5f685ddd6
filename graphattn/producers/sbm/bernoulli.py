r"""Dense Bernoulli sampling for the SBM-Transformer (:mod:`graphattn.producers.sbm`), the official
code's path: :func:`bernoulli_sample`, :math:`M_{ij} \sim \operatorname{Bernoulli}(\operatorname{clamp}
(p_{ij} + \delta, 0, 1))` independently, :math:`O(\sum_g n_g^2 k)` time, memory bounded by query-row
blocks. The reference for small graphs (:mod:`~graphattn.producers.sbm.fastrg` is the exact sampler
linear in the edges).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from graphattn.producers.keyed_random import KeyedRandom, KeyedRows
from graphattn.producers.sbm.edges import SAMPLED, SampledEdges
from graphattn.producers.sbm.model import check_sbm, check_values, graph_of_nodes, graph_sizes, key_projection
from graphattn.producers.sbm.native import sampler_ops

#: key tag of the per-pair uniforms (:mod:`~graphattn.producers.keyed_random`)
_TAG_BERNOULLI = 0xBE21


def bernoulli_sample(
    Y: Tensor,
    B: Tensor,
    Z: Tensor,
    ptr: Tensor,
    *,
    delta: float = 0.0,
    generator: torch.Generator | KeyedRandom | None = None,
    max_elements: int = 1 << 24,
    check_memory: Callable[[float], None] | None = None,
) -> tuple[SampledEdges, Tensor]:
    r"""Dense Bernoulli sampling (the official code's path): :math:`M_{ij} \sim
    \operatorname{Bernoulli}(\operatorname{clamp}(p_{ij} + \delta, 0, 1))` for every pair of every
    graph and head, with :math:`p = Y B Z^\top` computed in the dtype of ``Y`` on padded graphs, in
    blocks of query rows of at most ``max_elements`` probabilities.

    The uniform of pair :math:`(i, j)` of head :math:`h` is keyed by the graph, :math:`h` and the
    local indices of :math:`i, j` (``generator``: as :func:`fastrg_sample`). ``check_memory`` is
    called with the number of pairs (a bound on the edges) before sampling.

    Returns ``(edges, expected)``: the sampled edges (distinct, kind :data:`SAMPLED`) and ``expected
    [G, H]`` = :math:`\sum_{i,j \in g} \operatorname{clamp}(p_{ij} + \delta, 0, 1)`.
    """
    check_sbm(Y, B, Z, ptr)
    Y, B, Z = Y.detach(), B.detach(), Z.detach()
    check_values(Y, B, Z)
    N, H, k = Y.shape
    G = ptr.numel() - 1
    dev = Y.device
    n = graph_sizes(ptr)
    n_max = int(n.max()) if G else 0
    expected = torch.zeros(G, H, dtype=torch.float64, device=dev)
    if N == 0 or n_max == 0:
        return SampledEdges.empty(dev), expected
    if check_memory is not None:
        check_memory(float(G * H * n_max * n_max))
    batch = graph_of_nodes(ptr)
    local = torch.arange(N, device=dev) - ptr[batch]
    Yp = Y.new_zeros(G, n_max, H, k)
    Wp = Y.new_zeros(G, n_max, H, k)
    Yp[batch, local] = Y
    Wp[batch, local] = key_projection(Z, B)
    Yp, Wt = Yp.transpose(1, 2).contiguous(), Wp.permute(0, 2, 3, 1).contiguous()  # [G,H,n,k], [G,H,k,n]
    padded = bool((n < n_max).any())
    rng = KeyedRandom.coerce(generator, dev)
    pair_keys = rng.rows(_TAG_BERNOULLI, rng.graph_words(n)[:, None, None],
                         torch.arange(H, device=dev)[None, :, None]).keys  # [G, H, 1]
    cols = torch.arange(n_max, device=dev)
    key_ok = torch.arange(n_max, device=dev)[None, :] < n[:, None]  # [G, n_max]
    rows_per_block = max(1, max_elements // max(G * H * n_max, 1))
    parts: list[SampledEdges] = []
    ops = sampler_ops(Y) if Y.dtype in (torch.float32, torch.float64) else None
    for a in range(0, n_max, rows_per_block):
        b = min(a + rows_per_block, n_max)
        prob = torch.matmul(Yp[:, :, a:b], Wt).add_(delta).clamp_(0.0, 1.0)  # [G, H, b-a, n_max]
        if padded:
            ok = key_ok[:, None, None, :] & key_ok[:, None, a:b, None]
            prob.masked_fill_(~ok, 0.0)
        expected += prob.sum((-1, -2)).to(torch.float64)
        if ops is not None:  # the compiled loop: the same uniforms and comparisons, one pass
            hit = ops.sbm_bernoulli_hits(prob.contiguous(), pair_keys.reshape(-1).contiguous(), a)
        else:
            u = KeyedRows(pair_keys[..., None]).uniform(torch.arange(a, b, device=dev)[:, None], cols)
            hit = u < prob  # compared in float64
        g, h, il, jl = hit.nonzero(as_tuple=True)
        i, j = ptr[g] + il + a, ptr[g] + jl
        parts.append(SampledEdges(i, j, h, torch.full_like(i, SAMPLED)))
    return SampledEdges.cat(parts, dev), expected
