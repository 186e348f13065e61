"""Semantic-segmentation sets in their published layouts, read behind the one input boundary
(every file confined to the set's root, every error naming the file, nothing run).

PASCAL VOC 2012 as mmsegmentation's ``PascalVOCDataset`` lays it out (``configs/_base_/
datasets/pascal_voc12.py``) and the dense-CLIP papers read it (SCLIP, ClearCLIP, NACLIP:
``configs/cfg_voc21.py``, ``cfg_voc20.py``): ``JPEGImages/<id>.jpg``,
``SegmentationClass/<id>.png`` (a palette PNG whose pixel values are the class indices,
0 background, 1-20 the objects, 255 the void band around each object) and
``ImageSets/Segmentation/<split>.txt`` (one id a line; ``val`` by default, 1,449 images).
``voc`` scores the 21 classes (background a class); ``voc20`` the 20 object classes, its
background pixels void (mmseg-based ``PascalVOC20Dataset`` of SCLIP: ``reduce_zero_label``).

Each object class is named to the text tower by SCLIP's ``configs/cls_voc21.txt`` (its first
name a line: "ship" for boat, "table" for diningtable, "television monitor" for tvmonitor);
its first line, 26 stuff words for the background, is not read (the background is decided by
a threshold, :mod:`otviz.eval.segmentation_metrics`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from otviz.boundary.images import ImageInputError, header_size, to_rgb
from otviz.boundary.paths import confine
from otviz.data.datasets import EmptyDatasetError, MalformedDatasetError, MissingFilesError
from otviz.data.grounding_sets.items import (
    GoldPhrase,
    GroundingItem,
    GroundingSet,
    Skipped,
    annotation_file,
    find_image,
    image_size,
    shown,
    word_span,
)

#: mmsegmentation's ``PascalVOCDataset.METAINFO['classes']``: the label order of the masks.
VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car",
               "cat", "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person",
               "pottedplant", "sheep", "sofa", "train", "tvmonitor")
#: The object classes' names as the text tower reads them (SCLIP ``configs/cls_voc21.txt``,
#: the first name of lines 2-21).
VOC_NAMES = ("aeroplane", "bicycle", "bird", "ship", "bottle", "bus", "car", "cat", "chair",
             "cow", "table", "dog", "horse", "motorbike", "person", "pottedplant", "sheep",
             "sofa", "train", "television monitor")
#: The set kinds (``--dataset KIND:PATH``) and whether background is a scored class.
SEGMENTATION_KINDS = {"voc": True, "voc20": False}
VOID = 255
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


@dataclass(frozen=True)
class SegmentationItem:
    """One image of a segmentation set: its file, class-mask file, ``(width, height)`` from
    its header and its id."""

    image: Path
    mask: Path
    size: tuple[int, int]
    key: str


@dataclass
class SegmentationSet:
    """A segmentation set read from disk.

    Attributes:
        items: its images.
        classes: the scored classes in index order (``voc``: background first).
        names: the text of each candidate class (the object classes, in label order).
        background: whether background is a scored class (else its pixels are void).
        skipped: what the reader left out and why.
        source: format, split and files (relative to the root).
    """

    items: list[SegmentationItem]
    classes: tuple[str, ...]
    names: tuple[str, ...]
    background: bool
    skipped: Skipped
    source: dict[str, Any]

    def __post_init__(self) -> None:
        if not self.items:
            raise EmptyDatasetError(f"{self.source.get('format')}: no image with a class mask "
                                    f"in split {self.source.get('split')!r}; skipped: "
                                    f"{dict(self.skipped.counts)}")

    def __len__(self) -> int:
        return len(self.items)

    def load_image(self, i: int) -> Image.Image:
        """Item ``i``'s image as RGB (``ImageInputError`` when unreadable)."""
        return to_rgb(self.items[i].image, self.items[i].image.name)

    def load_labels(self, i: int) -> np.ndarray:
        """Item ``i``'s local labels ``uint8 [H, W]``: the mask's values (0 background,
        ``k`` object class ``k``, :data:`VOID`), background void without a background
        class; :class:`MalformedDatasetError` for a mask that is not a palette or grey
        image of the image's size with values among the labels."""
        item = self.items[i]
        labels = read_class_mask(item.mask, item.mask.name, item.size, len(self.names))
        if not self.background:
            labels = np.where(labels == 0, VOID, labels).astype(np.uint8)
        return labels

    def local_classes(self) -> np.ndarray:
        """The scored class of each local label ``0..len(names)`` (``voc``: itself;
        ``voc20``: ``k - 1``, label 0 being void)."""
        labels = np.arange(len(self.names) + 1)
        return labels if self.background else np.maximum(labels - 1, 0)

    def subset(self, indices: list[int]) -> SegmentationSet:
        return SegmentationSet([self.items[i] for i in indices], self.classes, self.names,
                               self.background, self.skipped,
                               {**self.source, "items": [int(i) for i in indices]})

    def digest(self) -> str:
        """A hash of the source and every image's and mask's name, size and time."""
        h = hashlib.sha256(json.dumps(self.source, sort_keys=True).encode())
        for it in self.items:
            for path in (it.image, it.mask):
                st = path.stat()
                h.update(f"{it.key}\0{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()

    def class_caption(self, separator: str = ", ") -> str:
        """Every candidate class's name, in label order, joined by ``separator``."""
        return separator.join(self.names)

    def as_grounding(self, prompt: str = "{}", separator: str = ", ") -> GroundingSet:
        """The set as a grounding set for the alignment methods: each image with one caption
        listing every candidate class's name (:meth:`class_caption`), each name a phrase
        whose text is ``prompt`` filled with it (what an explainer encodes) and whose box is
        the whole image (unused by the segmentation)."""
        caption = self.class_caption(separator)
        spans, start = [], 0
        for name in self.names:
            span = word_span(caption, start, start + len(name))
            if span is None:
                raise MalformedDatasetError(f"class name {name!r} has no word")
            spans.append(span)
            start += len(name) + len(separator)
        items = [GroundingItem(it.image, it.size, caption, tuple(
            GoldPhrase(s, e, prompt.format(n), ((0.0, 0.0, float(it.size[0]),
                                                 float(it.size[1])),))
            for n, (s, e) in zip(self.names, spans, strict=True)), it.key) for it in self.items]
        return GroundingSet(items, self.skipped, {**self.source, "images": len(items)})


def read_class_mask(path: Path, name: str, size: tuple[int, int], n_objects: int
                    ) -> np.ndarray:
    """The class indices of a mask file, ``uint8 [H, W]``: its header checked
    (:func:`~otviz.boundary.images.header_size`: pixel and aspect limits) before a pixel is
    decoded, then its size against the image's ``size`` and its values against ``0..
    n_objects`` and :data:`VOID`."""
    width, height = header_size(path, name)
    if (width, height) != tuple(size):
        raise MalformedDatasetError(f"{name}: class mask is {width}x{height}, its image "
                                    f"{size[0]}x{size[1]}")
    try:
        with Image.open(path) as mask:
            mode = mask.mode
            labels = np.asarray(mask, dtype=np.uint8).copy() if mode in ("P", "L") else None
    except _DECODE_ERRORS:
        raise ImageInputError(f"{name}: class mask does not decode") from None
    if labels is None:
        raise MalformedDatasetError(f"{name}: a class mask is a palette or grey PNG (mode P "
                                    f"or L), not mode {mode}")
    bad = np.unique(labels[(labels > n_objects) & (labels != VOID)])
    if bad.size:
        raise MalformedDatasetError(f"{name}: class mask holds values {bad[:5].tolist()} "
                                    f"outside 0-{n_objects} and {VOID}")
    return labels


def load_voc(root: str | os.PathLike, split: str = "val", limit: int = 0,
             background: bool = True) -> SegmentationSet:
    """PASCAL VOC 2012 at ``root`` (module docstring), split ``split``, the first ``limit``
    ids (0: all); ``background``: 21 classes, else the 20 object classes."""
    base = Path(root)
    listing = annotation_file(base, f"ImageSets/Segmentation/{split}.txt", "VOC split list")
    images = confine(base, base, "JPEGImages")
    masks = confine(base, base, "SegmentationClass")
    missing = [n for n, d in (("JPEGImages", images), ("SegmentationClass", masks))
               if d is None or not d.is_dir()]
    if missing or images is None or masks is None:
        raise MissingFilesError("VOC folders", missing, confined=True)
    try:
        ids = [line.strip() for line in listing.read_text(encoding="utf-8").splitlines()]
    except (UnicodeDecodeError, OSError):
        raise MalformedDatasetError(f"{shown(listing, base)} is not a text file") from None
    skipped, items = Skipped(), []
    for key in filter(None, ids):
        if limit and len(items) >= limit:
            break
        where = f"{shown(listing, base)}: {key}"
        image = find_image([images], key, base)
        size = image_size(image, key, skipped, where)
        mask = confine(base, masks, f"{key}.png")
        if size is None or image is None:
            continue
        if mask is None or not mask.is_file():
            skipped.add("missing class mask", f"{where}: SegmentationClass/{key}.png not found "
                        "or not allowed")
            continue
        items.append(SegmentationItem(image, mask, size, key))
    classes = VOC_CLASSES if background else VOC_CLASSES[1:]
    return SegmentationSet(items, classes, VOC_NAMES, background, skipped,
                           {"format": "voc" if background else "voc20", "split": split,
                            "list": shown(listing, base)})
