"""Shared-source attention (``kernels/dense.py``): padding per size class against padding to the
batch's largest graph, on the same inputs, in float64."""

from __future__ import annotations

import pytest
import torch
from graphattn.kernels import dense
from graphattn.kernels.dense import shared_source_attention


def _ragged(sizes):
    """``(N, ptr, batch)`` of a batch of graphs of these sizes."""
    ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    return sum(sizes), ptr, torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("fields", ["none", "mask", "mask_bias"])
def test_padding_per_size_class_matches_padding_to_the_largest_graph(per_head, fields, monkeypatch):
    g = torch.Generator().manual_seed(0)
    sizes = [1, 60, 3, 0, 17, 58, 2, 31, 5, 40]
    B, H, C, kk = len(sizes), 4, 6, 5
    N, ptr, batch = _ragged(sizes)
    q = torch.randn(N, H, C, dtype=torch.float64, generator=g).requires_grad_()
    k = torch.randn(N, H, C, dtype=torch.float64, generator=g).requires_grad_()
    v = torch.randn(N, H, C, dtype=torch.float64, generator=g).requires_grad_()
    Hs = H if per_head else 1
    # sources: kk nodes of each graph (any node of it; graph 3 is empty and takes node 0)
    n = torch.tensor(sizes).clamp(min=1)[:, None, None]
    local = torch.randint(0, 1 << 20, (B, Hs, kk), generator=g) % n
    sources = torch.where(torch.tensor(sizes)[:, None, None] > 0, ptr[:-1][:, None, None] + local, 0)
    source_mask = bias = None
    if fields != "none":
        source_mask = torch.rand(B, Hs, kk, generator=g) > 0.3
        source_mask[1] = False  # a graph with no valid source: its targets get 0
    if fields == "mask_bias":
        bias = torch.randn(B, Hs, kk, dtype=torch.float64, generator=g).requires_grad_()
    inputs = [q, k, v] + ([bias] if bias is not None else [])
    calls = []
    original = dense._sdpa_by_size_class

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(dense, "_sdpa_by_size_class", counted)

    def run():
        out = shared_source_attention(q, k, v, sources, ptr, batch, source_mask=source_mask,
                                      bias=bias)
        grads = torch.autograd.grad(out.square().sum(), inputs)
        return out, grads

    out_c, grads_c = run()
    assert calls == [1]  # the size classes were used
    monkeypatch.setattr(dense, "PAD_GAIN", 0.0)  # padding to the largest graph only
    out_b, grads_b = run()
    assert calls == [1]
    torch.testing.assert_close(out_c, out_b, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_c, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if source_mask is not None:
        assert torch.equal(out_c[ptr[1]:ptr[2]], torch.zeros_like(out_c[ptr[1]:ptr[2]]))


def test_padding_classes_pad_to_the_largest_graph_on_cuda_within_the_cap():
    """On the CPU the size classes; on CUDA one class of every non-empty graph padded to the
    largest while the padded work stays under the cap, and the size classes above it. Only the
    device's type is read, so this runs without a GPU."""
    sizes = [5, 0, 60, 1, 7, 59, 6]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dense.padding_classes(sizes, cpu, 10) == dense.size_classes(sizes)
    assert dense.padding_classes(sizes, cuda, 10) == [([0, 2, 3, 4, 5, 6], 60)]
    assert dense.padding_classes(sizes, cuda, dense.CUDA_PAD_PAIRS + 1) == dense.size_classes(sizes)
    assert dense.padding_classes([0, 0], cuda, 0) == []


def test_one_padded_class_matches_the_size_classes(monkeypatch):
    """The CUDA plan (every graph padded to the largest, one SDPA call) computes the same
    attention and gradients as the CPU's size classes (float64, ragged sizes, masked slots)."""
    g = torch.Generator().manual_seed(1)
    sizes = [1, 60, 3, 0, 17, 58, 2, 31, 5, 40]
    B, H, C, kk = len(sizes), 2, 4, 6
    N, ptr, batch = _ragged(sizes)
    q, k, v = (torch.randn(N, H, C, dtype=torch.float64, generator=g).requires_grad_()
               for _ in range(3))
    n = torch.tensor(sizes).clamp(min=1)[:, None, None]
    sources = ptr[:-1][:, None, None] + torch.randint(0, 1 << 20, (B, 1, kk), generator=g) % n
    sources = torch.where(torch.tensor(sizes)[:, None, None] > 0, sources, 0)
    source_mask = torch.rand(B, 1, kk, generator=g) > 0.3

    def run():
        out = shared_source_attention(q, k, v, sources, ptr, batch, source_mask=source_mask)
        return out, torch.autograd.grad(out.square().sum(), (q, k, v))

    calls = []
    original = dense._sdpa_by_size_class
    monkeypatch.setattr(dense, "_sdpa_by_size_class",
                        lambda *a, **kw: calls.append(1) or original(*a, **kw))
    out_c, grads_c = run()
    assert calls == [1]  # the CPU plan: per size class
    real = dense.padding_classes
    monkeypatch.setattr(dense, "padding_classes",
                        lambda sizes, device, pairs: real(sizes, torch.device("cuda"), pairs))
    out_1, grads_1 = run()
    assert calls == [1]  # the CUDA plan: one padded call, not the size classes
    torch.testing.assert_close(out_1, out_c, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads_1, grads_c, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
