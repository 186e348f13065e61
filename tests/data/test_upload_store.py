"""The store of unpacked uploads: a refused upload leaves nothing, the least recently used
folders go beyond the cap, the folders of servers that are gone go at start."""

from __future__ import annotations

import os

import pytest

from otviz.data.disk_lru import OWNER_FILE, discard, disk_bytes, last_change_ns
from otviz.data.upload_store import UploadStore
from otviz.errors import InputError


def _files(tmp_path, name: str, size: int) -> list[str]:
    path = tmp_path / "in" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"x" * size)
    return [str(path)]


def test_refused_uploads_leave_nothing(tmp_path):
    store = UploadStore(tmp_path / "store")
    with pytest.raises(InputError, match="refused"):
        with store.unpacked(_files(tmp_path, "a.csv", 10)) as root:
            assert (root / "a.csv").is_file()
            raise InputError("refused")
    assert store.entries() == []


def test_least_recently_used_folders_go_past_the_cap(tmp_path):
    store = UploadStore(tmp_path / "store", max_bytes=250)
    roots = []
    for k in range(3):
        with store.unpacked(_files(tmp_path, f"{k}.csv", 100)) as root:
            roots.append(root)
        os.utime(root.parent, (k, k))  # made in order, long ago
    # three 100-byte folders (plus owner files) against a 250-byte cap: the oldest went
    assert [r.parent for r in roots[1:]] == store.entries()
    store.touch(roots[1])  # used now: the next eviction takes the other one
    with store.unpacked(_files(tmp_path, "3.csv", 100)):
        pass
    assert roots[1].parent in store.entries() and roots[2].parent not in store.entries()


def test_folders_of_gone_servers_are_removed_at_start(tmp_path):
    store = UploadStore(tmp_path / "store")
    with store.unpacked(_files(tmp_path, "a.csv", 10)) as mine:
        pass
    with store.unpacked(_files(tmp_path, "b.csv", 10)) as gone:
        pass
    (gone.parent / OWNER_FILE).write_text(str(2**22 + 12345))  # no such process
    assert store.remove_stale() == [gone.parent]
    assert store.entries() == [mine.parent]


def test_an_entry_removed_by_another_request_meanwhile_is_skipped(tmp_path):
    """Requests unpack and refuse uploads at once: sizing, ordering and discarding an entry
    another request just removed count it as empty instead of failing."""
    gone = tmp_path / "gone"
    assert disk_bytes(gone, recursive=True) == 0 and last_change_ns(gone) == 0
    discard(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    kept = tmp_path / "kept"
    (kept / "a").mkdir(parents=True)
    (kept / "a" / "f.bin").write_bytes(b"x" * 10)
    assert disk_bytes(kept, recursive=True) == 10 and last_change_ns(kept) > 0
