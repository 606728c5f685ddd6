"""The data sets load with the published sizes and splits."""

from __future__ import annotations

import gzip
import io
import pickle
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import graphattn.data.fashion_mnist as fashion_mnist_module
import graphattn.data.listops as listops_module
from graphattn.data import (
    DamagedCacheError,
    FashionMNIST,
    GeometricShapes,
    ListOps,
    PeptidesFunctional,
    PeptidesStructural,
    Planetoid,
    RebuiltCacheWarning,
    TUDataset,
    UnreadableDataError,
)
from graphattn.data.peptides import STRUCT_TARGETS
from graphattn.data.store import load_cache, md5sum, spec


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


# ---------------------------------------------------- damaged processed caches are rebuilt


class _Payload:
    """Pickles to a call that creates ``marker``: loading it would run code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


DAMAGES = ("truncated", "empty", "random", "random pickle", "wrong content", "code")


def _damage(path: Path, how: str, marker: Path) -> None:
    good = path.read_bytes()
    rng = random.Random(DAMAGES.index(how))
    path.write_bytes({
        "truncated": lambda: good[: len(good) // 2],
        "empty": lambda: b"",
        "random": lambda: rng.randbytes(4096),
        "random pickle": lambda: b"\x80\x02" + rng.randbytes(4096),
        "wrong content": lambda: _saved({"weights": torch.zeros(3)}),
        "code": lambda: _saved(_Payload(marker)),
    }[how]())


def _same(a: Any, b: Any) -> None:
    assert len(a) == len(b)
    for i in (0, len(a) - 1):
        x, y = a[i], b[i]
        assert sorted(x.keys()) == sorted(y.keys())
        for k in x.keys():
            assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], k


def _rebuilds_every_damage(make: Callable[[int], Any], files: list[str], tmp_path: Path) -> None:
    """``make(k)`` builds the data set reading ``files[k]``; each kind of damage to each file is
    caught, named in one warning, and rebuilt into the same data set; no code ever runs."""
    reference = {k: make(k) for k in range(len(files))}
    marker = tmp_path / "pwned"
    for i, how in enumerate(DAMAGES):
        k = i % len(files)
        path = Path(files[k])
        _damage(path, how, marker)
        with pytest.warns(RebuiltCacheWarning) as caught:
            ds = make(k)
        msgs = [str(w.message) for w in caught if w.category is RebuiltCacheWarning]
        assert len(msgs) == 1, (how, msgs)
        assert msgs[0].startswith(f"{path} was a damaged processed cache ("), (how, msgs[0])
        assert "); rebuilding it from " in msgs[0] and "\n" not in msgs[0]
        _same(ds, reference[k])
        load_cache(path)  # a good file again
    assert not marker.exists()


def _idx_gz(path: Path, array: np.ndarray) -> None:
    """Writes ``array`` (uint8) as a gzipped IDX file, the MNIST format."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_fashion_mnist(tmp_path, monkeypatch) -> Path:
    """A 5 + 3 image Fashion-MNIST in the official IDX format (the registry's md5 are the real
    files', so fetching is switched off)."""
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 5), ("t10k", 3)):
        _idx_gz(raw / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _idx_gz(raw / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, (n,)))
    monkeypatch.setattr(fashion_mnist_module, "fetch", lambda *args, **kwargs: None)
    return tmp_path


@pytest.fixture
def tiny_peptides(tmp_path) -> tuple[Path, dict[str, Any]]:
    """Six molecules in the official Peptides-func files (CSV of SMILES and label lists, split
    pickle), with a registry entry carrying their md5."""
    folder = tmp_path / "peptides-functional"
    (folder / "raw").mkdir(parents=True)
    smiles = ["CC(N)C(=O)O", "NCC(=O)O", "CC(C)C(N)C(=O)O", "OCC(N)C(=O)O", "CCO", "c1ccccc1O"]
    labels = [str([int(j == i % 10) for j in range(10)]) for i in range(len(smiles))]
    csv = folder / "raw" / "peptide_multi_class_dataset.csv.gz"
    with gzip.open(csv, "wt") as f:
        pd.DataFrame({"smiles": smiles, "labels": labels}).to_csv(f)
    split = folder / "splits_random_stratified_peptide.pickle"
    split.write_bytes(pickle.dumps({"train": [0, 1, 2, 3], "val": [4], "test": [5]}))
    entry = dict(spec("peptides-func"))
    entry["files"] = {"raw/peptide_multi_class_dataset.csv.gz": md5sum(csv),
                      "splits_random_stratified_peptide.pickle": md5sum(split)}
    return tmp_path, entry


def _listops(root: Path) -> ListOps:
    return ListOps(root, "val", num_samples=6, min_length=5, max_length=40)


def test_listops_cache_is_rebuilt_when_damaged(tmp_path):
    _rebuilds_every_damage(lambda k: _listops(tmp_path), _listops(tmp_path).processed_paths, tmp_path)


def test_fashion_mnist_caches_are_rebuilt_when_damaged(tiny_fashion_mnist, tmp_path):
    def make(k):
        return FashionMNIST(tiny_fashion_mnist, split=("train", "test")[k])

    ds = make(0)
    assert len(ds) == 5 and len(make(1)) == 3 and ds[0].num_nodes == 784
    _rebuilds_every_damage(make, ds.processed_paths, tmp_path)


def test_peptides_caches_are_rebuilt_when_damaged(tiny_peptides, tmp_path):
    root, entry = tiny_peptides
    ds = PeptidesFunctional(root, entry=entry)
    assert len(ds) == 6 and [len(ds.split_idx[k]) for k in ("train", "val", "test")] == [4, 1, 1]

    def make(k):
        d = PeptidesFunctional(root, entry=entry)
        assert {k: v.tolist() for k, v in d.split_idx.items()} == {
            "train": [0, 1, 2, 3], "val": [4], "test": [5]}
        return d

    _rebuilds_every_damage(make, ds.processed_paths, tmp_path)


def test_planetoid_cache_is_rebuilt_when_damaged(mirror, tmp_path):
    ds = Planetoid("cora", tmp_path)
    _rebuilds_every_damage(lambda k: Planetoid("cora", tmp_path), ds.processed_paths, tmp_path)


def test_tu_cache_is_rebuilt_when_damaged(mirror, tmp_path):
    """PyG's TUDataset reads its cache itself: it is checked (and rebuilt) before PyG reads it."""
    ds = TUDataset("mutag", tmp_path)
    _rebuilds_every_damage(lambda k: TUDataset("mutag", tmp_path), ds.processed_paths, tmp_path)


def test_geometric_shapes_caches_are_rebuilt_when_damaged(mirror, tmp_path):
    ds = GeometricShapes(tmp_path)
    _rebuilds_every_damage(lambda k: GeometricShapes(tmp_path, train=k == 0), ds.processed_paths,
                           tmp_path)


@pytest.mark.parametrize("marker_file", ["pre_transform.pt", "pre_filter.pt"])
@pytest.mark.parametrize("how", ["truncated", "random pickle", "code"])
def test_pygs_own_marker_files_are_checked_before_pyg_reads_them(tmp_path, marker_file, how):
    """PyG reads ``pre_transform.pt`` / ``pre_filter.pt`` with ``weights_only=False``: graphattn
    checks them first, so a damaged one is rebuilt and a planted one never runs code."""
    ds = _listops(tmp_path)
    path = Path(ds.processed_dir) / marker_file
    _damage(path, how, tmp_path / "pwned")
    with pytest.warns(RebuiltCacheWarning, match=f"{path} was a damaged processed cache"):
        again = _listops(tmp_path)
    _same(again, ds)
    assert load_cache(path) == "None" and not (tmp_path / "pwned").exists()


def test_a_directory_at_a_cache_path_is_named_and_kept(tmp_path):
    path = Path(_listops(tmp_path).processed_paths[0])
    path.unlink()
    path.mkdir()
    with pytest.raises(UnreadableDataError, match=f"{path} is a directory, not a processed cache"):
        _listops(tmp_path)
    assert path.is_dir()


def test_a_cache_still_damaged_after_the_rebuild_is_an_error(tmp_path, monkeypatch):
    path = Path(_listops(tmp_path).processed_paths[0])
    path.write_bytes(b"")
    monkeypatch.setattr(listops_module, "atomic_torch_save",
                        lambda obj, p: Path(p).write_bytes(b"junk"))  # a disk that garbles writes
    with pytest.warns(RebuiltCacheWarning), pytest.raises(DamagedCacheError) as info:
        _listops(tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"{path} is a damaged processed cache (")
    assert "even right after rebuilding it" in msg and "check the disk" in msg
