"""Data roots, the mirror, md5 verification and atomic caches."""

from __future__ import annotations

import fcntl
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import graphattn.data.store as store
from graphattn.data import (
    CorruptedDataError,
    DamagedCacheError,
    MissingDataError,
    Planetoid,
    UnreadableDataError,
    fetch,
    md5sum,
)
from graphattn.data.store import (
    atomic_path,
    atomic_torch_save,
    data_root,
    load_cache,
    registry,
    spec,
)


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


# ----------------------------------------------------------------------------- damaged files


class _Payload:
    """Pickles to a call that creates ``marker``: loading it would run code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _damaged_variants(good: bytes, marker: Path) -> dict[str, bytes]:
    """The damage a cache can suffer, as file contents (``good`` is a valid cache's bytes)."""
    def saved(obj) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    rng = random.Random(0)
    return {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "random": rng.randbytes(4096),
        "random pickle": b"\x80\x02" + rng.randbytes(4096),
        "wrong content": saved({"weights": torch.zeros(3)}),
        "code": saved(_Payload(marker)),
    }


def test_load_cache_names_the_file_for_every_kind_of_damage(tmp_path):
    path = tmp_path / "processed" / "data.pt"
    path.parent.mkdir()

    def valid(obj):
        return isinstance(obj, tuple) and len(obj) == 2

    torch.save((torch.arange(5), torch.ones(5)), path)
    good = path.read_bytes()
    assert torch.equal(load_cache(path, valid)[0], torch.arange(5))
    marker = tmp_path / "pwned"
    reasons = {"truncated": "truncated or not a torch file", "empty": "it is empty",
               "random": "garbled", "random pickle": "garbled",
               "wrong content": "it holds a dict with keys ['weights'], not the pair",
               "code": "refers to code"}
    for how, blob in _damaged_variants(good, marker).items():
        path.write_bytes(blob)
        with pytest.raises(DamagedCacheError) as info:
            load_cache(path, valid, "the pair")
        msg = str(info.value)
        assert str(path) in msg and reasons[how] in msg, (how, msg)
        assert "delete it: it is rebuilt from the raw files on the next run" in msg
        assert "\n" not in msg and info.value.path == path
    assert not marker.exists()
    rng = random.Random(1)  # garbage drives the unpickler into any state: always the same error
    for i in range(100):
        path.write_bytes((b"\x80\x02" if i % 2 else b"") + rng.randbytes(rng.randint(1, 2048)))
        with pytest.raises(DamagedCacheError, match=str(path)):
            load_cache(path, valid)
    path.unlink()
    with pytest.raises(DamagedCacheError, match=r"data\.pt is a damaged processed cache \(it is missing\)"):
        load_cache(path)


def test_load_cache_refuses_a_directory_or_an_unreadable_file(tmp_path, monkeypatch):
    folder = tmp_path / "data.pt"
    folder.mkdir()
    with pytest.raises(UnreadableDataError, match=rf"{folder} is a directory, not a processed cache"):
        load_cache(folder)
    assert folder.is_dir()  # never deleted

    locked = tmp_path / "split.pt"
    locked.write_bytes(b"anything")

    def no_permission(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(store, "open", no_permission, raising=False)
    with pytest.raises(UnreadableDataError, match=rf"cannot read the processed cache {locked} "
                                                  r"\(Permission denied\); make it readable"):
        load_cache(locked)
    assert locked.exists()


def _entry(tmp_path: Path) -> tuple[dict, Path]:
    raw = tmp_path / "src" / "a.txt"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text("hello\n")
    return {"dir": "Toy", "files": {"a.txt": md5sum(raw)}, "source": "generated"}, raw


def test_a_raw_file_that_is_a_directory_or_unreadable_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("GRAPHATTN_MIRROR", raising=False)
    entry, raw = _entry(tmp_path)
    dest = tmp_path / "root" / "Toy" / "a.txt"
    dest.mkdir(parents=True)
    with pytest.raises(UnreadableDataError, match=rf"{dest} is a directory, not a raw file of data "
                                                  r"set 'toy'; remove it"):
        fetch("toy", tmp_path / "root", entry=entry)
    dest.rmdir()
    shutil.copyfile(raw, dest)
    assert fetch("toy", tmp_path / "root", entry=entry) == dest.parent

    real_open = open

    def no_permission(path, *args, **kwargs):
        if Path(path) == dest:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(store, "open", no_permission, raising=False)
    with pytest.raises(UnreadableDataError, match=rf"cannot read {dest} \(Permission denied\), a raw "
                                                  r"file of data set 'toy'"):
        fetch("toy", tmp_path / "root", entry=entry)


def test_a_damaged_registry_is_named(tmp_path, monkeypatch):
    (tmp_path / "registry.json").write_text('{"cora": ')

    class Files:
        @staticmethod
        def files(package):
            return tmp_path

    monkeypatch.setattr(store, "resources", Files)
    with pytest.raises(UnreadableDataError, match=r"registry\.json cannot be read .*reinstall"):
        registry.__wrapped__()


# ------------------------------------------------------------ temporary files of killed writers


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_stale_temporary_files_are_removed_on_the_next_write(tmp_path):
    target = tmp_path / "last.pt"
    stale = tmp_path / ".last.pt.k1ll3d_0.tmp"  # a writer killed two hours ago
    live = tmp_path / ".last.pt.w0rk1ng_.tmp"  # old, but its writer still holds the lock
    fresh = tmp_path / ".last.pt.ju5tn0w_.tmp"  # created a moment ago, lock not yet taken
    other = tmp_path / ".best.pt.k1ll3d_0.tmp"  # another target's
    lookalike = tmp_path / ".last.pt.a.b.tmp"  # not the pattern of last.pt's temporary files
    for p in (stale, live, fresh, other, lookalike):
        p.write_bytes(b"half a checkpoint")
    for p in (stale, live, other, lookalike):
        _age(p, 7200)
    fd = os.open(live, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        atomic_torch_save({"epoch": 1}, target)
        assert not stale.exists()
        assert live.exists() and fresh.exists() and other.exists() and lookalike.exists()
        assert torch.load(target, weights_only=True) == {"epoch": 1}
    finally:
        os.close(fd)  # the writer ends (or dies): the kernel drops its lock
    atomic_torch_save({"epoch": 2}, target)
    assert not live.exists() and fresh.exists() and other.exists() and lookalike.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".last.pt.")) == [
        lookalike.name, fresh.name]


def test_without_locks_only_old_temporary_files_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "fcntl", None)
    target = tmp_path / "data.pt"
    recent, old = tmp_path / ".data.pt.r3c3nt__.tmp", tmp_path / ".data.pt.0ld_____.tmp"
    for p, age in ((recent, 600), (old, 2 * store.STALE_TEMP_AGE_S)):
        p.write_bytes(b"half")
        _age(p, age)
    with atomic_path(target) as tmp:
        tmp.write_text("whole")
    assert target.read_text() == "whole" and recent.exists() and not old.exists()


_WRITER = """
import sys, time
from pathlib import Path
from graphattn.data.store import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    Path(tmp).write_bytes(b"half")
    print(tmp, flush=True)
    time.sleep(600)
"""


def test_a_killed_writers_file_goes_and_a_live_writers_file_stays(tmp_path):
    """A real concurrent writer (another process inside ``atomic_path``): its temporary file
    survives other writes of the same target while it lives, and goes once it is SIGKILLed."""
    target = tmp_path / "data.pt"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE,
                             text=True)
    try:
        tmp = Path(child.stdout.readline().strip())
        assert tmp.exists() and tmp.name.startswith(".data.pt.") and tmp.name.endswith(".tmp")
        _age(tmp, 7200)  # looks abandoned by its age alone
        with atomic_path(target) as mine:
            mine.write_text("mine")
        assert tmp.exists() and target.read_text() == "mine"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert tmp.exists()  # what SIGKILL leaves behind
    with atomic_path(target) as mine:
        mine.write_text("again")
    assert not tmp.exists() and target.read_text() == "again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.pt"]
