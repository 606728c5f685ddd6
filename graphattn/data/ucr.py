"""UCR/UEA time-series classification data sets bundled with ``sktime``, served as graphs through
:class:`~graphattn.data.SequenceToGraph`.

sktime ships a few archive problems inside its wheel (``sktime/datasets/data/<Name>/<Name>_TRAIN.ts``
and ``_TEST.ts``; sktime 1.2: ACSF1, ArrowHead, BasicMotions, GunPoint, ItalyPowerDemand,
JapaneseVowels, OSULeaf, PLAID and UnitTest). :class:`UCRDataset` reads only those files, with
sktime's own ``.ts`` reader, so nothing is ever downloaded; a problem that is not bundled is refused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data, Dataset

from graphattn.data.base import CachedDataset
from graphattn.data.loaders import SequenceToGraph
from graphattn.data.store import atomic_torch_save, data_root

INSTALL_HINT = "pip install sktime (or pip install 'graphattn[timeseries]')"
_SPLITS = ("train", "test")


def sktime_data_dir() -> Path:
    """The folder of the problems bundled with sktime (found without importing sktime);
    :class:`ImportError` naming ``pip install sktime`` when it is not installed."""
    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the UCR/UEA data sets are read from the files bundled with sktime, "
                          f"which is not installed: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def _is_classification(path: Path) -> bool:
    """``path`` is a ``.ts`` file whose header declares class labels (``@classLabel true ...``)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            words = line.strip().lower().split()
            if words[:1] == ["@data"]:
                return False
            if words[:2] == ["@classlabel", "true"]:
                return True
    return False


def bundled_datasets() -> tuple[str, ...]:
    """The classification problems sktime bundles (both ``_TRAIN.ts`` and ``_TEST.ts`` present,
    class labels declared), sorted by name."""
    root = sktime_data_dir()
    names = []
    for d in sorted(root.iterdir() if root.is_dir() else (), key=lambda p: p.name.lower()):
        files = [d / f"{d.name}_{s.upper()}.ts" for s in _SPLITS]
        if all(f.is_file() for f in files) and _is_classification(files[0]):
            names.append(d.name)
    return tuple(names)


def resolve_name(name: str) -> str:
    """The bundled problem called ``name`` (case-insensitive: ``"gunpoint"`` → ``"GunPoint"``)."""
    available = bundled_datasets()
    if isinstance(name, str):
        for n in available:
            if n.lower() == name.lower():
                return n
    raise ValueError(f"'dataset' must be a UCR/UEA classification problem bundled with sktime "
                     f"({', '.join(available) or 'none found'}), got {name!r}; graphattn reads "
                     f"only the bundled files and downloads nothing")


def _label_order(labels: list[str]) -> list[str]:
    """Class names in a stable order: numerically when every label is a number, else as text."""
    unique = sorted(set(labels))
    try:
        return sorted(unique, key=float)
    except ValueError:
        return unique


def read_ts(path: str | os.PathLike) -> tuple[list[np.ndarray], list[str]]:
    """A ``.ts`` file read with sktime's :func:`sktime.datasets.load_from_tsfile`: one float64
    array ``[L_i, C]`` per case (channels in the file's order; lengths may differ between cases)
    and the class labels as strings."""
    try:
        from sktime.datasets import load_from_tsfile
    except ImportError as exc:
        raise ImportError(f"reading UCR/UEA .ts files needs sktime: {INSTALL_HINT}") from exc
    X, y = load_from_tsfile(str(path), return_data_type="nested_univ")
    series = []
    for i in range(len(X)):
        channels = [np.asarray(X.iloc[i, c], dtype=np.float64) for c in range(X.shape[1])]
        if len({ch.shape[0] for ch in channels}) > 1:
            raise ValueError(f"{path}: case {i} has channels of different lengths "
                             f"{[ch.shape[0] for ch in channels]}")
        case = np.stack(channels, 1) if channels else np.zeros((0, 0))
        if not np.isfinite(case).all():
            raise ValueError(f"{path}: case {i} holds missing or infinite values, which "
                             f"SequenceToGraph refuses")
        series.append(case)
    return series, [str(v) for v in y]


def _fingerprint(files: list[Path]) -> str:
    h = hashlib.md5()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


class UCRDataset(CachedDataset, Dataset):
    r"""A UCR/UEA time-series classification problem bundled with sktime, on its official
    ``TRAIN`` / ``TEST`` split.

    Each case is a real series :math:`x \in \mathbb R^{L \times C}` (``C = 1`` for univariate
    problems; ``L`` may vary between cases, e.g. JapaneseVowels). The series are read once with
    sktime's ``.ts`` reader and cached in the data root (``<root>/UCR/<Name>/processed``, the file
    names carrying a digest of the source files, so a new sktime release with other data rebuilds
    them); on access each case is ``Data(x=[L, C] float32, y=[1] long)`` turned into a graph by
    ``graph`` (default :class:`~graphattn.data.SequenceToGraph`\ ``()``: one node per time step).
    Class ids index :attr:`classes` (sorted numerically where every label is a number), which is the
    same for both splits.

    Args:
        name: the problem (case-insensitive), one of :func:`bundled_datasets`.
        root: the data root. split: ``"train"`` or ``"test"``.
        graph: the series → graph transform. transform: a further PyG transform.

    Raises :class:`ImportError` naming ``pip install sktime`` when sktime is missing.
    """

    rebuilt_from = "the .ts files bundled with sktime"

    def __init__(self, name: str = "GunPoint", root: str | os.PathLike | None = None,
                 split: str = "train", graph: Callable | None = None,
                 transform: Callable | None = None) -> None:
        if split not in _SPLITS:
            raise ValueError(f"'split' must be 'train' or 'test', got {split!r}")
        self.name = resolve_name(name)
        self.split = split
        src = sktime_data_dir() / self.name
        self.source_files = [src / f"{self.name}_{s.upper()}.ts" for s in _SPLITS]
        self._digest = _fingerprint(self.source_files)
        self.graph = graph if graph is not None else SequenceToGraph()
        super().__init__(str(data_root(root) / "UCR" / self.name), transform)
        cache = self.load_processed(self.processed_paths[_SPLITS.index(split)], _is_series_cache,
                                    "a dict of values [T, C], offsets [N+1], labels [N], classes")
        self.values: torch.Tensor = cache["values"]
        self.offsets: torch.Tensor = cache["offsets"]
        self.labels: torch.Tensor = cache["labels"]
        self.classes: list[str] = list(cache["classes"])

    @property
    def raw_file_names(self) -> list[str]:
        return []  # the raw files live in the sktime package: nothing to download

    @property
    def processed_file_names(self) -> list[str]:
        return [f"{s}-{self._digest}.pt" for s in _SPLITS]

    def download(self) -> None:
        pass

    def process(self) -> None:
        read = [read_ts(f) for f in self.source_files]
        classes = _label_order([lab for _, labels in read for lab in labels])
        index = {c: i for i, c in enumerate(classes)}
        channels = {case.shape[1] for series, _ in read for case in series}
        if len(channels) != 1:
            raise ValueError(f"{self.name}: cases with different numbers of channels {channels}")
        (C,) = channels
        for path, (series, labels) in zip(self.processed_paths, read, strict=True):
            lengths = torch.tensor([s.shape[0] for s in series], dtype=torch.long)
            values = (torch.from_numpy(np.concatenate(series, 0)).float() if series
                      else torch.zeros(0, C))
            atomic_torch_save({
                "values": values,
                "offsets": torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]),
                "labels": torch.tensor([index[lab] for lab in labels], dtype=torch.long),
                "classes": classes,
            }, path)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def num_channels(self) -> int:
        """``C``, the channels of every series."""
        return int(self.values.size(1))

    def lengths(self) -> torch.Tensor:
        """The length ``L`` of every series ``[N]``."""
        return self.offsets.diff()

    def len(self) -> int:
        return int(self.labels.numel())

    def series(self, idx: int) -> torch.Tensor:
        """Series ``idx`` as stored, ``[L, C]`` float32."""
        s, e = int(self.offsets[idx]), int(self.offsets[idx + 1])
        return self.values[s:e].clone()

    def get(self, idx: int) -> Data:
        return self.graph(Data(x=self.series(idx), y=self.labels[idx : idx + 1]))


def _is_series_cache(obj: Any) -> bool:
    """``obj`` is a processed split as :meth:`UCRDataset.process` writes it."""
    if not (isinstance(obj, dict) and set(obj) == {"values", "offsets", "labels", "classes"}):
        return False
    values, offsets, labels, classes = obj["values"], obj["offsets"], obj["labels"], obj["classes"]
    if not (isinstance(values, torch.Tensor) and values.dtype == torch.float32 and values.dim() == 2
            and isinstance(offsets, torch.Tensor) and offsets.dtype == torch.long
            and offsets.dim() == 1 and isinstance(labels, torch.Tensor)
            and labels.dtype == torch.long and labels.dim() == 1
            and isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        return False
    return (offsets.numel() == labels.numel() + 1 and int(offsets[0]) == 0
            and int(offsets[-1]) == values.size(0) and bool((offsets.diff() >= 0).all())
            and (labels.numel() == 0 or (int(labels.min()) >= 0
                                          and int(labels.max()) < len(classes))))
