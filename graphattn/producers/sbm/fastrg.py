r"""fastRG for the SBM-Transformer (:mod:`graphattn.producers.sbm`): :func:`fastrg_sample`.

Exact Algorithm 1 of the paper (fastRG, Rohe et al. 2018) per (graph, head) of the model of
:mod:`~graphattn.producers.sbm.model`: with column sums :math:`y = 1^\top Y`, :math:`z = 1^\top Z` and
:math:`\bar B = \operatorname{diag}(y) B \operatorname{diag}(z)`, draw
:math:`m \sim \operatorname{Poisson}(1^\top \bar B 1)`, then for each of the :math:`m` edges a block pair
:math:`(U, V) \propto \bar B_{UV}` **jointly**, a query :math:`I \sim Y_{:,U} / y_U` and a key
:math:`J \sim Z_{:,V} / z_V`, both inside graph :math:`g`. By Poisson splitting the multiplicity of each
pair is :math:`N_{ij} \sim \operatorname{Poisson}(\lambda_{ij})`, independent over pairs; after
de-duplication :math:`P(M_{ij} = 1) = 1 - e^{-\lambda_{ij}}`. Exploration adds
:math:`\operatorname{Poisson}(\delta n_g^2)` uniform pairs per (graph, head), i.e.
:math:`\lambda_{ij} = p_{ij} + \delta`. Cost: the inverse-CDF tables, :math:`O(NHk + GHk^2)`, then
:math:`O(1)` expected per drawn edge (guide tables; a binary search when there are few draws per table
entry); no :math:`n^2` term and no Python loop over nodes or graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from graphattn.producers.keyed_random import KeyedRandom, KeyedRows, poisson_from_keys
from graphattn.producers.sbm.edges import EXPLORATION, SAMPLED, SampledEdges
from graphattn.producers.sbm.model import check_sbm, check_values, column_sums, graph_of_nodes, graph_sizes
from graphattn.producers.sbm.native import sampler_ops

#: key tags of the keyed draws (:mod:`~graphattn.producers.keyed_random`)
#: (a purpose's first word names it; the trailing words name a draw within it)
_TAG_CELL, _TAG_EXPLORE = 0xC311, 0xE8A1
_TAG_COUNT, _TAG_EDGE, _TAG_EXPLORE_COUNT, _TAG_EXPLORE_EDGE = 1, 2, 3, 4


def _table_search(keys: Tensor, guide: Tensor | None, start: Tensor, length: Tensor | int,
                  offset: Tensor, u: Tensor) -> Tensor:
    r"""Inverse-CDF draws from many discrete distributions stored as segments of one flat table.

    Segment ``s`` occupies ``keys[start_s : start_s + length_s]``, its keys are :math:`F_s + c_s`
    with :math:`F_s` its CDF (non-decreasing, last value 1) and ``offset`` :math:`= c_s`. Returns,
    per draw, the first index ``p`` of its segment with ``keys[p] > u + offset``, i.e. element
    :math:`t` with probability :math:`F_s(t) - F_s(t - 1)` (up to the float64 resolution of the
    offsets, about :math:`2^{-52} \max c`). With a ``guide`` table (Chen 1974; ``guide[start_s + t]`` =
    the first index with :math:`F_s > t / \text{length}_s`) the search starts there and walks
    forward, less than one step per draw on average; without, it is a binary search over the table.
    """
    last = start + (length - 1)
    target = u + offset
    if guide is None:
        pos = torch.searchsorted(keys, target, right=True)
        return torch.minimum(torch.maximum(pos, start), last)
    t = (u * length).long() if isinstance(length, int) else (u * length.to(u.dtype)).long()
    pos = guide[torch.minimum(start + t, last)]
    idx = ((keys[pos] <= target) & (pos < last)).nonzero().squeeze(1)
    while idx.numel():
        p = pos[idx] + 1
        pos[idx] = p
        idx = idx[(keys[p] <= target[idx]) & (p < last[idx])]
    return pos


def _guide(F: Tensor, length: Tensor | int, seg_start: Tensor, seg_end: Tensor) -> Tensor:
    r"""Guide table of the CDF values ``F`` (a table of consecutive segments; ``length``,
    ``seg_start`` (flat index of the segment's first element) and ``seg_end`` (is the element its
    segment's last?) broadcast against ``F``): ``guide[start_s + t]`` = the first index of segment
    ``s`` with :math:`F > t / L_s`. One pass, no search: element :math:`m` owns the cells
    :math:`t \in [\lceil L F_{m-1} \rceil, \lceil L F_m \rceil)` of its segment."""
    L = torch.as_tensor(length, dtype=F.dtype, device=F.device)
    cells = torch.where(seg_end, L, torch.minimum(torch.ceil(F * L), L)) + seg_start
    owned = torch.diff(cells.reshape(-1), prepend=cells.new_zeros(1)).long()
    return torch.repeat_interleave(torch.arange(owned.numel(), device=F.device), owned,
                                   output_size=owned.numel())


class _NodeTables(NamedTuple):
    """Inverse-CDF tables of every (head, cluster) column of ``Y`` within every graph of a block of
    graphs: segment ``(r, g)`` at ``r * Nb + ptr_g``, length ``n_g``, offset ``base_g + col_offset_r``."""

    keys: Tensor  # [R * Nb] float64
    guide: Tensor | None  # [R * Nb] long
    base: Tensor  # [Gb] float64: non-empty graphs before g in the block
    col_offset: Tensor  # [R] float64: r (Gb + 1)


def _node_tables(Y: Tensor, lptr: Tensor, batch: Tensor, with_guide: bool) -> _NodeTables:
    r"""Tables for ``Y [Nb, H, k]`` of a block of graphs (local CSR pointer ``lptr``, local ``batch``).

    Each column is normalised within each graph (uniform where its mass there is 0: a column that is
    never drawn) and cumulated over all nodes, so the running sum is :math:`a_g + F_{r,g}` with
    :math:`a_g` the number of non-empty graphs before :math:`g`; adding :math:`r (G_b + 1)` separates
    the columns. Cost :math:`O(N_b H k)`.
    """
    Nb, R = Y.size(0), Y.shape[1] * Y.shape[2]
    Gb = lptr.numel() - 1
    dev = Y.device
    Yf = Y.reshape(Nb, R).to(torch.float64)
    ops = sampler_ops(Y)
    if ops is not None:  # one compiled pass per column, the same float64 operations
        keys, guide_t, base = ops.sbm_node_tables(Yf.T.contiguous(), lptr.contiguous(), with_guide)
        col_offset = torch.arange(R, device=dev, dtype=torch.float64) * (Gb + 1)
        return _NodeTables(keys, guide_t if with_guide else None, base, col_offset)
    sizes = graph_sizes(lptr)
    mass = Yf.new_zeros(Gb, R).index_add_(0, batch, Yf)
    empty = mass <= 0
    inv = 1.0 / torch.where(empty, torch.ones_like(mass), mass)
    if bool(empty.any()):  # columns without mass in a graph: uniform (never drawn)
        Yf = torch.where(empty[batch], torch.ones_like(Yf), Yf)
        inv = torch.where(empty, (1.0 / sizes.clamp(min=1).to(torch.float64))[:, None], inv)
    running = (Yf * inv[batch]).T.contiguous().cumsum_(-1)  # [R, Nb]: a_g + F
    nonempty = (sizes > 0).to(torch.float64)
    base = nonempty.cumsum(0) - nonempty
    col_offset = torch.arange(R, device=dev, dtype=torch.float64) * (Gb + 1)
    guide = None
    if with_guide:
        seg_start = (torch.arange(R, device=dev) * Nb)[:, None] + lptr[batch][None, :]
        is_end = (torch.arange(Nb, device=dev) == lptr[batch + 1] - 1)[None, :]
        guide = _guide(running - base[batch][None, :], sizes[batch][None, :], seg_start, is_end)
    running += col_offset[:, None]
    return _NodeTables(running.reshape(-1), guide, base, col_offset)


def _chunks(counts: Tensor, chunk_size: int):
    """Yields ``(rows [P], pieces [P], offsets [P])``: consecutive pieces of at most ``chunk_size``
    draws in all, ``pieces[p]`` draws of row ``rows[p]`` starting at its draw number
    ``offsets[p]`` (rows with more draws are split), rows in order."""
    rows = counts.nonzero().squeeze(1)
    cnt = counts[rows]
    if cnt.numel() == 0:
        return
    offset = torch.zeros_like(cnt)
    if int(cnt.max()) > chunk_size:  # split big rows into pieces
        npieces = (cnt + chunk_size - 1) // chunk_size
        rows = rows.repeat_interleave(npieces)
        first = torch.cumsum(npieces, 0) - npieces
        piece = torch.arange(rows.numel(), device=counts.device) - first.repeat_interleave(npieces)
        cnt = torch.clamp(cnt.repeat_interleave(npieces) - piece * chunk_size, max=chunk_size)
        offset = piece * chunk_size
    chunk = torch.div(cnt.cumsum(0) - cnt, chunk_size, rounding_mode="floor")
    _, sizes = torch.unique_consecutive(chunk, return_counts=True)
    split = sizes.tolist()
    yield from zip(rows.split(split), cnt.split(split), offset.split(split), strict=True)


def _draw_numbers(cnt: Tensor, offset: Tensor, total: int) -> Tensor:
    """``[total]`` draw number of each draw within its row, for pieces of ``cnt`` draws starting at
    draw numbers ``offset`` (the pieces' draws listed one piece after another)."""
    start = cnt.cumsum(0) - cnt
    return (torch.arange(total, device=cnt.device)
            - torch.repeat_interleave(start - offset, cnt, output_size=total))


def _graph_blocks(ptr: Tensor, heads: int, k: int, max_table: int) -> list[tuple[int, int]]:
    """Consecutive graph ranges whose tables (:math:`n_g H k` node entries and :math:`H k^2`
    block-pair entries per graph) stay near ``max_table`` entries (a graph is never split)."""
    G = ptr.numel() - 1
    if G == 0:
        return []
    cost = graph_sizes(ptr) * heads * k + heads * k * k
    block = torch.div(cost.cumsum(0) - cost, max_table, rounding_mode="floor")
    _, counts = torch.unique_consecutive(block, return_counts=True)
    ends = counts.cumsum(0).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _fastrg_block(Y: Tensor, B: Tensor, Z: Tensor, ptr: Tensor, ga: int, gb: int, counts: Tensor,
                  row_keys: Tensor, chunk_size: int, guide: bool | None) -> list[SampledEdges]:
    """The SBM draws of graphs ``ga .. gb - 1``; ``counts [(gb - ga) H k]`` edges per (graph, head,
    U) and ``row_keys`` the keys of those rows (draw ``t`` of a row uses the uniforms keyed by
    ``(row key, t)``)."""
    total = int(counts.sum())
    if total == 0:
        return []
    H, k = Y.shape[1], Y.shape[2]
    dev = Y.device
    n0, n1 = int(ptr[ga]), int(ptr[gb])
    Nb, Gb = n1 - n0, gb - ga
    lptr = ptr[ga:gb + 1] - n0
    sizes = graph_sizes(lptr)
    batch = graph_of_nodes(lptr)
    # guide tables pay for themselves once there are enough draws per table entry
    node_guide = 8 * total >= Nb * H * k if guide is None else guide
    yt = _node_tables(Y[n0:n1], lptr, batch, node_guide)
    zt = _node_tables(Z[n0:n1], lptr, batch, node_guide)
    # V | U = u ∝ B[u, :] z: one segment of k entries per row ρ = (graph, head, u), offset ρ
    rows = Gb * H * k
    zs = column_sums(Z[n0:n1].to(torch.float64), lptr)
    cdf = (B.to(torch.float64)[None] * zs[:, :, None, :]).reshape(rows, k).cumsum_(-1)
    cdf /= torch.where(cdf[:, -1:] > 0, cdf[:, -1:], torch.ones_like(cdf[:, -1:]))
    row_f = torch.arange(rows, device=dev, dtype=torch.float64)
    v_start = torch.arange(rows, device=dev) * k
    v_guide = None
    if (8 * total >= rows * k) if guide is None else guide:
        v_guide = _guide(cdf, k, v_start[:, None], (torch.arange(k, device=dev) == k - 1)[None, :])
    v_keys = (cdf + row_f[:, None]).reshape(-1)
    del cdf
    # per-row values, repeated per edge (edges come grouped by row)
    g_row = torch.arange(Gb, device=dev).repeat_interleave(H * k)
    col_row = torch.arange(H * k, device=dev).repeat(Gb)
    first_row = lptr[g_row]
    tables = {
        "v_start": v_start, "v_off": row_f, "h": torch.div(col_row, k, rounding_mode="floor"),
        "first": first_row, "n": sizes[g_row], "base": yt.base[g_row],
        "i_start": col_row * Nb + first_row, "i_off": yt.base[g_row] + yt.col_offset[col_row],
        "key": row_keys,
    }
    parts = []
    ops = sampler_ops(Y)
    if ops is not None:  # the compiled per-edge loop: the same edges as below, in one pass
        none = torch.empty(0, dtype=torch.long)
        row_args = (row_keys.contiguous(), tables["h"], first_row, tables["n"], tables["base"],
                    tables["i_start"], tables["i_off"].contiguous(), v_keys,
                    none if v_guide is None else v_guide, yt.keys,
                    none if yt.guide is None else yt.guide, zt.keys,
                    none if zt.guide is None else zt.guide, zt.col_offset)
        for rsel, cnt, offset in _chunks(counts, chunk_size):
            i, j, h = ops.sbm_fastrg_draws(rsel.contiguous(), cnt.contiguous(), offset.contiguous(),
                                           *row_args, k, Nb, n0)
            parts.append(SampledEdges(i, j, h, torch.full_like(i, SAMPLED)))
        return parts
    for rsel, cnt, offset in _chunks(counts, chunk_size):
        E = int(cnt.sum())
        e = {name: torch.repeat_interleave(t[rsel], cnt, output_size=E) for name, t in tables.items()}
        draw = KeyedRows(e["key"]).extend(_draw_numbers(cnt, offset, E))
        v = _table_search(v_keys, v_guide, e["v_start"], k, e["v_off"], draw.uniform(0)) - e["v_start"]
        first, n_g = e["first"], e["n"]
        i = _table_search(yt.keys, yt.guide, e["i_start"], n_g, e["i_off"], draw.uniform(1)) \
            - e["i_start"]
        col = e["h"] * k + v
        start = col * Nb + first
        j = _table_search(zt.keys, zt.guide, start, n_g, e["base"] + zt.col_offset[col],
                          draw.uniform(2)) - start
        parts.append(SampledEdges(i + first + n0, j + first + n0, e["h"], torch.full_like(i, SAMPLED)))
    return parts


def fastrg_sample(
    Y: Tensor,
    B: Tensor,
    Z: Tensor,
    ptr: Tensor,
    *,
    delta: float = 0.0,
    generator: torch.Generator | KeyedRandom | None = None,
    chunk_size: int = 1 << 20,
    max_table: int = 1 << 22,
    guide: bool | None = None,
    check_memory: Callable[[float], None] | None = None,
) -> tuple[SampledEdges, Tensor]:
    r"""Exact batched fastRG (Algorithm 1) per (graph, head), plus :math:`\delta`-exploration.

    Lines 4 and 7 of Algorithm 1 (:math:`m \sim \operatorname{Poisson}(1^\top \bar B 1)`, then
    :math:`m` block pairs :math:`(U, V) \propto \bar B`) are drawn in their Poisson-split form, which
    has the same joint law: the number of edges with :math:`U = u` is
    :math:`\operatorname{Poisson}(\sum_v \bar B_{uv})`, independently over :math:`u`, and each of them
    draws :math:`V \mid U = u \propto \bar B_{u,:}` (lines 8-9: :math:`I \sim \bar Y_{:,U}`,
    :math:`J \sim \bar Z_{:,V}` inside the graph). Every draw inverts a CDF with a guide table (about
    one comparison per draw); edges come out grouped by (graph, head, :math:`U`), which keeps the
    query tables cache-hot. Graphs are processed in blocks whose tables hold about ``max_table``
    entries, and edges in chunks of ``chunk_size``.

    Args:
        Y, Z: ``[N, H, k]`` non-negative query / key memberships; the nodes of graph :math:`g` are
            ``ptr[g] .. ptr[g+1] - 1``.
        B: ``[H, k, k]`` non-negative block matrix.
        ptr: ``[G + 1]`` CSR pointer of the graphs.
        delta: exploration rate (:math:`\operatorname{Poisson}(\delta n_g^2)` extra uniform pairs).
        generator: the call's keyed random numbers (:class:`~graphattn.producers.keyed_random.
            KeyedRandom`), or a generator (``None``: the global RNG) from which one seed is drawn.
            Every draw is keyed by its graph (:meth:`~graphattn.producers.keyed_random.
            KeyedRandom.graph_words`: its size in a seeded producer call, so that a graph's edges
            do not depend on the other graphs of the batch), head, block and draw number.
        chunk_size: drawn edges processed at once.
        max_table: table entries per block of graphs (bounds the temporary memory, about 50 bytes
            per entry).
        guide: use guide tables (``None``: when there are at least 1/8 draws per table entry).
        check_memory: called with the expected number of draws before any is made (a memory
            guard, e.g. :func:`graphattn.memory.check_edges`; it raises to refuse).

    Returns:
        ``(edges, expected)``: the drawn multi-edges (not de-duplicated; SBM draws first, then the
        exploration draws, kind :data:`EXPLORATION`), and ``expected [G, H]`` =
        :math:`\mathbb{E}[m_{gh}]` (:func:`expected_num_edges`, float64).
    """
    check_sbm(Y, B, Z, ptr)
    Y, B, Z = Y.detach(), B.detach(), Z.detach()
    check_values(Y, B, Z)
    H, k = Y.shape[1], Y.shape[2]
    G = ptr.numel() - 1
    dev = Y.device
    n = graph_sizes(ptr)
    ys, zs = column_sums(Y.to(torch.float64), ptr), column_sums(Z.to(torch.float64), ptr)
    rate = ys * torch.einsum("huv,ghv->ghu", B.to(torch.float64), zs)  # [G, H, k]: Σ_v B̄[u, v]
    total = rate.sum() + delta * (n * n).sum().to(torch.float64) * H
    finite, total = torch.stack([torch.isfinite(rate).all().to(torch.float64), total]).tolist()
    if not finite:
        raise FloatingPointError("SBM expected edge count is not finite")
    if check_memory is not None:
        check_memory(total)
    rng = KeyedRandom.coerce(generator, dev)
    heads = torch.arange(H, device=dev)
    gw = rng.graph_words(n)
    cells = rng.rows(_TAG_CELL, gw[:, None, None], heads[None, :, None],
                     torch.arange(k, device=dev)[None, None, :])
    counts = poisson_from_keys(rate, cells.extend(_TAG_COUNT)).reshape(-1)  # edges per (graph, head, U)
    edge_keys = cells.extend(_TAG_EDGE).keys.reshape(-1)
    explore_rate = (delta * (n * n).to(torch.float64))[:, None].expand(G, H).reshape(-1)
    explore = rng.rows(_TAG_EXPLORE, gw[:, None], heads[None, :]).keys.reshape(-1)
    mx = poisson_from_keys(explore_rate, KeyedRows(explore).extend(_TAG_EXPLORE_COUNT)) if delta > 0 \
        else torch.zeros(0, dtype=torch.long)
    expected = rate.sum(-1) + explore_rate.view(G, H)

    parts: list[SampledEdges] = []
    for ga, gb in _graph_blocks(ptr, H, k, max_table):
        rows = slice(ga * H * k, gb * H * k)
        parts += _fastrg_block(Y, B, Z, ptr, ga, gb, counts[rows], edge_keys[rows], chunk_size, guide)
    if int(mx.sum()):
        for gh, cnt, offset in _chunks(mx, chunk_size):
            E = int(cnt.sum())
            draw = KeyedRows(torch.repeat_interleave(explore[gh], cnt, output_size=E)).extend(
                _TAG_EXPLORE_EDGE, _draw_numbers(cnt, offset, E))
            u = (draw.uniform(0), draw.uniform(1))
            gh = torch.repeat_interleave(gh, cnt, output_size=E)
            g, h = torch.div(gh, H, rounding_mode="floor"), gh % H
            size = n[g]
            i = ptr[g] + torch.minimum((u[0] * size).long(), size - 1)
            j = ptr[g] + torch.minimum((u[1] * size).long(), size - 1)
            parts.append(SampledEdges(i, j, h, torch.full_like(i, EXPLORATION)))
    return SampledEdges.cat(parts, dev), expected
