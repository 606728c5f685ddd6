"""Fuzz test of every public entry point against malformed and edge-case input (issue 19).

Every cell (input class × entry point) is its own test id, so no cell is skipped at random. Within a
cell, hypothesis (derandomised, a fixed example count) draws the graph sizes and the seed. A cell
passes when each call either

* succeeds with finite output of the right size (valid and edge-case classes: empty graphs, a
  batch of only empty graphs, an unsorted batch, other dtypes, ...), or
* raises a :class:`ValueError` / :class:`TypeError` whose message names the offending argument.

It fails on any other exception (``obscure``), on a ValueError / TypeError that does not name the
argument (``unnamed``), on a refused valid input (``refused``), on NaN/inf in the output (``nan``) and
on invalid input accepted without an error (``silent``: e.g. a negative ``num_nodes``, ``heads=True``,
a NaN position), which includes a producer emitting edges that fail
:meth:`~graphattn.EdgeSet.validate`.

The data loaders (``SequenceToGraph``, ``ImageToGraph``, ``PointCloudToGraph`` and the helpers
``morton_order``, ``grid_edges``) get one sample per graph of the class's sizes (empty and
single-element samples included); an ``x_*`` class malforms the tensor the loader reads (tokens, an
image, positions; ``x_none``: the attribute is missing). An accepted sample's output is compared
with what it must hold (nodes, features, positions, the exact edges, per-point attributes).

``python -m tests.test_fuzz --table`` prints the class × entry point → outcome table (one example
per cell); ``PYTHONPATH=<other checkout> python tests/test_fuzz.py --table`` runs it on other code.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch_geometric.data import Batch, Data

import graphattn
from graphattn import (
    BaseEdgeSet,
    EdgeAttention,
    EdgeSet,
    GraphTransformer,
    HybridLayer,
    PermutationEdgeSet,
    SharedSourceEdgeSet,
    union_edge_sets,
)
from graphattn.data import ImageToGraph, PointCloudToGraph, SequenceToGraph, morton_order
from graphattn.data.loaders import grid_edges
from graphattn.nn import MODELS
from graphattn.producers import PRODUCERS, build_producer

#: the package's own producers (tests and examples register more while the suite runs)
_OWN_PRODUCERS = sorted(n for n, c in PRODUCERS.items() if c.__module__.startswith("graphattn."))

F_IN = 8  # node feature width
E_DIM = 3  # edge feature width
HEADS = 2
HUGE = 2**40
OUTCOME_ORDER = ("obscure", "nan", "silent", "unnamed", "refused", "clear", "ok")
PASSING = ("ok", "clear")


# ------------------------------------------------------------------------------------ inputs
@dataclass
class Graph:
    """A batch of graphs as loose tensors (any field may be replaced by something malformed)."""

    x: Any
    batch: Any
    edge_index: Any
    edge_attr: Any
    pos: Any
    num_graphs: int
    sizes: list[int]
    kind: str = "valid"  # the input class that made it

    @property
    def num_nodes(self) -> int:
        return int(self.x.size(0)) if isinstance(self.x, Tensor) else 0

    def data(self) -> Batch:
        """The PyG ``Batch`` a model or a producer reads (fields as they are, malformed or not)."""
        b = Batch()
        for name in ("x", "edge_index", "edge_attr", "pos", "batch"):
            value = getattr(self, name)
            if value is not None:
                setattr(b, name, value)
        b._num_graphs = self.num_graphs
        return b


def make_graph(sizes: list[int], seed: int) -> Graph:
    """Random graphs with the given node counts (0 allowed), a sorted batch, edges within graphs."""
    g = torch.Generator().manual_seed(seed)
    N = sum(sizes)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
    parts, start = [], 0
    for n in sizes:
        if n:
            parts.append(torch.randint(0, n, (2, 2 * n), generator=g) + start)
        start += n
    ei = torch.cat(parts, 1) if parts else torch.empty(2, 0, dtype=torch.long)
    return Graph(x=torch.randn(N, F_IN, generator=g), batch=batch, edge_index=ei,
                 edge_attr=torch.randn(ei.size(1), E_DIM, generator=g),
                 pos=torch.randn(N, 3, generator=g), num_graphs=len(sizes), sizes=list(sizes))


def _unsorted(g: Graph) -> Graph:
    N = g.num_nodes
    perm = torch.arange(N).flip(0)  # a batch [1, 1, 0, 0, ...]: unsorted but valid
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(N)
    return replace(g, x=g.x[perm], batch=g.batch[perm], pos=g.pos[perm], edge_index=inv[g.edge_index])


def _set(**fields: Callable[[Graph], Any]) -> Callable[[Graph], Graph]:
    def mutate(g: Graph) -> Graph:
        return replace(g, **{k: f(g) for k, f in fields.items()})

    return mutate


def _shift_first_edge(g: Graph, delta: tuple[int, int]) -> Tensor:
    ei = g.edge_index.clone()
    ei[0, 0] += delta[0]
    ei[1, 0] += delta[1]
    return ei


def _cross_graph(g: Graph) -> Tensor:
    ei = g.edge_index.clone()
    ei[0, 0], ei[1, 0] = 0, g.num_nodes - 1  # first node of graph 0 -> last node of the last graph
    return ei


@dataclass(frozen=True)
class InputClass:
    """A class of input: ``arg`` is the argument an error must name (``None``: valid input, which
    must be accepted); ``invalid`` inputs must be refused, the others may be accepted."""

    name: str
    kind: str  # "data": a mutation of the graph; "hyper": a bad constructor argument; "heads"
    arg: str | None = None
    invalid: bool = True
    sizes: Callable[[int], list[int]] = lambda n: [n, n + 1]
    mutate: Callable[[Graph], Graph] | None = None
    bad: Callable[[Any], Any] | None = None  # hyper: valid value -> bad value


def _data(name: str, arg: str | None, mutate: Callable[[Graph], Graph] | None = None, *,
          invalid: bool = True, sizes: Callable[[int], list[int]] | None = None) -> InputClass:
    kw: dict[str, Any] = {} if sizes is None else {"sizes": sizes}
    return InputClass(name, "data", arg, invalid and arg is not None, mutate=mutate, **kw)


CLASSES: dict[str, InputClass] = {c.name: c for c in [
    # valid and edge-case input: must be accepted (or refused naming the argument, where marked)
    _data("valid", None),
    _data("empty_graph", None, sizes=lambda n: [0]),
    _data("only_empty_graphs", None, sizes=lambda n: [0, 0, 0]),
    _data("some_empty_graphs", None, sizes=lambda n: [n, 0, 1]),
    _data("single_node_graphs", None, sizes=lambda n: [1] * n),
    _data("unsorted_batch", "batch", _unsorted, invalid=False),
    _data("x_float64", "x", _set(x=lambda g: g.x.double()), invalid=False),
    _data("x_float16", "x", _set(x=lambda g: g.x.half()), invalid=False),
    _data("x_bfloat16", "x", _set(x=lambda g: g.x.bfloat16()), invalid=False),
    _data("x_int", "x", _set(x=lambda g: (g.x * 3).long()), invalid=False),
    # malformed node features
    _data("x_nan", "x", _set(x=lambda g: g.x.index_fill(0, torch.tensor([0]), float("nan")))),
    _data("x_inf", "x", _set(x=lambda g: g.x.index_fill(0, torch.tensor([0]), float("inf")))),
    _data("x_1d", "x", _set(x=lambda g: g.x[:, 0])),
    _data("x_3d", "x", _set(x=lambda g: g.x[:, None])),
    _data("x_list", "x", _set(x=lambda g: g.x.tolist())),
    _data("x_none", "x", _set(x=lambda g: None)),
    # malformed graph assignment
    _data("batch_negative_id", "batch", _set(batch=lambda g: g.batch - 1)),
    _data("batch_wrong_length", "batch", _set(batch=lambda g: g.batch[1:])),
    _data("batch_float", "batch", _set(batch=lambda g: g.batch.float())),
    # malformed edges
    _data("edge_index_float", "edge_index", _set(edge_index=lambda g: g.edge_index.float())),
    _data("edge_index_out_of_range", "edge_index",
          _set(edge_index=lambda g: _shift_first_edge(g, (0, g.num_nodes)))),
    _data("edge_index_negative", "edge_index",
          _set(edge_index=lambda g: _shift_first_edge(g, (-g.num_nodes - 1, 0)))),
    _data("edge_index_1d", "edge_index", _set(edge_index=lambda g: g.edge_index[0])),
    _data("edge_index_list", "edge_index", _set(edge_index=lambda g: g.edge_index.tolist())),
    _data("edge_index_cross_graph", "edge_index", _set(edge_index=_cross_graph)),
    _data("edge_attr_wrong_rows", "edge_attr", _set(edge_attr=lambda g: g.edge_attr[1:])),
    _data("edge_attr_nan", "edge_attr", _set(edge_attr=lambda g: g.edge_attr * float("nan"))),
    _data("pos_nan", "pos", _set(pos=lambda g: g.pos.index_fill(0, torch.tensor([1]), float("nan")))),
    # a point cloud's normals with one row too many (read by the point-cloud loader only)
    _data("normal_wrong_rows", "normal"),
    # bad constructor arguments (every integer hyperparameter of the entry point in turn)
    InputClass("hp_negative", "hyper", bad=lambda v: -7),
    InputClass("hp_zero", "hyper", bad=lambda v: 0),
    InputClass("hp_bool", "hyper", bad=lambda v: True),
    InputClass("hp_float", "hyper", bad=lambda v: v + 0.5),
    InputClass("hp_string", "hyper", bad=lambda v: str(v)),
    InputClass("hp_huge", "hyper", invalid=False, bad=lambda v: HUGE),
    InputClass("rate_out_of_range", "hyper", bad=lambda v: 1.5),
    InputClass("rate_nan", "hyper", bad=lambda v: float("nan")),
    # heads that do not fit (a producer called with a bad num_heads, an edge set of other heads)
    InputClass("num_heads_mismatch", "heads", arg="num_heads"),
]}

X_CLASSES = [c for c in CLASSES if c.startswith("x_")]
SIZE_CLASSES = ["valid", "empty_graph", "only_empty_graphs", "some_empty_graphs",
                "single_node_graphs"]
BATCH_CLASSES = ["unsorted_batch", "batch_negative_id", "batch_wrong_length", "batch_float"]
EDGE_CLASSES = [c for c in CLASSES if c.startswith("edge_index_")]
EDGE_ATTR_CLASSES = ["edge_attr_wrong_rows", "edge_attr_nan"]
HP_CLASSES = ["hp_negative", "hp_zero", "hp_bool", "hp_float", "hp_string", "hp_huge"]
RATE_CLASSES = ["rate_out_of_range", "rate_nan"]


# ------------------------------------------------------------------------------- entry points
@dataclass
class Entry:
    """A public entry point: ``build(**kwargs)`` then ``call(obj, graph)`` → output.

    ``ints`` are its integer hyperparameters with valid values (``zero_ok`` / ``negative_ok``: 0 / a
    negative value is valid, ``huge_ok``: a huge value is valid and must run), ``rates`` its
    probabilities. ``rename`` maps a class's argument to the name this entry point gives it.
    ``rows``: the expected output rows (``"nodes"``, ``"graphs"`` or ``None``). ``heads_call``
    yields the ``(case, thunk)`` calls of the ``num_heads_mismatch`` class. ``check`` finds a
    silent wrong answer in an accepted call's output (the loaders)."""

    name: str
    build: Callable[..., Any]
    call: Callable[[Any, Graph], Any]
    classes: list[str]
    ints: dict[str, Any] = field(default_factory=dict)
    zero_ok: frozenset[str] = frozenset()
    negative_ok: frozenset[str] = frozenset()
    huge_ok: frozenset[str] = frozenset()
    rates: dict[str, float] = field(default_factory=dict)
    rename: dict[str, str] = field(default_factory=dict)
    rows: str | None = "nodes"
    heads_call: Callable[[Graph], Any] | None = None
    check: Callable[[Any, Graph], str | None] | None = None  # a wrong answer in the output, or None


def _layer_call(layer: Any, g: Graph) -> Any:
    return layer(g.x, g.edge_index, batch=g.batch, edge_attr=g.edge_attr)


def _model_call(model: Any, g: Graph) -> Any:
    return model(g.data())


def _producer_call(name: str) -> Callable[[Any, Graph], Any]:
    def call(p: Any, g: Graph) -> Any:
        return p(g.x, g.batch, data=g.data(), num_heads=HEADS)

    return call


def _producer_in_layer(heads: int, channels: int) -> Callable[[Any, Graph], Any]:
    """Producers that read the layer's projections run inside an :class:`EdgeAttention`."""

    def call(p: Any, g: Graph) -> Any:
        layer = EdgeAttention(F_IN, channels, heads=heads, mode=p.mode)
        return layer(g.x, p, batch=g.batch, data=g.data())

    return call


def _producer_heads(name: str, kwargs: dict[str, Any]) -> Callable[[Graph], Any]:
    def call(g: Graph) -> Iterator[tuple[str, Callable[[], Any]]]:
        for bad in (0, -2, True, 2.5):
            yield (f"num_heads={bad!r}",
                   lambda bad=bad: build_producer({"name": name, **kwargs})(
                       g.x, g.batch, data=g.data(), num_heads=bad))

    return call


GRAPH_INPUT = [*SIZE_CLASSES, *X_CLASSES, *BATCH_CLASSES]
PRODUCER_SPECS: dict[str, dict[str, Any]] = {
    # name: constructor arguments, integer hyperparameters, the classes beyond GRAPH_INPUT
    "expander": {"ints": {"degree": 3, "seed": 0}, "zero_ok": {"seed"},
                 "negative_ok": {"seed"}, "huge_ok": {"degree", "seed"}},
    "full": {},
    "global": {"ints": {"positions": 1}, "zero_ok": {"positions"}, "huge_ok": {"positions"}},
    "input": {"kwargs": {"self_loops": True}, "extra": [*EDGE_CLASSES, *EDGE_ATTR_CLASSES]},
    "knn": {"ints": {"k": 3, "max_elements": 64}, "huge_ok": {"k", "max_elements"},
            "extra": ["pos_nan"]},
    "random": {"ints": {"k": 3, "seed": 0}, "zero_ok": {"seed"}, "negative_ok": {"seed"},
               "huge_ok": {"k", "seed"}},
    "union": {"kwargs": {"producers": ["input", "knn", "virtual"], "channels": F_IN},
              "extra": [*EDGE_CLASSES, "pos_nan"]},
    "virtual": {"kwargs": {"channels": F_IN}, "ints": {"num_virtual": 2}},
    "window": {"ints": {"window": 2}, "zero_ok": {"window"}, "huge_ok": {"window"}},
    "converter": {"kwargs": {"channels": F_IN}, "ints": {"order": 2, "stride": 1},
                  "zero_ok": {"order", "stride"}, "rates": {"dropout": 0.0}},
    "sac": {"kwargs": {"channels": F_IN, "alpha": 2.0},
            "ints": {"embed_dim": 8, "max_distance": 2, "beam_size": 2, "seed": 0,
                     "chunk_size": 4096, "max_dense": 1 << 20},
            "zero_ok": {"seed"}, "negative_ok": {"seed"},
            "huge_ok": {"seed", "chunk_size", "max_dense"},
            "extra": EDGE_CLASSES},
    "samsa": {"kwargs": {"channels": F_IN, "num_heads": HEADS},
              "ints": {"k": 3, "num_support": 4, "max_pairs": 4096},
              "zero_ok": {"num_support"}, "huge_ok": {"max_pairs"}},
    "sbm": {"ints": {"num_clusters": 4, "chunk_size": 4096, "eval_seed": 0},
            "zero_ok": {"eval_seed"}, "negative_ok": {"eval_seed"},
            "huge_ok": {"chunk_size", "eval_seed"}, "layer": (HEADS, 4)},
    "sliceformer": {"kwargs": {"order": "interleave"}, "ints": {"layer": 0, "num_layers": 2},
                    "zero_ok": {"layer"}, "layer": (F_IN, 1)},
}


def _producer_entry(name: str) -> Entry:
    spec = PRODUCER_SPECS.get(name, {})
    ints = dict(spec.get("ints", {}))
    kwargs = {**spec.get("kwargs", {}), **ints}
    layer = spec.get("layer")
    classes = [*GRAPH_INPUT, *spec.get("extra", [])]
    if spec.get("ints"):
        classes += HP_CLASSES
    if spec.get("rates"):
        classes += RATE_CLASSES
    if layer is None:
        classes.append("num_heads_mismatch")
    return Entry(
        name=f"producer:{name}",
        build=lambda **kw: build_producer({"name": name, **kwargs, **kw}),
        call=_producer_call(name) if layer is None else _producer_in_layer(*layer),
        classes=classes,
        ints=ints,
        zero_ok=frozenset(spec.get("zero_ok", ())),
        negative_ok=frozenset(spec.get("negative_ok", ())),
        huge_ok=frozenset(spec.get("huge_ok", ())),
        rates=dict(spec.get("rates", {})),
        rows=None if layer is None else "nodes",
        heads_call=_producer_heads(name, kwargs) if layer is None else None,
    )


def _union_call(num_nodes: Any, g: Graph, *, heads: tuple[int, int] = (HEADS, HEADS)) -> Any:
    N = g.num_nodes
    a = EdgeSet(g.edge_index, num_heads=heads[0])
    vx = torch.randn(g.num_graphs, F_IN)
    b = SharedSourceEdgeSet((N + torch.arange(g.num_graphs)).view(-1, 1, 1),
                            torch.cat([torch.zeros(1, dtype=torch.long), g.batch.bincount(
                                minlength=g.num_graphs).cumsum(0)]),
                            num_heads=heads[1], virtual_x=vx, virtual_batch=torch.arange(g.num_graphs))
    out = union_edge_sets([a, b, a], num_nodes)
    return out


def _union_entry() -> Entry:
    def heads_call(g: Graph) -> Iterator[tuple[str, Callable[[], Any]]]:
        yield "parts of 2 and 3 heads", lambda: _union_call(g.num_nodes, g, heads=(2, 3))

    return Entry(
        name="union_edge_sets",
        build=lambda num_nodes=None: num_nodes,
        call=lambda num_nodes, g: _union_call(g.num_nodes if num_nodes is None else num_nodes, g),
        # num_nodes=0 (or too small, or huge) cannot be told from a right one without a device sync
        classes=[*SIZE_CLASSES, *[c for c in HP_CLASSES if c != "hp_zero"], "num_heads_mismatch"],
        ints={"num_nodes": None},
        zero_ok=frozenset(), huge_ok=frozenset(), rows=None, heads_call=heads_call,
    )


def _shared_sources(g: Graph) -> tuple[Tensor, Tensor, Tensor]:
    """``(sources, ptr, source_mask)``: full attention within each graph as shared sources."""
    counts = torch.tensor(g.sizes, dtype=torch.long)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    n_max = max(g.sizes)
    slot = torch.arange(n_max)
    mask = (slot[None, :] < counts[:, None]).view(len(g.sizes), 1, n_max)
    B = len(g.sizes)
    sources = torch.where(mask, (ptr[:-1, None] + slot[None, :]).view(B, 1, n_max), 0)
    return sources, ptr, mask


def _edge_set_entries() -> list[Entry]:
    edge_classes = [*SIZE_CLASSES, *BATCH_CLASSES, *EDGE_CLASSES, *EDGE_ATTR_CLASSES, *HP_CLASSES]

    def heads_arg(num_heads: Any = HEADS) -> Any:
        return num_heads

    def explicit_call(num_heads: Any, g: Graph) -> Any:
        es = EdgeSet(g.edge_index, num_heads=num_heads, edge_attr=g.edge_attr,
                     bias=torch.zeros(_num_edges(g.edge_index)))
        return es.validate(g.num_nodes, g.batch)

    def shared_call(num_heads: Any, g: Graph) -> Any:
        sources, ptr, mask = _shared_sources(g)
        sources = _like_edge_index(sources, g)
        return SharedSourceEdgeSet(sources, ptr, num_heads=num_heads, source_mask=mask).validate(
            g.num_nodes, g.batch)

    def permutation_call(num_heads: Any, g: Graph) -> Any:
        N = g.num_nodes
        src = torch.arange(N)[:, None]
        src = _like_edge_index(src, g)
        return PermutationEdgeSet(src, num_heads=num_heads).validate(N, g.batch)

    structured = [*SIZE_CLASSES, *BATCH_CLASSES, *EDGE_CLASSES, *HP_CLASSES]
    return [
        Entry("EdgeSet", heads_arg, explicit_call, edge_classes, ints={"num_heads": HEADS},
              rows=None),
        Entry("SharedSourceEdgeSet", heads_arg, shared_call, structured, ints={"num_heads": HEADS},
              rename={"edge_index": "sources"}, rows=None),
        Entry("PermutationEdgeSet", heads_arg, permutation_call, structured,
              ints={"num_heads": HEADS}, rename={"edge_index": "src"}, rows=None),
    ]


def _num_edges(ei: Any) -> int:
    return int(ei.size(-1)) if isinstance(ei, Tensor) and ei.dim() else 0


def _like_edge_index(t: Tensor, g: Graph) -> Any:
    """The sources ``t`` of a structured edge set, malformed as the class ``g.kind`` malforms
    ``edge_index``."""
    kind = g.kind
    if kind == "edge_index_list":
        return t.tolist()
    if kind == "edge_index_1d":
        return t.reshape(-1)
    if kind == "edge_index_float":
        return t.float()
    t = t.clone()
    if kind == "edge_index_out_of_range":
        t.view(-1)[0] = g.num_nodes
    elif kind == "edge_index_negative":
        t.view(-1)[0] = -1
    elif kind == "edge_index_cross_graph":
        t.view(-1)[0] = g.num_nodes - 1  # the first target of graph 0 reads the last graph's node
    return t


# ------------------------------------------------------------------------------------ loaders
IMAGE_CHANNELS = 2
PATCH = 2  # the image loader's patch size (its images are made of whole patches)
#: the classes of a loader's input: one sample per graph of the class's sizes (empty, single-element,
#: ...); an ``x_*`` class malforms the tensor the loader reads (tokens, an image, positions)
LOADER_INPUT = [*SIZE_CLASSES, *X_CLASSES]


@dataclass
class LoaderRun:
    """A loader entry point's run: the transform (or the helper's arguments), the samples given to
    it (their fields) and what it returned for each."""

    config: Any
    inputs: list[dict[str, Any]]
    outputs: list[Any]


def _loader_tensor(t: Tensor, kind: str, drop: Callable[[Tensor], Tensor]) -> Any:
    """A loader's input ``t`` malformed as the class ``kind`` malforms ``x`` (``drop`` removes one
    dimension: the wrong-rank class ``x_1d``)."""
    if kind in ("x_float64", "x_float16", "x_bfloat16"):
        return t.to(getattr(torch, kind[2:]))
    if kind == "x_int":
        return (t * 3).long() if t.is_floating_point() else t.int()
    if kind in ("x_nan", "x_inf", "pos_nan"):
        t = t.float().clone()
        t.view(-1)[:1] = float("inf") if kind == "x_inf" else float("nan")
        return t
    if kind == "x_1d":
        return drop(t)
    if kind == "x_3d":
        return t[None]
    if kind == "x_list":
        return t.tolist()
    return t


def _loader_call(key: str, sample: Callable[[int], dict[str, Any]], drop: Callable[[Tensor], Tensor],
                 apply: Callable[[Any, dict[str, Any]], Any] | None = None
                 ) -> Callable[[Any, Graph], LoaderRun]:
    """Runs a loader on one sample per graph of ``g`` (``sample(n)``: the fields of a valid sample
    of ``n`` elements) with the field ``key`` malformed as the class ``g.kind`` says (``x_none``:
    left out). ``apply(config, fields)`` calls a helper; a transform gets ``Data(**fields)``."""

    def call(transform: Any, g: Graph) -> LoaderRun:
        inputs, outputs = [], []
        for n in g.sizes:
            fields = sample(n)
            if g.kind == "x_none":
                del fields[key]
            else:
                fields[key] = _loader_tensor(fields[key], g.kind, drop)
            if g.kind == "normal_wrong_rows":
                fields["normal"] = torch.randn(n + 1, 3)
            inputs.append(fields)
            outputs.append(transform(Data(**fields)) if apply is None else apply(transform, fields))
        return LoaderRun(transform, inputs, outputs)

    return call


def _grid_call(args: tuple[Any, Any, Any], g: Graph) -> LoaderRun:
    """``grid_edges(h, w, connectivity)`` on an ``n × (n + 1)`` grid per graph of ``g`` (where the
    class leaves ``h`` / ``w`` alone)."""
    h, w, connectivity = args
    inputs = [{"h": n if h is None else h, "w": n + 1 if w is None else w,
               "connectivity": connectivity} for n in g.sizes]
    return LoaderRun(args, inputs, [grid_edges(f["h"], f["w"], f["connectivity"]) for f in inputs])


def _edge_problem(ei: Any, num_nodes: int, num_edges: int) -> str | None:
    """What is wrong with a loader's ``edge_index``, where ``num_edges`` distinct edges without
    self-loops among ``num_nodes`` nodes are expected."""
    if not (isinstance(ei, Tensor) and ei.dtype == torch.long and ei.dim() == 2 and ei.size(0) == 2):
        return f"edge_index is not a [2, E] long tensor: {getattr(ei, 'shape', ei)!r}"
    if ei.size(1) != num_edges:
        return f"{ei.size(1)} edges, expected {num_edges}"
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= num_nodes):
        return f"edge_index out of range for {num_nodes} nodes"
    if bool((ei[0] == ei[1]).any()):
        return "a self-loop"
    if torch.unique(ei, dim=1).size(1) != num_edges:
        return "duplicate edges"
    return None


def _graph_problem(out: Any, num_nodes: int, num_edges: int) -> str | None:
    """What every loader output must be: a ``Data`` of ``num_nodes`` nodes, a row of ``x`` and a
    float ``pos`` per node, ``num_edges`` edges (:func:`_edge_problem`)."""
    if not isinstance(out, Data):
        return f"returned a {type(out).__name__}, not a Data"
    if out.num_nodes != num_nodes:
        return f"{out.num_nodes} nodes, expected {num_nodes}"
    for key in ("x", "pos"):
        value = out[key] if key in out else None
        if not isinstance(value, Tensor) or value.dim() == 0 or value.size(0) != num_nodes:
            return f"data.{key} has not one row per node: {getattr(value, 'shape', value)!r}"
    if out.pos.dtype != torch.float:
        return f"pos is {out.pos.dtype}"
    return _edge_problem(out.edge_index, num_nodes, num_edges)


def _grid_problem(d: Tensor, connectivity: int) -> str | None:
    """Grid edges, given ``|Δ(row, col)|`` of each: neighbours (diagonal only for 8)."""
    if d.numel() and bool((d.max(1).values != 1).any()):
        return "an edge between cells that are not neighbours"
    if connectivity == 4 and d.numel() and bool((d.sum(1) != 1).any()):
        return "a diagonal edge with connectivity 4"
    return None


def _grid_edge_count(h: int, w: int, connectivity: int) -> int:
    diagonal = 2 * max(h - 1, 0) * max(w - 1, 0) if connectivity == 8 else 0
    return 2 * (h * max(w - 1, 0) + max(h - 1, 0) * w + diagonal)


def _sequence_problem(t: SequenceToGraph, fields: dict[str, Any], out: Any) -> str | None:
    tokens = fields["tokens"].long()
    L = tokens.numel()
    n = max(L, t.pad_to or 0)
    head = [] if t.cls_token is None else [t.cls_token]
    c = len(head)
    x = torch.cat([torch.tensor(head, dtype=torch.long), tokens,
                   torch.full((n - L,), t.pad_token, dtype=torch.long)])
    pos = torch.cat([torch.full((c,), -1.0), torch.arange(n, dtype=torch.float)])[:, None]
    w = min(t.window, max(n - 1, 0))
    num_edges = 2 * sum(n - d for d in range(1, w + 1)) + (2 * n if c and t.cls_edges else 0)
    problem = _graph_problem(out, n + c, num_edges)
    if problem:
        return problem
    if out.x.dtype != torch.long or not torch.equal(out.x, x):
        return f"x is {out.x.tolist()}, expected {x.tolist()}"
    if not torch.equal(out.pos, pos):
        return f"pos is {out.pos.view(-1).tolist()}, expected {pos.view(-1).tolist()}"
    src, dst = out.edge_index
    tok = (src >= c) & (dst >= c)  # with the count, the band and the CLS edges are exactly right
    if bool(((src - dst)[tok].abs() > t.window).any()):
        return "an edge between tokens farther apart than the window"
    if not torch.equal(out.y, fields["y"]):
        return "the graph label y was not passed through"
    return None


def _image_problem(t: ImageToGraph, fields: dict[str, Any], out: Any) -> str | None:
    img = fields["image"].float()
    C, H, W = img.shape
    p = t.patch_size
    h, w = H // p, W // p
    n, c = h * w, int(t.cls)
    cells = [(r, q) for r in range(h) for q in range(w)]
    x = torch.stack([img[:, r * p:(r + 1) * p, q * p:(q + 1) * p].reshape(-1) for r, q in cells]) \
        if cells else torch.zeros(0, C * p * p)
    pos = torch.tensor(cells, dtype=torch.float).view(-1, 2)
    if c:
        x = torch.cat([torch.cat([torch.ones(1, 1), torch.zeros(1, C * p * p)], 1),
                       torch.cat([torch.zeros(n, 1), x], 1)])
        pos = torch.cat([torch.full((1, 2), -1.0), pos])
    problem = _graph_problem(out, n + c, _grid_edge_count(h, w, t.connectivity) + 2 * n * c)
    if problem:
        return problem
    if out.x.dtype != torch.float or not torch.equal(out.x, x):
        return "x does not hold the patches in raster order"
    if not torch.equal(out.pos, pos):
        return "pos does not hold the patches' (row, col) in raster order"
    src, dst = out.edge_index
    grid = (src >= c) & (dst >= c)
    problem = _grid_problem((out.pos[src[grid]] - out.pos[dst[grid]]).abs(), t.connectivity)
    if problem:
        return problem
    if not torch.equal(out.y, fields["y"]):
        return "the graph label y was not passed through"
    return None


def _point_cloud_problem(t: PointCloudToGraph, fields: dict[str, Any], out: Any) -> str | None:
    pos = fields["pos"].float()
    N = pos.size(0)
    feats = torch.cat([pos, fields["normal"].float()], 1)
    k = min(t.knn.k, max(N - 1, 0))
    problem = _graph_problem(out, N, N * k)
    if problem:
        return problem
    y = out.y if "y" in out else None  # the input's y is a per-point label: the point's index
    if not (isinstance(y, Tensor) and y.dtype == torch.long and sorted(y.tolist()) == list(range(N))):
        return "the per-point labels y are not a permutation of the input's"
    if not (torch.equal(out.pos, pos[y]) and torch.equal(out.x, feats[y])):
        return "pos / x are not the coordinates / features of the point whose label y is kept"
    src, dst = out.edge_index
    if N and bool((torch.bincount(dst, minlength=N) != k).any()):
        return f"an in-degree other than k = {k}"
    if k:
        d = torch.cdist(out.pos, out.pos).fill_diagonal_(float("inf"))
        kth = d.sort(1).values[:, k - 1]
        if bool((d[dst, src] > kth[dst] + 1e-5).any()):
            return "an edge from a point that is not among the k nearest"
    return None


def _morton_problem(bits: Any, fields: dict[str, Any], out: Any) -> str | None:
    N = fields["pos"].size(0)
    if not (isinstance(out, Tensor) and out.dtype == torch.long and out.dim() == 1
            and torch.equal(out.sort().values, torch.arange(N))):
        return f"not a permutation of the {N} points: {out!r}"
    return None


def _grid_edges_problem(args: Any, fields: dict[str, Any], out: Any) -> str | None:
    h, w, connectivity = fields["h"], fields["w"], fields["connectivity"]
    problem = _edge_problem(out, h * w, _grid_edge_count(h, w, connectivity))
    if problem:
        return problem
    cell = torch.arange(h * w)
    rc = torch.stack([cell // max(w, 1), cell % max(w, 1)], 1)
    return _grid_problem((rc[out[0]] - rc[out[1]]).abs(), connectivity)


def _check_loader(problem: Callable[[Any, dict[str, Any], Any], str | None]
                  ) -> Callable[[Any, Graph], str | None]:
    """A loader entry point's ``check``: ``problem(config, fields, output)`` on every sample; then
    the output graphs batched together keep their edges within their graphs."""

    def check(run: LoaderRun, g: Graph) -> str | None:
        for fields, out in zip(run.inputs, run.outputs, strict=True):
            found = problem(run.config, fields, out)
            if found:
                return found
        if run.outputs and all(isinstance(o, Data) for o in run.outputs):
            batch = Batch.from_data_list(run.outputs)
            src, dst = batch.edge_index
            if not torch.equal(batch.batch[src], batch.batch[dst]):
                return "edges across graphs after batching"
        return None

    return check


def _loader_entries() -> list[Entry]:
    def sequence(n: int) -> dict[str, Any]:
        return {"tokens": torch.randint(2, 50, (n,)), "y": torch.tensor([n % 3])}

    def image(n: int) -> dict[str, Any]:
        return {"image": torch.rand(IMAGE_CHANNELS, n * PATCH, n * PATCH), "y": torch.tensor([1])}

    def cloud(n: int) -> dict[str, Any]:  # y: a label per point (its index), as in segmentation
        return {"pos": torch.randn(n, 3), "normal": torch.randn(n, 3), "y": torch.arange(n)}

    seq_ints = {"window": 2, "cls_token": 1, "pad_to": 4, "pad_token": 0}
    return [
        Entry("SequenceToGraph",
              lambda window=2, cls_token=1, pad_to=4, pad_token=0: SequenceToGraph(
                  window=window, cls_token=cls_token, pad_to=pad_to, pad_token=pad_token),
              _loader_call("tokens", sequence, lambda t: t.sum()), [*LOADER_INPUT, *HP_CLASSES],
              ints=seq_ints, zero_ok=frozenset(seq_ints),
              huge_ok=frozenset({"window", "cls_token", "pad_token"}), rename={"x": "tokens"},
              rows=None, check=_check_loader(_sequence_problem)),
        Entry("ImageToGraph",
              lambda patch_size=PATCH, connectivity=8: ImageToGraph(
                  patch_size=patch_size, connectivity=connectivity, cls=True),
              _loader_call("image", image, lambda t: t[0]), [*LOADER_INPUT, *HP_CLASSES],
              ints={"patch_size": PATCH, "connectivity": 8}, rename={"x": "image"}, rows=None,
              check=_check_loader(_image_problem)),
        Entry("PointCloudToGraph(morton=True)",
              lambda k=3: PointCloudToGraph(k=k, morton=True),
              _loader_call("pos", cloud, lambda t: t[:, 0]),
              [*LOADER_INPUT, "pos_nan", "normal_wrong_rows", *HP_CLASSES],
              ints={"k": 3}, huge_ok=frozenset({"k"}), rename={"x": "pos"}, rows=None,
              check=_check_loader(_point_cloud_problem)),
        Entry("morton_order", lambda bits=10: bits,
              _loader_call("pos", lambda n: {"pos": torch.randn(n, 3)}, lambda t: t[:, 0],
                           apply=lambda bits, f: morton_order(f.get("pos"), bits=bits)),
              [*LOADER_INPUT, "pos_nan", *HP_CLASSES], ints={"bits": 10}, rename={"x": "pos"},
              rows=None, check=_check_loader(_morton_problem)),
        Entry("grid_edges", lambda h=None, w=None, connectivity=8: (h, w, connectivity), _grid_call,
              [*SIZE_CLASSES, *HP_CLASSES], ints={"h": None, "w": None, "connectivity": 8},
              zero_ok=frozenset({"h", "w"}), rows=None, check=_check_loader(_grid_edges_problem)),
    ]


def _entries() -> dict[str, Entry]:
    entries = [
        Entry("EdgeAttention",
              lambda in_channels=F_IN, out_channels=4, heads=HEADS, edge_dim=E_DIM, dropout=0.0:
              EdgeAttention(in_channels, out_channels, heads=heads, edge_dim=edge_dim,
                            dropout=dropout),
              _layer_call, [*GRAPH_INPUT, *EDGE_CLASSES, *EDGE_ATTR_CLASSES, *HP_CLASSES,
                            *RATE_CLASSES, "num_heads_mismatch"],
              ints={"in_channels": F_IN, "out_channels": 4, "heads": HEADS, "edge_dim": E_DIM},
              rates={"dropout": 0.0},
              heads_call=lambda g: iter([("EdgeSet of 3 heads into heads=2", lambda: EdgeAttention(
                  F_IN, 4, heads=HEADS)(g.x, EdgeSet(g.edge_index, num_heads=3), g.batch))])),
        Entry("EdgeAttention(reference,validate=False)",
              lambda: EdgeAttention(F_IN, 4, heads=HEADS, edge_dim=E_DIM, kernel="reference",
                                    validate=False),
              _layer_call, [*GRAPH_INPUT, *[c for c in EDGE_CLASSES if c != "edge_index_cross_graph"],
                            *EDGE_ATTR_CLASSES]),
        Entry("HybridLayer",
              lambda channels=F_IN, heads=HEADS, ffn_ratio=2, edge_dim=E_DIM, in_channels=F_IN,
              dropout=0.0, attn_dropout=0.0:
              HybridLayer(channels, conv="gine", producer="full", heads=heads, ffn_ratio=ffn_ratio,
                          edge_dim=edge_dim, in_channels=in_channels, dropout=dropout,
                          attn_dropout=attn_dropout),
              _layer_call, [*GRAPH_INPUT, *EDGE_CLASSES, *EDGE_ATTR_CLASSES, *HP_CLASSES,
                            *RATE_CLASSES],
              ints={"channels": F_IN, "heads": HEADS, "ffn_ratio": 2, "edge_dim": E_DIM,
                    "in_channels": F_IN},
              rates={"dropout": 0.0, "attn_dropout": 0.0}),
    ]
    model_ints = {"hidden_channels": 16, "out_channels": 3, "num_layers": 2, "heads": HEADS,
                  "ffn_ratio": 2, "head_layers": 2}
    model_rates = {"dropout": 0.0, "attn_dropout": 0.0, "input_dropout": 0.0}
    presets = {  # preset: (arguments, more rates, whether it reads data.edge_attr, output rows)
        "hybrid": ({"producer": "full", "conv": "gine", "edge_encoder": "linear"}, {}, True,
                   "graphs"),
        "samsa": ({"producer": {"name": "samsa", "k": 3}}, {"drop_path": 0.0}, False, "graphs"),
        "converter": ({}, {}, False, "graphs"),
        # a node-level model: DropNode, propagation over the input graph's edges, an MLP
        "grand": ({"steps": 2}, {"drop_node": 0.0, "feature_dropout": 0.0}, False, "nodes"),
        # GCN+ with a global branch: linear encoders for the float features here, LayerNorm (the
        # head's BatchNorm cannot train on the one pooled row of a single-graph batch)
        "gcnplus_attention": ({"producer": "full", "node_encoder": "linear",
                               "edge_encoder": "linear", "attn_channels": 4,
                               "norm": "layer_norm"}, {}, True, "graphs"),
    }
    for preset, (kwargs, extra_rates, reads_edge_attr, rows) in presets.items():
        cls = MODELS[preset]
        # a preset takes only the arguments it uses (e.g. the Converter has no heads)
        ints = {k: v for k, v in model_ints.items() if k in cls.OPTIONS}
        rates = {k: v for k, v in {**model_rates, **extra_rates}.items() if k in cls.OPTIONS}

        def build(cls: Any = cls, kwargs: dict[str, Any] = kwargs, ints: dict[str, Any] = ints,
                  rates: dict[str, Any] = rates, **kw: Any) -> Any:
            args = {**ints, **rates, **kwargs, **kw}
            return cls(args.pop("hidden_channels"), args.pop("out_channels"), **args)

        entries.append(Entry(
            f"GraphTransformer[{preset}]", build, _model_call,
            [*GRAPH_INPUT, *EDGE_CLASSES, *(EDGE_ATTR_CLASSES if reads_edge_attr else ()),
             *HP_CLASSES, *RATE_CLASSES], ints=dict(ints), rates=rates, rows=rows,
        ))
    entries += [_producer_entry(name) for name in sorted(_OWN_PRODUCERS)]
    entries.append(_union_entry())
    entries += _edge_set_entries()
    entries += _loader_entries()
    return {e.name: e for e in entries}


ENTRIES = _entries()


# ---------------------------------------------------------------------------------- outcomes
@dataclass
class Result:
    entry: str
    cls: str
    case: str
    outcome: str
    detail: str = ""


def _nonfinite(out: Any) -> str | None:
    """The first NaN/inf in the output (a tensor, an edge set, a loader's graphs, or a tuple of
    them)."""
    if isinstance(out, LoaderRun):
        return _nonfinite(out.outputs)
    if isinstance(out, Data):
        for key in out.keys():
            problem = _nonfinite(out[key])
            if problem:
                return f"data.{key}: {problem}"
        return None
    if isinstance(out, Tensor):
        if (out.is_floating_point() or out.is_complex()) and out.numel() \
                and not bool(torch.isfinite(out).all()):
            return f"non-finite values in an output of shape {list(out.shape)}"
        return None
    if isinstance(out, BaseEdgeSet):
        names = ("bias", "weight", "virtual_x", "edge_attr", "log_prob", "aux_loss", "slot_bias",
                 "slot_weight")
        for name in names:
            problem = _nonfinite(getattr(out, name, None))
            if problem:
                return f"{name}: {problem}"
        return None
    if isinstance(out, (tuple, list)):
        for o in out:
            problem = _nonfinite(o)
            if problem:
                return problem
    return None


def _wrong_output(entry: Entry, out: Any, g: Graph) -> str | None:
    """A silent wrong answer: wrong output rows, a producer's edges that fail validation, or what
    the entry point's own ``check`` finds."""
    if entry.check is not None:
        problem = entry.check(out, g)
        if problem:
            return problem
    if isinstance(out, BaseEdgeSet) and isinstance(g.batch, Tensor) and isinstance(g.x, Tensor):
        try:
            out.validate(g.num_nodes, g.batch)
        except ValueError as e:
            return f"the produced edge set fails validation: {e}"
    rows = {"nodes": g.num_nodes, "graphs": g.num_graphs}.get(entry.rows or "")
    if rows is not None and isinstance(out, Tensor) and out.size(0) != rows:
        return f"output has {out.size(0)} rows, expected {rows}"
    if isinstance(out, Tensor) and out.dim() == 2 and out.size(1) == 0:
        return "output has no columns"
    return None


def _names(message: str, arg: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(arg)}(?![A-Za-z0-9_])", message) is not None


def _run(entry: Entry, arg: str | None, invalid: bool, thunk: Callable[[], Any], g: Graph
         ) -> tuple[str, str]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = thunk()
    except (ValueError, TypeError) as e:
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if arg is None:
            return "refused", msg
        return ("clear", msg) if _names(str(e), arg) else ("unnamed", msg)
    except Exception as e:  # every other exception is what this test looks for
        return "obscure", f"{type(e).__name__}: {e}".splitlines()[0][:200]
    problem = _nonfinite(out)
    if problem:
        return "nan", problem
    if invalid:
        return "silent", "accepted without an error"
    problem = _wrong_output(entry, out, g)
    if problem:
        return "silent", problem
    return "ok", ""


def hyper_params(entry: Entry, cls_name: str) -> dict[str, Any]:
    """The hyperparameters a hyperparameter class tries on ``entry`` (name → valid value)."""
    if cls_name.startswith("rate_"):
        return dict(entry.rates)
    if cls_name == "hp_zero":
        return {k: v for k, v in entry.ints.items() if k not in entry.zero_ok}
    if cls_name == "hp_negative":
        return {k: v for k, v in entry.ints.items() if k not in entry.negative_ok}
    if cls_name == "hp_huge":
        return {k: v for k, v in entry.ints.items() if k in entry.huge_ok}
    return dict(entry.ints)


def run_cell(entry_name: str, cls_name: str, n: int, seed: int) -> list[Result]:
    """Every call of one cell (one per bad hyperparameter for the hyperparameter classes)."""
    entry, ic = ENTRIES[entry_name], CLASSES[cls_name]
    torch.manual_seed(seed)
    g = make_graph(ic.sizes(n), seed)
    results = []

    def record(case: str, arg: str | None, invalid: bool, thunk: Callable[[], Any], graph: Graph
               ) -> None:
        outcome, detail = _run(entry, arg, invalid, thunk, graph)
        results.append(Result(entry_name, cls_name, case, outcome, detail))

    if ic.kind == "data":
        bad = replace(ic.mutate(g) if ic.mutate is not None else g, kind=cls_name)
        arg = entry.rename.get(ic.arg, ic.arg) if ic.arg else None
        record(cls_name, arg, ic.invalid, lambda: entry.call(entry.build(), bad), bad)
    elif ic.kind == "hyper":
        assert ic.bad is not None
        for name, valid in hyper_params(entry, cls_name).items():
            value = ic.bad(valid if valid is not None else g.num_nodes)
            record(f"{name}={value!r}", name, ic.invalid,
                   lambda name=name, value=value: entry.call(entry.build(**{name: value}), g), g)
    else:
        assert entry.heads_call is not None
        for case, thunk in entry.heads_call(g):
            record(case, ic.arg, True, thunk, g)
    return results


def cells() -> list[tuple[str, str]]:
    return [(e.name, c) for e in ENTRIES.values() for c in CLASSES if c in e.classes
            and (CLASSES[c].kind != "hyper" or hyper_params(e, c))]


CELLS = cells()


@pytest.mark.parametrize(("entry", "cls"), CELLS, ids=[f"{e}|{c}" for e, c in CELLS])
@settings(derandomize=True, max_examples=2, deadline=None, database=None)
@given(n=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_fuzz_cell(entry: str, cls: str, n: int, seed: int) -> None:
    bad = [r for r in run_cell(entry, cls, n, seed) if r.outcome not in PASSING]
    assert not bad, "\n".join(f"{r.case}: {r.outcome}: {r.detail}" for r in bad)


def test_fuzz_covers_enough() -> None:
    """The issue's bar: at least 20 input classes, every public entry point."""
    assert len({c for _, c in CELLS}) >= 20
    names = set(ENTRIES)
    assert {"EdgeAttention", "HybridLayer", "union_edge_sets", "EdgeSet", "SharedSourceEdgeSet",
            "PermutationEdgeSet"} <= names
    # every model with graphattn's input handling (the citation anchors are PyG's layers as they
    # are, tests/nn/test_baselines.py)
    ours = {m for m, cls in MODELS.items() if "producer" in cls.OPTIONS}
    assert ours >= {"hybrid", "samsa", "converter"}
    assert {f"GraphTransformer[{m}]" for m in ours} <= names
    assert {f"producer:{p}" for p in _OWN_PRODUCERS} <= names
    assert {"SequenceToGraph", "ImageToGraph", "PointCloudToGraph(morton=True)", "morton_order",
            "grid_edges"} <= names


# ------------------------------------------------------------------------- the issue's cases
def _issue_graph() -> Graph:
    return make_graph([3, 4], 0)


def _knn_nan_pos() -> Any:
    g = _issue_graph()
    g.pos[2] = float("nan")
    return build_producer({"name": "knn", "k": 2})(g.x, g.batch, data=g.data())


def _model_data(**changes: Any) -> Batch:
    return replace(_issue_graph(), **changes).data()


def _graph_model() -> Any:
    return GraphTransformer(16, 3, num_layers=2, producer="full", conv="gcn", heads=2)


ISSUE_CASES: dict[str, tuple[Callable[[], Any], str]] = {
    # item 5: obscure errors
    "model_edge_index_out_of_range": (lambda: _graph_model()(_model_data(
        edge_index=torch.tensor([[0, 1], [1, 9]]))), "edge_index"),
    "model_edge_index_float": (lambda: _graph_model()(_model_data(
        edge_index=torch.tensor([[0.0, 1.0], [1.0, 2.0]]))), "edge_index"),
    "reference_validate_false": (lambda: EdgeAttention(F_IN, 4, kernel="reference", validate=False)(
        _issue_graph().x, torch.tensor([[0, 1], [1, 9]])), "edge_index"),
    "x_float64_into_float32": (lambda: EdgeAttention(F_IN, 4)(
        _issue_graph().x.double(), _issue_graph().edge_index), "x"),
    "x_float16_into_float32_model": (lambda: _graph_model()(_model_data(x=_issue_graph().x.half())),
                                     "x"),
    "negative_batch_id_into_producer": (lambda: build_producer("full")(
        _issue_graph().x, _issue_graph().batch - 1), "batch"),
    "hybrid_layer_negative_channels": (lambda: HybridLayer(-8, conv="gcn"), "channels"),
    # item 6: silent wrong answers
    "knn_nan_position": (_knn_nan_pos, "pos"),
    "union_negative_num_nodes": (lambda: union_edge_sets(
        [EdgeSet(torch.tensor([[0], [1]]))], num_nodes=-1), "num_nodes"),
    "edge_attention_negative_in_channels": (lambda: EdgeAttention(-7, 4), "in_channels"),
    "edge_attention_zero_in_channels": (lambda: EdgeAttention(0, 4), "in_channels"),
    "model_zero_out_channels": (lambda: GraphTransformer(16, 0), "out_channels"),
    "model_zero_ffn_ratio": (lambda: GraphTransformer(16, 2, ffn_ratio=0), "ffn_ratio"),
    "model_heads_true": (lambda: GraphTransformer(16, 2, heads=True), "heads"),
}


@pytest.mark.parametrize("case", list(ISSUE_CASES))
def test_issue_19_case_is_refused_naming_the_argument(case: str) -> None:
    thunk, arg = ISSUE_CASES[case]
    with pytest.raises(ValueError) as info:
        thunk()
    assert _names(str(info.value), arg), str(info.value)


def test_lazy_width_and_sliceformer_on_empty_graphs_still_work() -> None:
    g = _issue_graph()
    assert EdgeAttention(-1, 4, heads=2)(g.x, g.edge_index).shape == (g.num_nodes, 8)
    empty = make_graph([0, 0, 0], 0)
    layer = HybridLayer(F_IN, producer="sliceformer")
    assert layer(empty.x, batch=empty.batch, data=empty.data()).shape == (0, F_IN)
    model = GraphTransformer(16, 3, num_layers=2, producer="sliceformer", heads=2)
    out = model(empty.data())
    assert out.shape == (3, 3) and bool(torch.isfinite(out).all())


# ------------------------------------------------------------------------------------- table
CODES = {"ok": "ok", "clear": "err", "obscure": "OBS", "nan": "NAN", "silent": "SIL",
         "unnamed": "UNN", "refused": "REF"}


def table(n: int = 3, seed: int = 0, out: Any = sys.stdout) -> dict[str, int]:
    """Prints the class × entry point → outcome table (worst outcome of one example per cell) and
    the failing calls; returns the count of cells per outcome."""
    start = time.perf_counter()
    worst: dict[tuple[str, str], str] = {}
    failures = []
    for e, c in CELLS:
        results = run_cell(e, c, n, seed)
        worst[(e, c)] = min((r.outcome for r in results), key=OUTCOME_ORDER.index)
        failures += [r for r in results if r.outcome not in PASSING]
    classes = list(CLASSES)
    print(f"graphattn from {graphattn.__file__}", file=out)
    print("codes: ok = finite output, err = ValueError/TypeError naming the argument (both pass);"
          " OBS = other exception, UNN = error not naming the argument, REF = valid input refused,"
          " NAN = non-finite output, SIL = invalid input accepted / wrong output; . = n/a", file=out)
    print("\nclasses:", file=out)
    for i, c in enumerate(classes):
        print(f"  c{i:02d} {c}", file=out)
    width = max(len(e) for e in ENTRIES)
    print("\n" + " " * width + " " + " ".join(f"c{i:02d}" for i in range(len(classes))), file=out)
    for e in ENTRIES:
        row = [CODES[worst[(e, c)]] if (e, c) in worst else " . " for c in classes]
        print(f"{e:<{width}} " + " ".join(f"{r:>3}" for r in row), file=out)
    counts: dict[str, int] = {o: 0 for o in OUTCOME_ORDER}
    for o in worst.values():
        counts[o] += 1
    print(f"\n{len(CLASSES)} classes x {len(ENTRIES)} entry points = {len(CELLS)} cells "
          f"({time.perf_counter() - start:.1f} s): "
          + ", ".join(f"{o} {counts[o]}" for o in OUTCOME_ORDER), file=out)
    if failures:
        print("\nfailing calls:", file=out)
        for r in failures:
            print(f"  {r.entry} | {r.cls} | {r.case}: {r.outcome}: {r.detail}", file=out)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="print the outcome table")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.table:
        parser.print_help()
        return 0
    counts = table(args.n, args.seed)
    return 0 if counts["ok"] + counts["clear"] == sum(counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
