"""The checkpoint manifest (``checkpoints/manifest.json``): how every shipped checkpoint was
made, one entry per checkpoint keyed by its path relative to the manifest's folder (e.g.
``heads/conceptot``), with the exact command, wall time and metrics.

:func:`publish_head` copies a finished run's method head into a shipping folder and records
its entry; :func:`update_manifest` merges fields into an entry, keeping every other entry
(and every other field of that entry) as it was. Both write to a temporary path first and
rename, so a crash never leaves a half-written head or manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

FORMAT = "otviz-manifest/1"
ENTRIES = "checkpoints"


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest at ``path`` (an empty one when the file does not exist)."""
    p = Path(path)
    if not p.exists():
        return {"format": FORMAT, ENTRIES: {}}
    data = json.loads(p.read_text(encoding="utf-8"))
    data.setdefault(ENTRIES, {})
    return data


def manifest_key(manifest: str | os.PathLike, checkpoint: str | os.PathLike) -> str:
    """The entry key of ``checkpoint``: its path relative to the manifest's folder (POSIX)."""
    root = Path(manifest).resolve().parent
    return Path(os.path.relpath(Path(checkpoint).resolve(), root)).as_posix()


def update_manifest(path: str | os.PathLike, key: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Merge ``fields`` into the entry ``key`` (created if new) and write the manifest
    atomically; returns the entry."""
    p = Path(path)
    data = read_manifest(p)
    entry = data[ENTRIES].setdefault(key, {})
    entry.update(fields)
    data[ENTRIES] = dict(sorted(data[ENTRIES].items()))
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return entry


def publish_head(
    head: str | os.PathLike,
    target: str | os.PathLike,
    manifest: str | os.PathLike | None,
    fields: dict[str, Any],
) -> Path:
    """Copy the head checkpoint folder ``head`` to ``target`` (replacing it) and, with a
    ``manifest``, record ``fields`` (command, wall time, metrics, ...) under the target's
    key with the time of publication."""
    src, dst = Path(head), Path(target)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        staged = tmp / "head"
        shutil.copytree(src, staged)
        if dst.exists():
            shutil.rmtree(dst)
        os.rename(staged, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if manifest is not None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        update_manifest(manifest, manifest_key(manifest, dst), {**fields, "created": stamp})
    return dst
