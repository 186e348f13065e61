"""The folders that uploads are unpacked into, owned by the server that made them.

Each upload is unpacked (:func:`~otviz.boundary.paths.unpack_uploads`) into a folder of its
own under one root inside the app's data folder: a refused upload's folder is removed at
once (:meth:`UploadStore.unpacked`), the folders beyond a size cap are evicted least
recently used first, and a server at start removes the folders of servers that are gone
(:meth:`UploadStore.remove_stale`), with the same housekeeping as the feature cache
(:mod:`otviz.data.disk_lru`). Nothing goes to a new temporary root per start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from otviz.boundary.paths import unpack_uploads
from otviz.data.disk_lru import (
    disk_bytes,
    evict_least_recent,
    last_change_ns,
    owner_alive,
    write_owner,
)

#: Unpacked uploads kept at most, in bytes (least recently used evicted beyond).
DEFAULT_CAP_BYTES = 2 * 2**30
_DATA = "data"


class UploadStore:
    """Unpacked uploads under ``root``, at most ``max_bytes`` of them on disk."""

    def __init__(self, root: str | os.PathLike, max_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def entries(self) -> list[Path]:
        """The unpacked folders, least recently used first."""
        if not self.root.is_dir():
            return []
        found = [d for d in self.root.iterdir() if d.is_dir() and not d.name.startswith(".")]
        return sorted(found, key=last_change_ns)

    @contextlib.contextmanager
    def unpacked(self, files: Sequence[str | os.PathLike]) -> Iterator[Path]:
        """The uploaded ``files`` unpacked into a new folder, given as the root of their data
        for the ``with`` block; the folder is removed when the block raises (a refused
        upload leaves nothing), kept otherwise (and the store cut to its cap)."""
        entry = self.root / uuid.uuid4().hex
        entry.mkdir(parents=True)
        try:
            write_owner(entry)
            yield unpack_uploads(files, entry / _DATA)
        except BaseException:
            shutil.rmtree(entry, ignore_errors=True)
            raise
        self.evict()

    def evict(self) -> list[Path]:
        """Cut the store to its cap, least recently used first (the newest stays)."""
        entries = self.entries()
        sizes = [disk_bytes(d, recursive=True) for d in entries]
        return evict_least_recent(entries, sizes, self.max_bytes)

    def touch(self, data_root: Path) -> None:
        """Mark the folder holding ``data_root`` (a root :meth:`unpacked` gave) used now."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.utime(self.root / data_root.relative_to(self.root).parts[0])

    def remove_stale(self) -> list[Path]:
        """Remove the folders whose server is gone (and interrupted discards)."""
        if not self.root.is_dir():
            return []
        stale = [d for d in self.root.iterdir()
                 if d.is_dir() and (d.name.startswith(".discard.") or not owner_alive(d))]
        for d in stale:
            shutil.rmtree(d, ignore_errors=True)
        return stale
