"""Where data lives, and how raw files get there verified.

* **Data root** — where raw files are copied and processed caches written: the ``root`` argument
  (``--data-root``), else ``$GRAPHATTN_DATA``, else ``$XDG_CACHE_HOME/graphattn`` (``~/.cache``).
* **Mirror** — a read-only folder with the same layout (``$GRAPHATTN_MIRROR``; CI points it at
  ``../shared/datasets``). Raw files are copied from it into the data root.
* **Registry** — ``datasets/registry.json`` in the repository (installed as
  ``graphattn.datasets``): each data set's files, md5, source, licence and expected sizes.

Every raw file is checked against its md5 before it is used. A missing file that can be neither
copied from the mirror nor downloaded raises :class:`MissingDataError` naming the file, its md5 and
where to put it; a file with the wrong md5 raises :class:`CorruptedDataError`; a path that is a
directory or cannot be read raises :class:`UnreadableDataError` naming it.

Copies, processed caches and checkpoints are written to a temporary name next to the target
(``.<name>.<random>.tmp``) and renamed, so no half-written file is ever left behind under the
target's name. A writer killed mid-write (SIGKILL) leaves its temporary file; the next write of the
same target removes it (:func:`remove_stale_temps`): a temporary file is stale once it has not been
modified for :data:`STALE_TEMP_GRACE_S` seconds and no live writer holds its lock (every writer
holds an exclusive ``flock`` on its temporary file until the rename); where locks are unavailable,
once it is :data:`STALE_TEMP_AGE_S` seconds old. Concurrent writers of the same target (two runs
preparing the same data set) therefore never remove each other's files.

Processed caches are read back with :func:`load_cache` (``torch.load(weights_only=True)``: tensors
and plain containers only, never code); a truncated, empty, garbled or foreign cache raises
:class:`DamagedCacheError` naming the file, and the data sets rebuild it from the raw files with a
one-line :class:`RebuiltCacheWarning` (see :class:`graphattn.data.base.CachedDataset`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: stale temporary files go by age alone
    fcntl = None  # type: ignore[assignment]


class MissingDataError(FileNotFoundError):
    """A raw file is absent and can be neither copied from the mirror nor downloaded."""


class CorruptedDataError(ValueError):
    """A raw file does not have the md5 recorded in the registry."""


class UnreadableDataError(ValueError):
    """A data file (raw or processed) exists but cannot be read: a directory stands at its path,
    or it lacks read permission."""


_REBUILT = "delete it: it is rebuilt from the raw files on the next run"


class DamagedCacheError(ValueError):
    """A processed cache cannot be read back (truncated, empty, garbled) or does not hold what
    graphattn writes there. ``path`` names it, ``reason`` says what is wrong, ``advice`` what to do
    (``kind`` names what the file is: "processed cache" unless said otherwise)."""

    def __init__(self, path: str | os.PathLike, reason: str, advice: str = _REBUILT,
                 kind: str = "processed cache") -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path} is a damaged {kind} ({reason}); {advice}")


class RebuiltCacheWarning(UserWarning):
    """A damaged processed cache was found and is being rebuilt from the raw files."""


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
    path = resources.files("graphattn.datasets").joinpath("registry.json")
    try:
        reg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or not UTF-8
        raise UnreadableDataError(f"the data-set registry {path} cannot be read ({_first_line(exc)}); "
                                  f"reinstall graphattn or restore the file from the repository") from None
    if not isinstance(reg, dict):
        raise UnreadableDataError(f"the data-set registry {path} must hold a JSON object; reinstall "
                                  f"graphattn or restore the file from the repository")
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


STALE_TEMP_GRACE_S = 60.0
"""A temporary file modified this recently (seconds) is never removed: its writer may have just
created it and not yet taken its lock."""

STALE_TEMP_AGE_S = 3600.0
"""Where file locks are unavailable (no ``fcntl``, or a file system that refuses ``flock``), a
temporary file is stale only once it has gone unmodified this long (seconds)."""


def _first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message (its type name if it has none), shortened."""
    text = (str(exc).strip().splitlines() or [""])[0].strip() or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _lock_state(path: str) -> bool | None:
    """``True`` if a live writer holds the lock of temporary file ``path``, ``False`` if none
    does, ``None`` if that cannot be told (no ``fcntl``, the file system refuses locks, ...)."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also releases the lock taken just above
    return False


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Removes the temporary files (``.<name>.<random>.tmp`` next to ``path``) that earlier writes
    of ``path`` left behind when they were killed; returns the removed paths.

    A temporary file is removed once it has not been modified for :data:`STALE_TEMP_GRACE_S`
    seconds and no live writer holds its lock (:func:`atomic_path` holds one for the whole write;
    the kernel drops it when the writer dies), or, where locks cannot be checked, once it is
    :data:`STALE_TEMP_AGE_S` seconds old. Files of other targets are never touched.
    """
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")  # tempfile.mkstemp's names
    now = time.time()
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry.name):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if age < STALE_TEMP_GRACE_S:
            continue
        held = _lock_state(entry.path)
        if held or (held is None and age < STALE_TEMP_AGE_S):
            continue
        with contextlib.suppress(OSError):  # another writer may have removed it first
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path next to ``path``; renames it onto ``path`` only on success.

    The temporary file is locked (``flock``) until the rename, so that other writers can tell it
    from one a killed writer left behind; those are removed first (:func:`remove_stale_temps`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):  # no locks on this file system: the age rule applies
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        os.close(fd)
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _damage_reason(exc: BaseException) -> str:
    """What ``torch.load`` failing with ``exc`` says about the file, in a few words."""
    msg = _first_line(exc)
    if "Weights only load failed" in str(exc):
        found = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\.\s|\n|$)", str(exc))
        detail = found.group(1).strip() if found else ""
        if "GLOBAL" in detail:  # a class or function: loading it would run code
            tail = detail.split("GLOBAL", 1)[1].split()
            return f"it refers to code ({tail[0] if tail else '?'}), which a cache never holds"
        return f"garbled: {detail or msg}"
    if "PytorchStreamReader" in msg or "zip archive" in msg:
        return f"truncated or not a torch file: {msg.split('. ')[0]}"
    if msg == type(exc).__name__:
        return f"garbled: {msg}"
    return f"garbled: {type(exc).__name__}: {msg}"


def load_cache(path: str | os.PathLike, valid: Callable[[Any], bool] | None = None,
               what: str = "what graphattn writes there", *, kind: str = "processed cache",
               advice: str = _REBUILT) -> Any:
    """Reads a processed cache with ``torch.load(weights_only=True)`` (tensors and plain containers
    only: a cache can never run code) onto the CPU.

    ``valid(obj)`` checks the content; ``what`` describes the expected content for the message.
    A missing, truncated, empty, garbled or foreign file, or content ``valid`` refuses, raises
    :class:`DamagedCacheError` naming the file; a directory at ``path`` or a file without read
    permission raises :class:`UnreadableDataError`. ``kind`` (what the file is) and ``advice``
    (what to do: by default, delete it) go into the messages.
    """
    path = Path(path)
    if path.is_dir():
        raise UnreadableDataError(f"{path} is a directory, not a {kind}; remove it and "
                                  f"{advice.removeprefix('delete it: ')}")
    try:
        f = open(path, "rb")  # opened apart from torch.load: open errors are not damage
    except FileNotFoundError:
        raise DamagedCacheError(path, "it is missing", advice, kind) from None
    except OSError as exc:
        raise UnreadableDataError(f"cannot read the {kind} {path} ({exc.strerror or _first_line(exc)}); "
                                  f"make it readable, or {advice}") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            raise DamagedCacheError(path, "it is empty", advice, kind)
        try:
            with warnings.catch_warnings():  # garbage can look like an unusual pickle protocol
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                obj = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as exc:  # garbage drives the unpickler into any state: all mean "damaged"
            raise DamagedCacheError(path, _damage_reason(exc), advice, kind) from None
    if valid is not None:
        try:
            ok = bool(valid(obj))
        except Exception:  # a check that trips over foreign content has refused it
            ok = False
        if not ok:
            raise DamagedCacheError(path, f"it holds {_describe(obj)}, not {what}", advice, kind)
    return obj


def _describe(obj: Any) -> str:
    """A few words on what a loaded object is (for messages)."""
    if isinstance(obj, torch.Tensor):
        return f"a {obj.dtype} tensor of shape {list(obj.shape)}"
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)}"
    if isinstance(obj, dict):
        keys = sorted(map(str, obj))[:5]
        return f"a dict with keys {keys}" + (" ..." if len(obj) > 5 else "")
    return f"a {type(obj).__name__}"


def _check_readable(path: Path, name: str) -> None:
    """Raises :class:`UnreadableDataError` if raw file ``path`` of data set ``name`` is a directory
    or cannot be opened."""
    if path.is_dir():
        raise UnreadableDataError(f"{path} is a directory, not a raw file of data set {name!r}; "
                                  f"remove it and put the file there (in the data root, the next "
                                  f"run copies it from the mirror or downloads it)")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UnreadableDataError(f"cannot read {path} ({exc.strerror or _first_line(exc)}), a raw "
                                  f"file of data set {name!r}; make it readable, or delete it and "
                                  f"run again") from None


def _verify(path: Path, expected: str | None, name: str) -> None:
    _check_readable(path, name)
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
