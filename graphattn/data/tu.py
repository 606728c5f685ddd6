"""TU graph-classification data sets (MUTAG, PROTEINS, ENZYMES) from verified raw files."""

from __future__ import annotations

import os
from collections.abc import Callable

from torch_geometric.datasets import TUDataset as _PygTUDataset

from graphattn.data.base import VerifiedMixin
from graphattn.data.store import data_root

NAMES = {"mutag": "MUTAG", "proteins": "PROTEINS", "enzymes": "ENZYMES"}


class TUDataset(VerifiedMixin, _PygTUDataset):
    """PyG's :class:`~torch_geometric.datasets.TUDataset` over the registry's verified raw files
    (node labels one-hot, continuous node attributes appended when ``use_node_attr``)."""

    def __init__(self, name: str, root: str | os.PathLike | None = None,
                 transform: Callable | None = None, pre_transform: Callable | None = None,
                 use_node_attr: bool = True) -> None:
        key = name.lower()
        if key not in NAMES:
            raise ValueError(f"'name' must be one of {sorted(NAMES)}, got {name!r}")
        self.registry_key = key
        self._data_base = root
        super().__init__(str(data_root(root) / "TUDataset"), NAMES[key], transform=transform,
                         pre_transform=pre_transform, use_node_attr=use_node_attr)

    def process(self) -> None:
        self.fetch_raw()
        super().process()
