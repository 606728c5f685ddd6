"""Structured edge sets (``graphattn.core.structured`` and the Converter's operator): no member but
``to_explicit()`` enumerates their edges; their ``device`` / ``num_edges`` / ``num_heads`` come from
the structure; ``to_explicit()`` equals hand-built edges; the layer's fast path on the structure
equals the layer on those explicit edges; malformed input is refused with a clear message.

One small batch throughout: graphs of 3, 0 and 2 nodes (``ptr = [0, 3, 3, 5]``; the empty graph in
the middle has slots but no targets), and, where a case has them, two virtual sources ``5`` (bound
to graph 0) and ``6`` (graph-agnostic).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from graphattn import (
    EdgeAttention,
    EdgeSet,
    MemoryBudgetError,
    OperatorEdgeSet,
    PermutationEdgeSet,
    SharedSourceEdgeSet,
    memory_budget,
    origin_code,
    union_edge_sets,
)
from graphattn.core.edgeset import BaseEdgeSet, ExplicitOnlyError
from graphattn.core.structured import StructuredEdgeSet
from graphattn.interop import to_sparse_tensor, to_torch_sparse
from graphattn.producers.converter.chain import dense_givens_chain, givens, identity_rotations
from graphattn.producers.converter.chain_operator import UnitaryChainOperator

F64, C128 = torch.float64, torch.complex128
SIZES = [3, 0, 2]
PTR = torch.tensor([0, 3, 3, 5])
BATCH = torch.tensor([0, 0, 0, 2, 2])
N, H, F_IN = 5, 2, 4
#: virtual sources 5 (graph 0) and 6 (every graph)
VIRTUAL_BATCH = torch.tensor([0, -1])

#: slot sources per graph and head ([B, 2, k]; graph 1 has no targets, so its slots make no edge),
#: with virtual sources and without (real stand-ins of the same graph)
SHARED_SOURCES = {True: [[[2, 5, 0], [1, 6, 1]], [[0, 0, 0], [0, 0, 0]], [[4, 6, 3], [3, 3, 4]]],
                  False: [[[2, 1, 0], [1, 2, 1]], [[0, 0, 0], [0, 0, 0]], [[4, 3, 3], [3, 3, 4]]]}
SHARED_MASK = [[[True, True, False], [True, True, True]], [[True] * 3, [False] * 3],
               [[True, False, True], [True, True, True]]]
#: the source of every target per head ([N, 2]), within the target's graph
PERM_SOURCES = {True: [[1, 5], [0, 6], [2, 1], [4, 6], [3, 4]],
                False: [[1, 0], [0, 2], [2, 1], [4, 3], [3, 4]]}


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def heads_of(table: list, per_head: bool) -> Tensor:
    """The table as a tensor, all its head columns (dim 1) or only the first (head-shared)."""
    t = torch.tensor(table)
    return t if per_head else t[:, :1].contiguous()


# ----------------------------------------------------------------------------------- builders
def shared_case(per_head: bool = True, masked: bool = True, mode: str = "attention",
                virtual: bool = True) -> SharedSourceEdgeSet:
    g = gen(1)
    sources = heads_of(SHARED_SOURCES[virtual], per_head)
    shape = sources.shape
    mask = heads_of(SHARED_MASK, per_head) if masked else None
    return SharedSourceEdgeSet(
        sources, PTR, num_heads=H, source_mask=mask, mode=mode,
        bias=torch.randn(shape, generator=g, dtype=F64) if mode == "attention" else None,
        weight=torch.rand(shape, generator=g, dtype=F64) + 0.5,
        origin=torch.randint(0, 4, shape, generator=g),
        virtual_x=torch.randn(2, F_IN, generator=g, dtype=F64) if virtual else None,
        virtual_batch=VIRTUAL_BATCH if virtual else None,
        aux_loss=torch.tensor(0.25, dtype=F64),
        stats={"k": 3},
    )


def permutation_case(per_head: bool = True, mode: str = "weighted",
                     virtual: bool = True) -> PermutationEdgeSet:
    g = gen(2)
    src = heads_of(PERM_SOURCES[virtual], per_head)
    return PermutationEdgeSet(
        src, num_heads=H, mode=mode,
        weight=torch.randn(src.shape, generator=g, dtype=F64),
        origin=torch.randint(0, 4, src.shape, generator=g),
        virtual_x=torch.randn(2, F_IN, generator=g, dtype=F64) if virtual else None,
        virtual_batch=VIRTUAL_BATCH if virtual else None,
        stats={"sorted": True},
    )


def block_matrices() -> list[Tensor]:
    g = gen(3)
    return [torch.randn(n, n, generator=g, dtype=F64) for n in SIZES]


class DenseBlockOperator(OperatorEdgeSet):
    """One dense real matrix per graph, applied block by block (a test operator)."""

    def __init__(self, mats: list[Tensor], ptr: Tensor, num_heads: int = 1) -> None:
        super().__init__(ptr, num_heads=num_heads, stats={"blocks": len(mats)})
        self.mats = mats

    def _apply(self, v: Tensor, transpose: bool) -> Tensor:
        out = torch.zeros_like(v, dtype=torch.promote_types(v.dtype, F64))
        for b, m in enumerate(self.mats):
            s, e = int(self.ptr[b]), int(self.ptr[b + 1])
            m = m.T if transpose else m
            out[s:e] = torch.einsum("ij,jhc->ihc", m.to(v.device, out.dtype), v[s:e].to(out.dtype))
        return out

    def matvec(self, v: Tensor) -> Tensor:
        return self._apply(v, transpose=False)

    def rmatvec(self, v: Tensor) -> Tensor:
        return self._apply(v, transpose=True)


def dense_operator_case() -> DenseBlockOperator:
    return DenseBlockOperator(block_matrices(), PTR, num_heads=H)


def chain_parts() -> dict[str, Tensor]:
    """Rotations (identity on the pair (2, 3) that straddles graphs 0 and 2) and unit phases."""
    boundary = BATCH[1:] != BATCH[:-1]
    g = gen(4)
    a = torch.rand(3, 2, N - 1, generator=g, dtype=F64) * 6.28
    theta = torch.rand(N, generator=g, dtype=F64) * 6.28
    phi = torch.rand(N, generator=g, dtype=F64) * 2 - 1
    return {
        "rot_l": identity_rotations(givens(*a[:, 0]), boundary),
        "rot_u": identity_rotations(givens(*a[:, 1]), boundary),
        "diag": torch.polar(torch.ones(N, dtype=F64), theta),
        "eig": torch.polar(torch.ones(N, dtype=F64), phi),
    }


def chain_case() -> UnitaryChainOperator:
    p = chain_parts()
    return UnitaryChainOperator(p["rot_l"], p["rot_u"], p["diag"], p["eig"], PTR, num_heads=H,
                                aux_loss=torch.tensor(0.5, dtype=F64), stats={"scan": "torch"})


CASES: dict[str, Callable[[], StructuredEdgeSet]] = {
    "shared_per_head": lambda: shared_case(per_head=True),
    "shared_head_shared": lambda: shared_case(per_head=False),
    "shared_no_mask_no_virtual": lambda: shared_case(masked=False, virtual=False),
    "shared_weighted": lambda: shared_case(mode="weighted"),
    "permutation_per_head": lambda: permutation_case(per_head=True),
    "permutation_head_shared_attention": lambda: permutation_case(per_head=False, mode="attention"),
    "permutation_no_virtual": lambda: permutation_case(virtual=False),
    "operator": dense_operator_case,
    "converter_operator": chain_case,
}


# ---------------------------------------------------------------------- hand-built references
def shared_reference(es: SharedSourceEdgeSet) -> dict[str, Any]:
    """Target-major, then head, then slot; masked slots and graphs without targets make nothing."""
    B, Hs, k = es.sources.shape
    src, dst, head, bias, weight, origin = [], [], [], [], [], []
    ptr = es.ptr.tolist()
    for b in range(B):
        for t in range(ptr[b], ptr[b + 1]):
            for h in range(Hs):
                for s in range(k):
                    if es.source_mask is not None and not bool(es.source_mask[b, h, s]):
                        continue
                    src.append(int(es.sources[b, h, s]))
                    dst.append(t)
                    head.append(h)
                    if es.slot_bias is not None:
                        bias.append(float(es.slot_bias[b, h, s]))
                    weight.append(float(es.slot_weight[b, h, s]))  # type: ignore[index]
                    origin.append(int(es.slot_origin[b, h, s]))  # type: ignore[index]
    return {
        "edge_index": torch.tensor([src, dst], dtype=torch.long).reshape(2, -1),
        "head": torch.tensor(head, dtype=torch.long) if Hs > 1 else None,
        "bias": torch.tensor(bias, dtype=F64) if es.slot_bias is not None else None,
        "weight": torch.tensor(weight, dtype=F64),
        "origin": torch.tensor(origin, dtype=torch.long),
    }


def permutation_reference(es: PermutationEdgeSet) -> dict[str, Any]:
    """Target-major, then head: one edge per (target, head)."""
    n, Hs = es.src.shape
    pairs = [(t, h) for t in range(n) for h in range(Hs)]
    return {
        "edge_index": torch.tensor([[int(es.src[t, h]) for t, h in pairs], [t for t, _ in pairs]],
                                   dtype=torch.long).reshape(2, -1),
        "head": torch.tensor([h for _, h in pairs], dtype=torch.long) if Hs > 1 else None,
        "bias": None,
        "weight": torch.tensor([float(es.slot_weight[t, h]) for t, h in pairs], dtype=F64),  # type: ignore[index]
        "origin": torch.tensor([int(es.slot_origin[t, h]) for t, h in pairs], dtype=torch.long),  # type: ignore[index]
    }


def complete_digraph_reference(dense: Tensor, num_heads: int) -> dict[str, Any]:
    """Every pair of one graph, target-major then source, weight ``dense[target, source]`` in
    every head (``dense`` the whole block-diagonal N × N matrix)."""
    ptr = PTR.tolist()
    pairs = [(j, i) for b in range(len(SIZES)) for i in range(ptr[b], ptr[b + 1])
             for j in range(ptr[b], ptr[b + 1])]
    w = torch.stack([dense[i, j] for j, i in pairs]) if pairs else dense.new_zeros(0)
    return {
        "edge_index": torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1),
        "head": None,
        "bias": None,
        "weight": w[:, None].expand(len(pairs), num_heads),
        "origin": torch.full((len(pairs),), origin_code("operator"), dtype=torch.long),
    }


def dense_blocks(mats: list[Tensor]) -> Tensor:
    out = torch.zeros(N, N, dtype=F64)
    ptr = PTR.tolist()
    for b, m in enumerate(mats):
        out[ptr[b]:ptr[b + 1], ptr[b]:ptr[b + 1]] = m
    return out


def chain_dense(op: UnitaryChainOperator) -> Tensor:
    r"""The oracle :math:`S = \Phi^H \operatorname{diag}(e^{i\varphi}) \Phi`, :math:`\Phi =
    \operatorname{diag}(e^{i\theta}) H_l H_u` from dense Givens products (no permutation)."""
    phi = torch.diag(op.diag) @ dense_givens_chain(op.rot_l, "lower") @ dense_givens_chain(
        op.rot_u, "upper")
    return phi.conj().T @ torch.diag(op.eig) @ phi


def reference(es: StructuredEdgeSet) -> dict[str, Any]:
    if isinstance(es, SharedSourceEdgeSet):
        return shared_reference(es)
    if isinstance(es, PermutationEdgeSet):
        return permutation_reference(es)
    if isinstance(es, UnitaryChainOperator):
        return complete_digraph_reference(chain_dense(es), es.num_heads)
    assert isinstance(es, DenseBlockOperator)
    return complete_digraph_reference(dense_blocks(es.mats), es.num_heads)


# ----------------------------------------------------------------------------------- spying
@pytest.fixture
def materialisations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of any structured class's ``to_explicit`` while the test runs."""
    calls: list[str] = []
    for cls in (SharedSourceEdgeSet, PermutationEdgeSet, OperatorEdgeSet, DenseBlockOperator,
                UnitaryChainOperator):
        if "to_explicit" not in vars(cls):
            continue
        original = vars(cls)["to_explicit"]

        def spy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "to_explicit", spy)
    return calls


def public_properties(cls: type) -> list[str]:
    return sorted(n for n in dir(cls)
                  if not n.startswith("_") and isinstance(inspect.getattr_static(cls, n), property))


def public_methods(cls: type) -> list[str]:
    return sorted(n for n in dir(cls)
                  if not n.startswith("_") and inspect.isfunction(inspect.getattr_static(cls, n)))


def attend_probe(es: Any) -> Tensor:
    """The layer's fast path on ``es`` (which calls ``es.attend``)."""
    width = 4 if es.virtual_x is None else es.virtual_x.size(1)
    layer = EdgeAttention(width, 3, heads=es.num_heads, mode=es.mode).double()
    out = layer(torch.randn(N, width, generator=gen(10), dtype=F64), es, BATCH)
    assert layer.last_kernel not in ("reference", "fused")
    return out


def probe_value() -> Tensor:
    return torch.randn(N, H, 3, generator=gen(9), dtype=F64)


#: every public method of the structured edge sets but to_explicit and the explicit-only ones,
#: with a call that exercises it
CALLS: dict[str, Callable[[Any], Any]] = {
    "validate": lambda es: es.validate(N, BATCH),
    "assume_valid": lambda es: es.assume_valid(N, BATCH),
    "to": lambda es: (es.to("cpu"), es.to(torch.float32), es.to(device="meta")),
    "detach": lambda es: es.detach(),
    "cached": lambda es: es.cached(("probe",), lambda: 1),
    "matvec": lambda es: es.matvec(probe_value()),
    "attend": lambda es: attend_probe(es),
    "rmatvec": lambda es: es.rmatvec(probe_value()),
    # the Converter operator's own conversions: dense rows, never the explicit edge set
    "boundary_mask": lambda es: es.boundary_mask(),
    "phi": lambda es: es.phi(torch.ones(N, 2, dtype=C128)),
    "phi_inv": lambda es: es.phi_inv(torch.ones(N, 2, dtype=C128)),
    "local_dense": lambda es: es.local_dense(),
    "to_dense": lambda es: es.to_dense(),
    "row_energy_captured": lambda es: es.row_energy_captured(1),
    "to_topk": lambda es: es.to_topk(1),
}
#: how each explicit-only member is reached
EXPLICIT_ONLY_CALLS: dict[str, Callable[[Any], Any]] = {
    "edge_index": lambda es: es.edge_index,
    "csr": lambda es: es.csr(N),
    "replace": lambda es: es.replace(stats={}),
    "expand_heads": lambda es: es.expand_heads(),
    "coalesce": lambda es: es.coalesce(),
    "select": lambda es: es.select(torch.tensor([0])),
}
#: the conversions that need enumerated edges
INTEROP_CALLS: dict[str, Callable[[Any], Any]] = {
    "to_sparse_tensor": lambda es: to_sparse_tensor(es),
    "to_torch_sparse": lambda es: to_torch_sparse(es),
}


# -------------------------------------------------------------------- (a) nothing materialises
def test_the_hierarchy_keeps_isinstance_checks():
    for make in CASES.values():
        es = make()
        assert isinstance(es, StructuredEdgeSet) and isinstance(es, BaseEdgeSet)
        assert not isinstance(es, EdgeSet)  # a sibling of the explicit kind, not a subclass
        assert isinstance(es, BaseEdgeSet) and es.structure != "explicit"
    plain = EdgeSet(torch.tensor([[0], [1]]))
    assert isinstance(plain, BaseEdgeSet) and not isinstance(plain, StructuredEdgeSet)
    assert set(StructuredEdgeSet.EXPLICIT_ONLY) == set(EXPLICIT_ONLY_CALLS)


@pytest.mark.parametrize("cls", [SharedSourceEdgeSet, PermutationEdgeSet, OperatorEdgeSet,
                                 UnitaryChainOperator])
def test_no_member_of_explicit_edge_sets_is_inherited(cls):
    """A structured class is a sibling of EdgeSet under BaseEdgeSet: it inherits none of the
    members EdgeSet adds, and defines none of the explicit-only ones (reaching one raises
    ExplicitOnlyError, tested below) instead of overriding it to refuse."""
    assert EdgeSet not in cls.__mro__ and BaseEdgeSet in cls.__mro__
    own = {n for n in vars(EdgeSet) if not n.startswith("_") or n in ("_validate_indices",
                                                                     "__repr__")}
    own -= {"structure"}
    assert {"edge_index", "device", "num_edges", "per_head", "csr", "select"} <= own
    for name in sorted(own & set(StructuredEdgeSet.EXPLICIT_ONLY)):
        assert not any(name in vars(c) for c in cls.__mro__), f"{cls.__name__} defines {name}"


def test_a_structured_class_must_implement_the_structural_members():
    class Incomplete(StructuredEdgeSet):
        structure = "incomplete"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete(num_heads=1, mode="attention")  # type: ignore[abstract]


@pytest.mark.parametrize("case", list(CASES))
def test_no_member_but_to_explicit_materialises(case, materialisations):
    es = CASES[case]()
    cls = type(es)
    # every public property: structural ones answer, explicit-only ones refuse
    for name in public_properties(cls):
        if name in StructuredEdgeSet.EXPLICIT_ONLY:
            with pytest.raises(ExplicitOnlyError, match=r"\.to_explicit\(\)\.edge_index"):
                getattr(es, name)
        else:
            getattr(es, name)
    # every public method: a call for each (a new method must be added to CALLS to pass)
    methods = set(public_methods(cls)) - {"to_explicit"}
    assert not methods & set(StructuredEdgeSet.EXPLICIT_ONLY)  # neither inherited nor defined
    assert methods <= set(CALLS), methods - set(CALLS)
    for name in sorted(methods):
        CALLS[name](es)
    for name in sorted(set(StructuredEdgeSet.EXPLICIT_ONLY) - {"edge_index"}):
        with pytest.raises(ExplicitOnlyError, match=rf"{cls.__name__}\.{name}\(\).*to_explicit\(\)"):
            EXPLICIT_ONLY_CALLS[name](es)
    for convert in INTEROP_CALLS.values():
        with pytest.raises(ExplicitOnlyError, match=r"to_explicit\(\)"):
            convert(es)
    assert cls.__name__ in repr(es) and str(es)
    assert materialisations == [] and not es.is_materialised
    # the per-edge fields of the explicit form are empty, not enumerated
    assert all(getattr(es, f) is None for f in ("head", "bias", "weight", "origin", "edge_attr"))
    # the one member that does
    ex = es.to_explicit()
    assert es.is_materialised and materialisations == [cls.__name__]
    assert es.to_explicit() is ex  # cached
    assert not es.to("cpu").is_materialised and not es.detach().is_materialised


def test_the_explicit_only_error_names_the_member_and_the_way_out():
    es = shared_case()
    with pytest.raises(ExplicitOnlyError) as info:
        _ = es.edge_index
    message = str(info.value)
    assert "SharedSourceEdgeSet.edge_index" in message and "shared_sources" in message
    assert ".to_explicit().edge_index" in message
    assert isinstance(info.value, TypeError)  # refused like other misuse, not swallowed by hasattr


def test_reading_a_large_shared_source_set_enumerates_nothing():
    """The issue's case: N = 100k targets reading 4 shared sources (400,000 edges if enumerated).
    With a budget far below those edges, everything but to_explicit() still answers."""
    n, k = 100_000, 4
    es = SharedSourceEdgeSet(torch.arange(k).view(1, 1, k), torch.tensor([0, n]), num_heads=2)
    batch = torch.zeros(n, dtype=torch.long)
    with memory_budget("1MiB"):
        assert es.device == torch.device("cpu") and es.num_edges == n * k and not es.per_head
        assert es.num_heads == 2 and es.mode == "attention" and es.num_virtual == 0
        es.validate(n, batch)
        assert "num_graphs=1" in repr(es) and not es.is_materialised
        with pytest.raises(MemoryBudgetError, match=r"to_explicit\(\)"):
            es.to_explicit()
    assert not es.is_materialised


# ------------------------------------------------------------- (b) device, num_edges, num_heads
@pytest.mark.parametrize("case", list(CASES))
def test_structural_counts_and_device(case, materialisations):
    es = CASES[case]()
    ref = reference(es)
    assert es.num_edges == ref["edge_index"].size(1)
    assert es.device == torch.device("cpu") and es.num_heads == H
    assert es.per_head == (ref["head"] is not None)
    assert es.num_virtual == (2 if es.virtual_x is not None else 0)
    # the device is the structure's: on the meta device nothing could be enumerated or counted
    assert es.to(device="meta").device.type == "meta"
    assert materialisations == []
    ex = es.to_explicit()
    assert (ex.num_edges, ex.num_heads, ex.per_head, ex.device) == (
        es.num_edges, es.num_heads, es.per_head, es.device)


@pytest.mark.parametrize("case", list(CASES))
def test_the_device_follows_the_structure(case, device, materialisations):
    es = CASES[case]().to(device)
    assert es.device.type == device and es.num_edges == reference(es.to("cpu"))["edge_index"].size(1)
    es.validate(N, BATCH.to(device))
    assert materialisations == [] and not es.is_materialised
    assert es.to_explicit().device.type == device


def test_counts_without_targets_or_slots():
    empty_graphs = SharedSourceEdgeSet(torch.zeros(2, 1, 3, dtype=torch.long),
                                       torch.tensor([0, 0, 0]), num_heads=1)
    no_slots = SharedSourceEdgeSet(torch.zeros(1, 2, 0, dtype=torch.long), torch.tensor([0, 4]),
                                   num_heads=2)
    all_masked = SharedSourceEdgeSet(torch.zeros(1, 1, 2, dtype=torch.long), torch.tensor([0, 4]),
                                     source_mask=torch.zeros(1, 1, 2, dtype=torch.bool))
    for es in (empty_graphs, no_slots, all_masked):
        assert es.num_edges == 0 == es.to_explicit().num_edges
    nothing = PermutationEdgeSet(torch.zeros(0, 2, dtype=torch.long), num_heads=2)
    assert nothing.num_edges == 0 == nothing.to_explicit().num_edges and nothing.per_head
    op = DenseBlockOperator([torch.zeros(0, 0, dtype=F64)], torch.tensor([0, 0]))
    assert op.num_edges == 0 == op.to_explicit().num_edges and op.device.type == "cpu"


# ------------------------------------------------------------------- (c) to_explicit is exact
@pytest.mark.parametrize("case", list(CASES))
def test_to_explicit_equals_the_hand_built_edges(case):
    es = CASES[case]()
    ex = es.to_explicit()
    ref = reference(es)
    assert type(ex) is EdgeSet and ex.structure == "explicit"
    assert ex.edge_index.dtype == torch.long and torch.equal(ex.edge_index, ref["edge_index"])
    if ref["head"] is None:
        assert ex.head is None
    else:
        assert torch.equal(ex.head, ref["head"])
    if ref["bias"] is None:
        assert ex.bias is None
    else:
        torch.testing.assert_close(ex.bias, ref["bias"], rtol=0, atol=0)
    assert ex.weight.dtype == ref["weight"].dtype
    exact = not ex.weight.is_complex()
    torch.testing.assert_close(ex.weight, ref["weight"], rtol=0 if exact else 1e-12,
                               atol=0 if exact else 1e-12)
    assert torch.equal(ex.origin, ref["origin"])
    assert (ex.num_heads, ex.mode) == (es.num_heads, es.mode)
    assert ex.virtual_x is es.virtual_x and ex.virtual_batch is es.virtual_batch
    assert ex.aux_loss is es.aux_loss and ex.stats == es.stats
    ex.validate(N, BATCH)
    # the union of one part is that part (the union materialises it on purpose)
    u = union_edge_sets([es], N)
    assert torch.equal(u.edge_index, ex.edge_index) and torch.equal(u.origin, ex.origin)


# ----------------------------------------------------- (d) the fast path equals its explicit edges
def _layers(mode: str, complex_output: str = "real") -> tuple[EdgeAttention, EdgeAttention]:
    torch.manual_seed(11)
    fast = EdgeAttention(F_IN, 3, heads=H, mode=mode, complex_output=complex_output).double()
    ref = EdgeAttention(F_IN, 3, heads=H, mode=mode, complex_output=complex_output,
                        kernel="reference").double()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


@pytest.mark.parametrize("case", list(CASES))
def test_attention_on_the_structure_equals_attention_on_its_explicit_edges(case, materialisations):
    es = CASES[case]()
    layer_mode = "weighted" if es.structure == "operator" else es.mode
    complex_output = "complex" if isinstance(es, UnitaryChainOperator) else "real"
    fast, ref = _layers(layer_mode, complex_output)
    x = torch.randn(N, F_IN, generator=gen(12), dtype=F64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = fast(x1, es, BATCH)
    assert materialisations == [] and not es.is_materialised  # the fast path read the structure
    expected = ref(x2, es.to_explicit(), BATCH)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    out.abs().square().sum().backward()
    expected.abs().square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-11)
    if complex_output == "complex":
        assert out.is_complex()


# ---------------------------------------------------------------------- (e) malformed input
def _shared(**kw: Any) -> SharedSourceEdgeSet:
    args: dict[str, Any] = {"sources": torch.zeros(3, 1, 2, dtype=torch.long), "ptr": PTR,
                            "num_heads": H}
    args.update(kw)
    return SharedSourceEdgeSet(args.pop("sources"), args.pop("ptr"), **args)


def _perm(**kw: Any) -> PermutationEdgeSet:
    args: dict[str, Any] = {"src": torch.zeros(N, 1, dtype=torch.long), "num_heads": H}
    args.update(kw)
    return PermutationEdgeSet(args.pop("src"), **args)


def _chain(**kw: Any) -> UnitaryChainOperator:
    args: dict[str, Any] = {**chain_parts(), "ptr": PTR}
    args.update(kw)
    return UnitaryChainOperator(args.pop("rot_l"), args.pop("rot_u"), args.pop("diag"),
                                args.pop("eig"), args.pop("ptr"), **args)


def _reading_graph_0s_virtual_source() -> SharedSourceEdgeSet:
    """Graph 2's targets read virtual source 5, which is bound to graph 0."""
    es = shared_case(per_head=False, masked=False)
    sources = es.sources.clone()
    sources[2] = 5
    return SharedSourceEdgeSet(sources, es.ptr, num_heads=H, virtual_x=es.virtual_x,
                               virtual_batch=es.virtual_batch)


_B3 = (3, 1, 2)
MALFORMED: dict[str, tuple[Callable[[], Any], str]] = {
    # shared sources: construction
    "shared_2d_sources": (lambda: _shared(sources=torch.zeros(3, 2, dtype=torch.long)), "'sources'"),
    "shared_float_sources": (lambda: _shared(sources=torch.zeros(_B3)), "torch.long"),
    "shared_ptr_length": (lambda: _shared(ptr=torch.tensor([0, 5])), "'ptr' must have shape"),
    "shared_ptr_decreasing": (lambda: _shared(ptr=torch.tensor([0, 3, 2, 5])), "non-decreasing"),
    "shared_heads_of_sources": (lambda: _shared(sources=torch.zeros(3, 3, 2, dtype=torch.long)),
                                "num_heads=2"),
    "shared_mask_shape": (lambda: _shared(source_mask=torch.ones(3, 1, 1, dtype=torch.bool)),
                          "'source_mask'"),
    "shared_mask_dtype": (lambda: _shared(source_mask=torch.ones(_B3)), "torch.bool"),
    "shared_bias_nan": (lambda: _shared(bias=torch.full(_B3, float("nan"))), "NaN"),
    "shared_bias_int": (lambda: _shared(bias=torch.zeros(_B3, dtype=torch.long)), "floating"),
    "shared_origin_float": (lambda: _shared(origin=torch.zeros(_B3)), "torch.long"),
    "shared_weighted_bias": (lambda: _shared(mode="weighted", bias=torch.zeros(_B3)), "'bias'"),
    "shared_num_heads": (lambda: _shared(num_heads=0), "'num_heads' must be a positive int"),
    "shared_mode": (lambda: _shared(mode="softmax"), "'mode'"),
    "shared_virtual_batch_alone": (lambda: _shared(virtual_batch=VIRTUAL_BATCH), "virtual_batch"),
    "shared_aux_loss": (lambda: _shared(aux_loss=torch.zeros(2)), "aux_loss"),
    # shared sources: validation against the nodes
    "shared_ptr_end": (lambda: _shared().validate(N + 1), "num_nodes=6"),
    "shared_batch_disagrees": (lambda: _shared().validate(N, torch.tensor([0, 0, 2, 2, 2])),
                               "agree with 'ptr'"),
    "shared_source_range": (lambda: _shared(sources=torch.full(_B3, 7)).validate(N), "'sources'"),
    "shared_cross_graph": (lambda: _shared(sources=torch.full(_B3, 3)).validate(N, BATCH),
                           "joins two graphs"),
    "shared_cross_graph_virtual": (lambda: _reading_graph_0s_virtual_source().validate(N, BATCH),
                                   "graph 2 read source 5"),
    # permutation
    "perm_1d_src": (lambda: _perm(src=torch.zeros(N, dtype=torch.long)), "'src'"),
    "perm_float_src": (lambda: _perm(src=torch.zeros(N, 1)), "torch.long"),
    "perm_heads_of_src": (lambda: _perm(src=torch.zeros(N, 3, dtype=torch.long)), "num_heads=2"),
    "perm_weight_shape": (lambda: _perm(weight=torch.zeros(N, 2, dtype=F64)), "'weight'"),
    "perm_weight_inf": (lambda: _perm(weight=torch.full((N, 1), float("inf"))), "NaN or infinite"),
    "perm_origin_float": (lambda: _perm(origin=torch.zeros(N, 1)), "torch.long"),
    "perm_rows": (lambda: _perm().validate(N + 1), "one row per target node"),
    "perm_source_range": (lambda: _perm(src=torch.full((N, 1), -1)).validate(N), "'src'"),
    "perm_cross_graph": (lambda: _perm().validate(N, BATCH), "joins two graphs"),
    # operators
    "operator_float_ptr": (lambda: DenseBlockOperator(block_matrices(), PTR.double()), "torch.long"),
    "operator_2d_ptr": (lambda: DenseBlockOperator(block_matrices(), PTR[None]), "'ptr'"),
    "operator_ptr_end": (lambda: dense_operator_case().validate(N - 1), "num_nodes=4"),
    "operator_batch_disagrees": (
        lambda: dense_operator_case().validate(N, torch.tensor([0, 0, 2, 2, 2])), "agree with 'ptr'"),
    "operator_explicit_too_large": (lambda: dense_operator_case().to_explicit(max_nodes_per_graph=2),
                                    "max_nodes_per_graph=2"),
    "chain_rot_shape": (lambda: _chain(rot_l=chain_parts()["rot_l"][:2]), "'rot_l'"),
    "chain_real_eig": (lambda: _chain(eig=chain_parts()["eig"].real), "'eig'"),
    "chain_dtypes": (lambda: _chain(eig=chain_parts()["eig"].to(torch.complex64)), "one dtype"),
    "chain_perm_shape": (lambda: _chain(perm=torch.arange(N - 1)), "'perm'"),
    "chain_leaks_across_graphs": (
        lambda: _chain(rot_u=givens(*torch.rand(3, N - 1, generator=gen(5), dtype=F64))),
        "identity"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_input_is_refused_with_a_clear_message(case, materialisations):
    make, match = MALFORMED[case]
    with pytest.raises(ValueError, match=match):
        make()
    if case != "operator_explicit_too_large":
        assert materialisations == []
