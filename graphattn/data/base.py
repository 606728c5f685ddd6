"""Shared behaviour of graphattn's PyG datasets: verified raw files and atomic processed caches."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torch_geometric.data.data import BaseData

from graphattn.data.store import atomic_torch_save, fetch


class VerifiedMixin:
    """Mix into a PyG ``Dataset``: ``download()`` copies/verifies the registry's raw files,
    ``process()`` re-verifies them before reading, and processed files are written atomically.

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
