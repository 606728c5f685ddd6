"""Cora, CiteSeer and PubMed with the public Planetoid split, read from verified raw files."""

from __future__ import annotations

import os
from collections.abc import Callable

from torch_geometric.datasets import Planetoid as _PygPlanetoid

from graphattn.data.base import VerifiedMixin
from graphattn.data.store import data_root

NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}


class Planetoid(VerifiedMixin, _PygPlanetoid):
    """PyG's :class:`~torch_geometric.datasets.Planetoid` (public split: 20 labels per class,
    500 validation and 1000 test nodes) over the registry's md5-verified raw files.

    Args:
        name (str): ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (case-insensitive).
        root (str, optional): the data root (default: ``$GRAPHATTN_DATA`` or the user cache).
        transform, pre_transform: PyG transforms.
    """

    def __init__(self, name: str, root: str | os.PathLike | None = None,
                 transform: Callable | None = None, pre_transform: Callable | None = None) -> None:
        key = name.lower()
        if key not in NAMES:
            raise ValueError(f"'name' must be one of {sorted(NAMES)}, got {name!r}")
        self.registry_key = key
        self._data_base = root
        super().__init__(str(data_root(root) / "Planetoid"), NAMES[key], split="public",
                         transform=transform, pre_transform=pre_transform)

    def process(self) -> None:
        self.fetch_raw()  # re-verify md5 of files already present before reading them
        super().process()
