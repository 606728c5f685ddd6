"""Loaders: node counts, degrees, order, and no cross-graph edges after batching."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Batch, Data

from graphattn.data import ImageToGraph, PointCloudToGraph, SequenceToGraph, morton_order


def no_cross_graph(batch):
    src, dst = batch.edge_index
    assert torch.equal(batch.batch[src], batch.batch[dst])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=4), window=st.integers(0, 3),
       cls=st.booleans())
def test_sequence_to_graph(lengths, window, cls):
    t = SequenceToGraph(window=window, cls_token=1 if cls else None)
    graphs = [t(Data(tokens=torch.arange(L) + 2, y=torch.tensor([0]))) for L in lengths]
    for L, g in zip(lengths, graphs, strict=True):
        n = L + cls
        assert g.num_nodes == n
        toks = g.x[1:] if cls else g.x
        assert torch.equal(toks, torch.arange(L) + 2)  # order kept
        if cls:
            assert int(g.x[0]) == 1 and float(g.pos[0]) == -1
        assert torch.equal(g.pos[cls:, 0], torch.arange(L).float())
        deg = torch.bincount(g.edge_index[1], minlength=n)
        i = torch.arange(L)
        band = torch.minimum(i, torch.tensor(window)) + torch.minimum(L - 1 - i, torch.tensor(window))
        assert torch.equal(deg[cls:], band + (1 if cls and L else 0))
        if cls:
            assert int(deg[0]) == L
    batch = Batch.from_data_list(graphs)
    no_cross_graph(batch)


def test_sequence_padding_for_parity():
    g = SequenceToGraph(pad_to=8, pad_token=0)(Data(tokens=torch.tensor([5, 6, 7])))
    assert g.x.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 4), w=st.integers(1, 4), p=st.sampled_from([1, 2]),
       conn=st.sampled_from([4, 8]), cls=st.booleans())
def test_image_to_graph(h, w, p, conn, cls):
    img = torch.rand(2, h * p, w * p)
    g = ImageToGraph(patch_size=p, connectivity=conn, cls=cls)(Data(image=img, y=torch.tensor([3])))
    n = h * w
    assert g.num_nodes == n + cls and g.x.size(1) == 2 * p * p + cls
    pos = g.pos[cls:]
    assert torch.equal(pos[:, 0] * w + pos[:, 1], torch.arange(n).float())  # raster order
    r, c = 1, 2 if w > 2 else 0
    if h > r and w > c:  # the patch at (r, c) holds exactly those pixels
        idx = cls + r * w + c
        assert torch.equal(g.x[idx, cls:], img[:, r * p:(r + 1) * p, c * p:(c + 1) * p].reshape(-1))
    src, dst = g.edge_index
    real = (src >= cls) & (dst >= cls)
    d = (g.pos[src[real]] - g.pos[dst[real]]).abs()
    assert (d.max(1).values == 1).all()
    if conn == 4:
        assert (d.sum(1) == 1).all()
    deg = torch.bincount(dst[real], minlength=n + cls)[cls:]
    rows, cols = pos[:, 0], pos[:, 1]
    nb = ((rows > 0).long() + (rows < h - 1).long() + (cols > 0).long() + (cols < w - 1).long())
    if conn == 4:
        assert torch.equal(deg, nb)
    batch = Batch.from_data_list([g, g])
    no_cross_graph(batch)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), k=st.integers(1, 6), morton=st.booleans(), seed=st.integers(0, 99))
def test_point_cloud_to_graph(n, k, morton, seed):
    pos = torch.rand(n, 3, generator=torch.Generator().manual_seed(seed))
    g = PointCloudToGraph(k=k, morton=morton)(Data(pos=pos, y=torch.tensor([1])))
    assert g.num_nodes == n
    deg = torch.bincount(g.edge_index[1], minlength=n)
    assert (deg == min(k, max(n - 1, 0))).all()
    if morton and n:
        assert torch.equal(g.pos, pos[morton_order(pos)])
    batch = Batch.from_data_list([g, g])
    no_cross_graph(batch)


def test_morton_order_is_a_z_curve():
    pos = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    # Z order on a 2x2 grid: (0,0), (1,0), (0,1), (1,1) with x as the lowest bit
    assert morton_order(pos, bits=1).tolist() == [0, 2, 3, 1]


def test_morton_reorder_carries_per_point_attributes():
    pos = torch.rand(12, 3, generator=torch.Generator().manual_seed(0))
    g = PointCloudToGraph(k=3, morton=True)(Data(pos=pos, y=torch.arange(12), label=torch.tensor([7])))
    assert torch.equal(g.pos, pos[g.y])  # the per-point labels follow their points
    assert g.label.tolist() == [7]  # a graph-level attribute is kept as it is


def test_loader_errors_name_the_argument():
    with pytest.raises(ValueError, match="'patch_size'"):
        ImageToGraph(patch_size=3)(Data(image=torch.rand(1, 4, 4)))
    with pytest.raises(ValueError, match="'bits'"):
        morton_order(torch.rand(5, 3), bits=21)  # 63 bits: more than an int64 code holds
    with pytest.raises(ValueError, match="'normal'"):
        PointCloudToGraph(k=2)(Data(pos=torch.rand(4, 3), normal=torch.rand(3, 4)))
    with pytest.raises(ValueError, match="'tokens'"):
        SequenceToGraph()(Data(tokens=torch.tensor([1, -2, 3])))
    with pytest.raises(ValueError, match="'connectivity'"):
        ImageToGraph(connectivity=6)
