"""The functional reference kernel against dense masked softmax attention (float64)."""

from __future__ import annotations

import torch
from graphattn.kernels import edge_attention, permutation_gather

from tests.helpers import dense_reference


def test_edge_attention_matches_dense_and_returns_coefficients_in_order():
    g = torch.Generator().manual_seed(0)
    N, S, H, C, E = 6, 8, 2, 3, 25
    q = torch.randn(N, H, C, generator=g, dtype=torch.float64)
    k = torch.randn(S, H, C, generator=g, dtype=torch.float64)
    v = torch.randn(S, H, C, generator=g, dtype=torch.float64)
    src = torch.randperm(S * N, generator=g)[:E] % S
    dst = torch.randperm(S * N, generator=g)[:E] % (N - 1)  # target N-1 isolated
    ei = torch.stack([src, dst])
    out, coef = edge_attention(q, k, v, ei, N)
    for h in range(H):
        cnt = torch.zeros(N, S, dtype=torch.float64)
        cnt.index_put_((dst, src), torch.ones(E, dtype=torch.float64), accumulate=True)
        assert torch.allclose(out[:, h], dense_reference(q[:, h], k[:, h], v[:, h], cnt, C**-0.5),
                              atol=1e-12)
    assert torch.all(out[N - 1] == 0)
    sums = torch.zeros(N, H, dtype=torch.float64).index_add_(0, dst, coef)
    assert torch.allclose(sums[: N - 1][torch.bincount(dst, minlength=N)[: N - 1] > 0],
                          torch.tensor(1.0, dtype=torch.float64))
    w, _ = edge_attention(None, None, v, ei, N, mode="weighted")
    ref = torch.zeros(N, H, C, dtype=torch.float64).index_add_(0, dst, v[src])
    assert torch.allclose(w, ref)


def test_permutation_gather():
    v = torch.arange(12.0).view(3, 2, 2)
    src = torch.tensor([[2, 0], [0, 1], [1, 2]])
    out = permutation_gather(v, src, weight=torch.full((3, 2), 2.0))
    assert torch.equal(out[0, 0], 2 * v[2, 0]) and torch.equal(out[2, 1], 2 * v[2, 1])
