"""Where data lives, and how raw files get there verified.

* **Data root** — where raw files are copied and processed caches written: the ``root`` argument
  (``--data-root``), else ``$GRAPHATTN_DATA``, else ``$XDG_CACHE_HOME/graphattn`` (``~/.cache``).
* **Mirror** — a read-only folder with the same layout (``$GRAPHATTN_MIRROR``; CI points it at
  ``../shared/datasets``). Raw files are copied from it into the data root.
* **Registry** — ``datasets/registry.json`` in the repository (installed as
  ``graphattn.datasets``): each data set's files, md5, source, licence and expected sizes.

Every raw file is checked against its md5 before it is used. A missing file that can be neither
copied from the mirror nor downloaded raises :class:`MissingDataError` naming the file, its md5 and
where to put it; a file with the wrong md5 raises :class:`CorruptedDataError`. Copies and processed
caches are written to a temporary name and renamed, so no half-written file is ever left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch


class MissingDataError(FileNotFoundError):
    """A raw file is absent and can be neither copied from the mirror nor downloaded."""


class CorruptedDataError(ValueError):
    """A raw file does not have the md5 recorded in the registry."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The data root: ``root``, ``$GRAPHATTN_DATA`` or the user cache directory."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("GRAPHATTN_DATA")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "graphattn"


def mirror_root() -> Path | None:
    env = os.environ.get("GRAPHATTN_MIRROR")
    return Path(env).expanduser() if env else None


@cache
def registry() -> dict[str, dict[str, Any]]:
    """All registered data sets (``datasets/registry.json``)."""
    text = resources.files("graphattn.datasets").joinpath("registry.json").read_text()
    reg = json.loads(text)
    reg.pop("_about", None)
    return reg


def spec(name: str) -> dict[str, Any]:
    reg = registry()
    if name not in reg:
        raise ValueError(f"unknown data set {name!r}; registered: {', '.join(sorted(reg))}")
    return reg[name]


def md5sum(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path next to ``path``; renames it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _verify(path: Path, expected: str | None, name: str) -> None:
    if expected is None:
        return
    got = md5sum(path)
    if got != expected:
        raise CorruptedDataError(
            f"{path} is corrupted: md5 {got}, expected {expected} (data set {name!r}). Delete it "
            f"and put a good copy there, or set GRAPHATTN_MIRROR to a folder that has one."
        )


def _download(url: str, dest: Path, timeout: float = 30.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, atomic_path(dest) as tmp:
            with open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
            return True
    except OSError:
        return False


def fetch(name: str, root: str | os.PathLike | None = None, *,
          entry: dict[str, Any] | None = None) -> Path:
    """Makes every raw file of data set ``name`` present and verified under the data root.

    Returns the data set's folder (``<root>/<dir>``). ``entry`` overrides the registry entry (tests
    use it for generated files in the official format).
    """
    entry = entry if entry is not None else spec(name)
    base = data_root(root) / entry["dir"]
    mirror = mirror_root()
    for rel, md5 in entry["files"].items():
        dest = base / rel
        if dest.exists():
            _verify(dest, md5, name)
            continue
        src = mirror / entry["dir"] / rel if mirror is not None else None
        if src is not None and src.exists():
            _verify(src, md5, name)
            with atomic_path(dest) as tmp:
                shutil.copyfile(src, tmp)
            continue
        url = entry.get("url")
        if url and _download(url.format(file=rel), dest):
            _verify(dest, md5, name)
            continue
        where = f"{mirror / entry['dir'] / rel}" if mirror is not None else "(GRAPHATTN_MIRROR unset)"
        raise MissingDataError(
            f"data set {name!r} needs the file {rel!r} (md5 {md5}); it is not in the data root "
            f"({dest}), not in the mirror {where}, and "
            + (f"could not be downloaded from {url.format(file=rel)}. " if url else
               "has no download address. ")
            + f"Put the file at {dest} (source: {entry.get('source', 'see datasets/README.md')}) "
            f"or point GRAPHATTN_MIRROR at a folder holding {entry['dir']}/{rel}."
        )
    return base
