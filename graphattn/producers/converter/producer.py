r"""Converter (Zhang et al., "Converting Transformers into DGNNs Form"): Synvolution and Kernelution.

The producer turns node features into an exact, learnable, data-dependent **unitary digraph shift**
:math:`S = \Phi^H \operatorname{diag}(e^{i\varphi}) \Phi` over the complete digraph of every graph,
emitted as a :class:`~graphattn.producers.converter.chain_operator.UnitaryChainOperator` (an operator
edge set: :class:`~graphattn.EdgeAttention` applies it by four linear scans, :math:`O(N F)`, never
forming :math:`S`; the scans are in :mod:`graphattn.kernels.linear_scan`). The Givens chain lives in
:mod:`graphattn.producers.converter.chain`, Kernelution's polynomial in
:mod:`~graphattn.producers.converter.kernelution` and the node networks in
:mod:`~graphattn.producers.converter.blocks`.

Node order matters: the Givens chain runs over the nodes in their stored order (token order for
sequences, raster order for images; use a space-filling-curve order for point clouds), so the
operator is **not** permutation-equivariant.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphattn.core.checks import all_finite
from graphattn.producers.base import (
    EdgeProducer,
    ProducerContext,
    check_dtype,
    check_number,
    check_positive_int,
    check_sized_channels,
)
from graphattn.producers.converter.blocks import ScaleNorm, Siren
from graphattn.producers.converter.chain import givens, identity_rotations, stride_permutation
from graphattn.producers.converter.chain_operator import UnitaryChainOperator
from graphattn.producers.converter.kernelution import (
    KERNELS,
    chebyshev_phase,
    gibbs_damping,
    kernel_polynomial_loss,
)
from graphattn.producers.registry import register_producer

ANGLE_PARAMS = ("paper", "code")
PHASE_READOUTS = ("mean", "linear")
#: the readout's initial scale (``phase_readout="linear"``): ``r ~ U(±gain·sqrt(6/D))`` puts the
#: pre-activation's spread at a few radians, so that ``λ = sin(⟨r, s⟩)`` covers [-1, 1] at init
READOUT_GAIN = 4.0
NUM_ANGLES = 7  # α_l, β_l, γ_l (lower chain), α_u, β_u, γ_u (upper chain), θ (diagonal)


@register_producer("converter")
class ConverterProducer(EdgeProducer):
    r"""Converter's learnable unitary digraph shift (Synvolution, or Kernelution with ``kpm=True``).

    For the nodes of each graph in their stored order (one chain over the batch, with identity
    rotations between graphs, so :math:`S` is exactly block-diagonal):

    .. math::
        p_n = \operatorname{pool}_7\big(\operatorname{SIREN}_\Phi(x_n)\big) \in \mathbb{R}^7,
        \qquad \lambda_n = \operatorname{mean}_d \operatorname{SIREN}_\Lambda(x_n)_d \in [-1, 1]
        \quad\text{or (``phase_readout="linear"``)}\quad
        \lambda_n = \sin\big(\langle r, \operatorname{SIREN}_\Lambda(x_n)\rangle\big)

        \Phi = \operatorname{diag}(e^{2\pi i\, p_{n,6}})\, H_l\, H_u\, P,\qquad
        S = \Phi^H \operatorname{diag}(e^{i\varphi})\, \Phi,\qquad o_i = \sum_j S_{ij} v_j

    where :math:`\operatorname{pool}_7` is an adaptive average over the feature axis into 7 bins
    (after FixNorm with ``angle_param="code"``). The pair :math:`(j, j+1)` of :math:`H_l` takes
    its angles from node :math:`j` (:math:`p_{j,0..2}`), the pair of :math:`H_u` from node
    :math:`j+1` (:math:`p_{j+1,3..5}`), each block being
    :func:`~graphattn.producers.converter.chain.givens` with
    :math:`\tfrac{\alpha\pm\beta}{2} = \pi(p_0 \pm p_1)`,
    :math:`\tfrac{\gamma}{2} = \pi (p_2 + \gamma_0)` (the paper: :math:`\gamma_0 = 0`).
    Synvolution: :math:`\varphi = \lambda`. Kernelution: :math:`\varphi = \tfrac12 g_0 w_0 +
    \sum_{k=1}^{K} g_k w_k T_k(\lambda)` with learnable :math:`w` shared by the whole batch and
    fixed Gibbs factors :math:`g` of ``kernel``; the edge set's ``aux_loss`` is
    :math:`\eta\,\pi \sum_{k \ge 1} k^2 w_k^2` (kernel polynomial loss).

    :math:`S` is unitary and normal with eigenvalues exactly :math:`e^{i\varphi_n}`. The emitted
    :class:`~graphattn.producers.converter.chain_operator.UnitaryChainOperator` is applied by
    :class:`~graphattn.EdgeAttention` in four linear scans (:math:`O(N F)` time and memory);
    its ``to_explicit()`` is the complete digraph with complex weights :math:`S_{ij}` (small graphs)
    and ``to_topk(k)`` an explicitly labelled approximation. The layer takes the real part of
    :math:`S v` unless built with ``complex_output="complex"`` (the Converter preset does, and
    feeds complex values). Node order is semantic: the operator is not permutation-equivariant.

    Args:
        channels (int): node feature width :math:`D` (supplied by the model).
        kpm (bool): Kernelution (``True``) or plain Synvolution (``False``).
        order (int): Chebyshev order :math:`K` of Kernelution.
        kernel (str): Gibbs damping kernel, one of ``dirichlet`` (the paper's experiments),
            ``fejer``, ``jackson``, ``lanczos``, ``lorentz``, ``vekic``, ``wang``.
        kernel_kwargs (dict, optional): kernel hyperparameters (``lanczos_m``, ``lorentz_xi``,
            ``wang_a``, ``wang_b``) for :func:`~graphattn.producers.converter.kernelution.gibbs_damping`.
        kp_weight (float): :math:`\eta`, weight of the kernel polynomial loss (0: no aux loss).
        angle_param (str): ``"paper"`` (pooled SIREN outputs scaled to the full angle range) or
            ``"code"`` (FixNorm before pooling, as the released code: angles then stay small and
            :math:`S` is quasi-banded).
        stride (int): the fixed stride permutation :math:`P` (reshape ``(n/M, M)``, transpose,
            flatten, per graph; every graph size must be a multiple of it); 0 = identity.
        dropout (float): dropout inside both SIRENs (training only; masks drawn from the
            caller's generator when given).
        phase_readout (str): ``"mean"`` (the paper and its code: the mean of
            :math:`\operatorname{SIREN}_\Lambda`'s outputs, whose spread over nodes shrinks like
            :math:`1/\sqrt{D}`, so every eigen-phase starts near the same value and
            :math:`S \approx e^{i\bar\varphi} I`) or ``"linear"`` (a learnable readout
            :math:`r`, initialised :math:`U(\pm 4\sqrt{6/D})`, then :math:`\sin`: the phases
            cover :math:`[-1, 1]` at initialisation).
        gamma_offset (float): :math:`\gamma_0`, a constant added to the pooled rotation angle
            (in turns of :math:`\pi`): ``0`` the paper (the pooled angles start near 0, so
            every Givens block starts near a diagonal phase and :math:`\Phi` barely mixes);
            ``0.25`` starts every block near a 45° rotation, so :math:`\Phi` mixes neighbouring
            nodes from the first step (with ``phase_readout="linear"`` the operator's
            off-diagonal energy per row, :math:`1 - |S_{ii}|^2`, is about 0.25 at initialisation
            instead of under 1e-3).
    """

    mode = "weighted"

    lazy_channels: ClassVar[bool] = False  # parameters sized by the input width

    def __init__(
        self,
        channels: int,
        kpm: bool = True,
        order: int = 2,
        kernel: str = "dirichlet",
        kernel_kwargs: dict[str, Any] | None = None,
        kp_weight: float = 1e-3,
        angle_param: str = "paper",
        stride: int = 0,
        dropout: float = 0.0,
        phase_readout: str = "mean",
        gamma_offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.channels = check_sized_channels("ConverterProducer", channels)
        self.order = check_positive_int("order", order, allow_zero=True)
        if kernel not in KERNELS:
            raise ValueError(f"'kernel' must be one of {KERNELS}, got {kernel!r}")
        if angle_param not in ANGLE_PARAMS:
            raise ValueError(f"'angle_param' must be one of {ANGLE_PARAMS}, got {angle_param!r}")
        kp_weight = check_number("kp_weight", kp_weight, minimum=0)
        if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
            raise ValueError(f"'dropout' must lie in [0, 1), got {dropout!r}")
        if phase_readout not in PHASE_READOUTS:
            raise ValueError(f"'phase_readout' must be one of {PHASE_READOUTS}, got "
                             f"{phase_readout!r}")
        gamma_offset = check_number("gamma_offset", gamma_offset)
        self.stride = check_positive_int("stride", stride, allow_zero=True)
        self.kpm = bool(kpm)
        self.kernel = kernel
        self.kernel_kwargs = dict(kernel_kwargs or {})
        self.kp_weight = float(kp_weight)
        self.angle_param = angle_param
        self.dropout = float(dropout)
        self.eigvec_siren = Siren(channels, dropout)
        self.eigval_siren = Siren(channels, dropout)
        self.fixnorm = ScaleNorm(channels, affine=False)
        self.phase_readout = phase_readout
        self.gamma_offset = float(gamma_offset)
        if phase_readout == "linear":
            self.eigval_readout: nn.Parameter | None = nn.Parameter(torch.empty(channels))
        else:
            self.register_parameter("eigval_readout", None)
        if self.kpm:
            self.cheb_weight: nn.Parameter | None = nn.Parameter(torch.empty(self.order + 1))
            self.register_buffer("damping",
                                 gibbs_damping(kernel, self.order, **self.kernel_kwargs).float())
        else:
            self.register_parameter("cheb_weight", None)
            self.register_buffer("damping", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.eigvec_siren.reset_parameters()
        self.eigval_siren.reset_parameters()
        if self.eigval_readout is not None:
            bound = READOUT_GAIN * math.sqrt(6.0 / self.channels)
            nn.init.uniform_(self.eigval_readout, -bound, bound)
        if self.cheb_weight is not None:
            # φ = ½ w0 + Σ w_k T_k with every w = 2/(K+1): the released code's initial filter
            nn.init.constant_(self.cheb_weight, 2.0 / (self.order + 1))

    # ------------------------------------------------------------------------------ parameters
    def eigen_parameters(self, x: Tensor, training: bool = False,
                         generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``(p [N, 7], lambda [N])``: the pooled eigenvector parameters and the eigen-phases."""
        h = self.eigvec_siren(x, training, generator)
        if self.angle_param == "code":
            h = self.fixnorm(h)
        p = F.adaptive_avg_pool1d(h[:, None, :], NUM_ANGLES)[:, 0]
        s = self.eigval_siren(x, training, generator)
        lam = s.mean(-1) if self.eigval_readout is None else torch.sin(s @ self.eigval_readout)
        return p, lam

    def phase(self, lam: Tensor) -> Tensor:
        r""":math:`\varphi`: :math:`\lambda` (Synvolution) or the damped Chebyshev polynomial."""
        if self.cheb_weight is None:
            return lam
        return chebyshev_phase(lam, self.cheb_weight, self.damping)

    def kp_loss(self) -> Tensor | None:
        """:math:`\\eta L_{KP}` (``None`` without Kernelution or with ``kp_weight=0``)."""
        if self.cheb_weight is None or self.kp_weight == 0.0:
            return None
        return self.kp_weight * kernel_polynomial_loss(self.cheb_weight)

    # ------------------------------------------------------------------------------- produce
    def produce(self, ctx: ProducerContext) -> UnitaryChainOperator:
        x = ctx.x
        if not x.is_floating_point():
            raise ValueError(f"'x' must be a floating-point tensor, got {x.dtype}")
        if x.size(1) != self.channels:
            raise ValueError(f"'x' must have channels={self.channels} columns, got {x.size(1)}")
        check_dtype("x", x, self, type(self).__name__)
        if x.numel() and not bool(all_finite(x)):
            raise ValueError("'x' contains NaN or infinite values (a reset cannot stop a NaN: "
                             "0 * NaN = NaN would leak across graphs)")
        ptr = ctx.ptr  # raises for an unsorted batch: the chain needs contiguous graphs
        gen = ctx.generator  # dropout runs in training only: the caller's generator or the global RNG
        p, lam = self.eigen_parameters(x, ctx.training and self.dropout > 0, gen)
        phase = self.phase(lam)

        pi = math.pi
        lo, up = p[:-1], p[1:]
        g0 = self.gamma_offset
        rot_l = givens(pi * (lo[:, 0] + lo[:, 1]), pi * (lo[:, 0] - lo[:, 1]), pi * (lo[:, 2] + g0))
        rot_u = givens(pi * (up[:, 3] + up[:, 4]), pi * (up[:, 3] - up[:, 4]), pi * (up[:, 5] + g0))
        boundary = ctx.batch[1:] != ctx.batch[:-1]
        rot_l = identity_rotations(rot_l, boundary)
        rot_u = identity_rotations(rot_u, boundary)
        theta = 2 * pi * p[:, 6]
        diag = torch.complex(torch.cos(theta), torch.sin(theta))
        eig = torch.complex(torch.cos(phase), torch.sin(phase))

        counts = ptr[1:] - ptr[:-1]
        perm = stride_permutation(counts, self.stride) if self.stride else None
        N = x.size(0)
        stats = {"edges_per_node": float((counts * counts).sum()) / max(N, 1),
                 "implicit": True}
        return UnitaryChainOperator(rot_l, rot_u, diag, eig, ptr, num_heads=ctx.num_heads,
                                    perm=perm, aux_loss=self.kp_loss(), stats=stats,
                                    check_boundaries=False)

    def extra_repr(self) -> str:
        kind = f"kernelution(order={self.order}, kernel={self.kernel!r})" if self.kpm else "synvolution"
        return (f"{self.channels}, {kind}, angle_param={self.angle_param!r}, "
                f"kp_weight={self.kp_weight}, stride={self.stride}, dropout={self.dropout}, "
                f"phase_readout={self.phase_readout!r}, gamma_offset={self.gamma_offset}")
