"""Sliding-window reading of a segmentation set's images, as the dense-CLIP papers read them:
mmsegmentation's ``slide_inference`` (``mmseg/models/segmentors/encoder_decoder.py``) on the
image resized by ``Resize(scale=(2048, SHORT), keep_ratio=True)`` (SCLIP's
``configs/cfg_voc21.py``: SHORT 336, ``slide_crop`` 224, ``slide_stride`` 112).

Each image is resized so that its shorter side is ``short`` (its longer side at most 2048),
cut into ``crop`` x ``crop`` windows every ``stride`` pixels (the last window of a row or
column flush with the edge, mmseg's rule), each window read as its own image; a class's map
is each window's map drawn on the window's pixels, averaged where windows overlap (mmseg
sums the windows' logits and divides by the count), then resized to the image's own size
(bilinear) where it is scored. Without a window (:data:`WHOLE`) an image is one window: the
whole image at its own size, resized to the model's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from otviz.data.grounding_sets import GoldPhrase, GroundingItem, GroundingSet
from otviz.errors import InputError
from otviz.eval.segmentation import PixelMaps, picked
from otviz.patch_grid.tokens import TokenGeometry

#: mmseg's ``Resize(scale=(2048, short), keep_ratio=True)``: the longer side at most this.
LONG = 2048
WindowBox = tuple[int, int, int, int]


@dataclass(frozen=True)
class SlideWindow:
    """``short``: the shorter side the image is resized to; ``crop``, ``stride``: the windows'
    side and step, in pixels of the resized image."""

    short: int
    crop: int
    stride: int

    @classmethod
    def parse(cls, text: str) -> SlideWindow | None:
        """``"SHORT:CROP:STRIDE"`` (e.g. ``"336:224:112"``), ``None`` for ``""``;
        :class:`InputError` naming ``--slide`` for anything else."""
        if not text.strip():
            return None
        parts = text.split(":")
        if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise InputError(f"--slide takes SHORT:CROP:STRIDE in pixels (e.g. 336:224:112), "
                             f"not {text[:40]!r}")
        short, crop, stride = (int(p) for p in parts)
        if stride > crop:
            raise InputError(f"--slide: a stride ({stride}) over the crop ({crop}) leaves "
                             "pixels unread")
        return cls(short, crop, stride)

    def scaled_size(self, width: int, height: int) -> tuple[int, int]:
        """The image's ``(width, height)`` resized (mmseg's keep-ratio rule, rounded)."""
        factor = min(self.short / min(width, height), LONG / max(width, height))
        return max(1, round(width * factor)), max(1, round(height * factor))

    def boxes(self, width: int, height: int) -> list[WindowBox]:
        """The windows ``(x0, y0, x1, y1)`` over a ``width x height`` image, row by row."""

        def starts(side: int) -> list[tuple[int, int]]:
            n = max(side - self.crop + self.stride - 1, 0) // self.stride + 1
            out = []
            for k in range(n):
                end = min(k * self.stride + self.crop, side)
                out.append((max(end - self.crop, 0), end))
            return out

        return [(x0, y0, x1, y1) for y0, y1 in starts(height) for x0, x1 in starts(width)]


@dataclass(frozen=True)
class Windows:
    """One image's windows: the size it is resized to and each window's box there."""

    size: tuple[int, int]
    boxes: list[WindowBox]


def image_windows(size: tuple[int, int], slide: SlideWindow | None) -> Windows:
    """The windows of an image of ``size`` (one, the whole image, without ``slide``)."""
    if slide is None:
        return Windows(size, [(0, 0, *size)])
    scaled = slide.scaled_size(*size)
    return Windows(scaled, slide.boxes(*scaled))


@dataclass
class WindowedSet(GroundingSet):
    """A grounding set whose item ``i`` shows only a window of its image: the image resized
    to ``windows[i][0]`` and cut to the box ``windows[i][1]``."""

    windows: list[tuple[tuple[int, int], WindowBox]] = field(default_factory=list)

    def load_image(self, i: int) -> Image.Image:
        size, box = self.windows[i]
        image = super().load_image(i)
        if image.size != size:
            image = image.resize(size, Image.Resampling.BICUBIC)
        return image if box == (0, 0, *size) else image.crop(box)


def windowed(items: Sequence[GroundingItem], windows: Sequence[Windows], source: dict,
             base: GroundingSet) -> WindowedSet:
    """``items[n]`` (the captions of image ``n``, chunk by chunk) once per window of
    ``windows[n]``, each its window's size, keyed ``<item key>@<window>``; items run image by
    image, window by window, chunk by chunk."""
    out, shown = [], []
    chunks = len(items) // max(1, len(windows))
    for n, own in enumerate(windows):
        for w, box in enumerate(own.boxes):
            for item in items[n * chunks : (n + 1) * chunks]:
                width, height = box[2] - box[0], box[3] - box[1]
                out.append(GroundingItem(item.image, (width, height), item.caption, tuple(
                    GoldPhrase(p.start, p.end, p.text, ((0.0, 0.0, float(width),
                                                         float(height)),))
                    for p in item.phrases), f"{item.key}@{w}"))
                shown.append((own.size, box))
    return WindowedSet(out, base.skipped, source, shown)


def pasted_maps(maps: Tensor, geometry: TokenGeometry, windows: Sequence[Windows],
                rows: Sequence[Sequence[list[int]]], labels_size: Sequence[tuple[int, int]]
                ) -> PixelMaps:
    """Image ``j``'s ``[k, H, W]`` class maps from ``[P, N]`` token maps: window ``w``'s
    candidates' maps (``rows[j][w][c]``: the query row of class ``c``, -1: none, an empty
    map) drawn on its pixels, averaged over the windows covering a pixel, resized to the
    labels' ``(H, W)`` (``labels_size[j]``)."""

    def draw(j: int, _image: object) -> Tensor:
        own = windows[j]
        width, height = own.size
        k = len(rows[j][0])
        total = torch.zeros(k, height, width, dtype=torch.float64)
        count = torch.zeros(height, width, dtype=torch.float64)
        for (x0, y0, x1, y1), cand in zip(own.boxes, rows[j], strict=True):
            total[:, y0:y1, x0:x1] += geometry.upsample(picked(maps, cand), x1 - x0, y1 - y0)
            count[y0:y1, x0:x1] += 1
        mean = total / count.clamp_min(1)
        h, w = labels_size[j]
        if (h, w) == (height, width):
            return mean
        return F.interpolate(mean[None], size=(h, w), mode="bilinear", align_corners=False)[0]

    return draw
