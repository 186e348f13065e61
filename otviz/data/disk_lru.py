"""Directories on disk with an owner and a last use: the housekeeping that the feature cache,
the store of unpacked uploads and the app's training runs share.

An entry records the process that is writing or using it (:data:`OWNER_FILE`), so a later
server can tell leftovers of a process that is gone from entries in use
(:func:`owner_alive`); entries are discarded by an atomic rename first (:func:`discard`), and
:func:`evict_least_recent` deletes the least recently used ones beyond a size cap,
:func:`evict_oldest_dirs` the oldest folders of a root that no one holds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

OWNER_FILE = "owner.pid"
#: A directory without its owner file is stale after this long (its owner wrote the file
#: right after creating it, unless it died first).
ORPHAN_AGE_S = 60.0


def write_owner(directory: Path) -> None:
    """Record this process as the owner of ``directory``."""
    (directory / OWNER_FILE).write_text(str(os.getpid()))


def owner_alive(directory: Path) -> bool:
    """Whether the process that owns ``directory`` still runs (a directory without an owner
    file counts as alive for :data:`ORPHAN_AGE_S` after its last change)."""
    try:
        pid = int((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        try:
            return time.time() - directory.stat().st_mtime < ORPHAN_AGE_S
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def discard(directory: Path) -> None:
    """Delete ``directory``: renamed out of the way first (atomic), then removed (a
    directory another request removed meanwhile is left as it is)."""
    trash = Path(tempfile.mkdtemp(prefix=".discard.", dir=directory.parent))
    with contextlib.suppress(FileNotFoundError):
        os.rename(directory, trash / "entry")
    shutil.rmtree(trash, ignore_errors=True)


def disk_bytes(directory: Path, recursive: bool = False) -> int:
    """Bytes of the files in ``directory`` (and below it when ``recursive``); files another
    request removes meanwhile (a refused upload's entry) count nothing."""
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for f in directory.rglob("*") if recursive else directory.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if f.is_file() and not f.is_symlink():
                    total += f.stat().st_size
    return total


def last_change_ns(directory: Path) -> int:
    """``directory``'s last change in ns (0 for one removed meanwhile), the order of use."""
    try:
        return directory.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def evict_oldest(entries: Sequence[Path], sizes: Sequence[int], max_bytes: int,
                 keep: Sequence[bool] | None = None) -> list[Path]:
    """Discard ``entries`` (oldest first, with their ``sizes``) until all of them take at
    most ``max_bytes``, skipping those marked in ``keep``. Returns the discarded entries."""
    keep = keep if keep is not None else [False] * len(entries)
    total, deleted = sum(sizes), []
    for entry, size, kept in zip(entries, sizes, keep, strict=True):
        if total <= max_bytes:
            break
        if kept:
            continue
        discard(entry)
        total -= size
        deleted.append(entry)
    return deleted


def evict_least_recent(entries: Sequence[Path], sizes: Sequence[int], max_bytes: int
                       ) -> list[Path]:
    """Discard ``entries`` (least recently used first, with their ``sizes``) until the rest
    take at most ``max_bytes``; the most recently used entry always stays. Returns the
    discarded entries."""
    return evict_oldest(entries, sizes, max_bytes,
                        [k == len(entries) - 1 for k in range(len(entries))])


def dated_dirs(root: Path) -> list[Path]:
    """The folders under ``root`` whose names start with their creation time, oldest first
    (hidden ones, e.g. :func:`discard`'s, left out); none when ``root`` does not exist."""
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def evict_oldest_dirs(root: Path, max_bytes: int, keep: set[Path]) -> list[Path]:
    """Cut :func:`dated_dirs` of ``root`` to ``max_bytes``, oldest first; the folders in
    ``keep`` (resolved paths) stay, and so do those a live process owns (:data:`OWNER_FILE`,
    which their owner removes when it is done with them). Returns the discarded folders."""
    dirs = dated_dirs(root)
    sizes = [disk_bytes(d, recursive=True) for d in dirs]
    kept = [d.resolve() in keep or ((d / OWNER_FILE).is_file() and owner_alive(d))
            for d in dirs]
    return evict_oldest(dirs, sizes, max_bytes, kept)
