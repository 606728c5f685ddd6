"""Converter (Zhang et al., "Converting Transformers into DGNNs Form"): Synvolution and Kernelution.

* :mod:`~graphattn.producers.converter.producer` — :class:`ConverterProducer`, registered as
  ``converter``;
* :mod:`~graphattn.producers.converter.chain_operator` — the operator edge set it emits,
  :class:`UnitaryChainOperator` (the unitary digraph shift, applied by linear scans);
* :mod:`~graphattn.producers.converter.chain` — the Givens chain (SU(2) blocks, graph boundaries, the
  stride shuffle, dense test oracles);
* :mod:`~graphattn.producers.converter.kernelution` — Kernelution's eigen-phase polynomial;
* :mod:`~graphattn.producers.converter.blocks` — the node networks (:class:`ScaleNorm`, :class:`Siren`).
"""

from graphattn.producers.converter.blocks import ScaleNorm, Siren
from graphattn.producers.converter.chain import (
    dense_givens_chain,
    givens,
    givens_matrix,
    identity_rotations,
    stride_permutation,
)
from graphattn.producers.converter.chain_operator import UnitaryChainOperator
from graphattn.producers.converter.kernelution import (
    KERNELS,
    chebyshev_phase,
    gibbs_damping,
    kernel_polynomial_loss,
)
from graphattn.producers.converter.producer import (
    ANGLE_PARAMS,
    NUM_ANGLES,
    PHASE_READOUTS,
    READOUT_GAIN,
    ConverterProducer,
)

__all__ = [
    "ANGLE_PARAMS",
    "KERNELS",
    "NUM_ANGLES",
    "PHASE_READOUTS",
    "READOUT_GAIN",
    "ConverterProducer",
    "ScaleNorm",
    "Siren",
    "UnitaryChainOperator",
    "chebyshev_phase",
    "dense_givens_chain",
    "gibbs_damping",
    "givens",
    "givens_matrix",
    "identity_rotations",
    "kernel_polynomial_loss",
    "stride_permutation",
]
