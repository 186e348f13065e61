"""The heads trained in the app, remembered across restarts: a small JSON file next to the
run directories, listing each picker entry's backbone, label and head directories (relative
to the file), rewritten atomically (a temporary file renamed over it) after every run, under
a file lock that every server sharing the folder takes: each label is picked unique in the
file, so a restart offers every head under the label it had."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path

from otviz.ui.context import AppContext, HeadSet, unique_label

try:
    import fcntl
except ImportError:  # no file locks (Windows): one server per runs folder there
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("otviz.ui.head_registry")

REGISTRY_FILE = "heads.json"
LOCK_FILE = ".heads.lock"
_LOCK = threading.Lock()


def registry_path(runs_root: Path) -> Path:
    return Path(runs_root) / REGISTRY_FILE


def load_head_sets(runs_root: Path, complete_only: bool = True) -> list[HeadSet]:
    """The head sets recorded under ``runs_root``, in the order they were trained; entries
    whose head directories are gone are left out (unless not ``complete_only``), an
    unreadable file reads as empty (and is logged)."""
    path = registry_path(runs_root)
    if not path.is_file():
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        sets = [HeadSet(str(r["label"]), str(r["backbone"]),
                        {str(m): path.parent / str(p) for m, p in r["heads"].items()})
                for r in records]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.warning("the head registry %s is unreadable; no trained heads restored", path,
                    exc_info=True)
        return []
    return [s for s in sets if _complete(s) or not complete_only]


def _complete(head_set: HeadSet) -> bool:
    return all(p.is_dir() for p in head_set.heads.values())


@contextlib.contextmanager
def _locked(runs_root: Path) -> Iterator[None]:
    """The registry under ``runs_root`` held by this thread and process alone: a thread lock,
    and an exclusive ``flock`` on :data:`LOCK_FILE` that other servers sharing the folder
    take too (where ``fcntl`` exists)."""
    root = Path(runs_root)
    root.mkdir(parents=True, exist_ok=True)
    with _LOCK, open(root / LOCK_FILE, "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _write(runs_root: Path, sets: list[HeadSet]) -> None:
    """Write the registry under ``runs_root`` atomically (a temporary file renamed over)."""
    path = registry_path(runs_root)
    records = [
        {"label": s.label, "backbone": s.backbone,
         "heads": {m: os.path.relpath(p, path.parent) for m, p in s.heads.items()}}
        for s in sets
    ]
    fd, tmp = tempfile.mkstemp(prefix=".heads.", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_head_set(runs_root: Path, head_set: HeadSet, taken: Collection[str] = (),
                    keep: int | None = None) -> tuple[HeadSet, list[HeadSet]]:
    """Add ``head_set`` to the registry under ``runs_root`` under a label that no recorded set
    on its backbone (of any server sharing the folder) and nothing in ``taken`` has
    (:func:`~otviz.ui.context.unique_label`), so that a label never names two heads, across
    restarts and servers. With ``keep``, only the newest ``keep`` sets stay recorded.
    Returns the set as recorded and the sets retired to make room (oldest first)."""
    with _locked(runs_root):
        kept = load_head_sets(runs_root, complete_only=False)
        used = {s.label for s in kept if s.backbone == head_set.backbone} | set(taken)
        recorded = replace(head_set, label=unique_label(head_set.label, used))
        sets = [s for s in kept if _complete(s)] + [recorded]
        cut = max(0, len(sets) - keep) if keep is not None else 0
        _write(runs_root, sets[cut:])
    return recorded, sets[:cut]


def register_head_set(ctx: AppContext, runs_root: Path | None, backbone: str, label: str,
                      heads: dict[str, Path], keep: int | None = None) -> str:
    """Offer ``heads`` on ``backbone`` as a picker entry of ``ctx``, recorded first in the
    registry under ``runs_root`` (when given) under a label unique there and in ``ctx``;
    beyond ``keep`` recorded sets the oldest leave the registry and the picker (their run
    directories may then be evicted). Returns the picker entry."""
    if runs_root is not None:
        recorded, retired = record_head_set(runs_root, HeadSet(label, backbone, heads),
                                            ctx.head_labels(backbone), keep)
        label = recorded.label
        for old in retired:
            ctx.remove_head_set(old.backbone, old.label)
    return ctx.add_head_set(backbone, label, heads)
