"""Flickr30k Entities (Plummer et al.): phrases of Flickr30k captions with their boxes.

Layout (as published)::

    <root>/train.txt, val.txt, test.txt    image ids of each split, one a line
    <root>/Sentences/<id>.txt              one caption a line, phrases in brackets:
                                           ``[/EN#18/people A child] in [/EN#19/clothing a
                                           pink dress] is climbing ...``
    <root>/Annotations/<id>.xml            VOC-style: ``<size>``, then ``<object>``s, each
                                           with one or more ``<name>`` (entity ids) and a
                                           ``<bndbox>`` (``xmin ymin xmax ymax``, 1-based,
                                           inclusive) or ``<nobndbox>1`` or ``<scene>1``
    <images>/<id>.jpg                      the Flickr30k images (default
                                           ``<root>/flickr30k-images``)

A phrase's gold region is every box of its entity. Phrases of entity 0 (``notvisual``)
and of entities with no box (``nobndbox``, ``scene``) are skipped and counted, as are
captions left with no grounded phrase, annotation files that do not parse and missing
images. The XML is read without any document type declaration (one is refused), so no
entity is expanded and nothing outside the file is read.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import otviz.data.grounding_sets.items as common
from otviz.data.datasets import EmptyDatasetError, MalformedDatasetError, MissingFilesError

IMAGE_FOLDERS = ("flickr30k-images", "flickr30k_images", "images")
_PHRASE = re.compile(r"\[/EN#(\d+)((?:/[^\s\]/]+)*)\s+([^\]]*)\]")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_XML_BYTES = 2**20


def load_flickr30k_entities(
    root: str | os.PathLike, split: str = "test", images: str | os.PathLike | None = None,
    limit: int = 0,
) -> common.GroundingSet:
    """The captions of the first ``limit`` (0: all) images of ``split`` with their grounded
    phrases (see the module docstring); every file read is confined to ``root``."""
    base = Path(root)
    split_file = common.annotation_file(base, f"{split}.txt", "split list")
    folder, image_root = common.images_folder(base, images, IMAGE_FOLDERS)
    ids = _split_ids(split_file, common.shown(split_file, base))
    if not ids:
        raise EmptyDatasetError(
            f"{common.shown(split_file, base)}: the split {split!r} lists no image")
    if limit:
        ids = ids[:limit]
    skipped = common.Skipped()
    items: list[common.GroundingItem] = []
    for image_id in ids:
        items += _image_items(base, folder, image_root, image_id, skipped)
    source = {"format": "flickr30k_entities", "split": split, "file": f"{split}.txt",
              "images": len(ids), "limit": limit}
    return common.GroundingSet(items, skipped, source)


def parse_sentence(line: str) -> tuple[str, list[tuple[int, str, int, int]]]:
    """``(caption, [(entity id, text, first char, end char)])``: the caption with the
    bracket markup removed and each bracketed phrase's character span in it."""
    caption, phrases, last = [], [], 0
    length = 0
    for m in _PHRASE.finditer(line):
        before = line[last:m.start()]
        caption.append(before)
        length += len(before)
        text = m.group(3)
        phrases.append((int(m.group(1)), text, length, length + len(text)))
        caption.append(text)
        length += len(text)
        last = m.end()
    caption.append(line[last:])
    return "".join(caption), phrases


def _split_ids(path: Path, name: str) -> list[str]:
    ids = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise MalformedDatasetError(f"{name}: not UTF-8 text") from None
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if not _ID.match(line):
            raise MalformedDatasetError(f"{name}, line {n}: not an image id")
        ids.append(line)
    return ids


def _image_items(base: Path, folder: Path, image_root: Path, image_id: str,
                 skipped: common.Skipped) -> list[common.GroundingItem]:
    sentences = f"Sentences/{image_id}.txt"
    annotations = f"Annotations/{image_id}.xml"
    try:
        lines = common.annotation_file(base, sentences, "sentences").read_text(
            encoding="utf-8").splitlines()
        boxes = _entity_boxes(common.annotation_file(base, annotations, "annotations"),
                              annotations)
    except UnicodeDecodeError:
        skipped.add("malformed annotations", f"{sentences}: not UTF-8 text")
        return []
    except MalformedDatasetError as e:
        skipped.add("malformed annotations", str(e))
        return []
    except MissingFilesError as e:
        skipped.add("missing annotations", str(e))
        return []
    path = common.find_image([folder], image_id, image_root)
    size = common.image_size(path, f"{image_id}.jpg", skipped, f"image {image_id}")
    if path is None or size is None:
        return []
    items = []
    for n, line in enumerate(lines):
        where = f"{sentences}, line {n + 1}"
        item = _item(line, where, boxes, path, size, f"{image_id}#{n}", skipped)
        if item is not None:
            items.append(item)
    return items


def _item(line: str, where: str, boxes: dict[int, list[common.PixelBox]], path: Path,
          size: tuple[int, int], key: str, skipped: common.Skipped
          ) -> common.GroundingItem | None:
    text, marked = parse_sentence(line.strip())
    caption = common.checked_caption(text, f"{where}: the caption", skipped)
    if caption is None:
        return None
    phrases = []
    for entity, text, start, end in marked:
        gold = [b for b in (common.clip_box(b, size, skipped, f"{where}, entity {entity}")
                            for b in boxes.get(entity, [])) if b is not None]
        span = common.word_span(caption, start, end)
        if not gold or span is None:
            skipped.add("phrase without a box", f"{where}: entity {entity} has no box")
            continue
        phrases.append(common.GoldPhrase(span[0], span[1], text, tuple(gold)))
    if not phrases:
        skipped.add("caption without a grounded phrase", f"{where}: no phrase with a box")
        return None
    return common.GroundingItem(path, size, caption, tuple(phrases), key)


def _entity_boxes(path: Path, name: str) -> dict[int, list[common.PixelBox]]:
    """Entity id -> its boxes (half-open, 0-based) of a VOC-style annotation file."""
    data = path.read_bytes()
    if len(data) > _MAX_XML_BYTES:
        raise MalformedDatasetError(f"{name}: over {_MAX_XML_BYTES} bytes")
    if b"<!DOCTYPE" in data.upper() or b"<!ENTITY" in data.upper():
        raise MalformedDatasetError(f"{name}: a document type declaration is not accepted")
    try:
        tree = ET.fromstring(data)
    except ET.ParseError as e:
        raise MalformedDatasetError(f"{name}: not well-formed XML (line {e.position[0]})"
                                    ) from None
    out: dict[int, list[common.PixelBox]] = {}
    for k, obj in enumerate(tree.iter("object")):
        box = obj.find("bndbox")
        if box is None:
            continue  # nobndbox / scene
        where = f"{name}: object {k + 1}"
        coords = [common.number(_text(box, c, where), f"{where}, bndbox/{c}")
                  for c in ("xmin", "ymin", "xmax", "ymax")]
        half_open = (coords[0] - 1, coords[1] - 1, coords[2], coords[3])
        for entity in obj.findall("name"):
            try:
                out.setdefault(int((entity.text or "").strip()), []).append(half_open)
            except ValueError:
                raise MalformedDatasetError(f"{where}, name: not an entity id") from None
    return out


def _text(node: ET.Element, tag: str, where: str) -> str:
    child = node.find(tag)
    if child is None or child.text is None:
        raise MalformedDatasetError(f"{where}: no bndbox/{tag}")
    return child.text
