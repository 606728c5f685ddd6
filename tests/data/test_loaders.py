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


# ------------------------------------------------------------------ real-valued series (time series)
@settings(max_examples=40, deadline=None)
@given(L=st.integers(0, 23), C=st.integers(1, 3), p=st.integers(1, 5), window=st.integers(0, 2),
       cls=st.booleans(), flat=st.booleans())
def test_series_to_graph(L, C, p, window, cls, flat):
    series = torch.randn(L, C, generator=torch.Generator().manual_seed(L * 7 + C))
    if flat:
        series, C = series[:, 0], 1
    g = SequenceToGraph(window=window, patch_size=p, cls=cls)(Data(x=series, y=torch.tensor([2])))
    n = -(-L // p)
    F = p * C + cls + (p > 1)
    assert g.num_nodes == n + cls and tuple(g.x.shape) == (n + cls, F)
    assert g.x.dtype == torch.float32 and g.y.tolist() == [2]
    assert torch.equal(g.pos[cls:, 0], torch.arange(n).float())
    body = g.x[cls:, cls:cls + p * C]
    flat_values = body.reshape(-1, C)
    assert torch.equal(flat_values[:L], series.view(L, C))  # every value kept, in time order
    assert not flat_values[L:].any()  # the ragged tail is zero padding
    if p > 1 and n:
        valid = g.x[cls:, -1]
        assert torch.allclose(valid * p, torch.tensor([min(p, L - k * p) for k in range(n)]).float())
    if cls:
        assert g.x[0, 0] == 1 and not g.x[0, 1:].any() and not g.x[1:, 0].any()
        assert float(g.pos[0]) == -1
    deg = torch.bincount(g.edge_index[1], minlength=n + cls)
    i = torch.arange(n)
    band = torch.minimum(i, torch.tensor(window)) + torch.minimum(n - 1 - i, torch.tensor(window))
    assert torch.equal(deg[cls:], band + (1 if cls and n else 0))
    no_cross_graph(Batch.from_data_list([g, g]))


def test_series_feature_layout_by_hand():
    x = torch.arange(10.0).view(5, 2)  # L = 5, C = 2
    g = SequenceToGraph(patch_size=2, cls=True)(Data(x=x))
    assert g.x.tolist() == [[1, 0, 0, 0, 0, 0],
                            [0, 0, 1, 2, 3, 1],
                            [0, 4, 5, 6, 7, 1],
                            [0, 8, 9, 0, 0, 0.5]]
    # a 1-D float series is one channel: the same graph as [L, 1]
    s = torch.tensor([0.5, -1.0, 2.0])
    a, b = SequenceToGraph()(Data(x=s)), SequenceToGraph()(Data(x=s[:, None]))
    assert torch.equal(a.x, b.x) and a.x.shape == (3, 1)
    assert SequenceToGraph()(Data(x=s.double())).x.dtype == torch.float32


def test_series_lengths_batch_together():
    t = SequenceToGraph(patch_size=4, cls=True)
    graphs = [t(Data(x=torch.randn(L, 3))) for L in (0, 5, 8, 13)]
    assert len({g.x.size(1) for g in graphs}) == 1  # F does not depend on L
    no_cross_graph(Batch.from_data_list(graphs))


def test_series_normalize_is_a_per_channel_zscore():
    x = torch.stack([torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.full((4,), 5.0)], 1)
    g = SequenceToGraph(normalize=True)(Data(x=x))
    assert torch.allclose(g.x[:, 0].mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(g.x[:, 0].pow(2).mean(), torch.tensor(1.0), atol=1e-6)  # population std
    assert not g.x[:, 1].any()  # a constant channel becomes zeros
    assert SequenceToGraph(normalize=True)(Data(x=torch.zeros(0, 2))).num_nodes == 0


def test_integer_x_is_still_tokens():
    g = SequenceToGraph(cls_token=1)(Data(x=torch.tensor([4, 5])))
    assert g.x.tolist() == [1, 4, 5] and g.x.dtype == torch.long


@pytest.mark.parametrize("make,data,name", [
    (lambda: SequenceToGraph(), Data(x=torch.tensor([1.0, float("nan")])), "'x'"),
    (lambda: SequenceToGraph(), Data(x=torch.tensor([[1.0], [float("inf")]])), "'x'"),
    (lambda: SequenceToGraph(), Data(x=torch.zeros(3, 0)), "'x'"),
    (lambda: SequenceToGraph(), Data(x=torch.zeros(2, 3, 4)), "'x'"),
    (lambda: SequenceToGraph(), Data(x=torch.zeros(2, 3, dtype=torch.long)), "'x'"),
    (lambda: SequenceToGraph(), Data(tokens=torch.tensor([0.5, 1.0])), "'tokens'"),
    (lambda: SequenceToGraph(cls_token=0), Data(x=torch.rand(4)), "'cls_token'"),
    (lambda: SequenceToGraph(pad_to=8), Data(x=torch.rand(4)), "'pad_to'"),
    (lambda: SequenceToGraph(cls=True), Data(tokens=torch.tensor([3, 4])), "'cls'"),
    (lambda: SequenceToGraph(patch_size=2), Data(tokens=torch.tensor([3, 4])), "'patch_size'"),
    (lambda: SequenceToGraph(normalize=True), Data(x=torch.tensor([3, 4])), "'normalize'"),
])
def test_series_errors_name_the_argument(make, data, name):
    with pytest.raises(ValueError, match=name):
        make()(data)


@pytest.mark.parametrize("kwargs,name", [
    ({"patch_size": 0}, "'patch_size'"), ({"patch_size": 1.5}, "'patch_size'"),
    ({"patch_size": True}, "'patch_size'"), ({"cls": 1}, "'cls'"), ({"normalize": "yes"}, "'normalize'"),
    ({"cls": True, "cls_token": 2}, "'cls_token'"),
])
def test_series_options_are_checked(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SequenceToGraph(**kwargs)
