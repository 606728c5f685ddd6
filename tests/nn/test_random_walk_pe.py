"""The memoised random-walk encoding equals PyG's AddRandomWalkPE and never changes a result."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import AddRandomWalkPE

from graphattn.nn import positional_encoding
from graphattn.nn.random_walk_pe import CachedRandomWalkPE


def _graph(n: int, seed: int, weighted: bool = False) -> Data:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, 3 * n), generator=g)
    ew = torch.rand(3 * n, generator=g) if weighted else None
    return Data(x=torch.randn(n, 4, generator=g), edge_index=ei, edge_weight=ew, num_nodes=n)


@pytest.mark.parametrize("weighted", [False, True])
def test_equals_pyg_and_is_computed_once_per_structure(weighted, monkeypatch):
    pe = CachedRandomWalkPE(6, attr_name="rw")
    graphs = [_graph(n, s, weighted) for n, s in ((7, 0), (12, 1), (7, 2))]
    calls = []
    inner = pe.inner.forward
    monkeypatch.setattr(pe.inner, "forward", lambda d: calls.append(1) or inner(d))
    for _epoch in range(3):
        for g in graphs:
            out = pe(g.clone())
            ref = AddRandomWalkPE(6, attr_name="rw")(g.clone())
            assert torch.equal(out.rw, ref.rw)
            assert torch.equal(out.x, g.x)  # everything else untouched
    assert len(calls) == 3  # one computation per distinct graph, not per access
    # same structure, other features: the cached encoding; other edges: a new one
    same = graphs[0].clone()
    same.x = torch.zeros_like(same.x)
    assert torch.equal(pe(same).rw, pe(graphs[0].clone()).rw) and len(calls) == 3
    moved = graphs[0].clone()
    moved.edge_index = moved.edge_index.flip(0)
    pe(moved)
    assert len(calls) == 4


def test_output_is_a_copy_and_the_cache_is_bounded():
    pe = CachedRandomWalkPE(3, attr_name="rw", max_entries=2)
    g = _graph(5, 0)
    first = pe(g.clone()).rw
    first.zero_()  # an in-place change downstream does not reach the cache
    assert torch.equal(pe(g.clone()).rw, AddRandomWalkPE(3, attr_name="rw")(g.clone()).rw)
    for s in range(1, 4):
        pe(_graph(5, s))
    assert len(pe._cache) == 2
    assert "CachedRandomWalkPE(3" in repr(pe)
    with pytest.raises(ValueError, match="'attr_name'"):
        CachedRandomWalkPE(3, attr_name="")


def test_positional_encoding_returns_the_cached_transform():
    assert isinstance(positional_encoding("random_walk", 8), CachedRandomWalkPE)
