"""GCN+'s edge-aware convolution against an explicit float64 sum over the edges."""

from __future__ import annotations

import pytest
import torch

from graphattn.nn import EdgeGCNConv
from graphattn.nn.blocks import CONVS, make_conv


def _reference(conv: EdgeGCNConv, x: torch.Tensor, edge_index: torch.Tensor,
               edge_attr: torch.Tensor | None) -> torch.Tensor:
    """b + Σ_{j→i} ReLU(W x_j + W_E e_ji), one edge at a time."""
    W = conv.lin.weight.double()
    out = torch.zeros(x.size(0), conv.out_channels, dtype=torch.float64)
    for k, (j, i) in enumerate(edge_index.t().tolist()):
        m = W @ x[j].double()
        if edge_attr is not None:
            e = edge_attr[k].double()
            m = m + (conv.lin_edge.weight.double() @ e if conv.lin_edge is not None else e)
        out[i] += m.relu()
    return out + (conv.bias.double() if conv.bias is not None else 0.0)


@pytest.mark.parametrize("edge_dim", [None, 6, 3])
def test_matches_the_explicit_sum(edge_dim):
    g = torch.Generator().manual_seed(0)
    n, c_in, c_out, E = 9, 5, 6, 30
    x = torch.randn(n, c_in, generator=g, dtype=torch.float64)
    edge_index = torch.randint(0, n, (2, E), generator=g)
    torch.manual_seed(0)
    conv = EdgeGCNConv(c_in, c_out, edge_dim=edge_dim).double()
    with torch.no_grad():
        conv.bias.normal_()
    width = c_out if edge_dim is None else edge_dim
    edge_attr = torch.randn(E, width, generator=g, dtype=torch.float64)
    assert (conv.lin_edge is None) == (edge_dim in (None, c_out))
    torch.testing.assert_close(conv(x, edge_index, edge_attr),
                               _reference(conv, x, edge_index, edge_attr), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(conv(x, edge_index), _reference(conv, x, edge_index, None),
                               rtol=1e-12, atol=1e-12)


def test_isolated_nodes_get_the_bias_and_gradients_flow():
    conv = EdgeGCNConv(4, 4)
    x = torch.randn(5, 4, requires_grad=True)
    edge_index = torch.tensor([[0, 1], [1, 2]])
    out = conv(x, edge_index, torch.randn(2, 4))
    torch.testing.assert_close(out[3], conv.bias.detach().expand(4))
    out.sum().backward()
    assert x.grad is not None and x.grad[3].abs().sum() == 0  # node 3 sends nothing


def test_lazy_input_width():
    conv = EdgeGCNConv(-1, 8)
    assert conv(torch.randn(4, 11), torch.tensor([[0, 1], [2, 3]])).shape == (4, 8)


def test_bad_edge_attr_is_named():
    conv = EdgeGCNConv(4, 6)
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="'edge_attr' must have 6 channels"):
        conv(torch.randn(3, 4), ei, torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"'edge_attr' must be \[E=2"):
        conv(torch.randn(3, 4), ei, torch.randn(3, 6))
    with pytest.raises(ValueError, match="'out_channels'"):
        EdgeGCNConv(4, 0)


def test_resolved_by_name_for_the_hybrid_layer():
    assert "gcne" in CONVS
    conv = make_conv("gcne", 16, edge_dim=16)
    assert isinstance(conv, EdgeGCNConv) and conv.lin_edge is None
    assert repr(conv) == "EdgeGCNConv(16, 16, edge_dim=16)"
