"""Data roots, the mirror, md5 verification and atomic caches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from graphattn.data import CorruptedDataError, MissingDataError, Planetoid, fetch, md5sum
from graphattn.data.store import atomic_path, data_root, registry, spec


def test_registry_documents_every_data_set():
    reg = registry()
    for name in ("cora", "citeseer", "pubmed", "peptides-func", "peptides-struct", "mutag",
                 "proteins", "enzymes", "fashion-mnist", "geometric-shapes"):
        entry = reg[name]
        assert entry["files"] and entry["source"] and entry["licence"] and entry["dir"]
        assert all(len(m) == 32 for m in entry["files"].values())
    with pytest.raises(ValueError, match="unknown data set"):
        spec("imagenet")


def test_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHATTN_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("GRAPHATTN_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "graphattn"


def test_fetch_copies_from_mirror_and_verifies(mirror, tmp_path):
    base = fetch("cora", tmp_path)
    for f, md5 in spec("cora")["files"].items():
        assert md5sum(base / f) == md5
    # the mirror is the source and stays untouched
    assert (mirror / "Planetoid/Cora/raw/ind.cora.x").exists()


def test_corrupted_file_is_reported_and_no_processed_cache_left(mirror, tmp_path):
    base = fetch("cora", tmp_path)
    bad = base / "ind.cora.graph"
    bad.chmod(0o644)
    bad.write_bytes(b"not the graph")
    with pytest.raises(CorruptedDataError, match=r"ind\.cora\.graph.*md5"):
        Planetoid("cora", tmp_path)
    processed = tmp_path / "Planetoid" / "Cora" / "processed"
    assert not processed.exists() or not any(processed.iterdir())


def test_missing_file_without_source_names_file_md5_and_place(monkeypatch, tmp_path):
    monkeypatch.delenv("GRAPHATTN_MIRROR", raising=False)
    with pytest.raises(MissingDataError) as info:
        fetch("peptides-struct", tmp_path)
    msg = str(info.value)
    assert "peptide_structure_dataset.csv.gz" in msg
    assert "9786061a34298a0684150f2e4ff13f47" in msg
    assert str(tmp_path / "peptides-structural") in msg


def test_missing_file_in_mirror_is_reported(monkeypatch, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    monkeypatch.setenv("GRAPHATTN_MIRROR", str(mirror))
    with pytest.raises(MissingDataError, match=r"MUTAG_A\.txt"):
        fetch("mutag", tmp_path / "root")


def test_corrupted_mirror_file_is_not_copied(monkeypatch, mirror, tmp_path):
    fake = tmp_path / "mirror" / "TUDataset" / "MUTAG" / "raw"
    shutil.copytree(mirror / "TUDataset" / "MUTAG" / "raw", fake)
    (fake / "MUTAG_A.txt").chmod(0o644)
    (fake / "MUTAG_A.txt").write_text("1, 2\n")
    monkeypatch.setenv("GRAPHATTN_MIRROR", str(tmp_path / "mirror"))
    with pytest.raises(CorruptedDataError):
        fetch("mutag", tmp_path / "root")
    assert not (tmp_path / "root" / "TUDataset" / "MUTAG" / "raw" / "MUTAG_A.txt").exists()


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "x.bin"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    with atomic_path(target) as tmp:
        Path(tmp).write_text("whole")
    assert target.read_text() == "whole" and len(list(tmp_path.iterdir())) == 1
