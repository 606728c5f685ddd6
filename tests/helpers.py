"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

#: whether this machine has a CUDA device (the ``cuda`` tests are skipped without one)
CUDA = torch.cuda.is_available()
NO_CUDA_REASON = "no CUDA device (torch.cuda.is_available() is False)"
#: marks of a test (or parameter) that needs a CUDA device: selected by ``-m cuda``, skipped without
CUDA_MARKS = (pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason=NO_CUDA_REASON))
#: ``@pytest.mark.parametrize("device", DEVICES)``: the CPU, and CUDA (marked ``cuda``) — the same
#: values as the ``device`` fixture of ``tests/conftest.py``, for where a fixture does not fit
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA_MARKS, id="cuda")]


def make_batch(sizes, *, channels: int = 8, edges_per_node: int = 2, seed: int = 0,
               dtype=torch.float64) -> Batch:
    """A PyG batch of random graphs with the given node counts (0 allowed), with ``pos``."""
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for n in sizes:
        if n:
            ei = torch.randint(0, n, (2, edges_per_node * n), generator=g)
        else:
            ei = torch.empty(2, 0, dtype=torch.long)
        graphs.append(Data(x=torch.randn(n, channels, generator=g, dtype=dtype), edge_index=ei,
                           pos=torch.randn(n, 3, generator=g, dtype=dtype), num_nodes=n))
    return Batch.from_data_list(graphs)


def dense_reference(x_q, k, v, adj_count, scale, bias=None, weight=None):
    """Dense masked-softmax attention for one head: ``adj_count[i, j]`` copies of edge j→i.

    ``bias``/``weight`` are dense [N, S] (same for every copy). Rows without edges give 0.
    """
    logits = (x_q @ k.T) * scale
    if bias is not None:
        logits = logits + bias
    mask = adj_count > 0
    m = torch.where(mask, logits, torch.full_like(logits, float("-inf"))).amax(1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(logits - m) * adj_count
    den = e.sum(1, keepdim=True)
    p = torch.where(den > 0, e / den.clamp_min(1e-300), torch.zeros_like(e))
    if weight is not None:
        p = p * weight
    return p @ v
