r"""Random numbers keyed by what a draw is *for*, not by where it falls in a batch.

A producer that drew its edges from one generator stream over the whole batch would give a graph
different edges depending on its batch-mates: the stream position of graph :math:`b`'s draws moves
with the number of draws the graphs before it consumed. Here every uniform is a hash of a **seed**
and a tuple of integer **key words** that name the draw inside its own graph (e.g. the graph's size,
the node's index within its graph, the draw's number):

.. math::
    u = \operatorname{hash}(s, w_1, \dots, w_m) \in [0, 1),

so a graph's draws depend only on the seed and on the graph itself. One seed serves a whole call:
in evaluation a producer's fixed seed, otherwise one number drawn from the caller's generator (or
the global RNG), so successive training calls differ and a seeded call is reproducible.

In a seeded call (evaluation, or a caller's generator) a graph is named by its **size** and a
**fingerprint of its raw input features** (``data.x``: a hash of the first
:data:`FINGERPRINT_COLUMNS` columns and the node order; integer sums, so exact on every device):
then its draws never depend on its batch-mates, and different graphs draw differently. Only graphs
with identical size and features (copies of one graph) share their uniforms in such a call.
Without ``data.x`` the size alone names the graph (graphs of equal size then share the uniforms, as
BigBird shares its random pattern across the sequences of a batch; their edges still differ
wherever their distributions differ). Unseeded training draws (the global RNG) name a graph by its
**position** instead, so every graph of the batch draws independently — copies included.

The hash chains the 32-bit MurmurHash3 finaliser (:func:`mix32`), a bijection on 32-bit words with
full avalanche, over the words; the final 32-bit state gives the uniform (resolution
:math:`2^{-32}`; two different keys share a state with probability :math:`2^{-32}`). All integer
arithmetic is exact in ``int64`` (32-bit products are split in 16-bit halves), so the numbers are
the same on every device and instruction set. Key words are used
modulo :math:`2^{32}`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from graphattn.producers._util import draw_device
from graphattn.producers.base import ProducerContext

__all__ = ["KeyedRandom", "KeyedRows", "mix32", "poisson_from_keys"]

_M32 = 0xFFFFFFFF
_C1, _C2 = 0x85EBCA6B, 0xC2B2AE35  # MurmurHash3 fmix32 multipliers
_GOLDEN = 0x9E3779B9
_TWO_M32 = 2.0 ** -32


def _mul32(x: Tensor, c: int) -> Tensor:
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)`` without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def mix32(x: Tensor) -> Tensor:
    """The MurmurHash3 32-bit finaliser on words held in ``int64`` (values in ``[0, 2**32)``)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 13)
    x = _mul32(x, _C2)
    return x ^ (x >> 16)


def _word(w: Tensor | int, device: torch.device) -> Tensor | int:
    if isinstance(w, Tensor):
        return w.to(device=device, dtype=torch.long) & _M32
    return int(w) & _M32


class KeyedRows:
    """Hashed keys ``[...]`` (one per row of a draw: a node, a cell, an edge); :meth:`uniform`
    extends each with more words and returns uniforms of the same shape."""

    def __init__(self, keys: Tensor) -> None:
        self.keys = keys

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def extend(self, *words: Tensor | int) -> KeyedRows:
        """Keys extended by ``words`` (each broadcast against the keys)."""
        h = self.keys
        for w in words:
            h = mix32(h ^ _word(w, h.device))
        return KeyedRows(h)

    def uniform(self, *words: Tensor | int, dtype: torch.dtype = torch.float64) -> Tensor:
        """Uniforms in ``(0, 1)`` on the grid :math:`(h + 1/2) / 2^{32}` of the keys' 32-bit state
        :math:`h` (then rounded to ``dtype``, kept below 1), one per key (broadcast against
        ``words``)."""
        h = self.extend(*words).keys
        u = (h.to(torch.float64) + 0.5) * _TWO_M32
        return u if dtype == torch.float64 else u.to(dtype).clamp_(max=1.0 - torch.finfo(dtype).eps)


class KeyedRandom:
    """The seed of one call's keyed draws (a 0-d ``int64`` tensor on the draws' device).

    Build it with :meth:`from_seed` (a fixed pattern, e.g. evaluation), :meth:`draw` (one number
    from a generator or the global RNG) or :meth:`for_context` (a producer's call); then
    :meth:`rows` keys each row of a draw, with :meth:`graph_words` naming the graphs.
    ``by_position``: :meth:`graph_words` names graphs by their index in the batch instead of their
    size (independent draws for identical graphs; no batch independence).
    """

    def __init__(self, seed: Tensor, *, by_position: bool = False,
                 context: ProducerContext | None = None) -> None:
        if not isinstance(seed, Tensor) or seed.dim() != 0 or seed.dtype != torch.long:
            raise ValueError(f"'seed' must be a 0-d int64 tensor, got {seed!r}")
        self.by_position = bool(by_position)
        self._context = context
        self._fingerprints: Tensor | None = None
        s = seed & ((1 << 62) - 1)
        self.seed = mix32(mix32((s & _M32) ^ _GOLDEN) ^ (s >> 32))

    @property
    def device(self) -> torch.device:
        return self.seed.device

    @classmethod
    def from_seed(cls, seed: int, device: torch.device | str | None = None) -> KeyedRandom:
        return cls(torch.tensor(int(seed) & ((1 << 62) - 1), dtype=torch.long, device=device))

    @classmethod
    def draw(cls, generator: torch.Generator | None, device: torch.device | str | None = None, *,
             by_position: bool = False) -> KeyedRandom:
        """A seed drawn from ``generator`` (``None``: the global RNG of ``device``), without a host
        synchronisation: the number stays on the device."""
        dev = torch.device("cpu") if device is None else torch.device(device)
        where = draw_device(generator, dev)
        seed = torch.randint(0, 2**62, (), generator=generator, device=where)
        return cls(seed.to(dev), by_position=by_position)

    @classmethod
    def coerce(cls, rng: KeyedRandom | torch.Generator | None,
               device: torch.device | str | None) -> KeyedRandom:
        """``rng`` itself, or a seed drawn from a generator (``None``: the global RNG) that names
        graphs by position (a stream-like draw: every graph of the batch independent)."""
        if isinstance(rng, KeyedRandom):
            return rng
        if rng is None or isinstance(rng, torch.Generator):
            return cls.draw(rng, device, by_position=True)
        raise TypeError(f"expected a KeyedRandom, a torch.Generator or None, got {type(rng).__name__}")

    @classmethod
    def for_context(cls, ctx: ProducerContext, seed: int | None) -> KeyedRandom:
        """The seed of a producer call: drawn from the caller's generator when given; otherwise
        drawn from the global RNG in training (fresh draws every step, reproducible under
        ``torch.manual_seed``; graphs named by position) and ``seed`` in evaluation (``None``:
        drawn too — stochastic evaluation)."""
        if ctx.generator is not None:
            rng = cls.draw(ctx.generator, ctx.device)
        elif ctx.training or seed is None:  # unseeded: graphs draw independently of each other
            return cls.draw(None, ctx.device, by_position=True)
        else:
            rng = cls.from_seed(seed, ctx.device)
        rng._context = ctx
        return rng

    def graph_words(self, sizes: Tensor) -> Tensor:
        """``[G]`` key words naming the graphs of sizes ``sizes`` (graph ids ``0 .. G-1``): in a
        seeded call the sizes, mixed with the fingerprints of the graphs' raw features when the
        call came from a producer whose data has ``x`` (a graph's draws depend on the graph only);
        the positions with ``by_position``."""
        if self.by_position:
            return torch.arange(sizes.numel(), device=sizes.device)
        if self._context is not None and self._fingerprints is None:
            self._fingerprints = graph_fingerprints(self._context)
            self._context = None
        fp = self._fingerprints
        if fp is None or fp.numel() != sizes.numel():
            return sizes
        return mix32((sizes.to(torch.long) & _M32) ^ fp)

    def rows(self, *words: Tensor | int) -> KeyedRows:
        """Keys of rows named by ``words`` (broadcast together)."""
        return KeyedRows(self.seed).extend(*words)


# ----------------------------------------------------------------------------- fingerprints
#: columns of ``data.x`` hashed into a graph's fingerprint
FINGERPRINT_COLUMNS = 8


def _bits32(t: Tensor) -> Tensor:
    """The bit patterns of ``t``'s entries folded to 32-bit words (``int64``)."""
    if t.dtype == torch.float64:
        v = t.view(torch.int64)
    elif t.dtype == torch.float32:
        v = t.view(torch.int32).long()
    elif t.dtype in (torch.float16, torch.bfloat16):
        v = t.view(torch.int16).long()
    elif t.is_floating_point() or t.is_complex():
        v = t.to(torch.float64).view(torch.int64)
    else:
        v = t.long()
    return (v ^ (v >> 32)) & _M32


def graph_fingerprints(ctx: ProducerContext) -> Tensor | None:
    """``[G]`` a 32-bit hash of each graph's raw input features (``ctx.data.x``, its first
    :data:`FINGERPRINT_COLUMNS` columns, with each node's index within its graph), or ``None``
    without such features. Sums of hashed words (exact integer arithmetic), so a graph's
    fingerprint is the same alone and in any batch, on every device."""
    x = getattr(ctx.data, "x", None) if ctx.data is not None else None
    N = ctx.num_nodes
    if not isinstance(x, Tensor) or x.dim() == 0 or x.size(0) != N or x.numel() == 0:
        return None
    cols = x.detach().reshape(N, -1)[:, :FINGERPRINT_COLUMNS]
    col = mix32(torch.arange(cols.size(1), device=x.device) ^ _GOLDEN)
    cell = mix32(_bits32(cols).to(ctx.device) ^ col.to(ctx.device))
    row = mix32((cell.sum(1) & _M32) ^ mix32(ctx.local_index() & _M32))
    per_graph = torch.zeros(ctx.num_graphs, dtype=torch.long, device=ctx.device)
    return mix32(per_graph.index_add_(0, ctx.batch, row) & _M32)


# --------------------------------------------------------------------------------- Poisson
_SMALL_RATE = 10.0
#: inversion terms for λ < 10: P(X > 48) < 1e-17 there (the tail is folded onto 48)
_INVERSION_TERMS = 48
#: rejection attempts made for every entry at once; P(an entry needs more) < 1e-8
_PTRS_ATTEMPTS = 8
#: key words of the two methods' uniforms
_INVERSION, _REJECTION = 0x5A17, 0x7E55


def poisson_from_keys(rate: Tensor, rows: KeyedRows) -> Tensor:
    r"""One :math:`\operatorname{Poisson}(\lambda)` draw per entry of ``rate`` (any shape; finite and
    non-negative — not checked here, the samplers check their rates), each a function of its key in
    ``rows`` only (``int64`` result).

    :math:`\lambda < 10`: inversion, :math:`k = \min\{k : F(k) \ge u\}` with the probabilities
    accumulated term by term (48 terms). :math:`\lambda \ge 10`: Hörmann's transformed rejection with
    squeeze (PTRS, 1993), attempt :math:`t` keyed by ``(t, 0)`` and ``(t, 1)``, about 1.1 attempts per
    draw. Both run over the whole tensor for a fixed number of steps (no host synchronisation) and
    the rare entries still rejected after 8 attempts are finished in a loop (one host read).
    """
    lam = rate.to(torch.float64)
    if lam.numel() == 0:
        return torch.zeros(lam.shape, dtype=torch.long, device=lam.device)
    keys = KeyedRows(torch.broadcast_to(rows.keys, lam.shape).reshape(-1))
    flat = lam.reshape(-1)
    small = flat < _SMALL_RATE
    # inversion (large rates clamped to 0 there: their result is not used)
    ls = torch.where(small, flat, torch.zeros_like(flat))
    u = keys.uniform(_INVERSION)
    p = torch.exp(-ls)
    cdf = p
    k = torch.zeros(flat.shape, dtype=torch.long, device=flat.device)
    for i in range(1, _INVERSION_TERMS + 1):
        k += (u > cdf).long()  # cdf only grows: once u <= cdf, k stays
        p = p * ls / i
        cdf = cdf + p
    # transformed rejection (small rates raised to 10 there: their result is not used)
    big = torch.where(small, torch.full_like(flat, _SMALL_RATE), flat)
    draw, accepted = _ptrs(big, keys, range(_PTRS_ATTEMPTS))
    if not bool((accepted | small).all()):
        todo = (~(accepted | small)).nonzero().squeeze(1)
        attempt = _PTRS_ATTEMPTS
        while todo.numel():
            if attempt > 1000:  # acceptance is > 0.9 per attempt
                raise RuntimeError("Poisson rejection sampling did not converge")
            d, ok = _ptrs(big[todo], KeyedRows(keys.keys[todo]), [attempt])
            draw[todo[ok]] = d[ok]
            todo = todo[~ok]
            attempt += 1
    return torch.where(small, k, draw).view(lam.shape)


def _ptrs(lam: Tensor, keys: KeyedRows, attempts: Iterable[int]) -> tuple[Tensor, Tensor]:
    """PTRS attempts ``attempts`` for every entry (``λ ≥ 10``): ``(draw, accepted)``, the draw of
    the first accepted attempt."""
    slam = lam.sqrt()
    log_lam = lam.log()
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_inv_alpha = torch.log(1.1239 + 1.1328 / (b - 3.4))
    v_r = 0.9277 - 3.6224 / (b - 2)
    draw = torch.zeros(lam.shape, dtype=torch.long, device=lam.device)
    accepted = torch.zeros(lam.shape, dtype=torch.bool, device=lam.device)
    for attempt in attempts:
        key = keys.extend(_REJECTION, attempt)
        U = key.uniform(0) - 0.5
        V = key.uniform(1)
        us = 0.5 - U.abs()
        k = torch.floor((2 * a / us + b) * U + lam + 0.43)
        quick = (us >= 0.07) & (V <= v_r)
        bad = (k < 0) | ((us < 0.013) & (V > us))
        lhs = V.log() + log_inv_alpha - (a / (us * us) + b).log()
        rhs = -lam + k * log_lam - torch.lgamma(k.clamp(min=0) + 1)
        ok = (quick | (~bad & (lhs <= rhs))) & ~accepted
        draw = torch.where(ok, k.long(), draw)
        accepted = accepted | ok
    return draw, accepted
