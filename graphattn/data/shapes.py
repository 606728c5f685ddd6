"""GeometricShapes meshes as sampled point clouds."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path

from torch_geometric.datasets import GeometricShapes as _PygGeometricShapes

from graphattn.data.base import VerifiedMixin
from graphattn.data.store import data_root, fetch


class GeometricShapes(VerifiedMixin, _PygGeometricShapes):
    """PyG's :class:`~torch_geometric.datasets.GeometricShapes` (40 classes, one mesh each for
    train and test) from the verified ``raw.zip``. Compose ``transform`` with
    :class:`torch_geometric.transforms.SamplePoints` and :class:`~graphattn.data.PointCloudToGraph`
    to get point-cloud graphs (see :func:`graphattn.runner.tasks`)."""

    registry_key = "geometric-shapes"

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True,
                 transform: Callable | None = None, pre_transform: Callable | None = None) -> None:
        self._data_base = root
        super().__init__(str(data_root(root) / "GeometricShapes"), train=train,
                         transform=transform, pre_transform=pre_transform)

    @property
    def classes(self) -> list[str]:
        """Class names in label order: the mesh folders, sorted as PyG numbers them
        (``2d_circle`` ... ``3d_wedge_long``)."""
        return sorted(d.name for d in Path(self.raw_dir).iterdir() if d.is_dir())

    def download(self) -> None:
        base = fetch(self.registry_key, self._data_base)
        with zipfile.ZipFile(base / "raw.zip") as z:
            z.extractall(base)

    def process(self) -> None:
        fetch(self.registry_key, self._data_base)
        super().process()
