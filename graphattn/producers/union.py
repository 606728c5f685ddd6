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
        split = self._static_prefix(ctx)
        if split is not None:
            key, n = split
            assert ctx.edge_cache is not None
            prefix = ctx.edge_cache.get(key)
            if prefix is None:
                prefix = ctx.edge_cache[key] = union_edge_sets(sets[:n], ctx.num_nodes,
                                                               coalesce=True)
            if prefix.virtual_x is None:  # the tail's virtual sources cannot repeat a prefix edge
                # valid parts make a valid union: the prefix is checked once per pass, the virtual
                # tail (B·m slots) in every layer, the union of them is not walked again
                for part in (prefix, *sets[n:]):
                    part.validate(ctx.num_nodes, ctx.batch)
                out = union_edge_sets([prefix, *sets[n:]], ctx.num_nodes, coalesce=False)
                out.stats = {f"part{i}.{k}": v for i, s in enumerate(sets) for k, v in s.stats.items()}
                return out.assume_valid(ctx.num_nodes, ctx.batch)
        return union_edge_sets(sets, ctx.num_nodes, coalesce=self.coalesce)

    def _static_prefix(self, ctx: ProducerContext) -> tuple[Hashable, int] | None:
        r"""``(key, n)`` when the parts are :math:`n \ge 1` batch-only parts
        (:meth:`~graphattn.EdgeProducer.static_key`) followed only by parts whose sources are all
        virtual (:attr:`~graphattn.EdgeProducer.virtual_sources_only`, e.g. ``virtual``), inside a
        model's forward pass: the coalesced union of the first :math:`n` is built once per pass
        and shared by the layers, and each layer appends its own virtual edges, which no real edge
        can duplicate, without sorting again. The edges, their fields and every output are those
        of the plain union; only the order of the edges differs (each target's real in-edges, by
        source, then its virtual ones)."""
        if ctx.edge_cache is None or not self.coalesce:
            return None
        keys = []
        for p in self.parts:
            k = p.static_key(ctx)
            if k is None:
                break
            keys.append(k)
        n = len(keys)
        if not 0 < n < len(self.parts) or not all(p.virtual_sources_only for p in self.parts[n:]):
            return None
        return ("union-prefix", tuple(keys), ctx.num_heads, ctx.num_nodes), n

    def extra_repr(self) -> str:
        return f"coalesce={self.coalesce}"
