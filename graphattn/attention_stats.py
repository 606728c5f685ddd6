r"""Per-layer statistics of recorded attention: the one definition that
:meth:`graphattn.tracing.AttentionTrace.summary` and the viewer's
:func:`graphattn.viz.view.layer_stats` both report.

This module needs numpy only (no torch), so the viewer and the command line can import it cheaply.

Notation, for one layer with :math:`H` heads and edges :math:`e = 1..E` from source :math:`s_e` to
target :math:`t_e` (real targets :math:`0..n-1`; a source :math:`\ge n` is a virtual node). An edge
belongs to every head (head-shared edge set) or to the one head ``head[e]`` (per-head edge set).
:math:`a_e^h = |\alpha_e^h|` is the magnitude of the coefficient of :math:`v_{s_e}` in the output of
:math:`t_e` in head :math:`h` (the modulus of a complex coefficient).

**Attention distribution.** The weight of source :math:`j` in target :math:`i`'s output in head
:math:`h` is the sum over the copies of the edge :math:`j \to i` in that head,
:math:`m_{ij}^h = \sum_{e:\, s_e = j,\, t_e = i} a_e^h`, and

.. math::
    p_{ij}^h = \frac{m_{ij}^h}{\sum_{j'} m_{ij'}^h}.

For softmax attention without edge weights :math:`p_{ij}^h = \sum_{\text{copies}} \alpha_{ij}^h`
(the coefficients already sum to one); with edge weights or ``"weighted"`` mode it is each source's
share of the coefficient mass. A (target, head) *has a distribution* when its mass is positive.

**Entropy** (nats), of target :math:`i` in head :math:`h`, with :math:`0 \log 0 = 0`:

.. math::
    \mathcal H_i^h = -\sum_j p_{ij}^h \log p_{ij}^h \in [0, \log d_i^h],

where :math:`d_i^h` is the number of *distinct* sources of :math:`i` in head :math:`h`. Uniform
attention over :math:`d` sources gives :math:`\log d`; attention on one source gives 0.

**Normalised entropy** (evenness), for targets with at least two distinct sources:
:math:`\mathcal H_i^h / \log d_i^h \in [0, 1]` (1: uniform over its sources, 0: one source). It
compares layers whose edge sets have different in-degrees, which the raw entropy cannot: the raw
entropy of uniform attention grows with the in-degree.

**Layer values**: per head, the mean over the targets that have a distribution (``entropy_nats``
per head) or that also have :math:`d \ge 2` (``entropy_normalized`` per head); the layer value is
the mean over the heads that have any such target. Targets without in-edges are left out: they have
no distribution (counting them as 0 would make a layer look more focused the more isolated nodes it
has). A value that no (target, head) defines is ``None``: a permutation edge set (Sliceformer:
exactly one in-edge per target and head) has entropy 0 everywhere and no normalised entropy, so
its layers report ``entropy_nats = 0`` and ``entropy_normalized = None`` (there is no choice
among sources to be even or focused about).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphattn.core.origins import origin_name

__all__ = ["layer_statistics", "target_entropy"]


def target_entropy(src: np.ndarray, dst: np.ndarray, weight: np.ndarray,
                   num_targets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The attention entropy of every target for one head.

    Args:
        src, dst: ``[E]`` source and target ids of the head's edges (duplicates allowed).
        weight: ``[E]`` coefficients :math:`\alpha_e` (real or complex; magnitudes are used).
        num_targets: targets ``0 .. num_targets-1``.

    Returns:
        ``(entropy, degree, defined)``, each ``[num_targets]``: :math:`\mathcal H_i` in nats (float64,
        0 where undefined), :math:`d_i` the number of distinct sources of :math:`i` (int64), and
        whether :math:`i` has a distribution (positive total :math:`\sum_j |\alpha_{ij}|`).
    """
    n = int(num_targets)
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    w = np.abs(np.asarray(weight)).astype(np.float64).reshape(-1)
    if not src.size == dst.size == w.size:
        raise ValueError(f"'src', 'dst' and 'weight' must have one entry per edge, got "
                         f"{src.size}, {dst.size}, {w.size}")
    if not np.isfinite(w).all():
        raise ValueError("attention coefficients must be finite")
    if dst.size and (dst.min() < 0 or dst.max() >= n):
        raise ValueError(f"target ids must lie in [0, {n}), got [{dst.min()}, {dst.max()}]")
    if src.size and src.min() < 0:
        raise ValueError(f"source ids must be >= 0, got {src.min()}")
    entropy = np.zeros(n, dtype=np.float64)
    degree = np.zeros(n, dtype=np.int64)
    if not src.size:
        return entropy, degree, np.zeros(n, dtype=bool)
    # merge copies of the same (target, source) pair: the weight of a source is the sum of its copies
    key = dst * (int(src.max()) + 1) + src
    uniq, inv = np.unique(key, return_inverse=True)
    m = np.bincount(inv.reshape(-1), weights=w, minlength=uniq.size)
    t = uniq // (int(src.max()) + 1)
    degree += np.bincount(t, minlength=n)
    total = np.bincount(t, weights=m, minlength=n)
    defined = total > 0
    p = m / np.where(total[t] > 0, total[t], 1.0)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    entropy -= np.bincount(t, weights=plogp, minlength=n)
    entropy = np.where(defined, np.maximum(entropy, 0.0), 0.0)  # no -0.0 or rounding below zero
    return entropy, degree, defined


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def layer_statistics(
    src: np.ndarray,
    dst: np.ndarray,
    alpha: np.ndarray,
    *,
    num_targets: int,
    head: np.ndarray | None = None,
    origin: np.ndarray | None = None,
    batch: np.ndarray | None = None,
    name: str = "",
) -> dict[str, Any]:
    r"""Statistics of one attention layer (the module docstring defines the notation).

    Args:
        src, dst: ``[E]`` edge sources and targets; targets are the real nodes
            ``0 .. num_targets-1``, a source ``>= num_targets`` is a virtual node.
        alpha: ``[E, H]`` coefficients (real or complex; magnitudes are used). For a per-head edge
            set only column ``head[e]`` of row ``e`` is read.
        num_targets: the real nodes :math:`n`.
        head: ``[E]`` head of each edge (per-head edge set) or ``None`` (every edge in every head).
        origin: ``[E]`` origin codes (:mod:`graphattn.core.origins`), ``None``: all ``"unknown"``.
        batch: ``[n]`` graph of each real node, for ``density`` over a batch of graphs;
            ``None``: one graph.
        name: the layer's name.

    Returns:
        A dict with

        * ``layer``, ``heads`` (:math:`H`), ``edges`` (:math:`E`, every head's edges together);
        * ``edges_per_node``: :math:`E / n` (every head together, as producers' ``stats``);
          ``edges_per_node_head``: :math:`\frac1H \sum_h E_h / n`, :math:`E_h` the edges of head
          :math:`h` (equal to ``edges_per_node`` for a head-shared edge set);
        * ``density``: :math:`\frac1H \sum_h E_h` over the possible (source, target) pairs
          :math:`\sum_g n_g (n_g + V_g)` (:math:`n_g` nodes of graph :math:`g`, :math:`V_g` virtual
          sources attended to by it);
        * ``entropy_nats``, ``entropy_nats_per_head``: mean attention entropy
          :math:`\mathcal H_i^h` in nats; ``entropy_normalized``, ``entropy_normalized_per_head``:
          mean :math:`\mathcal H_i^h / \log d_i^h` over targets with :math:`d_i^h \ge 2`
          (``None`` where undefined, see the module docstring);
        * ``max_weight``: per head, the mean over targets with in-edges of their largest
          :math:`|\alpha_e^h|`, averaged over heads;
        * ``origin_share``: share of (edge, head) pairs by origin name; ``mass_share``: share of
          :math:`\sum_{e,h} |\alpha_e^h|` by origin name.
    """
    n = int(num_targets)
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    dst = np.asarray(dst, dtype=np.int64).reshape(-1)
    alpha = np.asarray(alpha)
    if alpha.ndim == 1:
        alpha = alpha[:, None]
    mag = np.abs(alpha).astype(np.float64)
    E, H = int(src.size), int(mag.shape[1])
    if dst.size != E or mag.shape[0] != E:
        raise ValueError(f"'src', 'dst' and 'alpha' must have one row per edge, got {E}, {dst.size}, "
                         f"{mag.shape[0]}")
    origin = np.zeros(E, dtype=np.int64) if origin is None else np.asarray(origin, dtype=np.int64)
    head_of = None if head is None else np.asarray(head, dtype=np.int64).reshape(-1)

    per_head_edges: list[int] = []
    ent_head: list[float | None] = []
    norm_head: list[float | None] = []
    top_head: list[float] = []
    pairs: dict[str, float] = {}
    mass: dict[str, float] = {}
    for h in range(H):
        sel = np.ones(E, dtype=bool) if head_of is None else head_of == h
        s, d, w = src[sel], dst[sel], mag[sel, h]
        per_head_edges.append(int(s.size))
        ent, deg, ok = target_entropy(s, d, w, n)
        ent_head.append(_mean(ent[ok].tolist()))
        even = ok & (deg >= 2)
        norm_head.append(_mean((ent[even] / np.log(deg[even])).tolist()))
        if s.size:
            top = np.zeros(n)
            np.maximum.at(top, d, w)
            top_head.append(float(top[np.bincount(d, minlength=n) > 0].mean()))
        for code in np.unique(origin[sel]):
            m = origin[sel] == code
            key = origin_name(int(code))
            pairs[key] = pairs.get(key, 0.0) + float(m.sum())
            mass[key] = mass.get(key, 0.0) + float(w[m].sum())

    # possible (source, target) pairs: each graph's targets times its real and virtual sources
    g = np.zeros(n, dtype=np.int64) if batch is None else np.asarray(batch, dtype=np.int64).reshape(-1)
    if g.size != n:
        raise ValueError(f"'batch' must have one entry per real node ({n}), got {g.size}")
    sizes = np.bincount(g) if n else np.zeros(0, dtype=np.int64)
    virt = src >= n
    num_virtual = np.zeros(sizes.size, dtype=np.int64)
    if virt.any():
        gv = np.unique(np.stack([g[dst[virt]], src[virt]]), axis=1)[0]
        num_virtual += np.bincount(gv, minlength=sizes.size)
    possible = int((sizes * (sizes + num_virtual)).sum())
    mean_edges = float(np.mean(per_head_edges)) if H else 0.0
    total_pairs, total_mass = sum(pairs.values()), sum(mass.values())
    return {
        "layer": name,
        "heads": H,
        "edges": E,
        "edges_per_node": E / max(n, 1),
        "edges_per_node_head": mean_edges / max(n, 1),
        "density": mean_edges / max(possible, 1),
        "entropy_nats": _mean([v for v in ent_head if v is not None]),
        "entropy_normalized": _mean([v for v in norm_head if v is not None]),
        "entropy_nats_per_head": ent_head,
        "entropy_normalized_per_head": norm_head,
        "max_weight": float(np.mean(top_head)) if top_head else 0.0,
        "origin_share": {k: v / total_pairs for k, v in pairs.items()} if total_pairs else {},
        "mass_share": {k: v / total_mass for k, v in mass.items()} if total_mass > 0 else {},
    }
