"""RefCOCO, RefCOCO+ and RefCOCOg (Yu et al., Mao et al.): referring expressions of COCO
objects, as published with the ``refer`` toolkit.

Layout::

    <root>/refs(<split_by>).p    a pickled list of refs (``refs(unc).p`` for RefCOCO and
                                 RefCOCO+, ``refs(umd).p`` or ``refs(google).p`` for
                                 RefCOCOg); the same list as JSON, ``refs(<split_by>).json``,
                                 is read too
    <root>/instances.json        COCO instances: ``images`` (``id``, ``file_name``) and
                                 ``annotations`` (``id``, ``bbox`` = ``[x, y, w, h]``)
    <images>/<file_name>         the COCO train2014 images (default ``<root>/images``)

Each ref has ``ref_id``, ``ann_id``, ``image_id``, ``split`` (``train``, ``val``,
``testA``, ``testB``, ``test``) and ``sentences`` (each with ``sent``, or ``raw``). Every
sentence is one item: the whole expression is the phrase, the ref's object box its gold
region. The pickle is read by
:func:`~otviz.data.grounding_sets.restricted_pickle.load_plain_pickle`: a pickle that
names any class or function is refused and nothing in it is run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import otviz.data.grounding_sets.items as common
from otviz.data.datasets import EmptyDatasetError, MalformedDatasetError, MissingFilesError
from otviz.data.grounding_sets.restricted_pickle import load_plain_pickle
from otviz.errors import InputError

#: Data set -> the ``split_by`` of its refs file, in order of preference.
SPLIT_BY = {"refcoco": ("unc",), "refcoco+": ("unc",), "refcocog": ("umd", "google")}
IMAGE_FOLDERS = ("images", "train2014")
INSTANCES = "instances.json"


def load_refcoco(
    root: str | os.PathLike, kind: str = "refcoco", split: str = "testA",
    images: str | os.PathLike | None = None, limit: int = 0,
) -> common.GroundingSet:
    """The expressions of the refs of ``split`` on the first ``limit`` (0: all) images, in
    the refs file's order (see the module docstring); files confined to ``root``."""
    if kind not in SPLIT_BY:
        raise InputError(f"unknown referring-expression set {kind!r}; known: "
                         f"{', '.join(SPLIT_BY)}")
    base = Path(root)
    refs_name, refs = _refs(base, kind)
    folder, image_root = common.images_folder(base, images, IMAGE_FOLDERS)
    images_by_id, boxes = _instances(common.annotation_file(base, INSTANCES, "COCO instances"))
    chosen = [(k, r) for k, r in enumerate(refs) if isinstance(r, dict) and r.get("split") == split]
    if not chosen:
        raise EmptyDatasetError(f"{refs_name}: no ref in split {split!r}")
    skipped = common.Skipped()
    items: list[common.GroundingItem] = []
    seen: dict[Any, tuple[Path, tuple[int, int]] | None] = {}
    for k, ref in chosen:
        where = f"{refs_name}: refs[{k}]"
        image_id, ann_id, sentences = _ref_fields(ref, where)
        if image_id not in seen:
            if limit and len(seen) >= limit:
                continue
            seen[image_id] = _image(image_id, images_by_id, folder, image_root, skipped, where)
        located = seen[image_id]
        if located is None:
            continue
        path, size = located
        if ann_id not in boxes:
            raise MalformedDatasetError(f"{where}.ann_id is not an annotation of {INSTANCES}")
        box = common.clip_box(boxes[ann_id], size, skipped, where)
        if box is None:
            continue
        for n, sentence in enumerate(sentences):
            items += _items(sentence, f"{where}.sentences[{n}]", path, size, box,
                            f"{image_id}#{ref.get('ref_id', k)}#{n}", skipped)
    source = {"format": kind, "split": split, "file": refs_name, "images": len(seen),
              "limit": limit}
    return common.GroundingSet(items, skipped, source)


def _refs(base: Path, kind: str) -> tuple[str, list[Any]]:
    names = [f"refs({s}){ext}" for s in SPLIT_BY[kind] for ext in (".p", ".json")]
    for name in names:
        try:
            path = common.annotation_file(base, name, "refs file")
        except MissingFilesError:
            continue
        data = path.read_bytes()
        refs = _json(data, name) if name.endswith(".json") else load_plain_pickle(data, name)
        if not isinstance(refs, list):
            raise MalformedDatasetError(f"{name}: not a list of refs at the top level")
        return name, refs
    raise MissingFilesError("refs file", [" or ".join(names)], confined=True)


def _json(data: bytes, name: str) -> Any:
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise MalformedDatasetError(f"{name}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise MalformedDatasetError(f"{name}: not valid JSON (line {e.lineno}, column "
                                    f"{e.colno})") from None


def _instances(path: Path) -> tuple[dict[Any, str], dict[Any, common.PixelBox]]:
    """``(image id -> file name, annotation id -> half-open box)`` of COCO instances."""
    data = _json(path.read_bytes(), INSTANCES)
    if not isinstance(data, dict):
        raise MalformedDatasetError(f"{INSTANCES}: not an object at the top level")
    images, boxes = {}, {}
    for key in ("images", "annotations"):
        if not isinstance(data.get(key), list):
            raise MalformedDatasetError(f"{INSTANCES}: no list {key!r} at the top level")
    for k, im in enumerate(data["images"]):
        if not isinstance(im, dict) or "id" not in im or not isinstance(im.get("file_name"), str):
            raise MalformedDatasetError(f"{INSTANCES}: images[{k}] lacks id or file_name")
        images[im["id"]] = im["file_name"]
    for k, ann in enumerate(data["annotations"]):
        where = f"{INSTANCES}: annotations[{k}]"
        if not isinstance(ann, dict) or "id" not in ann:
            raise MalformedDatasetError(f"{where} lacks id")
        bbox = ann.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise MalformedDatasetError(f"{where}.bbox is not [x, y, w, h]")
        x, y, w, h = (common.number(v, f"{where}.bbox") for v in bbox)
        boxes[ann["id"]] = (x, y, x + w, y + h)
    return images, boxes


def _ref_fields(ref: dict, where: str) -> tuple[Any, Any, list[Any]]:
    missing = [f for f in ("image_id", "ann_id", "sentences") if f not in ref]
    if missing:
        raise MalformedDatasetError(f"{where} lacks {missing}")
    if not isinstance(ref["sentences"], list):
        raise MalformedDatasetError(f"{where}.sentences is not a list")
    return ref["image_id"], ref["ann_id"], ref["sentences"]


def _image(image_id: Any, images_by_id: dict[Any, str], folder: Path, image_root: Path,
           skipped: common.Skipped, where: str) -> tuple[Path, tuple[int, int]] | None:
    if image_id not in images_by_id:
        raise MalformedDatasetError(f"{where}.image_id is not an image of {INSTANCES}")
    name = images_by_id[image_id]
    path = common.image_file(folder, name, image_root)
    size = common.image_size(path, name, skipped, where)
    return None if path is None or size is None else (path, size)


def _items(sentence: Any, where: str, path: Path, size: tuple[int, int], box: common.PixelBox,
           key: str, skipped: common.Skipped) -> list[common.GroundingItem]:
    text = sentence.get("sent", sentence.get("raw")) if isinstance(sentence, dict) else None
    if not isinstance(text, str):
        raise MalformedDatasetError(f"{where} has no text (sent or raw)")
    caption = common.checked_caption(text, f"{where}: the expression", skipped)
    if caption is None:
        return []
    phrases = common.whole_caption(caption, (box,))
    return [common.GroundingItem(path, size, caption, phrases, key)] if phrases else []
