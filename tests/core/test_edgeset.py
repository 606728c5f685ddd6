"""EdgeSet: construction checks, validation, conversions, coalesce and union."""

from __future__ import annotations

import pytest
import torch

from graphattn import (
    EdgeSet,
    OperatorEdgeSet,
    PermutationEdgeSet,
    SharedSourceEdgeSet,
    origin_code,
    union_edge_sets,
)
from graphattn.core.index import first_occurrences
from graphattn.core.union import featured_rows


def ei(*pairs):
    return torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1)


def test_basic_fields_and_repr():
    es = EdgeSet(ei((0, 1), (1, 2)), num_heads=2, bias=torch.zeros(2, 2), origin=torch.zeros(2).long())
    assert es.num_edges == 2 and not es.per_head
    assert "num_edges=2" in repr(es) and "bias=[2, 2]" in repr(es)
    es.validate(3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"edge_index": torch.zeros(3, 2, dtype=torch.long)}, "edge_index"),
        ({"edge_index": torch.zeros(2, 2)}, "torch.long"),
        ({"head": torch.zeros(3, dtype=torch.long)}, "head"),
        ({"bias": torch.zeros(5)}, "bias"),
        ({"weight": torch.zeros(2, 7)}, "weight"),
        ({"bias": torch.tensor([0.0, float("nan")])}, "NaN"),
        ({"origin": torch.zeros(2)}, "origin"),
        ({"edge_attr": torch.zeros(3, 4)}, "edge_attr"),
        ({"virtual_x": torch.zeros(3)}, "virtual_x"),
        ({"mode": "softmax"}, "mode"),
        ({"num_heads": 0}, "num_heads"),
        ({"log_prob": torch.zeros(3)}, "log_prob_graph"),
        ({"aux_loss": torch.zeros(2)}, "aux_loss"),
        ({"virtual_batch": torch.zeros(1, dtype=torch.long)}, "virtual_batch"),
    ],
)
def test_construction_errors_name_the_field(kwargs, match):
    base = {"edge_index": ei((0, 1), (1, 0)), "num_heads": 2}
    base.update(kwargs)
    edge_index = base.pop("edge_index")
    with pytest.raises(ValueError, match=match):
        EdgeSet(edge_index, **base)


def test_per_head_bias_must_be_1d():
    with pytest.raises(ValueError, match="per-head"):
        EdgeSet(ei((0, 1)), head=torch.tensor([1]), num_heads=2, bias=torch.zeros(1, 2))


@pytest.mark.parametrize(
    "es, n, batch, match",
    [
        (EdgeSet(ei((0, 5))), 3, None, "targets"),
        (EdgeSet(ei((4, 1))), 3, None, "virtual_x"),
        (EdgeSet(ei((-1, 1))), 3, None, ">= 0"),
        (EdgeSet(ei((5, 1)), virtual_x=torch.zeros(1, 4)), 3, None, r"\[0, 4\)"),
        (EdgeSet(ei((0, 1)), head=torch.tensor([2]), num_heads=2), 3, None, "head"),
        (EdgeSet(ei((0, 2))), 3, torch.tensor([0, 0, 1]), "joins two graphs"),
        (
            EdgeSet(ei((3, 2)), virtual_x=torch.zeros(1, 2), virtual_batch=torch.tensor([0])),
            3,
            torch.tensor([0, 0, 1]),
            "virtual source",
        ),
        (EdgeSet(ei((0, 1))), 3, torch.tensor([0, 0]), "batch"),
    ],
)
def test_validate_errors(es, n, batch, match):
    with pytest.raises(ValueError, match=match):
        es.validate(n, batch)


def test_graph_agnostic_virtual_sources_are_allowed():
    es = EdgeSet(ei((3, 0), (3, 2)), virtual_x=torch.zeros(1, 2),
                 virtual_batch=torch.tensor([-1]))
    es.validate(3, torch.tensor([0, 0, 1]))


def test_coalesce_keeps_first_occurrence_and_counts_once():
    es = EdgeSet(ei((0, 1), (2, 1), (0, 1), (1, 0)), weight=torch.tensor([1.0, 2.0, 3.0, 4.0]),
                 origin=torch.tensor([1, 2, 3, 4]))
    c = es.coalesce()
    assert c.num_edges == 3
    pairs = {(int(s), int(d)): float(w) for s, d, w in zip(*c.edge_index, c.weight, strict=True)}
    assert pairs == {(0, 1): 1.0, (2, 1): 2.0, (1, 0): 4.0}
    # per-head: the same pair in two heads is two edges
    ph = EdgeSet(ei((0, 1), (0, 1), (0, 1)), head=torch.tensor([0, 1, 0]), num_heads=2)
    assert ph.coalesce().num_edges == 2


def test_expand_heads_matches_shared():
    es = EdgeSet(ei((0, 1), (2, 1)), num_heads=3, bias=torch.randn(2, 3), weight=torch.randn(2))
    ex = es.expand_heads()
    assert ex.per_head and ex.num_edges == 6
    assert torch.equal(ex.head, torch.tensor([0, 1, 2, 0, 1, 2]))
    assert torch.equal(ex.bias, es.bias.reshape(-1))
    assert torch.equal(ex.weight, es.weight.repeat_interleave(3))


def test_union_keeps_origin_shifts_virtual_and_fills():
    n = 4
    a = EdgeSet(ei((0, 1), (1, 0)), num_heads=2, origin=torch.full((2,), origin_code("input")),
                bias=torch.ones(2))
    b = EdgeSet(ei((4, 2), (4, 3)), num_heads=2, virtual_x=torch.zeros(1, 3),
                origin=torch.full((2,), origin_code("virtual")))
    c = EdgeSet(ei((4, 0), (0, 1)), num_heads=2, virtual_x=torch.ones(1, 3),
                aux_loss=torch.tensor(2.0))
    u = union_edge_sets([a, b, c], n)
    assert u.num_edges == 6 and u.num_virtual == 2
    assert u.edge_index[0].tolist() == [0, 1, 4, 4, 5, 0]  # c's virtual source shifted to 5
    assert u.origin.tolist()[:4] == [origin_code("input")] * 2 + [origin_code("virtual")] * 2
    assert u.origin.tolist()[4:] == [origin_code("unknown")] * 2
    assert u.bias.tolist() == [1, 1, 0, 0, 0, 0]
    assert float(u.aux_loss) == 2.0
    u.validate(n)
    assert union_edge_sets([a, c], n, coalesce=True).num_edges == 3  # (0,1) counted once


def test_union_mixed_heads_expands():
    a = EdgeSet(ei((0, 1)), num_heads=2)
    b = EdgeSet(ei((1, 0)), head=torch.tensor([1]), num_heads=2)
    u = union_edge_sets([a, b], 2)
    assert u.per_head and u.num_edges == 3


def test_union_rejects_mismatch():
    with pytest.raises(ValueError, match="modes"):
        union_edge_sets([EdgeSet(ei((0, 1))), EdgeSet(ei((0, 1)), mode="weighted")], 2)
    with pytest.raises(ValueError, match="num_heads"):
        union_edge_sets([EdgeSet(ei((0, 1))), EdgeSet(ei((0, 1)), num_heads=2)], 2)


def test_to_and_detach():
    w = torch.randn(2, requires_grad=True)
    es = EdgeSet(ei((0, 1), (1, 0)), weight=w * 2)
    d = es.detach()
    assert not d.weight.requires_grad and es.weight.requires_grad
    h = es.to(torch.float64)
    assert h.weight.dtype == torch.float64 and h.edge_index.dtype == torch.long


def test_shared_sources_to_explicit():
    ptr = torch.tensor([0, 2, 3])
    sources = torch.tensor([[[1, 0, 9]], [[2, 0, 0]]])
    mask = torch.tensor([[[True, True, False]], [[True, False, False]]])
    es = SharedSourceEdgeSet(sources, ptr, num_heads=2, source_mask=mask)
    ex = es.to_explicit()
    assert ex.edge_index.t().tolist() == [[1, 0], [0, 0], [1, 1], [0, 1], [2, 2]]
    assert es.num_edges == ex.num_edges == 5
    assert not ex.per_head
    ex.validate(3, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="ptr"):
        es.validate(4)


def test_shared_sources_per_head_to_explicit():
    ptr = torch.tensor([0, 1])
    sources = torch.tensor([[[0], [1]]])
    es = SharedSourceEdgeSet(sources, ptr, num_heads=2, virtual_x=torch.zeros(1, 2))
    ex = es.to_explicit()
    assert ex.per_head and ex.head.tolist() == [0, 1] and ex.edge_index[0].tolist() == [0, 1]


def test_shared_sources_errors():
    with pytest.raises(ValueError, match="sources"):
        SharedSourceEdgeSet(torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="ptr"):
        SharedSourceEdgeSet(torch.zeros(2, 1, 3, dtype=torch.long), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="source_mask"):
        SharedSourceEdgeSet(torch.zeros(1, 1, 3, dtype=torch.long), torch.tensor([0, 1]),
                            source_mask=torch.ones(1, 1, 2, dtype=torch.bool))


def test_permutation_to_explicit():
    src = torch.tensor([[1, 0], [0, 1]])
    es = PermutationEdgeSet(src, num_heads=2)
    ex = es.to_explicit()
    assert ex.edge_index.t().tolist() == [[1, 0], [0, 0], [0, 1], [1, 1]]
    assert ex.head.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="src"):
        PermutationEdgeSet(torch.zeros(3, 3, dtype=torch.long), num_heads=2)


class _MatrixOperator(OperatorEdgeSet):
    """A dense per-graph matrix as an operator, for tests."""

    def __init__(self, mats, ptr, num_heads=1):
        super().__init__(ptr, num_heads=num_heads)
        self.mats = mats

    def matvec(self, v):
        out = torch.zeros_like(v, dtype=torch.promote_types(v.dtype, self.mats[0].dtype))
        for b, m in enumerate(self.mats):
            s, e = int(self.ptr[b]), int(self.ptr[b + 1])
            out[s:e] = torch.einsum("ij,jhc->ihc", m.to(out.dtype), v[s:e].to(out.dtype))
        return out


def test_operator_to_explicit_is_block_diagonal():
    mats = [torch.randn(2, 2, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)]
    op = _MatrixOperator(mats, torch.tensor([0, 2, 5]))
    ex = op.to_explicit()
    assert ex.num_edges == 4 + 9 == op.num_edges
    dense = torch.zeros(5, 5, dtype=torch.float64)
    dense[ex.edge_index[1], ex.edge_index[0]] = ex.weight[:, 0]
    assert torch.equal(dense[:2, :2], mats[0]) and torch.equal(dense[2:, 2:], mats[1])
    assert dense[:2, 2:].abs().sum() == 0


def test_validation_is_remembered_per_batch_and_redone_when_anything_changes():
    """``validate`` checks an edge set once per batch tensor (layers sharing one edge set do not
    repeat it); another batch, or an in-place change of the edges, is checked again."""
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    es = EdgeSet(ei, num_heads=1)
    batch = torch.tensor([0, 0, 0])
    es.validate(3, batch)
    es.validate(3, batch)  # remembered
    with pytest.raises(ValueError, match="graph"):
        es.validate(3, torch.tensor([0, 0, 1]))  # a new batch: edge 1 -> 2 joins two graphs
    ei[1, 0] = 7  # in place: out of range now
    with pytest.raises(ValueError):
        es.validate(3, batch)


def test_assume_valid_records_a_check_for_one_batch_only():
    """``assume_valid`` (for producers assembling validated parts) is remembered like a check, for
    that batch tensor and those edges only."""
    es = EdgeSet(torch.tensor([[0, 1], [1, 2]]), num_heads=1)
    batch = torch.tensor([0, 0, 1])  # edge 1 -> 2 joins two graphs
    es.assume_valid(3, batch)
    es.validate(3, batch)  # not walked again: recorded as valid
    with pytest.raises(ValueError, match="graph"):
        es.validate(3, batch.clone())  # another batch tensor: checked


def test_union_marks_the_rows_it_fills_with_zero_features_and_selections_keep_the_marks():
    n = 5
    attr = torch.randn(3, 4)
    a = EdgeSet(ei((0, 1), (1, 2), (3, 4)), num_heads=2, edge_attr=attr)
    b = EdgeSet(ei((2, 0), (0, 1), (4, 4)), num_heads=2)  # no features: filled with zeros
    assert featured_rows(a) is None  # a user's edge set: every row counts
    u = union_edge_sets([a, b], n)
    assert featured_rows(u).tolist() == [0, 1, 2]
    assert torch.equal(u.edge_attr[3:], torch.zeros(3, 4))
    c = union_edge_sets([a, b], n, coalesce=True)  # (0, 1) in both: a's copy, with features, wins
    feat = {tuple(c.edge_index[:, i].tolist()) for i in featured_rows(c).tolist()}
    assert feat == {(0, 1), (1, 2), (3, 4)}
    assert torch.equal(c.edge_attr[c._featured.logical_not()], torch.zeros(2, 4))
    h = c.expand_heads()
    assert torch.equal(featured_rows(h), (c._featured.repeat_interleave(2)).nonzero().view(-1))
    # a union of a union keeps the first union's marks
    v = EdgeSet(ei((5, 0),), num_heads=2, virtual_x=torch.zeros(1, 3))
    assert featured_rows(union_edge_sets([u, v], n)).tolist() == [0, 1, 2]
    # replacing the features drops the marks
    assert featured_rows(u.replace(edge_attr=torch.ones(6, 4))) is None


def test_known_ptr_marks_the_context_pointer_only_while_unchanged():
    """The context's graph pointer is marked (an edge set built on it skips re-checking it); the
    mark belongs to that object, is lost by an in-place change, and never covers another tensor
    with the same values; an unmarked malformed pointer is still refused."""
    import gc

    from graphattn import ProducerContext, SharedSourceEdgeSet
    from graphattn.core.index import _KNOWN_PTRS, is_known_ptr

    batch = torch.tensor([0, 0, 1, 1, 1])
    ctx = ProducerContext(torch.randn(5, 3), batch, num_heads=1)
    ptr = ctx.ptr
    assert torch.equal(ptr, torch.tensor([0, 2, 5])) and is_known_ptr(ptr)
    assert not is_known_ptr(ptr.clone())
    SharedSourceEdgeSet(torch.zeros(2, 1, 1, dtype=torch.long), ptr, num_heads=1)
    ptr[1] = 4  # in place: the mark is gone, the check runs again
    assert not is_known_ptr(ptr)
    bad = ptr.clone()
    bad[1] = 6
    with pytest.raises(ValueError, match="non-decreasing"):
        SharedSourceEdgeSet(torch.zeros(2, 1, 1, dtype=torch.long), bad, num_heads=1)
    key = id(ptr)
    del ctx, ptr
    gc.collect()
    assert key not in _KNOWN_PTRS  # the mark dies with the tensor


def _first_occurrences_reference(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(key, stable=True)
    s = key[order]
    first = torch.ones_like(s, dtype=torch.bool)
    first[1:] = s[1:] != s[:-1]
    return order[first], s[first]


@pytest.mark.parametrize("case", ["empty", "one", "ties", "negative", "wide", "extremes", "constant"])
def test_compiled_unique_first_equals_the_stable_argsort(case):
    """The compiled radix de-duplication (``unique_first``): the first position of every distinct
    key and the keys, in key order, exactly as torch's stable argsort; keys over 32 bits of range,
    negative keys, both int64 extremes, a single repeated key, no key."""
    from graphattn.kernels.cpu_extension import cpu_ops

    ops = cpu_ops(warn=False)
    if ops is None or not hasattr(ops, "unique_first"):
        pytest.skip("the CPU extension is unavailable")
    g = torch.Generator().manual_seed(1)
    lo, hi = torch.iinfo(torch.long).min, torch.iinfo(torch.long).max
    key = {
        "empty": torch.zeros(0, dtype=torch.long),
        "one": torch.tensor([7]),
        "ties": torch.randint(0, 300, (20000,), generator=g),
        "negative": torch.randint(-5000, 5000, (9000,), generator=g),
        "wide": torch.randint(0, 1 << 45, (9000,), generator=g) * torch.randint(0, 2, (9000,), generator=g),
        "extremes": torch.tensor([hi, lo, 0, lo, hi, -1, 1, lo]),
        "constant": torch.full((5000,), -3),
    }[case]
    pos, values = ops.unique_first(key)
    ref_pos, ref_values = _first_occurrences_reference(key)
    assert torch.equal(pos, ref_pos) and torch.equal(values, ref_values)
    assert torch.equal(first_occurrences(key), ref_pos)  # the public function, either path


def test_compiled_unique_first_arguments():
    from graphattn.kernels.cpu_extension import cpu_ops

    ops = cpu_ops(warn=False)
    if ops is None or not hasattr(ops, "unique_first"):
        pytest.skip("the CPU extension is unavailable")
    with pytest.raises(RuntimeError, match="'key' must be a 1-D int64 CPU tensor"):
        ops.unique_first(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="'key' must be a 1-D int64 CPU tensor"):
        ops.unique_first(torch.zeros(2, 2, dtype=torch.long))


def test_replace_keeps_a_passed_validation_only_when_no_index_field_changes(monkeypatch):
    """``replace(bias=...)`` (e.g. the union's origin bias, per layer) does not run the index checks
    again; ``replace(edge_index=...)`` or ``replace(head=...)`` does, and a bad one still fails."""
    batch = torch.tensor([0, 0, 1, 1])
    es = EdgeSet(torch.tensor([[0, 1, 2], [1, 0, 3]]), num_heads=2).validate(4, batch)
    calls = []
    original = EdgeSet._validate_indices

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EdgeSet, "_validate_indices", counting)
    es.replace(bias=torch.ones(3, 2), origin=torch.zeros(3, dtype=torch.long)).validate(4, batch)
    assert calls == []
    es.replace(bias=torch.ones(3)).validate(4, None)  # another batch: checked
    assert calls == [1]
    es.replace(head=torch.tensor([0, 1, 1])).validate(4, batch)
    assert calls == [1, 1]
    with pytest.raises(ValueError, match="joins two graphs"):
        es.replace(edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]])).validate(4, batch)
