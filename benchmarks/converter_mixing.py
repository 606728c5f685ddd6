"""How much Converter's operator mixes tokens at initialisation, per parameterisation.

For a random batch of graphs (standard normal features, sizes ``--sizes``) and ``--inits``
initialisations of :class:`~graphattn.producers.converter.ConverterProducer` per setting, the
off-diagonal energy per row of the materialised operator, :math:`1 - |S_{ii}|^2` (the rows of the
unitary :math:`S` have unit norm; 0 means :math:`S` is diagonal), averaged over the rows, then
over the initialisations (and its lowest value), for Kernelution and Synvolution. Settings: the
paper's (mean phase readout, no angle offset), the linear phase readout alone, the 45° angle
offset alone, both, and the linear readout with a 90° offset. Float64, no timing.

    python benchmarks/converter_mixing.py                    # D = 32 and 64, five initialisations
"""

from __future__ import annotations

import argparse

import torch

from graphattn.producers.converter import ConverterProducer

SETTINGS = {
    "paper": {},
    "readout alone": {"phase_readout": "linear"},
    "offset alone": {"gamma_offset": 0.25},
    "both": {"phase_readout": "linear", "gamma_offset": 0.25},
    "readout, offset 0.5": {"phase_readout": "linear", "gamma_offset": 0.5},
}


def energies(D: int, kw: dict, kpm: bool, x: torch.Tensor, batch: torch.Tensor,
             inits: int) -> tuple[list[float], list[float]]:
    """Mean off-diagonal energy per row and the phases' std over nodes, one value per init."""
    energy, lam_std = [], []
    for seed in range(inits):
        torch.manual_seed(seed)
        prod = ConverterProducer(D, kpm=kpm, **kw).double()
        with torch.no_grad():
            S = prod(x, batch).to_dense()
            _, lam = prod.eigen_parameters(x)
        energy.append(float((1 - S.diagonal().abs() ** 2).mean()))
        lam_std.append(float(lam.std()))
    return energy, lam_std


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--sizes", type=int, nargs="+", default=[40, 64, 25])
    parser.add_argument("--inits", type=int, default=5)
    args = parser.parse_args()
    counts = torch.tensor(args.sizes)
    batch = torch.repeat_interleave(torch.arange(len(args.sizes)), counts)
    print("| D | setting | energy, Kernelution (lowest) | energy, Synvolution (lowest) | "
          "std of λ |")
    print("|---|---|---|---|---|")
    for D in args.dims:
        x = torch.randn(int(counts.sum()), D, generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64)
        for name, kw in SETTINGS.items():
            cells = []
            for kpm in (True, False):
                e, lam_std = energies(D, kw, kpm, x, batch, args.inits)
                cells.append(f"{sum(e) / len(e):.4f} ({min(e):.4f})")
            print(f"| {D} | {name} | {cells[0]} | {cells[1]} | {sum(lam_std) / len(lam_std):.2f} |")


if __name__ == "__main__":
    main()
