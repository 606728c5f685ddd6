"""Fashion-MNIST images, served as graphs through :class:`~graphattn.data.ImageToGraph`."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable

import numpy as np
import torch
from torch_geometric.data import Data, Dataset

from graphattn.data.base import CachedDataset
from graphattn.data.loaders import ImageToGraph
from graphattn.data.store import atomic_torch_save, data_root, fetch

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")
_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Reads an IDX file (the MNIST format: magic, big-endian dims, unsigned bytes), gzipped."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims.tolist()} but holds {data.size} values")
    return data.reshape(dims)


def _images_labels(obj: object) -> bool:
    """``obj`` is a processed split: ``(uint8 images [N, 28, 28], int64 labels [N])``."""
    if not (isinstance(obj, tuple) and len(obj) == 2
            and all(isinstance(t, torch.Tensor) for t in obj)):
        return False
    images, labels = obj
    return (images.dtype == torch.uint8 and images.dim() == 3 and tuple(images.shape[1:]) == (28, 28)
            and labels.dtype == torch.long and labels.shape == images.shape[:1])


class FashionMNIST(CachedDataset, Dataset):
    """Fashion-MNIST (60,000 train / 10,000 test, 28×28 grey, 10 classes). Images are stored once
    as a uint8 tensor and turned into graphs on access by ``graph`` (default: 28×28 pixel graph
    with 4-neighbour edges; e.g. ``ImageToGraph(patch_size=4)`` gives 49 patch nodes). Pixel values
    are scaled to [0, 1].

    Args:
        root: the data root. split: ``"train"`` or ``"test"``.
        graph: the image → graph transform. transform: a further PyG transform.
    """

    registry_key = "fashion-mnist"

    def __init__(self, root: str | os.PathLike | None = None, split: str = "train",
                 graph: Callable | None = None, transform: Callable | None = None) -> None:
        if split not in _FILES:
            raise ValueError(f"'split' must be 'train' or 'test', got {split!r}")
        self.split = split
        self._data_base = root
        self.graph = graph if graph is not None else ImageToGraph()
        super().__init__(str(data_root(root) / "FashionMNIST"), transform)
        self.images, self.labels = self.load_processed(
            self.processed_paths[0 if split == "train" else 1], _images_labels,
            "the (uint8 images [N, 28, 28], int64 labels [N]) pair")

    @property
    def raw_file_names(self) -> list[str]:
        return [f for pair in _FILES.values() for f in pair]

    @property
    def processed_file_names(self) -> list[str]:
        return ["train.pt", "test.pt"]

    def download(self) -> None:
        fetch(self.registry_key, self._data_base)

    def process(self) -> None:
        fetch(self.registry_key, self._data_base)
        for path, (img, lab) in zip(self.processed_paths, _FILES.values(), strict=True):
            images = torch.from_numpy(read_idx(os.path.join(self.raw_dir, img)).copy())
            labels = torch.from_numpy(read_idx(os.path.join(self.raw_dir, lab)).astype(np.int64))
            if images.size(0) != labels.size(0):
                raise ValueError(f"{img} and {lab} disagree on the number of samples")
            atomic_torch_save((images, labels), path)

    def len(self) -> int:
        return int(self.labels.numel())

    def get(self, idx: int) -> Data:
        image = self.images[idx].float().div(255.0).unsqueeze(0)
        data = self.graph(Data(image=image, y=self.labels[idx : idx + 1]))
        return data
