"""The heads trained in the app, remembered across restarts: a small JSON file next to the
run directories, listing each picker entry's backbone, label and head directories (relative
to the file), rewritten atomically (a temporary file renamed over it) after every run."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from otviz.ui.context import HeadSet

log = logging.getLogger("otviz.ui.head_registry")

REGISTRY_FILE = "heads.json"
_LOCK = threading.Lock()


def registry_path(runs_root: Path) -> Path:
    return Path(runs_root) / REGISTRY_FILE


def load_head_sets(runs_root: Path) -> list[HeadSet]:
    """The head sets recorded under ``runs_root``, in the order they were trained; entries
    whose head directories are gone are left out, an unreadable file reads as empty (and
    is logged)."""
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
    return [s for s in sets if all(p.is_dir() for p in s.heads.values())]


def record_head_set(runs_root: Path, head_set: HeadSet) -> None:
    """Add ``head_set`` to the registry under ``runs_root`` (atomically)."""
    path = registry_path(runs_root)
    with _LOCK:
        kept = load_head_sets(runs_root)
        kept.append(head_set)
        records = [
            {"label": s.label, "backbone": s.backbone,
             "heads": {m: os.path.relpath(p, path.parent) for m, p in s.heads.items()}}
            for s in kept
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".heads.", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(records, f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
