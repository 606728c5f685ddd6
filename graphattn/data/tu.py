"""TU graph-classification data sets (MUTAG, PROTEINS, ENZYMES) from verified raw files."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch_geometric.datasets import TUDataset as _PygTUDataset

from graphattn.data.base import VerifiedMixin, is_collated
from graphattn.data.store import data_root

NAMES = {"mutag": "MUTAG", "proteins": "PROTEINS", "enzymes": "ENZYMES"}
_SIZES = {"num_node_labels", "num_node_attributes", "num_edge_labels", "num_edge_attributes"}


def _is_tu_collated(obj: Any) -> bool:
    """``obj`` is what PyG's ``TUDataset.process`` writes: ``(data dict, slices, sizes, class)``."""
    return (isinstance(obj, tuple) and len(obj) == 4
            and is_collated((obj[0], obj[1], obj[3]))
            and isinstance(obj[2], dict) and _SIZES <= set(obj[2]))


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

    def check_processed(self) -> None:
        # PyG's TUDataset reads its cache itself right after this: check it (and rebuild it if it
        # is damaged) first, so that PyG only ever reads a good one
        self.load_processed(self.processed_paths[0], _is_tu_collated,
                            "the (data, slices, sizes, class) tuple of a TU data set")

    def process(self) -> None:
        self.fetch_raw()
        super().process()
