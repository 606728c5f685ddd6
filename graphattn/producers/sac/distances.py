r"""SAC's distance encodings (SAC §4.2): the buckets :math:`\delta(o, j)` whose learned embeddings the
predictors (:mod:`~graphattn.producers.sac.lstm`, :mod:`~graphattn.producers.sac.parallel`) add to
the destination logits.

* :class:`HopDistances` — hop distance in the (symmetrised) input graph: buckets ``0 .. K``, far,
  unreachable; per origin row, per node pair, or as ``[B, W, W]`` tables;
* :class:`HopCache` — the :class:`HopDistances` of the last input graph and its tables, kept across
  forward passes while the input graph stays the same;
* :func:`sequence_buckets` / :func:`clipped_offsets` — signed offsets in the local node order;
* :func:`predicted_so_far_buckets` — hop distance in the graph of the edges predicted so far;
* :func:`bucket_sizes` — the number of buckets of every table of a ``distance`` setting.

Everything works on local node ids ``0 .. n_b - 1`` of the padded per-graph layout ``[B, W, ·]``
unless said otherwise; no parameters here.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def bucket_sizes(distance: str, K: int) -> list[int]:
    """Buckets of every distance table of the ``distance`` setting (one embedding table each)."""
    return {"input_graph": [K + 3], "sequence": [2 * K + 2], "predicted_so_far": [K + 2],
            "both": [K + 3, K + 2], "none": []}[distance]


class HopDistances:
    r"""Bucketed hop distances :math:`\delta(i, j)` in the (symmetrised) input graph.

    Buckets: ``0 .. K`` hops, ``K + 1`` = farther than ``K`` hops but in the same connected component
    ("far"), ``K + 2`` = in another component ("unreachable", the paper's :math:`-1`). Distances are
    found by ``K`` sparse breadth-first steps from each origin (cost :math:`O(K\,|E|)` per origin),
    components once per call with SciPy.

    Args:
        edge_index: ``[2, E]`` edges of the whole batch (global ids; direction ignored).
        num_nodes: total number of nodes.
        ptr: ``[B + 1]`` CSR pointer of the graphs (sorted batch).
        max_distance: :math:`K`.
    """

    def __init__(self, edge_index: Tensor | None, num_nodes: int, ptr: Tensor, max_distance: int) -> None:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        self.K = max_distance
        self.num_nodes = num_nodes
        self.ptr = ptr
        dev = ptr.device
        self.graph = torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=dev), ptr.diff())
        if edge_index is None or edge_index.numel() == 0:
            ei = torch.empty(2, 0, dtype=torch.long, device=dev)
        else:
            ei = edge_index[:, edge_index[0] != edge_index[1]]
            ei = torch.cat([ei, ei.flip(0)], 1)
        n = max(num_nodes, 1)
        key = torch.unique(ei[0] * n + ei[1])
        row, col = key // n, key % n
        self.adj = torch.sparse_coo_tensor(
            torch.stack([row, col]), torch.ones(key.numel(), device=dev), (num_nodes, num_nodes),
            is_coalesced=True, check_invariants=False)
        r, c = row.cpu().numpy(), col.cpu().numpy()
        mat = coo_matrix((np.ones(r.size), (r, c)), shape=(num_nodes, num_nodes))
        _, comp = connected_components(mat, directed=False)
        self.comp = torch.as_tensor(comp, dtype=torch.long, device=dev)
        self.row, self.col = row, col  # sorted by (row, col): CSR order
        self._mat = mat.tocsr()
        self._reach: list[Tensor] | None = None

    @property
    def num_buckets(self) -> int:
        return self.K + 3

    def rows(self, src: Tensor, width: int) -> Tensor:
        """``[S, width]`` buckets from the global nodes ``src`` to the nodes of their own graph, in
        local order (columns past the graph's size hold the "unreachable" bucket)."""
        S, N, K = src.numel(), self.num_nodes, self.K
        out = torch.full((S, width), K + 2, dtype=torch.uint8, device=src.device)
        if S == 0 or N == 0:
            return out
        step = max(1, (1 << 23) // max(N, 1))
        for s0 in range(0, S, step):
            sc = src[s0:s0 + step]
            C = sc.numel()
            cols = torch.arange(C, device=src.device)
            dist = torch.full((N, C), K + 1, dtype=torch.uint8, device=src.device)
            dist[sc, cols] = 0
            reached = torch.zeros(N, C, dtype=torch.bool, device=src.device)
            reached[sc, cols] = True
            front = reached.to(self.adj.dtype)
            for h in range(1, K + 1):
                nxt = (self.adj @ front > 0) & ~reached
                dist[nxt] = h
                reached |= nxt
                front = nxt.to(self.adj.dtype)
            g = self.graph[sc]
            start, end = self.ptr[g], self.ptr[g + 1]
            glob = start[:, None] + torch.arange(width, device=src.device)
            inside = glob < end[:, None]
            glob = glob.clamp(max=N - 1)
            d = dist[glob, cols[:, None]]
            d = torch.where(self.comp[glob] != self.comp[sc][:, None], K + 2, d)
            out[s0:s0 + step] = torch.where(inside, d, K + 2)
        return out

    def neighbours(self) -> tuple[Tensor, Tensor]:
        """``(ptr [N + 1], col [E'])``: the symmetrised input neighbours of every node (CSR)."""
        counts = torch.bincount(self.row, minlength=self.num_nodes)
        return torch.cat([counts.new_zeros(1), counts.cumsum(0)]), self.col

    def pair_buckets(self, src: Tensor, dst: Tensor, max_pairs: int = 1 << 25) -> Tensor:
        r"""Buckets of arbitrary node pairs (global ids, same shape). Uses the sorted pair keys of
        :math:`A^{\le k}`, built once with sparse products; if they would exceed ``max_pairs`` the
        larger distances are reported as "far"."""
        K, N = self.K, max(self.num_nodes, 1)
        if self._reach is None:
            self._reach = []
            within = self._mat.copy()
            for k in range(1, K + 1):
                if k > 1:
                    within = (within + within @ self._mat).tocsr()
                    within.data[:] = 1.0
                if within.nnz > max_pairs:
                    break
                coo = within.tocoo()
                keys = torch.as_tensor(coo.row, dtype=torch.long) * N + torch.as_tensor(coo.col)
                self._reach.append(keys.sort().values.to(self.ptr.device))
        key = src * N + dst
        out = torch.where(self.comp[src] == self.comp[dst], K + 1, K + 2)
        for k in range(len(self._reach), 0, -1):
            keys = self._reach[k - 1]
            if keys.numel() == 0:
                continue
            pos = torch.searchsorted(keys, key).clamp(max=keys.numel() - 1)
            out = torch.where(keys[pos] == key, k, out)
        return torch.where(src == dst, 0, out).to(torch.uint8)

    def table(self, num_graphs: int, width: int) -> Tensor:
        """``[B, width, width]`` buckets between every pair of nodes of each graph."""
        out = torch.full((num_graphs, width, width), self.K + 2, dtype=torch.uint8, device=self.ptr.device)
        if self.num_nodes:
            src = torch.arange(self.num_nodes, device=self.ptr.device)
            local = src - self.ptr[self.graph]
            out[self.graph, local] = self.rows(src, width)
        return out



class HopCache:
    """The :class:`HopDistances` of the last input graph seen (and its ``[B, W, W]`` tables, by
    ``W``), reused while the edges and the batch pointer stay the same (a transductive graph, or a
    producer shared by several layers, sees the same graph in every forward pass)."""

    def __init__(self) -> None:
        self._entry: tuple[Tensor, Tensor, HopDistances, dict[int, Tensor]] | None = None

    def distances(self, edge_index: Tensor, num_nodes: int, ptr: Tensor, max_distance: int) -> HopDistances:
        """The hop distances of ``edge_index`` (global ids; the cached ones if it and ``ptr`` are
        unchanged)."""
        if self._entry is not None:
            old_ei, old_ptr, hops, _ = self._entry
            if old_ei.shape == edge_index.shape and old_ptr.shape == ptr.shape \
                    and torch.equal(old_ei, edge_index) and torch.equal(old_ptr, ptr):
                return hops
        hops = HopDistances(edge_index, num_nodes, ptr, max_distance)
        self._entry = (edge_index.clone(), ptr.clone(), hops, {})
        return hops

    def table(self, hops: HopDistances, B: int, W: int, max_dense: int) -> Tensor:
        """``[B, W, W]`` buckets of ``hops``, the last :meth:`distances` (built once per ``W``); a
        table of more than ``max_dense`` entries is a ``ValueError``."""
        assert self._entry is not None
        tables = self._entry[3]
        if W not in tables:
            if B * W * W > max_dense:
                raise ValueError(f"policy='lstm' keeps [B, W, W] = [{B}, {W}, {W}] distance tables, more "
                                 f"than max_dense={max_dense}; use policy='parallel'")
            tables.clear()
            tables[W] = hops.table(B, W)
        return tables[W]


def clipped_offsets(off: Tensor, K: int) -> Tensor:
    r"""Signed offsets ``off`` clipped to ``[-K, K]`` → buckets ``0 .. 2K``; ``2K + 1`` = farther."""
    return torch.where(off.abs() <= K, off + K, 2 * K + 1)


def sequence_buckets(origin: Tensor, width: int, K: int) -> Tensor:
    r"""Signed offsets :math:`j - o` clipped to ``[-K, K]`` → buckets ``0 .. 2K``; ``2K + 1`` = farther
    ("far"). ``origin`` ``[...]`` → ``[..., width]``."""
    off = torch.arange(width, device=origin.device) - origin[..., None]
    return clipped_offsets(off, K)


def predicted_so_far_buckets(origin: Tensor, hist_o: Tensor, hist_d: Tensor, width: int, K: int) -> Tensor:
    r"""Hop distance from ``origin [B, R]`` in the undirected graph of the edges predicted so far
    (``hist_o``/``hist_d`` ``[B, R, E]``, local ids, ``width`` = unused slot): buckets ``0 .. K``,
    ``K + 1`` = not within ``K`` hops (farther or unreachable). Breadth-first over the edge list, cost
    :math:`O(K E)` per call. → ``[B, R, width]``."""
    B, R = origin.shape
    front = torch.zeros(B, R, width + 1, dtype=torch.long, device=origin.device)
    front.scatter_(-1, origin[..., None], 1)
    reached = front.bool()
    dist = torch.full((B, R, width + 1), K + 1, dtype=torch.long, device=origin.device)
    dist.scatter_(-1, origin[..., None], 0)
    if hist_o.size(-1) == 0:
        return dist[..., :width]
    for h in range(1, K + 1):
        nxt = torch.zeros_like(front)
        nxt.scatter_reduce_(-1, hist_d, front.gather(-1, hist_o), "amax")
        nxt.scatter_reduce_(-1, hist_o, front.gather(-1, hist_d), "amax")
        new = nxt.bool() & ~reached
        dist = torch.where(new, h, dist)
        reached |= new
        front = new.long()
    return dist[..., :width]

