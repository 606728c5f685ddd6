"""Shared behaviour of graphattn's PyG datasets: verified raw files and atomic processed caches that
are read back safely and rebuilt when damaged."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch_geometric.data import Data
from torch_geometric.data.data import BaseData

from graphattn.data.store import (
    DamagedCacheError,
    RebuiltCacheWarning,
    atomic_torch_save,
    fetch,
    load_cache,
)

# files PyG itself writes into ``processed/`` (the ``repr`` of the pre-transform and pre-filter)
_PYG_MARKERS = ("pre_transform.pt", "pre_filter.pt")


def is_collated(obj: Any) -> bool:
    """``obj`` is what :meth:`VerifiedMixin.save` writes: ``(data dict, slices, data class)``."""
    return (isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[0], dict)
            and (obj[1] is None or isinstance(obj[1], dict))
            and isinstance(obj[2], type) and issubclass(obj[2], BaseData))


class CachedDataset:
    """Mix into a PyG ``Dataset`` whose processed files graphattn writes: they are read back with
    :func:`~graphattn.data.store.load_cache` (``weights_only=True``), and a damaged one (truncated,
    empty, garbled, or holding something else) is deleted and rebuilt from the raw files with a
    one-line :class:`~graphattn.data.store.RebuiltCacheWarning` naming it. A cache that is still
    damaged after the rebuild raises :class:`~graphattn.data.store.DamagedCacheError`; a directory
    or an unreadable file at a cache's path raises
    :class:`~graphattn.data.store.UnreadableDataError` (neither is deleted).

    The data set loads its caches with :meth:`load_processed`; PyG's own marker files
    (``pre_transform.pt``, ``pre_filter.pt``) are checked the same way before PyG reads them.
    """

    processed_dir: str
    processed_paths: list[str]
    rebuilt_from: str = "the raw files"  # for the warning: where the cache comes from

    def _drop_processed(self, bad: Path, reason: str, *, everything: bool = False) -> None:
        """Warns that ``bad`` is damaged and deletes it (with ``everything``, every processed file),
        so that PyG's processing step, which skips a data set whose files all exist, rebuilds."""
        warnings.warn(f"{bad} was a damaged processed cache ({reason}); rebuilding it from "
                      f"{self.rebuilt_from}", RebuiltCacheWarning, stacklevel=3)
        bad.unlink(missing_ok=True)
        if everything:
            for p in self.processed_paths:
                Path(p).unlink(missing_ok=True)

    def _process(self) -> None:
        # PyG's ``_process`` reads the marker files with ``weights_only=False``: check them first
        for name in _PYG_MARKERS:
            marker = Path(self.processed_dir) / name
            if marker.exists():
                try:
                    load_cache(marker, lambda o: isinstance(o, str), "the repr of a transform")
                except DamagedCacheError as exc:  # built with an unknown transform: rebuild all
                    self._drop_processed(exc.path, exc.reason, everything=True)
        super()._process()  # type: ignore[misc]
        self.check_processed()

    def check_processed(self) -> None:
        """Runs right after PyG's processing step (which skips a data set whose files exist): a data
        set whose cache PyG reads itself, bypassing :meth:`load_processed`, checks it here."""

    def load_processed(self, path: str | os.PathLike, valid: Callable[[Any], bool] | None = None,
                       what: str = "what graphattn writes there") -> Any:
        """The content of processed file ``path`` (see :func:`~graphattn.data.store.load_cache`
        for ``valid`` and ``what``); rebuilt from the raw files first if it is damaged."""
        try:
            return load_cache(path, valid, what)
        except DamagedCacheError as exc:
            self._drop_processed(exc.path, exc.reason)
        super()._process()  # type: ignore[misc]  # PyG's step: the files are gone, so it rebuilds
        try:
            return load_cache(path, valid, what)
        except DamagedCacheError as exc:
            raise DamagedCacheError(exc.path, f"{exc.reason}, even right after rebuilding it from "
                                              f"{self.rebuilt_from}", "check the disk (free space, "
                                              "errors) and run again") from None


class VerifiedMixin(CachedDataset):
    """Mix into a PyG ``Dataset``: ``download()`` copies/verifies the registry's raw files,
    ``process()`` re-verifies them before reading, and processed files are written atomically and
    read back as :class:`CachedDataset` does (``load`` rebuilds a damaged cache).

    Subclasses set ``registry_key`` and ``_data_base`` (the data root) and may set ``_entry``.
    """

    registry_key: str = ""
    _data_base: str | os.PathLike | None = None
    _entry: dict[str, Any] | None = None

    def fetch_raw(self) -> None:
        fetch(self.registry_key, self._data_base, entry=self._entry)

    def download(self) -> None:
        self.fetch_raw()

    @classmethod
    def save(cls, data_list: Sequence[BaseData], path: str) -> None:
        data, slices = cls.collate(data_list)  # type: ignore[attr-defined]
        atomic_torch_save((data.to_dict(), slices, data.__class__), path)

    def load(self, path: str, data_cls: type[BaseData] = Data) -> None:
        """Reads what :meth:`save` wrote (PyG's ``InMemoryDataset.load``, through
        :meth:`load_processed`)."""
        data, slices, data_cls = self.load_processed(
            path, is_collated, "the (data, slices, class) triple of a collated PyG data set")
        self.data = data_cls.from_dict(data)
        self.slices = slices
