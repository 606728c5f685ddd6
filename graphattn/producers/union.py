"""The union of several producers' edge sets."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_names
from graphattn.core.union import union_edge_sets
from graphattn.producers.base import EdgeProducer, ProducerContext, check_number, resolve_num_heads
from graphattn.producers.registry import build_producer, register_producer

#: rows of the ``origin_bias`` table: at least the number of registered origin names
ORIGIN_TABLE_SIZE = 32


@register_producer("union")
class UnionProducer(EdgeProducer):
    r""":math:`\mathcal{N}(i) = \bigcup_p \mathcal{N}_p(i)`: the edges of every part, each keeping its
    ``origin`` (e.g. ``input`` ∪ ``expander`` ∪ ``virtual`` is Exphormer's edge set).

    With ``origin_bias=True`` every edge's logit also gets a learned bias per (origin, head),
    :math:`s_{ji}^h \mathrel{+}= b^h_{o(j \to i)}` with :math:`b = c\,\theta` (:math:`\theta` the
    parameter table, :math:`c` = ``origin_bias_scale``; added to the parts' own ``bias``), so attention
    can weigh the kinds of edges differently — Exphormer's edge-type embeddings in their simplest
    form: without them, an expander edge and an input edge between the same features score alike.
    The table is ``[ORIGIN_TABLE_SIZE, H]``, zero at initialisation (the plain union), one per
    producer instance (so per layer in a model). Only the relative bias of origins that meet at one
    target matters (the softmax is shift-invariant). Under Adam a parameter moves by about the
    learning rate per step whatever its gradient's size, so :math:`c` multiplies the bias's
    learning rate: with :math:`c = 1`, full-batch Cora (200 steps at lr 0.005) moves it by at most
    about 1, too little to silence the expander's random edges.

    Args:
        producers: the parts, as producers, names or ``{"name": ..., **kwargs}`` mappings.
        coalesce (bool): drop duplicate edges (the earlier part's attributes win), so an edge in
            two parts counts once in the softmax.
        origin_bias (bool): add the learned per-(origin, head) logit bias (needs ``num_heads``,
            which a model supplies; attention-mode parts only).
        origin_bias_scale (float): :math:`c`, the bias's learning-rate multiplier (see above).
        **defaults: model-supplied arguments (``channels``, ``num_heads``, ...) for parts built from
            names.
    """

    def __init__(self, producers: Sequence[Any], coalesce: bool = True, origin_bias: bool = False,
                 origin_bias_scale: float = 10.0, **defaults: Any) -> None:
        super().__init__()
        if isinstance(producers, (str, EdgeProducer)) or not len(producers):
            raise ValueError("'producers' must be a non-empty list of producers or names")
        self.parts = nn.ModuleList([build_producer(p, **defaults) for p in producers])
        modes = {p.mode for p in self.parts}
        if len(modes) > 1:
            raise ValueError(f"cannot unite producers of different modes {sorted(modes)}")
        self.coalesce = bool(coalesce)
        if not isinstance(origin_bias, bool):
            raise ValueError(f"'origin_bias' must be a bool, got {origin_bias!r}")
        self.origin_bias_scale = check_number("origin_bias_scale", origin_bias_scale, minimum=0,
                                              strict=True)
        self.origin_table: nn.Parameter | None = None
        if origin_bias:
            if self.mode != "attention":
                raise ValueError("'origin_bias' needs attention-mode parts (logits to bias), got "
                                 f"mode={self.mode!r}")
            heads = resolve_num_heads(defaults.get("num_heads"), defaults.get("heads"), "union")
            if heads is None:
                raise ValueError("'origin_bias' needs 'num_heads' (a model supplies it)")
            self.origin_table = nn.Parameter(torch.zeros(ORIGIN_TABLE_SIZE, heads))

    def reset_parameters(self) -> None:
        """Zeroes the origin bias (the parts keep their own parameters)."""
        if self.origin_table is not None:
            nn.init.zeros_(self.origin_table)

    def forward(self, *args: Any, **kwargs: Any) -> EdgeSet:
        es = super().forward(*args, **kwargs)
        return es if self.origin_table is None else self._with_origin_bias(es)

    def _with_origin_bias(self, es: EdgeSet) -> EdgeSet:
        """``es`` with :math:`b^h_{o(e)}` added to its logit bias (a new edge set: the union itself
        may be cached and shared by layers whose tables differ)."""
        table = self.origin_table
        assert table is not None
        if not isinstance(es, EdgeSet) or es.origin is None:
            raise ValueError("'origin_bias' needs an explicit edge set with 'origin' from every part")
        if es.num_heads != table.size(1):
            raise ValueError(f"'origin_bias' was built for num_heads={table.size(1)}, the edge set "
                             f"has {es.num_heads}")
        if len(origin_names()) > table.size(0):
            raise ValueError(f"{len(origin_names())} edge origins are registered; 'origin_bias' holds "
                             f"{table.size(0)} (ORIGIN_TABLE_SIZE)")
        table = table * self.origin_bias_scale
        bias: Tensor = (table[es.origin, es.head] if es.head is not None else table[es.origin])
        if es.bias is not None:
            bias = bias.to(es.bias.dtype)
            bias = bias + (es.bias if es.bias.dim() == bias.dim() else es.bias.unsqueeze(-1))
        return es.replace(bias=bias)

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
        bias = (f", origin_bias=True, origin_bias_scale={self.origin_bias_scale:g}"
                if self.origin_table is not None else "")
        return f"coalesce={self.coalesce}{bias}"
