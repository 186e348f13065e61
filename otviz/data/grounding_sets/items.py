"""What every grounding-set reader yields: images with captions (or referring expressions),
each caption's phrases as word spans with their gold boxes, and what was skipped.

Boxes are pixel boxes ``(x0, y0, x1, y1)`` of the source image, half-open like the world's
(a point ``x`` is inside when ``x0 <= x < x1``), floats (COCO's boxes are fractional).
A phrase's gold region is the union of its boxes (Flickr30k Entities: every box of its
entity); its enclosing box is what box accuracy compares with.

Readers skip what cannot be used and count it by reason (:class:`Skipped`): a phrase whose
entity has no box (``nobndbox``, ``scene``), a box wholly outside its image, an annotation
file that does not parse, a missing image. The first few reasons are kept with the file and
field they concern, so the output says what was left out and why.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from otviz.boundary.images import ImageInputError, header_size, to_rgb
from otviz.boundary.paths import confine, inside
from otviz.boundary.text import check_caption
from otviz.data.datasets import EmptyDatasetError, MalformedDatasetError, MissingFilesError
from otviz.errors import InputError
from otviz.text.words import split_words

PixelBox = tuple[float, float, float, float]
_KEPT_MESSAGES = 20  # reasons kept word for word (the rest are counted only)


@dataclass(frozen=True)
class GoldPhrase:
    """A phrase of a caption: words ``[start, end)`` of ``split_words(caption)``, its text
    and its gold boxes in source-image pixels (at least one)."""

    start: int
    end: int
    text: str
    boxes: tuple[PixelBox, ...]

    @property
    def box(self) -> PixelBox:
        """The enclosing box of :attr:`boxes`."""
        xs0, ys0, xs1, ys1 = zip(*self.boxes, strict=True)
        return (min(xs0), min(ys0), max(xs1), max(ys1))


@dataclass(frozen=True)
class GroundingItem:
    """One caption of one image with its grounded phrases.

    Attributes:
        image: the image file (confined to the set's root).
        size: the image's ``(width, height)`` from its header.
        caption: the caption or referring expression.
        phrases: its phrases with boxes, in word order.
        key: the item's identity in its source (image id and sentence / ref).
    """

    image: Path
    size: tuple[int, int]
    caption: str
    phrases: tuple[GoldPhrase, ...]
    key: str


@dataclass
class Skipped:
    """What a reader left out, counted by reason, with the first messages."""

    counts: Counter = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)

    def add(self, reason: str, message: str) -> None:
        self.counts[reason] += 1
        if len(self.messages) < _KEPT_MESSAGES:
            self.messages.append(message)

    def as_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "messages": list(self.messages)}


@dataclass
class GroundingSet:
    """A grounding data set read from disk: its items, what was skipped, and its source.

    ``source`` names the format, split and files (relative to the root); ``digest`` hashes
    the annotations read and every image's size and modification time, so it changes when
    the data does (the feature cache and the output stamps use it)."""

    items: list[GroundingItem]
    skipped: Skipped
    source: dict[str, Any]

    def __post_init__(self) -> None:
        if not self.items:
            counted = f"; skipped: {dict(self.skipped.counts)}" if self.skipped.counts else ""
            raise EmptyDatasetError(
                f"{self.source.get('format')}: no grounded phrase in split "
                f"{self.source.get('split')!r}{counted}")

    def __len__(self) -> int:
        return len(self.items)

    @property
    def n_phrases(self) -> int:
        return sum(len(it.phrases) for it in self.items)

    def load_image(self, i: int) -> Image.Image:
        """Item ``i``'s image as RGB (raises ``ImageInputError`` when unreadable)."""
        return to_rgb(self.items[i].image, self.items[i].image.name)

    def subset(self, indices: Sequence[int]) -> GroundingSet:
        """The items ``indices`` (same source and skip counts)."""
        return GroundingSet([self.items[i] for i in indices], self.skipped,
                            {**self.source, "items": [int(i) for i in indices]})

    def digest(self) -> str:
        h = hashlib.sha256(json.dumps(self.source, sort_keys=True).encode())
        for it in self.items:
            st = it.image.stat()
            h.update(json.dumps([it.key, it.caption, [[p.start, p.end, p.boxes]
                                                      for p in it.phrases]]).encode())
            h.update(f"\0{it.image.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()


# --------------------------------------------------------------------- helpers for readers
def shown(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` (how messages name files)."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except (OSError, ValueError):
        return path.name


def annotation_file(root: Path, name: str, what: str) -> Path:
    """The file ``root / name``, which must exist inside ``root``."""
    path = confine(root, root, name)
    if path is None or not path.is_file():
        raise MissingFilesError(what, [name], confined=True)
    return path


def image_file(images: Path, name: str, root: Path) -> Path | None:
    """``images / name`` confined to ``root`` (``None`` when refused)."""
    return confine(root, images, name)


#: Image files are looked for under these suffixes (the published JPEG; PNG from
#: :mod:`~otviz.data.grounding_sets.export` with ``lossless``).
IMAGE_SUFFIXES = (".jpg", ".png")


def find_image(folders: Sequence[Path], stem: str, root: Path) -> Path | None:
    """The first existing ``<folder>/<stem><suffix>`` confined to ``root``, or ``None``."""
    for folder in folders:
        for suffix in IMAGE_SUFFIXES:
            path = confine(root, folder, f"{stem}{suffix}")
            if path is not None and path.is_file():
                return path
    return None


def checked_caption(text: str, what: str, skipped: Skipped) -> str | None:
    """``text`` when the caption rule (:func:`~otviz.boundary.text.check_caption`) takes
    it, else ``None`` (counted as an unusable caption)."""
    try:
        return check_caption(text, what)
    except InputError as e:
        skipped.add("unusable caption", str(e))
        return None


def images_folder(root: Path, images: str | os.PathLike | None,
                  defaults: Sequence[str]) -> tuple[Path, Path]:
    """``(images folder, the root image names are confined to)``: ``images`` as given (a
    folder the caller names, e.g. on the command line; names are confined to it) or the
    first of ``defaults`` that exists under ``root`` (confined to ``root``)."""
    if images is not None:
        folder = Path(images)
        if not folder.is_dir():
            raise MissingFilesError("image folder", [folder.name], confined=True)
        return folder, (root if inside(root, folder) else folder)
    for name in defaults:
        folder = confine(root, root, name)
        if folder is not None and folder.is_dir():
            return folder, root
    raise MissingFilesError("image folder", [" or ".join(defaults)], confined=True)


def image_size(path: Path | None, name: str, skipped: Skipped, where: str
               ) -> tuple[int, int] | None:
    """The image's header size, or ``None`` (counted as a missing or unreadable image)."""
    if path is None or not path.is_file():
        skipped.add("missing image", f"{where}: image {name} not found or not allowed")
        return None
    try:
        return header_size(path, name)
    except ImageInputError as e:
        skipped.add("unreadable image", f"{where}: {e}")
        return None


def clip_box(box: PixelBox, size: tuple[int, int], skipped: Skipped, where: str
             ) -> PixelBox | None:
    """``box`` cut to the image; ``None`` (counted) when nothing of it is inside or it is
    empty."""
    w, h = size
    x0, y0, x1, y1 = max(0.0, box[0]), max(0.0, box[1]), min(float(w), box[2]), min(float(h),
                                                                                     box[3])
    if x1 <= x0 or y1 <= y0:
        skipped.add("box outside the image", f"{where}: box {list(box)} has no pixel inside "
                    f"the {w}x{h} image")
        return None
    return (x0, y0, x1, y1)


def number(value: Any, where: str) -> float:
    """A finite number of an annotation, or :class:`MalformedDatasetError` naming ``where``."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise MalformedDatasetError(f"{where} is not a number") from None
    if x != x or x in (float("inf"), float("-inf")):
        raise MalformedDatasetError(f"{where} is not a finite number")
    return x


def word_span(caption: str, start: int, end: int) -> tuple[int, int] | None:
    """The words of ``split_words(caption)`` inside the characters ``[start, end)``, as a
    word span, or ``None`` when no word lies inside."""
    idx = [k for k, w in enumerate(split_words(caption)) if w.start >= start and w.end <= end]
    return (idx[0], idx[-1] + 1) if idx else None


def whole_caption(caption: str, boxes: tuple[PixelBox, ...]) -> tuple[GoldPhrase, ...]:
    """The caption as one phrase (a referring expression, a region description)."""
    n = len(split_words(caption))
    return (GoldPhrase(0, n, caption, boxes),) if n else ()
