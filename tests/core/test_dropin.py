"""``EdgeAttention`` as a drop-in for PyG's attention convolutions: TransformerConv's call order,
options and function (copied weights, float64), GATConv's ``add_self_loops``, bipartite input, a
PyG model written for TransformerConv running unchanged, and the earlier call order (a warning)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import GATConv, TransformerConv
from torch_geometric.utils import add_self_loops, remove_self_loops

from graphattn import EdgeAttention
from graphattn.producers import ExpanderEdges


def _graph(num_nodes: int = 7, edge_dim: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, 5, generator=g, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 1, 2], [1, 2, 3, 4, 5, 6, 0, 3, 2]])
    ea = torch.randn(ei.size(1), edge_dim, generator=g, dtype=torch.float64)
    return x, ei, ea


def _copy(src: nn.Module, dst: nn.Module) -> None:
    """TransformerConv's parameters into EdgeAttention: the same names (TransformerConv keeps a
    ``lin_skip`` it does not use when ``root_weight=False``)."""
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert not missing and all(k.startswith("lin_skip.") and not src.root_weight
                               for k in unexpected), (missing, unexpected)


@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("edge_dim", [None, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_transformer_conv_with_its_options(concat, beta, edge_dim, bias):
    x, ei, ea = _graph()
    kw = dict(heads=2, concat=concat, beta=beta, edge_dim=edge_dim, bias=bias, root_weight=True)
    ref = TransformerConv(5, 4, **kw).double()
    conv = EdgeAttention(5, 4, **kw).double()
    _copy(ref, conv)
    args = (x, ei) if edge_dim is None else (x, ei, ea)
    torch.testing.assert_close(conv(*args), ref(*args), rtol=1e-12, atol=1e-12)
    _, (edges, alpha) = conv(*args, return_attention_weights=True)
    _, (ref_edges, ref_alpha) = ref(*args, return_attention_weights=True)
    assert torch.equal(edges, ref_edges)
    torch.testing.assert_close(alpha, ref_alpha, rtol=1e-12, atol=1e-12)


def test_root_weight_off_equals_transformer_conv_without_it():
    x, ei, _ = _graph()
    ref = TransformerConv(5, 4, heads=3, root_weight=False).double()
    conv = EdgeAttention(5, 4, heads=3).double()  # the default: no skip
    _copy(ref, conv)
    torch.testing.assert_close(conv(x, ei), ref(x, ei), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("root_weight", [False, True])
def test_bipartite_input_equals_transformer_conv(root_weight):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(4, 6, generator=g, dtype=torch.float64)
    xd = torch.randn(3, 5, generator=g, dtype=torch.float64)
    ei = torch.tensor([[0, 1, 2, 3, 3], [0, 1, 2, 2, 0]])
    ref = TransformerConv((6, 5), 4, heads=2, root_weight=root_weight).double()
    conv = EdgeAttention((6, 5), 4, heads=2, root_weight=root_weight).double()
    _copy(ref, conv)
    torch.testing.assert_close(conv((xs, xd), ei), ref((xs, xd), ei), rtol=1e-12, atol=1e-12)
    assert repr(conv) == "EdgeAttention((6, 5), 4, heads=2)"
    with pytest.raises(ValueError, match=r"sources must lie in \[0, 4\)"):
        conv((xs, xd), torch.tensor([[4], [0]]))
    with pytest.raises(ValueError, match="a producer builds edges among one node set"):
        conv((xs, xd), ExpanderEdges(2))
    with pytest.raises(ValueError, match="pass no 'batch'"):
        conv((xs, xd), ei, batch=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="'x' must have in_channels=6 columns"):
        conv((xd, xd), ei)


@pytest.mark.parametrize("edge_dim", [None, 3])
def test_add_self_loops_as_gat_conv(edge_dim):
    """GATConv's rule: the self-loops there are removed, one per node added (their features
    ``fill_value``, default the mean of the node's in-edges); the same as attending over those
    edges explicitly, and the same edges GATConv reports."""
    x, ei, ea = _graph(edge_dim=3)
    ea = ea if edge_dim else None
    conv = EdgeAttention(5, 4, heads=2, add_self_loops=True, edge_dim=edge_dim).double()
    plain = EdgeAttention(5, 4, heads=2, edge_dim=edge_dim).double()
    plain.load_state_dict(conv.state_dict())
    loops, loop_attr = add_self_loops(*remove_self_loops(ei, ea), fill_value="mean",
                                      num_nodes=x.size(0))
    out, (edges, _) = conv(x, ei, ea, return_attention_weights=True)
    torch.testing.assert_close(out, plain(x, loops, loop_attr), rtol=1e-12, atol=1e-12)
    gat = GATConv(5, 4, heads=2, edge_dim=edge_dim).double()
    _, (gat_edges, _) = gat(x, ei, ea, return_attention_weights=True)
    assert torch.equal(edges, gat_edges)
    with pytest.raises(ValueError, match="add_self_loops=True adds self-loops to a plain"):
        conv(x, ExpanderEdges(2))


def test_a_model_written_for_transformer_conv_runs_unchanged(monkeypatch):
    """A PyG model that builds ``TransformerConv`` and calls it as PyG's docs do: the class
    swapped for ``EdgeAttention`` (root_weight as TransformerConv's default) gives the same
    output with the same weights, and trains."""
    import sys
    import types

    source = '''
import torch
from torch_geometric.nn import TransformerConv

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = TransformerConv(5, 8, heads=2, edge_dim=3, root_weight=True, beta=True)
        self.conv2 = TransformerConv(16, 3, heads=1, concat=False, edge_dim=3, root_weight=True)

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr=edge_attr)
'''
    module = types.ModuleType("user_model")
    exec(compile(source, "user_model.py", "exec"), module.__dict__)
    x, ei, ea = _graph()
    torch.manual_seed(0)
    ref = module.Net().double()
    module.TransformerConv = EdgeAttention  # the one change a user makes
    monkeypatch.setitem(sys.modules, "user_model", module)
    net = module.Net().double()
    assert isinstance(net.conv1, EdgeAttention)
    net.load_state_dict(ref.state_dict())
    torch.testing.assert_close(net(x, ei, ea), ref(x, ei, ea), rtol=1e-12, atol=1e-12)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x, ei, ea), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_earlier_call_order_still_works_with_a_warning():
    x, ei, ea = _graph()
    batch = torch.zeros(x.size(0), dtype=torch.long)
    conv = EdgeAttention(5, 4, heads=2, edge_dim=3).double()
    want = conv(x, ei, ea, batch=batch)
    with pytest.warns(FutureWarning, match="pass batch=... by keyword"):
        torch.testing.assert_close(conv(x, ei, batch, ea), want)
    with pytest.warns(FutureWarning):
        torch.testing.assert_close(conv(x, ei, None, ea), want)
    with pytest.warns(FutureWarning):
        torch.testing.assert_close(conv(x, ei, batch, edge_attr=ea), want)
    with pytest.raises(TypeError, match="'edge_attr' twice"):
        conv(x, ei, ea, edge_attr=ea)
    with pytest.raises(TypeError, match="at most 4 positional arguments"):
        conv(x, ei, ea, None, None)


def test_option_errors_name_the_option():
    with pytest.raises(ValueError, match="'beta' gates the root weight's skip: set root_weight=True"):
        EdgeAttention(5, 4, beta=True)
    with pytest.raises(ValueError, match="'in_channels' must be an int or a pair"):
        EdgeAttention((5, 4, 3), 4)
    with pytest.raises(ValueError, match="'add_self_loops' must be a bool"):
        EdgeAttention(5, 4, add_self_loops="yes")
    with pytest.raises(ValueError, match="'fill_value' must be a number"):
        EdgeAttention(5, 4, fill_value=None)
