"""The producer interface: a module that turns node features (and the graph) into an EdgeSet.

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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from graphattn.edgeset import EdgeSet, ptr_from_batch


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
    ) -> None:
        if not isinstance(x, Tensor) or x.dim() != 2:
            shape = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"'x' must be a 2-D tensor [N, F], got {shape}")
        num_heads = check_positive_int("num_heads", num_heads)
        N = x.size(0)
        if batch is None:
            batch = torch.zeros(N, dtype=torch.long, device=x.device)
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
                stats.append(torch.isfinite(x).all())
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
        self.generator = generator
        self.training = training
        self._projections = projections or {}
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
            if not self.is_sorted:
                raise ValueError("this producer needs 'batch' sorted by graph (as in a PyG Batch)")
            self._cache["ptr"] = ptr_from_batch(self.batch, self.num_graphs)
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
    """

    mode: ClassVar[str] = "attention"
    name: ClassVar[str] = ""
    head_size: int | None = None

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
        edges = self.produce(context)
        if not isinstance(edges, EdgeSet):
            raise TypeError(f"{type(self).__name__}.produce() must return an EdgeSet, "
                            f"got {type(edges).__name__}")
        return edges

    def produce(self, ctx: ProducerContext) -> EdgeSet:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_repr(self) -> str:
        return ""


def check_positive_int(name: str, value: Any, *, allow_zero: bool = False) -> int:
    """Validates a producer hyperparameter."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"'{name}' must be a {kind} int, got {value!r}")
    return value


def check_int(name: str, value: Any) -> int:
    """Validates an integer argument of any sign (a seed): a bool, a float or a string is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"'{name}' must be an int, got {value!r}")
    return value


def check_channels(name: str, value: Any, *, lazy: bool = True, optional: bool = False) -> Any:
    """Validates a width: a positive int, ``-1`` for lazy initialisation (PyG's convention) where
    ``lazy``, ``None`` where ``optional``. ``0`` and other negative values are refused (they used
    to pass for lazy)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and not (lazy and value == -1)):
        what = "a positive int" + (" or -1 (lazy)" if lazy else "") + (" or None" if optional else "")
        raise ValueError(f"'{name}' must be {what}, got {value!r}")
    return value


def resolve_num_heads(num_heads: Any, heads: Any, owner: str) -> int | None:
    """The heads a producer is built for: ``num_heads`` (the one spelling of the producer contract)
    or ``heads`` (its older spelling, still accepted); both given must agree. ``None`` if neither."""
    if num_heads is not None and heads is not None and num_heads != heads:
        raise ValueError(f"{owner} got num_heads={num_heads!r} and heads={heads!r}; give 'num_heads' "
                         f"only ('heads' is its older spelling)")
    value = num_heads if num_heads is not None else heads
    return None if value is None else check_positive_int("num_heads", value)


def check_rate(name: str, value: Any) -> float:
    """Validates a probability (a dropout rate): a real number in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"'{name}' must be a number in [0, 1), got {value!r}")
    return float(value)


def check_node_features(x: Any, in_channels: int, module: nn.Module) -> None:
    """The checks of a layer's node features ``x``: a 2-D floating-point tensor with
    ``in_channels`` columns (any width when ``in_channels`` is ``-1``, lazy) and the dtype of
    ``module``'s parameters (:func:`check_dtype`)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"'x' must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"'x' must be 2-D [N, F], got shape {list(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"'x' must be a floating-point tensor, got {x.dtype}")
    if in_channels > 0 and x.size(1) != in_channels:
        raise ValueError(f"'x' must have in_channels={in_channels} columns, got {x.size(1)}")
    check_dtype("x", x, module, type(module).__name__)


def check_dtype(name: str, x: Tensor, module: nn.Module, what: str) -> None:
    """A clear error when the floating-point ``x`` does not have the dtype of ``module``'s
    parameters (instead of ``mat1 and mat2 must have the same dtype`` deep inside a projection).
    Inputs are not cast: cast ``x`` or the module (``module.to(dtype)``). Under
    :func:`torch.autocast` (mixed precision) the projections cast themselves: no check."""
    if not x.is_floating_point() or torch.is_autocast_enabled(x.device.type):
        return
    param = next((p for p in module.parameters() if p.is_floating_point()), None)
    if param is not None and x.dtype != param.dtype:
        raise ValueError(f"'{name}' has dtype {x.dtype} but {what} has parameters of dtype "
                         f"{param.dtype}; cast one to the other ({name}.to({param.dtype}) or "
                         f"module.to({x.dtype}))")
