"""The producer contract: a module that turns node features (and the graph) into an EdgeSet.

A producer implements one method, :meth:`EdgeProducer.produce`, which receives a
:class:`ProducerContext` and returns an :class:`~graphattn.EdgeSet`. It never does attention
arithmetic. Calling a producer directly works like any module::

    edges = producer(x, batch, data=data)          # standalone
    out = EdgeAttention(...)(x, producer, batch)   # inside the layer, after the projections

Inside :class:`~graphattn.EdgeAttention` the context also exposes the layer's per-head projections
(:meth:`ProducerContext.query`, :meth:`~ProducerContext.key`, :meth:`~ProducerContext.value`),
computed once and shared with the layer: producers such as SBM-Transformer (memberships from ``q``
and ``k``) or Sliceformer (sorting ``v``) read them there.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from graphattn.core.checks import all_finite, check_positive_int
from graphattn.core.edgeset import BaseEdgeSet, EdgeSet
from graphattn.core.index import default_batch, known_ptr, ptr_from_batch, tensor_version


class ProducerContext:
    """Everything a producer may read.

    Attributes:
        x: ``[N, F]`` node features entering the layer.
        batch: ``[N]`` graph id of each node.
        num_graphs: number of graphs ``B`` (graphs may be empty).
        num_heads: heads of the consuming layer (1 when called standalone, unless given).
        data: the PyG ``Data``/``Batch`` (``edge_index``, ``edge_attr``, ``pos``, ...) or ``None``.
        generator: a :class:`torch.Generator` for every random draw, or ``None`` (global RNG).
        training: whether the consumer is in training mode.
        inputs: named tensors the caller hands to the producer beside ``x`` (e.g. the SAMSA block
            passes its un-normalised input as ``"residual"``); read with :meth:`input`.
        edge_cache: a dict shared by the layers of one forward pass (the model creates it): a
            producer whose edges depend only on the batch (:meth:`EdgeProducer.static_key`) builds
            them once and every layer with the same key reuses that edge set. ``None``: no sharing.

    With ``validate=True`` (the default) the context checks, in one host read, that ``x`` holds no
    NaN/inf and ``batch`` no negative graph id (or one ``>= num_graphs``);
    :class:`~graphattn.EdgeAttention` passes ``validate=False`` after checking its inputs itself.
    """

    def __init__(
        self,
        x: Tensor,
        batch: Tensor | None = None,
        *,
        num_graphs: int | None = None,
        num_heads: int = 1,
        data: Any = None,
        generator: torch.Generator | None = None,
        training: bool = False,
        projections: dict[str, Callable[[], Tensor]] | None = None,
        validate: bool = True,
        inputs: Mapping[str, Tensor] | None = None,
        edge_cache: dict[Hashable, Any] | None = None,
    ) -> None:
        if not isinstance(x, Tensor) or x.dim() != 2:
            shape = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"'x' must be a 2-D tensor [N, F], got {shape}")
        num_heads = check_positive_int("num_heads", num_heads)
        N = x.size(0)
        if batch is None:
            batch = default_batch(None, N, x.device)
        elif not isinstance(batch, Tensor) or batch.dim() != 1 or batch.numel() != N:
            shape = list(batch.shape) if isinstance(batch, Tensor) else type(batch).__name__
            raise ValueError(f"'batch' must be a 1-D tensor with one graph id per node [{N}], "
                             f"got {shape}")
        elif batch.dtype != torch.long:
            raise ValueError(f"'batch' must have dtype torch.long, got {batch.dtype}")
        if num_graphs is not None:
            num_graphs = check_positive_int("num_graphs", num_graphs, allow_zero=True)
        if validate and N:
            # one host read: x free of NaN/inf (producers sort, score and pool it), the graph ids
            # non-negative (they index per-graph tables) and below num_graphs
            stats = [batch.min(), batch.max()]
            if x.is_floating_point():
                stats.append(all_finite(x))
            bmin, bmax, *finite = torch.stack([s.long() for s in stats]).tolist()
            if bmin < 0:
                raise ValueError(f"'batch' must hold non-negative graph ids, got {bmin}")
            if finite and not finite[0]:
                raise ValueError("'x' contains NaN or infinite values")
            if num_graphs is None:
                num_graphs = bmax + 1
            elif bmax >= num_graphs:
                raise ValueError(f"'batch' holds graph id {bmax} >= num_graphs={num_graphs}")
        if num_graphs is None:
            num_graphs = int(batch.max()) + 1 if N else (1 if data is None else _num_graphs(data))
        self.x = x
        self.batch = batch
        self.num_graphs = num_graphs
        self.num_heads = num_heads
        self.data = data
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"'generator' must be a torch.Generator or None, got "
                             f"{type(generator).__name__}")
        self.generator = generator
        self.training = training
        self._projections = projections or {}
        self.inputs: Mapping[str, Tensor] = {} if inputs is None else inputs
        self.edge_cache = edge_cache
        self._cache: dict[str, Tensor] = {}

    @property
    def num_nodes(self) -> int:
        return int(self.x.size(0))

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def is_sorted(self) -> bool:
        b = self.batch
        return b.numel() < 2 or bool((b[1:] >= b[:-1]).all())

    @property
    def ptr(self) -> Tensor:
        """``[B + 1]`` CSR pointer of the graphs; requires a sorted ``batch`` (as in PyG ``Batch``)."""
        if "ptr" not in self._cache:
            # within a model's forward pass the layers share it (the same batch tensor)
            key = ("ptr", self.num_graphs, id(self.batch), tensor_version(self.batch))
            shared = None if self.edge_cache is None else self.edge_cache.get(key)
            if shared is None:
                if not self.is_sorted:
                    raise ValueError("this producer needs 'batch' sorted by graph (as in a PyG "
                                     "Batch)")
                shared = known_ptr(ptr_from_batch(self.batch, self.num_graphs))
                if self.edge_cache is not None:
                    self.edge_cache[key] = shared
            self._cache["ptr"] = shared
        return self._cache["ptr"]

    @property
    def counts(self) -> Tensor:
        """``[B]`` number of nodes per graph."""
        return torch.bincount(self.batch, minlength=self.num_graphs)

    def local_index(self) -> Tensor:
        """``[N]`` index of each node within its graph (in node order)."""
        if "local" not in self._cache:
            b = self.batch
            order = torch.argsort(b, stable=True)
            counts = self.counts
            starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])
            local = torch.empty_like(b)
            local[order] = torch.arange(b.numel(), device=b.device) - starts[b[order]]
            self._cache["local"] = local
        return self._cache["local"]

    def input(self, name: str) -> Tensor:
        """The caller's named input ``name`` (:attr:`inputs`), else ``data.<name>``; a clear error if
        neither exists."""
        if name in self.inputs:
            return self.inputs[name]
        if self.data is not None and getattr(self.data, name, None) is not None:
            return self.attr(name)
        raise ValueError(f"this producer reads the input {name!r}, which the caller did not pass "
                         f"(inputs: {sorted(self.inputs)}) and the data does not have")

    def attr(self, name: str) -> Any:
        """``data.<name>``, with a clear error if there is no data or no such attribute."""
        if self.data is None:
            raise ValueError(f"this producer reads data.{name}, but no 'data' was passed")
        value = getattr(self.data, name, None)
        if value is None:
            raise ValueError(f"this producer reads data.{name}, which the data does not have")
        return value

    def _projection(self, name: str) -> Tensor:
        if name not in self._cache:
            fn = self._projections.get(name)
            if fn is None:
                raise ValueError(
                    f"this producer needs the layer's '{name}' projection; call it from "
                    f"EdgeAttention (in mode='attention' for query/key)"
                )
            self._cache[name] = fn()
        return self._cache[name]

    def query(self) -> Tensor:
        """The consuming layer's queries ``[N, H, C]``."""
        return self._projection("query")

    def key(self) -> Tensor:
        """The consuming layer's keys of the real nodes ``[N, H, C]``."""
        return self._projection("key")

    def value(self) -> Tensor:
        """The consuming layer's values of the real nodes ``[N, H, C]``."""
        return self._projection("value")

    def cached_projection(self, name: str) -> Tensor | None:
        return self._cache.get(name)


def _num_graphs(data: Any) -> int:
    n = getattr(data, "num_graphs", None)
    return int(n) if n is not None else 1


class EdgeProducer(nn.Module):
    """Base class of every producer: implement :meth:`produce`.

    Class attributes:
        mode: the EdgeSet mode this producer emits (``"attention"`` or ``"weighted"``); the hybrid
            layer builds its attention accordingly (no query/key parameters for ``"weighted"``).
        name: the registry name (set by :func:`~graphattn.producers.register_producer`).
        head_size: the head size the producer's edge sets need from the consuming attention, or
            ``None`` (the model's ``heads``). E.g. ``1`` for one permutation per channel
            (Sliceformer): the hybrid layer then builds ``channels`` heads of size 1.
        virtual_sources_only: whether every edge has a virtual source (virtual nodes), so that
            none can repeat a real edge.
    """

    mode: ClassVar[str] = "attention"
    name: ClassVar[str] = ""
    head_size: int | None = None
    #: every edge this producer emits has a virtual source (``>= N``), e.g. virtual nodes: its
    #: edges can never repeat a real edge (the ``union`` producer uses this to skip a sort)
    virtual_sources_only: ClassVar[bool] = False
    #: the producer accepts ``channels=-1`` (sized lazily, or no parameters sized by the input);
    #: ``False`` for those whose parameters need the input width at construction (SAMSA, the
    #: Converter): a model reading raw features must then be given ``in_channels``
    lazy_channels: ClassVar[bool] = True
    #: ``False`` for a producer whose output at slot ``r`` does not depend on the node at ``r``
    #: (Sliceformer: the r-th order statistic of each channel). A node-level model refuses it
    #: unless told the node order means something (``GraphTransformer(allow_order_dependent=True)``)
    permutation_equivariant: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self._share_token: object | None = None

    @contextmanager
    def sharing_scope(self) -> Iterator[None]:
        """One model forward pass in which this instance serves several layers.

        The model (:class:`~graphattn.GraphTransformer`) enters it around its layer loop for every
        producer instance used by more than one layer; inside, :attr:`share_token` identifies the
        pass, so a producer may predict once and reuse the result in later layers (SAC). Outside a
        scope every call is a new request."""
        previous = self._share_token
        self._share_token = object()
        try:
            yield
        finally:
            self._share_token = previous

    @property
    def share_token(self) -> object | None:
        """The current :meth:`sharing_scope` (``None`` outside one)."""
        return self.__dict__.get("_share_token")

    def forward(
        self,
        x: Tensor,
        batch: Tensor | None = None,
        *,
        data: Any = None,
        generator: torch.Generator | None = None,
        num_heads: int | None = None,
        context: ProducerContext | None = None,
    ) -> EdgeSet:
        if context is None:
            context = ProducerContext(
                x, batch, num_heads=1 if num_heads is None else num_heads, data=data,
                generator=generator,
                training=self.training,
            )
        cache = context.edge_cache
        key = None if cache is None else self.static_key(context)
        if key is not None:
            key = (key, context.num_heads, context.num_nodes)
            hit = cache.get(key)
            if hit is not None:
                return hit
        edges = self.produce(context)
        if not isinstance(edges, BaseEdgeSet):
            raise TypeError(f"{type(self).__name__}.produce() must return an EdgeSet, "
                            f"got {type(edges).__name__}")
        if key is not None:
            cache[key] = edges
        return edges

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        """A key naming this producer's edge set when the set depends only on the batch (its graph
        structure and data attributes, not the layer's input ``x``), on this producer's settings
        and on ``ctx.num_heads`` — never on parameters or random draws. Inside a model's forward
        pass (:attr:`ProducerContext.edge_cache`) such an edge set is built once and shared by every
        layer whose producer gives the same key (with its kernel layouts and validation). ``None``
        (the default): built on every call. Override it only for deterministic producers; the key
        must hold every setting that changes the edges."""
        return None

    def produce(self, ctx: ProducerContext) -> EdgeSet:  # pragma: no cover - abstract
        raise NotImplementedError

    def in_warm_start(self) -> bool:
        """Whether the next call still returns warm-start edges in place of this producer's own
        (e.g. SAC's ``warm_start`` stage on the input edges). A model evaluated then is not this
        producer's model, so the runner selects no epoch until every producer is out of it.
        ``False`` by default."""
        return False

    def policy_parameters(self) -> list[nn.Parameter]:
        """The parameters trained by the policy gradient only (e.g. SAC's edge predictor), which the
        runner's ``pg_lr`` gives a learning rate of their own. None by default."""
        return []

    def extra_repr(self) -> str:
        return ""
