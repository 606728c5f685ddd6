"""Malformed input of many kinds gets a clear ValueError from EdgeSet / EdgeAttention: never a
crash of another type, a hang or a NaN."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphattn import EdgeAttention, EdgeSet, PermutationEdgeSet, SharedSourceEdgeSet


def _case(kind: str, n: int, g: torch.Generator):
    """Returns a thunk that must raise ValueError."""
    H, F = 2, 4
    x = torch.randn(n, F, generator=g)
    good = torch.stack([torch.randint(0, n, (3 * n,), generator=g),
                        torch.randint(0, n, (3 * n,), generator=g)])
    E = good.size(1)
    layer = EdgeAttention(F, 3, heads=H)
    batch = torch.zeros(n, dtype=torch.long)
    if n > 1:
        batch[n // 2:] = 1
    run = {
        "float_edge_index": lambda: layer(x, good.float()),
        "edge_index_3_rows": lambda: layer(x, torch.cat([good, good[:1]])),
        "edge_index_1d": lambda: layer(x, good[0]),
        "target_out_of_range": lambda: layer(x, good + torch.tensor([[0], [n]])),
        "negative_source": lambda: layer(x, good - torch.tensor([[n + 1], [0]])),
        "virtual_source_without_virtual_x": lambda: layer(x, good + torch.tensor([[n], [0]])),
        "head_out_of_range": lambda: layer(x, EdgeSet(good, head=torch.full((E,), H), num_heads=H)),
        "cross_graph_edge": lambda: layer(
            torch.randn(2, F), torch.tensor([[0], [1]]), torch.tensor([0, 1])),
        "bias_wrong_shape": lambda: layer(x, EdgeSet(good, num_heads=H, bias=torch.zeros(E + 1))),
        "nan_weight": lambda: layer(
            x, EdgeSet(good, num_heads=H, weight=torch.full((E, H), float("nan")))),
        "inf_bias": lambda: layer(x, EdgeSet(good, num_heads=H, bias=torch.full((E,), -float("inf")))),
        "nan_x": lambda: layer(x * float("nan"), good),
        "x_1d": lambda: layer(x[:, 0], good),
        "x_integer": lambda: layer(x.long(), good),
        "x_wrong_width": lambda: layer(torch.randn(n, F + 1), good),
        "batch_wrong_length": lambda: layer(x, good, torch.zeros(n + 1, dtype=torch.long)),
        "batch_float": lambda: layer(x, good, batch.float()),
        "heads_mismatch": lambda: layer(x, EdgeSet(good, num_heads=H + 1)),
        "virtual_x_wrong_width": lambda: layer(
            x, EdgeSet(good, num_heads=H, virtual_x=torch.zeros(1, F + 2))),
        "edge_attr_without_edge_dim": lambda: layer(x, good, edge_attr=torch.zeros(E, 2)),
        "edge_attr_wrong_rows": lambda: EdgeAttention(F, 3, heads=H, edge_dim=2)(
            x, good, edge_attr=torch.zeros(E + 2, 2)),
        "attention_edges_to_weighted_layer": lambda: EdgeAttention(F, 3, heads=H, mode="weighted")(
            x, EdgeSet(good, num_heads=H)),
        "shared_sources_2d": lambda: SharedSourceEdgeSet(good, torch.tensor([0, n]), num_heads=H),
        "shared_sources_ptr_mismatch": lambda: layer(
            x, SharedSourceEdgeSet(torch.zeros(1, 1, 2, dtype=torch.long), torch.tensor([0, n + 1]),
                                   num_heads=H)),
        "permutation_wrong_rows": lambda: layer(
            x, PermutationEdgeSet(torch.zeros(n + 1, 1, dtype=torch.long), num_heads=H)),
        "not_a_tensor": lambda: layer(x, good.tolist()),
        "bad_mode": lambda: EdgeSet(good, mode="sum"),
    }[kind]
    return run


KINDS = [
    "float_edge_index", "edge_index_3_rows", "edge_index_1d", "target_out_of_range",
    "negative_source", "virtual_source_without_virtual_x", "head_out_of_range",
    "cross_graph_edge", "bias_wrong_shape", "nan_weight", "inf_bias", "nan_x", "x_1d",
    "x_integer", "x_wrong_width", "batch_wrong_length", "batch_float", "heads_mismatch",
    "virtual_x_wrong_width", "edge_attr_without_edge_dim", "edge_attr_wrong_rows",
    "attention_edges_to_weighted_layer", "shared_sources_2d", "shared_sources_ptr_mismatch",
    "permutation_wrong_rows", "not_a_tensor", "bad_mode",
]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=6, deadline=2000, derandomize=True, database=None)
@given(n=st.integers(2, 12), seed=st.integers(0, 2**16))
def test_malformed_input_raises_value_error(kind, n, seed):
    """Every kind is its own test (none skipped at random), with a few sizes and seeds each."""
    g = torch.Generator().manual_seed(seed)
    thunk = _case(kind, n, g)
    with pytest.raises(ValueError):
        thunk()


@settings(max_examples=60, deadline=2000)
@given(n=st.integers(0, 10), e=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_valid_random_input_never_nan(n, e, seed):
    """The other side: any valid edge set (including empty graphs and isolated targets) is finite."""
    g = torch.Generator().manual_seed(seed)
    layer = EdgeAttention(3, 2, heads=2)
    x = torch.randn(n, 3, generator=g) * 50
    ei = torch.randint(0, max(n, 1), (2, e if n else 0), generator=g)
    out = layer(x, EdgeSet(ei, num_heads=2, bias=torch.randn(ei.size(1), generator=g) * 100))
    assert out.shape == (n, 4) and torch.isfinite(out).all()
