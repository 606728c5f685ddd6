"""LRGB Peptides-func and Peptides-struct, built from the official CSV with ogb ``smiles2graph``."""

from __future__ import annotations

import ast
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch
from torch_geometric.data import Data, InMemoryDataset
from tqdm.auto import tqdm

from graphattn.data.base import VerifiedMixin
from graphattn.data.store import atomic_torch_save, data_root, spec

#: Peptides-func's 10 labels, in the order of ``y``'s columns (LRGB, Dwivedi et al. 2022)
FUNCTION_CLASSES = ("antifungal", "cell_cell_communication", "anticancer", "drug_delivery_vehicle",
                    "antimicrobial", "antiviral", "antihypertensive", "antibacterial",
                    "antiparasitic", "toxic")

STRUCT_TARGETS = (
    "Inertia_mass_a", "Inertia_mass_b", "Inertia_mass_c",
    "Inertia_valence_a", "Inertia_valence_b", "Inertia_valence_c",
    "length_a", "length_b", "length_c", "Spherocity", "Plane_best_fit",
)


class _Peptides(VerifiedMixin, InMemoryDataset):
    """Common path of both LRGB peptide data sets.

    Each molecule becomes a graph with ogb's featurisation (9 integer atom features, 3 integer bond
    features, both edge directions), ``y`` of shape ``[1, T]``. ``split_idx`` holds the official
    stratified ``train`` / ``val`` / ``test`` indices.
    """

    csv_name = ""
    split_name = ""

    def __init__(self, root: str | os.PathLike | None = None, transform: Callable | None = None,
                 pre_transform: Callable | None = None, *, entry: dict[str, Any] | None = None,
                 progress: bool = False) -> None:
        self._data_base = root
        self._entry = entry
        self.progress = progress
        folder = (entry or spec(self.registry_key))["dir"]
        super().__init__(str(data_root(root) / folder), transform, pre_transform)
        self.load(self.processed_paths[0])
        n = len(self)

        def valid(split: Any) -> bool:
            return (isinstance(split, dict) and set(split) == {"train", "val", "test"}
                    and all(isinstance(t, torch.Tensor) and t.dtype == torch.long and t.dim() == 1
                            and (t.numel() == 0 or 0 <= int(t.min()) <= int(t.max()) < n)
                            for t in split.values()))

        self.split_idx: dict[str, torch.Tensor] = self.load_processed(
            self.processed_paths[1], valid, f"the train/val/test index tensors of {n} graphs")

    @property
    def raw_file_names(self) -> list[str]:
        return [self.csv_name]

    @property
    def processed_file_names(self) -> list[str]:
        return ["data.pt", "split.pt"]

    def read_targets(self, df: Any) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def process(self) -> None:
        import pandas as pd
        from ogb.utils import smiles2graph

        self.fetch_raw()
        df = pd.read_csv(os.path.join(self.raw_dir, self.csv_name))
        y = self.read_targets(df)
        data_list = []
        smiles = df["smiles"].tolist()
        for i, smi in enumerate(tqdm(smiles, desc=f"{self.registry_key}: smiles2graph",
                                     disable=not self.progress)):
            g = smiles2graph(smi)
            data = Data(
                x=torch.from_numpy(g["node_feat"]).long(),
                edge_index=torch.from_numpy(g["edge_index"]).long(),
                edge_attr=torch.from_numpy(g["edge_feat"]).long(),
                y=y[i : i + 1],
                num_nodes=int(g["num_nodes"]),
            )
            if self.pre_transform is not None:
                data = self.pre_transform(data)
            data_list.append(data)
        with open(os.path.join(self.root, self.split_name), "rb") as f:
            split = pickle.load(f)
        split_idx = {k: torch.as_tensor(split[k], dtype=torch.long) for k in ("train", "val", "test")}
        self.save(data_list, self.processed_paths[0])
        atomic_torch_save(split_idx, self.processed_paths[1])


class PeptidesFunctional(_Peptides):
    """LRGB Peptides-func: 15,535 peptides, 10 binary functional labels (multi-label), metric:
    average precision averaged over labels (see :func:`graphattn.runner.metrics.lrgb_ap`)."""

    registry_key = "peptides-func"
    csv_name = "peptide_multi_class_dataset.csv.gz"
    split_name = "splits_random_stratified_peptide.pickle"

    def read_targets(self, df: Any) -> torch.Tensor:
        labels = [ast.literal_eval(s) for s in df["labels"]]
        return torch.tensor(labels, dtype=torch.float)


class PeptidesStructural(_Peptides):
    """LRGB Peptides-struct: the same molecules and split, 11 regression targets (3-D structure
    descriptors), each standardised to zero mean and unit variance over the whole data set as in
    the official LRGB code; metric: MAE. The targets are not available offline here."""

    registry_key = "peptides-struct"
    csv_name = "peptide_structure_dataset.csv.gz"
    split_name = "splits_random_stratified_peptide_structure.pickle"

    def read_targets(self, df: Any) -> torch.Tensor:
        missing = [c for c in STRUCT_TARGETS if c not in df.columns]
        if missing:
            raise ValueError(f"{self.csv_name} lacks the target columns {missing}")
        t = torch.tensor(df[list(STRUCT_TARGETS)].to_numpy(), dtype=torch.float)
        return (t - t.mean(0)) / t.std(0)
