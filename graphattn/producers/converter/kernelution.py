r"""Kernelution's eigen-phase polynomial (Converter, paper eqs. 10–12;
:mod:`graphattn.producers.converter`): the Gibbs damping factors (:func:`gibbs_damping`, paper Table 6,
one per :data:`KERNELS` entry), the damped Chebyshev series of the phases (:func:`chebyshev_phase`)
and its penalty (:func:`kernel_polynomial_loss`). Plain tensor code, no parameters.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

KERNELS = ("dirichlet", "fejer", "jackson", "lanczos", "lorentz", "vekic", "wang")


def gibbs_damping(kernel: str, order: int, *, lanczos_m: int = 3, lorentz_xi: float = 4.0,
                  wang_a: float = 2.0, wang_b: float = 2.0) -> Tensor:
    r"""Gibbs damping factors :math:`g_0 .. g_K` (paper Table 6), ``float64 [K + 1]``,
    :math:`g_0 = 1`; with :math:`x_k = k / (K+1)`:

    ``dirichlet`` :math:`1`; ``fejer`` :math:`1 - x_k`; ``jackson``
    :math:`[(K{+}2{-}k)\cos\frac{k\pi}{K+2} + \sin\frac{k\pi}{K+2}\cot\frac{\pi}{K+2}]/(K{+}2)`;
    ``lanczos`` :math:`(\sin(\pi x_k)/(\pi x_k))^M`; ``lorentz``
    :math:`\sinh(\xi(1 - x_k))/\sinh\xi`; ``vekic``
    :math:`\tfrac12 - \tfrac12\tanh\frac{x_k - 1/2}{x_k(1 - x_k)}`; ``wang``
    :math:`\exp(-(a x_k)^b)`.
    """
    if kernel not in KERNELS:
        raise ValueError(f"'kernel' must be one of {KERNELS}, got {kernel!r}")
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"'order' must be a non-negative int, got {order!r}")
    K = order
    k = torch.arange(1, K + 1, dtype=torch.float64)
    x = k / (K + 1)
    if kernel == "dirichlet":
        g = torch.ones_like(k)
    elif kernel == "fejer":
        g = 1 - x
    elif kernel == "jackson":
        q = math.pi / (K + 2)
        g = ((K + 2 - k) * torch.cos(k * q) + torch.sin(k * q) / math.tan(q)) / (K + 2)
    elif kernel == "lanczos":
        g = (torch.sin(math.pi * x) / (math.pi * x)) ** lanczos_m
    elif kernel == "lorentz":
        g = torch.sinh(lorentz_xi * (1 - x)) / math.sinh(lorentz_xi)
    elif kernel == "vekic":
        g = 0.5 - 0.5 * torch.tanh((x - 0.5) / (x * (1 - x)))
    else:  # wang
        g = torch.exp(-((wang_a * x) ** wang_b))
    return torch.cat([torch.ones(1, dtype=torch.float64), g])


def chebyshev_phase(lam: Tensor, weight: Tensor, damping: Tensor) -> Tensor:
    r"""Kernelution's eigen-phases (paper eq. 10 with learnable :math:`w_k`):

    .. math::
        \varphi = \tfrac12 g_0 w_0 + \sum_{k=1}^{K} g_k w_k T_k(\lambda),\qquad
        T_0 = 1,\ T_1 = \lambda,\ T_k = 2\lambda T_{k-1} - T_{k-2}.

    Args:
        lam: ``[N]`` phases :math:`\lambda \in [-1, 1]`.
        weight: ``[K + 1]`` coefficients :math:`w`.
        damping: ``[K + 1]`` Gibbs factors :math:`g` (:func:`gibbs_damping`).
    """
    c = (weight * damping.to(weight.dtype)).to(lam.dtype)
    out = 0.5 * c[0] * torch.ones_like(lam)
    t_prev, t = torch.ones_like(lam), lam
    for k in range(1, c.numel()):
        if k > 1:
            t_prev, t = t, 2 * lam * t - t_prev
        out = out + c[k] * t
    return out


def kernel_polynomial_loss(weight: Tensor) -> Tensor:
    r"""Kernel polynomial loss (paper eq. 11) :math:`L_{KP} = \pi \sum_{k=1}^{K} k^2 w_k^2`.

    The paper derives it as :math:`\int_{-1}^{1} |p'(x)|^2 dx`, which is not exact (for
    :math:`k = 1` that integral is 2, not :math:`\pi`); the exact identity is
    :math:`\pi \sum_k k^2 w_k^2 = 2 \int_{-1}^{1} |p'(x)|^2 \sqrt{1 - x^2}\, dx`, a weighted
    Sobolev penalty on the phase polynomial.
    """
    k = torch.arange(weight.numel(), dtype=weight.dtype, device=weight.device)
    return math.pi * (k.square() * weight.square())[1:].sum()
