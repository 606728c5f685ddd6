r"""The order-interleave rule of Sliceformer_interleave (:mod:`graphattn.producers.sliceformer`):
:func:`interleave_descending`, which channels of a layer sort descending (paper eqs. 5–6, in integer
arithmetic), and its choices (:data:`RULES`, :data:`TAILS`, :data:`SCOPES`, :data:`DIRECTIONS`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.producers.base import check_positive_int
from graphattn.producers.sliceformer.checks import check_choice

RULES = ("block", "paper_exact")
TAILS = ("code", "block")
SCOPES = ("global", "head")
DIRECTIONS = ("paper", "lra_code")


def interleave_descending(
    channels: int,
    layer: int,
    num_layers: int,
    *,
    rule: str = "block",
    tail: str = "code",
    scope: str = "global",
    scope_heads: int | None = None,
    direction: str = "paper",
) -> Tensor:
    r"""Which channels of layer ``layer`` sort descending under Sliceformer_interleave.

    The paper (eqs. 5–6) sorts channel :math:`i \in 1..C` of layer :math:`n \in 1..L` ascending iff
    :math:`\psi_n(i) = \sin(2^{L-n}\pi i / C) \ge 0`. With 0-based ``layer`` :math:`\ell = n - 1`,
    0-based channel :math:`c = i - 1` and frequency exponent :math:`k` (``direction="paper"``:
    :math:`k = L - 1 - \ell`, the last layer all ascending; ``"lra_code"``: :math:`k = \ell`, the
    reversed direction of the LRA and Graphormer code, the first layer all ascending), everything is
    integer arithmetic (float ``sin`` is rounding noise at its zero crossings):

    * ``rule="block"`` (default): descending iff :math:`\lfloor c / b \rfloor` is odd, with block
      :math:`b = \max(1, \lfloor C / 2^k \rfloor)`. With ``tail="code"`` and :math:`k \ge 1`, the
      channels past the last complete (ascending, descending) block pair, :math:`c \ge 2b\lfloor C /
      2b\rfloor`, also descend (as the authors' ``Haar_wavelet_basis``); ``tail="block"`` keeps the
      block rule there. Both agree when :math:`2^k` divides :math:`C`.
    * ``rule="paper_exact"``: :math:`\psi \ge 0` evaluated exactly: ascending iff
      :math:`2^k (c + 1) \bmod 2C \le C` (so :math:`\sin = 0` is ascending and block ends differ
      from the block rule, e.g. :math:`C = 8, k = 1` descends on {4, 5, 6}).

    ``scope="global"`` indexes all :math:`C` channels (paper); ``scope="head"`` applies the rule to
    the index within each of ``scope_heads`` consecutive groups of :math:`C / \text{scope\_heads}`
    channels (the code's per-head index, blocks ``scope_heads`` times shorter).

    Returns:
        BoolTensor ``[channels]``, ``True`` = descending.
    """
    channels = check_positive_int("channels", channels)
    num_layers = check_positive_int("num_layers", num_layers)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
        raise ValueError(f"'layer' must be an int in [0, num_layers={num_layers}), got {layer!r}")
    check_choice("rule", rule, RULES)
    check_choice("tail", tail, TAILS)
    check_choice("scope", scope, SCOPES)
    check_choice("direction", direction, DIRECTIONS)
    k = num_layers - 1 - layer if direction == "paper" else layer
    c = torch.arange(channels)
    size = channels
    if scope == "head":
        if scope_heads is None:
            raise ValueError("scope='head' needs 'scope_heads' (the heads of the original MHA code)")
        scope_heads = check_positive_int("scope_heads", scope_heads)
        if channels % scope_heads:
            raise ValueError(f"'scope_heads' ({scope_heads}) must divide the channels ({channels})")
        size = channels // scope_heads
        c = c % size
    if rule == "paper_exact":
        return (2**k * (c + 1)) % (2 * size) > size
    b = max(1, size // 2**k)
    desc = (c // b) % 2 == 1
    if tail == "code" and k >= 1:
        desc |= c >= 2 * b * (size // (2 * b))
    return desc
