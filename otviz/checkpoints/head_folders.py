"""Folders of trained method heads, as ``otviz train --publish DIR`` writes them
(``DIR/<method>/``, or ``DIR/<method>/head/``), or a Hugging Face snapshot folder holding
such a folder (its heads at the top or under ``heads/``).

:func:`read_head_folder` groups a folder's heads by the backbone weights and the reading
(feature source, input size) they were trained on, each group one set a caller offers;
:func:`provenance` says how a set was made from what its heads record (data, steps,
reading, and the date its manifest entry or, without one, its file gives);
:func:`weights_mismatch` is the one message for heads beside weights they were not trained
on. Folders and weight files are named by their last part only (pages never show a
server's folders).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otviz.checkpoints.heads import head_meta
from otviz.checkpoints.manifest import ENTRIES, manifest_key, read_manifest
from otviz.checkpoints.store import META_FILE, CheckpointError

#: Where a Hugging Face snapshot (or a Space repository) may keep its heads.
HEADS_SUBFOLDER = "heads"
MANIFEST = "manifest.json"
#: Hex digits of a weights hash that messages show.
HASH_SHOWN = 8


def find_heads(root: str | os.PathLike) -> list[tuple[str, dict[str, Any], Path]]:
    """``(method, backbone identity, directory)`` of every method-head checkpoint under
    ``root`` (``root/<name>/`` or ``root/<name>/head/``), sorted by directory; unreadable
    ones are skipped."""
    found = []
    for directory in sorted(p for p in Path(root).glob("*") if p.is_dir()):
        for candidate in (directory, directory / "head"):
            try:
                meta = head_meta(candidate)
            except (CheckpointError, OSError, ValueError):
                continue
            found.append((str(meta.get("method")), meta.get("backbone") or {}, candidate))
            break
    return found


def trained_reading(identity: dict[str, Any]) -> tuple[str, int | None]:
    """``(features, image_size)`` a head of backbone ``identity`` was trained on (``last``
    and ``None``, the native size, where unrecorded:
    :func:`~otviz.checkpoints.identity.feature_choice`)."""
    size = identity.get("image_size")
    return str(identity.get("features", "last")), None if size is None else int(size)


@dataclass(frozen=True)
class HeadFolder:
    """The heads of one folder trained on one backbone at one reading.

    Attributes:
        name: the folder as pages name it (:func:`folder_name`).
        heads: method name -> head checkpoint directory.
        backbone: the identity the heads record (:mod:`otviz.checkpoints.identity`).
    """

    name: str
    heads: dict[str, Path]
    backbone: dict[str, Any]


def folder_name(root: str | os.PathLike) -> str:
    """How pages name a heads folder: a Hugging Face cache snapshot
    (``models--OWNER--NAME/snapshots/REVISION``) by its repository ``OWNER/NAME``, any
    other by its last part."""
    path = Path(root).expanduser().resolve()
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return "/".join(path.parent.parent.name.split("--")[1:])
    return path.name


def read_head_folder(root: str | os.PathLike) -> list[HeadFolder]:
    """The head sets of the folder ``root``: its heads (at its top, else under
    :data:`HEADS_SUBFOLDER`) grouped by the weights and reading they were trained on, in
    the order found; a method found twice in a group starts another group.

    Raises:
        CheckpointError: ``root`` is not a folder or holds no readable head.
    """
    path = Path(root).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path.name or root}: not a folder of trained heads")
    found = find_heads(path) or find_heads(path / HEADS_SUBFOLDER)
    if not found:
        raise CheckpointError(
            f"{path.name}: no trained heads in it (expected <method>/{META_FILE} and its "
            "tensors, as otviz train --publish DIR writes)")
    groups: list[tuple[tuple, HeadFolder]] = []
    for method, identity, head in found:
        key = (identity.get("weights"), trained_reading(identity))
        group = next((g for k, g in groups if k == key and method not in g.heads), None)
        if group is None:
            group = HeadFolder(folder_name(path), {}, identity)
            groups.append((key, group))
        group.heads[method] = head
    return [group for _, group in groups]


def source_name(source: str | None) -> str | None:
    """A weights source as pages name it: a path by its last part, a tag as written."""
    if source is None:
        return None
    return Path(source).name if ("/" in source or "\\" in source) else source


def describe_weights(identity: dict[str, Any]) -> str:
    """``"ViT-B-16 / vit-b-16.pt with weights 1a2b3c4d"``: the architecture, where its
    weights came from (a file by its last part, a tag as written) and the start of their
    hash."""
    tags = identity.get("tags") or {}
    source = source_name(tags.get("pretrained"))
    name = str(identity.get("name", "?")) + (f" / {source}" if source else "")
    weights = str(identity.get("weights", ""))[:HASH_SHOWN]
    return f"{name} with weights {weights}" if weights else name


def weights_mismatch(trained_on: dict[str, Any], loaded: dict[str, Any],
                     loaded_name: str) -> str | None:
    """None when heads trained on the backbone of identity ``trained_on`` fit the loaded
    weights of identity ``loaded`` (the same weights hash, or none recorded), else the one
    message naming both: what the heads were trained on and what is loaded
    (``loaded_name``, as the page names it)."""
    saved = trained_on.get("weights")
    if saved is None or saved == loaded.get("weights"):
        return None
    now = str(loaded.get("weights", ""))[:HASH_SHOWN]
    return (f"These heads were trained on {describe_weights(trained_on)}, but this entry "
            f"loads {loaded_name} with weights {now}: their features would mean something "
            "else, so they are not used. Pick the entry of the weights they were trained on, "
            "or a training-free entry.")


@dataclass(frozen=True)
class Provenance:
    """How a head set was made, as its heads record it: the data (a file or folder by its
    last part; the world with its number of pairs), the training steps (a range where the
    heads differ), the reading, and the date or dates published."""

    data: str
    steps: str
    reading: str
    date: str

    @property
    def text(self) -> str:
        """``"world, 4000 pairs, 62-186 steps, features last, 2026-11-26 to 2026-11-28"``
        (unknown parts left out)."""
        return ", ".join(p for p in (self.data, self.steps, self.reading, self.date) if p)


def provenance(heads: dict[str, Path]) -> Provenance:
    """The :class:`Provenance` of the heads ``heads`` (method -> directory); heads whose
    record cannot be read are left out."""
    metas, dates = [], []
    for head in heads.values():
        try:
            metas.append(head_meta(head))
        except (CheckpointError, OSError, ValueError):
            continue
        dates.append(published(head))
    configs = [m.get("train_config") or {} for m in metas]
    data = sorted({_data_name(c) for c in configs} - {""})
    steps = sorted({int(m["metrics"]["steps"]) for m in metas
                    if isinstance((m.get("metrics") or {}).get("steps"), (int, float))})
    readings = sorted({_reading_name(m.get("backbone") or {}) for m in metas})
    return Provenance(" + ".join(data), _span(steps, " steps"), " + ".join(readings),
                      _span(sorted(set(dates) - {""}), "", " to "))


def _reading_name(identity: dict[str, Any]) -> str:
    """``"features clearclip"``, ``"features layer:6 at 336 px"`` (the native size unsaid)."""
    features, size = trained_reading(identity)
    return f"features {features}" + (f" at {size} px" if size else "")


def _data_name(config: dict[str, Any]) -> str:
    data = str(config.get("data", ""))
    if data == "world":
        n = config.get("n_train")
        return f"world, {n} pairs" if n else "world"
    return source_name(data.rstrip("/\\")) or ""


def _span(values: Iterable[Any], unit: str, between: str = "-") -> str:
    values = list(values)
    if not values:
        return ""
    shown = str(values[0]) if len(values) == 1 else f"{values[0]}{between}{values[-1]}"
    return shown + unit


def published(head: Path) -> str:
    """The day (``YYYY-MM-DD``, UTC) the head at ``head`` was published: its entry's
    ``created`` in the manifest ``otviz train --publish`` writes next to the folder (or in
    it), else the day its record file was written."""
    for manifest in (head.parent / MANIFEST, head.parent.parent / MANIFEST):
        try:
            entry = read_manifest(manifest)[ENTRIES].get(manifest_key(manifest, head)) or {}
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        created = str(entry.get("created", ""))
        if created:
            return created[:10]
    try:
        stamp = (head / META_FILE).stat().st_mtime
    except OSError:
        return ""
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d")
