"""The data sets load with the published sizes and splits."""

from __future__ import annotations

import gzip
import pickle

import pandas as pd
import pytest
import torch

from graphattn.data import (
    FashionMNIST,
    GeometricShapes,
    PeptidesFunctional,
    PeptidesStructural,
    Planetoid,
    TUDataset,
)
from graphattn.data.peptides import STRUCT_TARGETS
from graphattn.data.store import md5sum, spec


@pytest.mark.parametrize("name", ["cora", "citeseer", "pubmed"])
def test_planetoid_public_split(mirror, name):
    exp = spec(name)["expected"]
    data = Planetoid(name)[0]
    assert data.num_nodes == exp["nodes"] and data.num_edges == exp["edges"]
    assert data.num_features == exp["features"] and int(data.y.max()) + 1 == exp["classes"]
    split = [int(data[f"{s}_mask"].sum()) for s in ("train", "val", "test")]
    assert split == exp["split"]


@pytest.mark.parametrize("name", ["mutag", "proteins", "enzymes"])
def test_tu(mirror, name):
    ds = TUDataset(name)
    exp = spec(name)["expected"]
    assert len(ds) == exp["graphs"] and ds.num_classes == exp["classes"]


def test_fashion_mnist(mirror):
    test = FashionMNIST(split="test")
    assert len(test) == 10000
    g = test[0]
    assert g.num_nodes == 784 and g.pos.shape == (784, 2) and g.x.shape == (784, 1)
    assert 0 <= float(g.x.min()) and float(g.x.max()) <= 1
    assert len(FashionMNIST(split="train")) == 60000
    counts = torch.bincount(test.labels, minlength=10)
    assert torch.equal(counts, torch.full((10,), 1000))


def test_geometric_shapes(mirror):
    train, test = GeometricShapes(train=True), GeometricShapes(train=False)
    assert len(train) == len(test) == 40
    assert sorted(int(d.y) for d in train) == list(range(40))


def test_peptides_functional_official_sizes(mirror):
    """The LRGB numbers: 15,535 graphs, 2,344,859 nodes, 4,773,974 edges, 10,873/2,331/2,331."""
    ds = PeptidesFunctional()
    exp = spec("peptides-func")["expected"]
    assert len(ds) == exp["graphs"]
    assert ds._data.x.size(0) == exp["nodes"]
    assert ds._data.edge_index.size(1) == exp["edges"]
    assert [len(ds.split_idx[k]) for k in ("train", "val", "test")] == exp["split"]
    g = ds[0]
    assert g.x.shape[1] == 9 and g.edge_attr.shape[1] == 3 and g.y.shape == (1, 10)
    all_idx = torch.cat(list(ds.split_idx.values()))
    assert torch.equal(all_idx.sort().values, torch.arange(len(ds)))


def test_peptides_structural_same_path_on_generated_targets(mirror, tmp_path):
    """Targets are not available offline: write the official file format with generated targets
    and load it through the same code path (standardisation per target included)."""
    src = pd.read_csv(mirror / "peptides-functional/raw/peptide_multi_class_dataset.csv.gz").head(30)
    g = torch.Generator().manual_seed(0)
    targets = torch.randn(30, len(STRUCT_TARGETS), generator=g) * 5 + 3
    df = pd.DataFrame({"smiles": src["smiles"]})
    for i, name in enumerate(STRUCT_TARGETS):
        df[name] = targets[:, i].numpy()
    folder = tmp_path / "peptides-structural"
    (folder / "raw").mkdir(parents=True)
    csv = folder / "raw" / "peptide_structure_dataset.csv.gz"
    with gzip.open(csv, "wt") as f:
        df.to_csv(f)
    split = {"train": list(range(20)), "val": list(range(20, 25)), "test": list(range(25, 30))}
    with open(folder / "splits_random_stratified_peptide_structure.pickle", "wb") as f:
        pickle.dump(split, f)
    entry = dict(spec("peptides-struct"))
    entry["files"] = {"raw/peptide_structure_dataset.csv.gz": md5sum(csv),
                      "splits_random_stratified_peptide_structure.pickle":
                          md5sum(folder / "splits_random_stratified_peptide_structure.pickle")}
    ds = PeptidesStructural(tmp_path, entry=entry)
    assert len(ds) == 30 and ds[0].y.shape == (1, 11)
    y = ds._data.y
    assert torch.allclose(y.mean(0), torch.zeros(11), atol=1e-5)
    assert torch.allclose(y.std(0), torch.ones(11), atol=1e-5)
    expected = (targets - targets.mean(0)) / targets.std(0)
    assert torch.allclose(y, expected, atol=1e-5)
    assert [len(ds.split_idx[k]) for k in ("train", "val", "test")] == [20, 5, 5]
    assert ds[0].x.shape[1] == 9
