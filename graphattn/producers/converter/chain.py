r"""The Givens chain of Converter (Zhang et al., "Converting Transformers into DGNNs Form";
:mod:`graphattn.producers.converter`): the factors of :math:`\Phi = D H_l H_u P`, plain tensor code
with no parameters.

* :func:`givens` — the SU(2) block of paper eq. 6 for every pair :math:`(j, j+1)` of a chain;
  :func:`identity_rotations` (graph boundaries), and the test oracles :func:`givens_matrix` and
  :func:`dense_givens_chain` (dense products of explicit Givens matrices);
* :func:`stride_permutation` — the fixed per-graph stride shuffle :math:`P`.

The operator these build, the unitary digraph shift
:math:`S = \Phi^H \operatorname{diag}(e^{i\varphi}) \Phi`, is
:class:`~graphattn.producers.converter.chain_operator.UnitaryChainOperator`; the linear scan and
the Givens-chain sweeps that apply it (:func:`~graphattn.kernels.linear_scan.linear_scan`,
:func:`~graphattn.kernels.linear_scan.upper_sweep`, :func:`~graphattn.kernels.linear_scan.lower_sweep`)
are in :mod:`graphattn.kernels.linear_scan`. Kernelution's phase polynomial is
:mod:`~graphattn.producers.converter.kernelution`.

The released code of the paper drops the scan's boundary carry (so its :math:`\Phi` is not unitary
and the last token never contributes) and inverts with swapped factors; the sweeps are the corrected
ones (``docs/converter.md``, departures) and are tested against :func:`dense_givens_chain`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from graphattn.core.index import ptr_from_counts


# --------------------------------------------------------------------------------------------- Givens
def givens(half_sum: Tensor, half_diff: Tensor, half_gamma: Tensor) -> Tensor:
    r"""The SU(2) blocks of paper eq. 6, ``[..., 4]`` complex ``(ii, ij, ji, jj)``:

    .. math::
        \begin{bmatrix} ii & ij \\ ji & jj \end{bmatrix} =
        \begin{bmatrix} e^{-i s_+}\cos c & -e^{i s_-}\sin c \\
                        e^{-i s_-}\sin c & e^{i s_+}\cos c \end{bmatrix},\qquad
        s_\pm = \tfrac{\alpha \pm \beta}{2},\ c = \tfrac{\gamma}{2}.

    Unitary with determinant 1 for any real angles. The arguments are real tensors of one shape;
    the result is ``complex64`` for ``float32`` input and ``complex128`` for ``float64``.
    """
    c, s = torch.cos(half_gamma), torch.sin(half_gamma)
    cp, sp = torch.cos(half_sum), torch.sin(half_sum)
    cm, sm = torch.cos(half_diff), torch.sin(half_diff)
    ii = torch.complex(cp * c, -sp * c)
    ij = torch.complex(-cm * s, -sm * s)
    ji = torch.complex(cm * s, -sm * s)
    jj = torch.complex(cp * c, sp * c)
    return torch.stack([ii, ij, ji, jj], dim=-1)


def identity_rotations(rot: Tensor, mask: Tensor) -> Tensor:
    """``rot [P, 4]`` with the pairs where ``mask`` is set replaced by the exact identity
    ``(1, 0, 0, 1)`` (graph boundaries of a segmented chain: the scans reset there)."""
    eye = torch.tensor([1, 0, 0, 1], dtype=rot.dtype, device=rot.device)
    return torch.where(mask[:, None], eye, rot)


def givens_matrix(rot: Tensor, j: int, n: int) -> Tensor:
    """The explicit :math:`n \times n` matrix :math:`G_{j,j+1}` of the block ``rot [4]``."""
    g = torch.eye(n, dtype=rot.dtype, device=rot.device)
    g[j, j], g[j, j + 1], g[j + 1, j], g[j + 1, j + 1] = rot
    return g


def dense_givens_chain(rot: Tensor, order: str) -> Tensor:
    r"""Dense :math:`N \times N` product of the Givens rotations ``rot [N-1, 4]`` (test oracle).

    ``order="upper"``: :math:`H_u = G_{0,1} G_{1,2} \cdots G_{N-2,N-1}`;
    ``order="lower"``: :math:`H_l = G_{N-2,N-1} \cdots G_{1,2} G_{0,1}`. Each factor is applied as
    its 2×2 block on two columns (``upper``, right products) or two rows (``lower``, left
    products) of the running product, :math:`O(N^2)` per factor; equal to the product of the
    :func:`givens_matrix` s.
    """
    if order not in ("upper", "lower"):
        raise ValueError(f"'order' must be 'upper' or 'lower', got {order!r}")
    n = rot.size(0) + 1
    out = torch.eye(n, dtype=rot.dtype, device=rot.device)
    for j in range(n - 1):
        block = rot[j].reshape(2, 2)
        if order == "upper":
            out[:, j:j + 2] = out[:, j:j + 2] @ block
        else:
            out[j:j + 2] = block @ out[j:j + 2]
    return out


# ---------------------------------------------------------------------------------------- permutation
def stride_permutation(counts: Tensor, stride: int) -> Tensor:
    """``perm [N]`` of the fixed stride shuffle :math:`P` applied per graph (``P x = x[perm]``):
    each graph's local indices reshaped ``(n / M, M)``, transposed and flattened."""
    bad = counts % stride != 0
    if bool(bad.any()):
        raise ValueError(f"'stride'={stride} needs every graph size to be a multiple of it, "
                         f"got a graph of {int(counts[bad][0])} nodes")
    # slot l of a graph of n = m·M nodes (M = stride) reads its local node (l mod m)·M + l div m
    ptr = ptr_from_counts(counts)
    N = int(ptr[-1])
    graph = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts,
                                    output_size=N)
    start = ptr[graph]
    local = torch.arange(N, device=counts.device) - start
    m = counts[graph] // stride
    return start + (local % m) * stride + torch.div(local, m, rounding_mode="floor")
