"""Small helpers shared by the static producers."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.core.edgeset import EdgeSet
from graphattn.core.origins import origin_code
from graphattn.producers.base import ProducerContext


def producer_generator(ctx: ProducerContext, seed: int) -> torch.Generator | None:
    """The generator for a random producer.

    The caller's ``ctx.generator`` wins. Otherwise training draws from the global RNG (fresh edges
    every step, reproducible under ``torch.manual_seed``) and evaluation uses a generator seeded with
    ``seed``, so evaluation is deterministic unless the caller passes a generator.
    """
    if ctx.generator is not None:
        return ctx.generator
    if ctx.training:
        return None
    g = torch.Generator(device=ctx.device)
    g.manual_seed(seed)
    return g


def draw_device(generator: torch.Generator | None, device: torch.device | str) -> torch.device:
    """Where to draw with ``generator``: its own device (a sampler of one device cannot be driven by
    a generator of another: a CPU generator cannot draw CUDA tensors), else ``device`` (the global
    RNG of the tensors' device)."""
    return torch.device(device) if generator is None else generator.device


def rand(size: tuple[int, ...], generator: torch.Generator | None, *, dtype: torch.dtype,
         device: torch.device | str | None) -> Tensor:
    """``torch.rand(size)`` on ``device`` from ``generator`` (``None``: the global RNG). A generator
    of another device (a caller's CPU generator with CUDA tensors) draws on its own device and the
    draw is moved, so the numbers are the ones that generator gives on its device."""
    target = torch.get_default_device() if device is None else torch.device(device)
    if generator is None or generator.device == target:
        return torch.rand(size, generator=generator, dtype=dtype, device=device)
    return torch.rand(size, generator=generator, dtype=dtype, device=generator.device).to(target)


def poisson(rate: Tensor, generator: torch.Generator | None) -> Tensor:
    """``torch.poisson(rate)`` from ``generator`` (``None``: the global RNG), drawn on the
    generator's device (see :func:`rand`) and returned on ``rate``'s."""
    if generator is None or generator.device == rate.device:
        return torch.poisson(rate, generator=generator)
    return torch.poisson(rate.to(generator.device), generator=generator).to(rate.device)


def graph_of_local(ctx: ProducerContext) -> tuple[Tensor, Tensor, Tensor]:
    """``(graph, local, start)`` per node for a sorted batch: node = start[graph] + local."""
    ptr = ctx.ptr
    batch = ctx.batch
    local = torch.arange(ctx.num_nodes, device=ctx.device) - ptr[batch]
    return batch, local, ptr[:-1]


def explicit_edge_set(edge_index: Tensor, ctx: ProducerContext, origin: str) -> EdgeSet:
    """An attention :class:`EdgeSet` whose edges all come from one producer (``origin``), with the
    ``edges_per_node`` statistic every producer reports."""
    codes = torch.full((edge_index.size(1),), origin_code(origin), dtype=torch.long, device=edge_index.device)
    return EdgeSet(edge_index, num_heads=ctx.num_heads, origin=codes,
                   stats={"edges_per_node": edge_index.size(1) / max(ctx.num_nodes, 1)})
