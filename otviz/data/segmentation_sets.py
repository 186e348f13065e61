"""Semantic-segmentation sets in their published layouts, read behind the one input boundary
(every file confined to the set's root, every error naming the file, nothing run).

Each set as mmsegmentation's dataset class lays it out and the dense-CLIP papers read it
(SCLIP, ClearCLIP, NACLIP: ``configs/cfg_<set>.py``), its classes named as SCLIP names them
(:mod:`otviz.data.segmentation_classes`). Masks are single-channel PNGs (palette or grey)
whose pixel values are labels, 255 void. Label 0 is read one of three ways
(:class:`SegmentationLayout`'s ``zero``):

* ``"background"``: a scored background class, decided by a threshold (VOC21, Context60,
  COCO-Object);
* ``"void"``: ignored, label ``k`` the class ``k - 1`` (mmseg's ``reduce_zero_label``: VOC20,
  Context59, ADE20K);
* ``"class"``: the first class, label ``k`` the class ``k`` (train-id masks: Cityscapes,
  COCO-Stuff).

Sets with a split list (VOC, Context) read the ids of ``<listing>``; the others every mask
under their mask folder (sorted; symbolic links to folders are not followed).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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
from otviz.data.segmentation_classes import (
    ADE20K_NAMES,
    CITYSCAPES_NAMES,
    COCO_OBJECT_NAMES,
    COCO_STUFF_NAMES,
    CONTEXT_NAMES,
    VOC_CLASSES,
    VOC_NAMES,
)

VOID = 255
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


@dataclass(frozen=True)
class SegmentationLayout:
    """Where a set's files are and what its labels mean (module docstring): image and mask
    folders (``{split}`` filled in), their file suffixes, the split list (``None``: every
    mask under the mask folder), the default split, the candidate classes' names, the scored
    classes and how label 0 is read."""

    images: str
    masks: str
    image_suffix: str
    mask_suffix: str
    listing: str | None
    split: str
    names: tuple[str, ...]
    classes: tuple[str, ...]
    zero: Literal["background", "void", "class"]


_VOC = dict(images="JPEGImages", masks="SegmentationClass", image_suffix=".jpg",
            mask_suffix=".png", listing="ImageSets/Segmentation/{split}.txt", split="val",
            names=VOC_NAMES)
_CONTEXT = dict(images="JPEGImages", masks="SegmentationClassContext", image_suffix=".jpg",
                mask_suffix=".png", listing="ImageSets/SegmentationContext/{split}.txt",
                split="val", names=CONTEXT_NAMES)
#: COCO-Object (GroupViT's and TCL's background plus COCO's 80 object classes) as SCLIP,
#: ClearCLIP and NACLIP read it: SCLIP's ``custom_datasets.py`` lines 42-75
#: (``COCOObjectDataset``: ``img_suffix='.jpg'``, ``seg_map_suffix='_instanceTrainIds.png'``,
#: 0 background, ``k`` the ``k``-th object class, 255 void; masks written from COCO-Stuff
#: 164k by GroupViT's converter, NACLIP's ``datasets/cvt_coco_object.py``: thing ids 0-90 to
#: 1-80, stuff and unlabelled ids to 0) and ``configs/cfg_coco_object.py``
#: lines 11-33 (``reduce_zero_label=False``, ``img_path='images/val2017'``,
#: ``seg_map_path='annotations/val2017'``; the same in ClearCLIP's and NACLIP's
#: ``configs/cfg_coco_object.py``). Their background threshold (``prob_thd`` on the softmax
#: over classes): 0.1 in SCLIP's (line 7) and NACLIP's (line 6), 0.4 in ClearCLIP's (line 6);
#: otviz applies its own rule to every set (:mod:`otviz.eval.segmentation_metrics`).
COCO_OBJECT = SegmentationLayout("images/{split}", "annotations/{split}", ".jpg",
                                 "_instanceTrainIds.png", None, "val2017", COCO_OBJECT_NAMES,
                                 ("background", *COCO_OBJECT_NAMES), "background")
#: ``--dataset KIND:PATH`` -> the layout (mmseg's ``PascalVOCDataset``,
#: ``PascalContextDataset(59)``, ``ADE20KDataset``, ``CityscapesDataset``,
#: ``COCOStuffDataset``; SCLIP's ``COCOObjectDataset``, :data:`COCO_OBJECT`).
LAYOUTS: dict[str, SegmentationLayout] = {
    "voc": SegmentationLayout(**_VOC, classes=VOC_CLASSES, zero="background"),
    "voc20": SegmentationLayout(**_VOC, classes=VOC_CLASSES[1:], zero="void"),
    "context60": SegmentationLayout(**_CONTEXT, classes=("background", *CONTEXT_NAMES),
                                    zero="background"),
    "context59": SegmentationLayout(**_CONTEXT, classes=CONTEXT_NAMES, zero="void"),
    "ade20k": SegmentationLayout("images/{split}", "annotations/{split}", ".jpg", ".png", None,
                                 "validation", ADE20K_NAMES, ADE20K_NAMES, "void"),
    "cityscapes": SegmentationLayout("leftImg8bit/{split}", "gtFine/{split}", "_leftImg8bit.png",
                                     "_gtFine_labelTrainIds.png", None, "val",
                                     CITYSCAPES_NAMES, CITYSCAPES_NAMES, "class"),
    "coco-stuff": SegmentationLayout("images/{split}", "annotations/{split}", ".jpg",
                                     "_labelTrainIds.png", None, "val2017", COCO_STUFF_NAMES,
                                     COCO_STUFF_NAMES, "class"),
    "coco-object": COCO_OBJECT,
}
#: The set kinds of ``--dataset``.
SEGMENTATION_KINDS = tuple(LAYOUTS)


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
        layout: what its labels mean and its classes' names.
        skipped: what the reader left out and why.
        source: format, split and files (relative to the root).
    """

    items: list[SegmentationItem]
    layout: SegmentationLayout
    skipped: Skipped
    source: dict[str, Any]

    def __post_init__(self) -> None:
        if not self.items:
            raise EmptyDatasetError(f"{self.source.get('format')}: no image with a class mask "
                                    f"in split {self.source.get('split')!r}; skipped: "
                                    f"{dict(self.skipped.counts)}")

    def __len__(self) -> int:
        return len(self.items)

    @property
    def names(self) -> tuple[str, ...]:
        """The candidate classes' text, in label order."""
        return self.layout.names

    @property
    def classes(self) -> tuple[str, ...]:
        """The scored classes, in index order."""
        return self.layout.classes

    @property
    def background(self) -> bool:
        """Whether label 0 is a scored background class (decided by a threshold)."""
        return self.layout.zero == "background"

    def load_image(self, i: int) -> Image.Image:
        """Item ``i``'s image as RGB (``ImageInputError`` when unreadable)."""
        return to_rgb(self.items[i].image, self.items[i].image.name)

    def load_labels(self, i: int) -> np.ndarray:
        """Item ``i``'s local labels ``uint8 [H, W]``: 0 background, ``k`` candidate ``k - 1``
        (:attr:`names`), :data:`VOID` (module docstring);
        :class:`MalformedDatasetError` for a mask that is not a palette or grey image of the
        image's size with values among the labels."""
        item = self.items[i]
        zero = self.layout.zero
        top = len(self.names) - (zero == "class")
        labels = read_class_mask(item.mask, item.mask.name, item.size, top)
        if zero == "void":
            return np.where(labels == 0, VOID, labels).astype(np.uint8)
        if zero == "class":
            return np.where(labels == VOID, VOID, labels.astype(np.int16) + 1).astype(np.uint8)
        return labels

    def local_classes(self) -> np.ndarray:
        """The scored class of each local label ``0..len(names)``: itself with a background
        class, else ``k - 1`` (local 0 never occurs)."""
        labels = np.arange(len(self.names) + 1)
        return labels if self.background else np.maximum(labels - 1, 0)

    def subset(self, indices: list[int]) -> SegmentationSet:
        return SegmentationSet([self.items[i] for i in indices], self.layout, self.skipped,
                               {**self.source, "items": [int(i) for i in indices]})

    def digest(self) -> str:
        """A hash of the source and every image's and mask's name, size and time."""
        h = hashlib.sha256(json.dumps(self.source, sort_keys=True).encode())
        for it in self.items:
            for path in (it.image, it.mask):
                st = path.stat()
                h.update(f"{it.key}\0{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()

    def as_grounding(self, prompt: str = "{}", chunks: list[tuple[int, int]] | None = None,
                     separator: str = ", ", template: str = "{}") -> GroundingSet:
        """The set as a grounding set for the alignment methods: per image, one caption per
        chunk ``(start, end)`` of the candidate classes (default: one chunk of all), listing
        their names, each filled into ``template`` (e.g. ``"a photo of a {}."``), joined by
        ``separator``; each name's words a phrase whose text is ``prompt`` filled with it
        (what an explainer encodes) and whose box is the whole image (unused by the
        segmentation). Items run image by image, chunk by chunk."""
        chunks = chunks or [(0, len(self.names))]
        before = template.index("{}")
        captions = []
        for start, end in chunks:
            names = self.names[start:end]
            pieces = [template.format(n) for n in names]
            caption = separator.join(pieces)
            spans, at = [], 0
            for name, piece in zip(names, pieces, strict=True):
                span = word_span(caption, at + before, at + before + len(name))
                if span is None:
                    raise MalformedDatasetError(f"class name {name!r} has no word")
                spans.append(span)
                at += len(piece) + len(separator)
            captions.append((caption, names, spans))
        items = [GroundingItem(it.image, it.size, caption, tuple(
            GoldPhrase(s, e, prompt.format(n), ((0.0, 0.0, float(it.size[0]),
                                                 float(it.size[1])),))
            for n, (s, e) in zip(names, spans, strict=True)), f"{it.key}#{k}")
            for it in self.items for k, (caption, names, spans) in enumerate(captions)]
        return GroundingSet(items, self.skipped, {**self.source, "images": len(self.items),
                                                  "chunks": [list(c) for c in chunks],
                                                  "template": template})


def read_class_mask(path: Path, name: str, size: tuple[int, int], top: int) -> np.ndarray:
    """The labels of a mask file, ``uint8 [H, W]``: its header checked
    (:func:`~otviz.boundary.images.header_size`: pixel and aspect limits) before a pixel is
    decoded, then its size against the image's ``size`` and its values against ``0..top``
    and :data:`VOID`."""
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
    bad = np.unique(labels[(labels > top) & (labels != VOID)])
    if bad.size:
        raise MalformedDatasetError(f"{name}: class mask holds values {bad[:5].tolist()} "
                                    f"outside 0-{top} and {VOID}")
    return labels


def load_segmentation_set(kind: str, root: str | os.PathLike, split: str = "", limit: int = 0
                          ) -> SegmentationSet:
    """The set ``kind`` (:data:`LAYOUTS`) at ``root``, split ``split`` (``""``: the layout's),
    its first ``limit`` images (0: all)."""
    layout = LAYOUTS[kind]
    split = split or layout.split
    base = Path(root)
    images = confine(base, base, layout.images.format(split=split))
    masks = confine(base, base, layout.masks.format(split=split))
    missing = [f.format(split=split) for f, d in ((layout.images, images), (layout.masks, masks))
               if d is None or not d.is_dir()]
    if missing or images is None or masks is None:
        raise MissingFilesError(f"{kind} folders", missing, confined=True)
    skipped, items = Skipped(), []
    for key, where in _keys(base, layout, split, masks):
        if limit and len(items) >= limit:
            break
        if layout.listing is not None:
            image = find_image([images], key, base)
        else:
            image = confine(base, images, key + layout.image_suffix)
        size = image_size(image, key, skipped, where)
        mask = confine(base, masks, key + layout.mask_suffix)
        if size is None or image is None:
            continue
        if mask is None or not mask.is_file():
            skipped.add("missing class mask", f"{where}: class mask of {key} not found or not "
                        "allowed")
            continue
        items.append(SegmentationItem(image, mask, size, key))
    return SegmentationSet(items, layout, skipped, {"format": kind, "split": split})


def _keys(base: Path, layout: SegmentationLayout, split: str, masks: Path
          ) -> list[tuple[str, str]]:
    """``(key, where)`` of the set's images: the ids of its split list, or every mask file
    under ``masks`` (relative path without the mask suffix)."""
    if layout.listing is not None:
        listing = annotation_file(base, layout.listing.format(split=split), "split list")
        try:
            lines = listing.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            raise MalformedDatasetError(f"{shown(listing, base)} is not a text file") from None
        return [(k, f"{shown(listing, base)}: {k}") for k in (x.strip() for x in lines) if k]
    found = []
    for folder, dirs, files in os.walk(masks, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(layout.mask_suffix):
                rel = Path(folder, name).relative_to(masks).as_posix()
                found.append((rel[: -len(layout.mask_suffix)], shown(Path(folder, name), base)))
    return found

