"""Grounding data sets on disk: images, captions (or referring expressions), phrase word
spans and gold boxes, read behind the one input boundary (every file confined to the set's
root, every error naming the file and field, nothing from the data ever run).

One module per published format: :mod:`~otviz.data.grounding_sets.flickr30k` (Flickr30k
Entities), :mod:`~otviz.data.grounding_sets.refcoco` (RefCOCO, RefCOCO+, RefCOCOg),
:mod:`~otviz.data.grounding_sets.visual_genome` (region descriptions);
:mod:`~otviz.data.grounding_sets.export` writes a world draw in each of them.
:func:`load_grounding_set` reads any by its kind.
"""

from __future__ import annotations

import os
from pathlib import Path

from otviz.data.grounding_sets.flickr30k import load_flickr30k_entities
from otviz.data.grounding_sets.items import GoldPhrase, GroundingItem, GroundingSet, Skipped
from otviz.data.grounding_sets.refcoco import SPLIT_BY, load_refcoco
from otviz.data.grounding_sets.visual_genome import load_visual_genome
from otviz.errors import InputError

KINDS = ("flickr30k", *SPLIT_BY, "vg")
#: The split read (and written by the exporter) when none is named.
DEFAULT_SPLITS = {"flickr30k": "test", "refcoco": "testA", "refcoco+": "testA",
                  "refcocog": "test", "vg": "all"}

__all__ = ["DEFAULT_SPLITS", "KINDS", "GoldPhrase", "GroundingItem", "GroundingSet", "Skipped",
           "detect_layout", "load_grounding_set", "parse_dataset_spec"]


def parse_dataset_spec(spec: str) -> tuple[str, str]:
    """``"KIND:PATH"`` as ``(kind, path)``; :class:`InputError` naming the kinds."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS or not path:
        raise InputError(f"--dataset takes KIND:PATH with KIND one of {', '.join(KINDS)}")
    return kind, path


def detect_layout(root: str | os.PathLike) -> tuple[str, str] | None:
    """``(kind, split)`` of the grounding layout at the top of folder ``root`` (Flickr30k
    Entities: ``Sentences/`` and ``Annotations/``, split ``test`` when listed, else ``val``
    or ``train``; a refs file with ``instances.json``: ``refcoco``, its split by the refs
    file (``testA`` for ``unc``, ``test`` for ``umd``, ``val`` for ``google``);
    ``region_descriptions.json``: ``vg``, ``all``), or ``None``. Looks only at names
    directly in ``root``."""
    base = Path(root)
    if (base / "Sentences").is_dir() and (base / "Annotations").is_dir():
        split = next((s for s in ("test", "val", "train") if (base / f"{s}.txt").is_file()),
                     "test")
        return "flickr30k", split
    if (base / "instances.json").is_file():
        for split_by, split in (("unc", "testA"), ("umd", "test"), ("google", "val")):
            if any((base / f"refs({split_by}){ext}").is_file() for ext in (".p", ".json")):
                return ("refcoco" if split_by == "unc" else "refcocog"), split
    if (base / "region_descriptions.json").is_file():
        return "vg", "all"
    return None


def load_grounding_set(
    kind: str, root: str | os.PathLike, split: str, images: str | os.PathLike | None = None,
    limit: int = 0,
) -> GroundingSet:
    """The set ``kind`` (one of :data:`KINDS`) at ``root``, split ``split``, on the first
    ``limit`` images (0: all)."""
    if kind == "flickr30k":
        return load_flickr30k_entities(root, split, images, limit)
    if kind == "vg":
        return load_visual_genome(root, split, images, limit)
    if kind in SPLIT_BY:
        return load_refcoco(root, kind, split, images, limit)
    raise InputError(f"unknown grounding set {kind!r}; known: {', '.join(KINDS)}")
