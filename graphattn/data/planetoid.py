"""Cora, CiteSeer and PubMed with the public Planetoid split, read from verified raw files."""

from __future__ import annotations

import os
from collections.abc import Callable

from torch_geometric.datasets import Planetoid as _PygPlanetoid

from graphattn.data.base import VerifiedMixin
from graphattn.data.store import data_root

NAMES = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}

# Class names in the Planetoid label order (matched through the per-class node counts: Cora
# 351/217/418/818/426/298/180; CiteSeer 249/590/668/701/596/508, plus 15 featureless nodes labelled 0).
CLASSES = {
    "cora": ("Theory", "Reinforcement_Learning", "Genetic_Algorithms", "Neural_Networks",
             "Probabilistic_Methods", "Case_Based", "Rule_Learning"),
    "citeseer": ("AI", "ML", "IR", "DB", "Agents", "HCI"),
}


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
