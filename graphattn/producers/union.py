"""The union of several producers' edge sets."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from torch import nn

from graphattn.edgeset import EdgeSet, union_edge_sets
from graphattn.producers.base import EdgeProducer, ProducerContext
from graphattn.producers.registry import build_producer, register_producer


@register_producer("union")
class UnionProducer(EdgeProducer):
    r""":math:`\mathcal{N}(i) = \bigcup_p \mathcal{N}_p(i)`: the edges of every part, each keeping its
    ``origin`` (e.g. ``input`` ∪ ``expander`` ∪ ``virtual`` is Exphormer's edge set).

    Args:
        producers: the parts, as producers, names or ``{"name": ..., **kwargs}`` mappings.
        coalesce (bool): drop duplicate edges (the earlier part's attributes win), so an edge in
            two parts counts once in the softmax.
        **defaults: model-supplied arguments (``channels``, ...) for parts built from names.
    """

    def __init__(self, producers: Sequence[Any], coalesce: bool = True, **defaults: Any) -> None:
        super().__init__()
        if isinstance(producers, (str, EdgeProducer)) or not len(producers):
            raise ValueError("'producers' must be a non-empty list of producers or names")
        self.parts = nn.ModuleList([build_producer(p, **defaults) for p in producers])
        modes = {p.mode for p in self.parts}
        if len(modes) > 1:
            raise ValueError(f"cannot unite producers of different modes {sorted(modes)}")
        self.coalesce = bool(coalesce)

    @property
    def mode(self) -> str:  # type: ignore[override]
        return self.parts[0].mode

    def static_key(self, ctx: ProducerContext) -> Hashable | None:
        return self._parts_key(ctx)

    def _parts_key(self, ctx: ProducerContext) -> Hashable | None:
        keys = [p.static_key(ctx) for p in self.parts]
        return None if any(k is None for k in keys) else ("union", self.coalesce, tuple(keys))

    def produce(self, ctx: ProducerContext) -> EdgeSet:
        sets = [p(ctx.x, ctx.batch, context=ctx) for p in self.parts]
        return union_edge_sets(sets, ctx.num_nodes, coalesce=self.coalesce)

    def extra_repr(self) -> str:
        return f"coalesce={self.coalesce}"
