"""World samples written in PASCAL VOC 2012's layout (:mod:`otviz.data.segmentation_sets`
reads it back), to time ``otviz eval --dataset voc:DIR`` where no VOC is at hand (a GPU
machine without network): images per second and peak memory are real, the mIoU is not a
VOC figure.

Labels: each object's pixels (coverage at least 0.5, :func:`otviz.world.render.object_labels`)
take ``1 + `` its shape's index in :data:`otviz.world.SHAPES` (so VOC's reader names them
aeroplane, bicycle, ... bus: the shapes are not those classes), background 0, and the
antialiased edge of every object (partly covered pixels) 255, VOC's void band.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from otviz.world import SHAPES, Sample
from otviz.world.render import object_labels

VOID = 255


def voc_labels(sample: Sample) -> np.ndarray:
    """``uint8 [H, W]`` VOC-style labels of a world sample (module docstring)."""
    size = sample.image.shape[0]
    objects = object_labels(sample.objects, size)
    touched = object_labels(sample.objects, size, covered=1e-6)
    whole = object_labels(sample.objects, size, covered=1.0)
    shape_of = np.asarray([0] + [1 + SHAPES.index(o.shape) for o in sample.objects], np.uint8)
    labels = shape_of[objects]
    labels[touched != whole] = VOID
    return labels


def export_voc(samples: list[Sample], root: str | Path, split: str = "val") -> Path:
    """``samples`` under ``root`` as ``JPEGImages/<id>.png`` (lossless; the reader takes
    ``.jpg`` or ``.png``), ``SegmentationClass/<id>.png`` (palette PNGs) and
    ``ImageSets/Segmentation/<split>.txt``; ids ``world_000000, ...``."""
    base = Path(root)
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    ids = []
    for k, sample in enumerate(samples):
        key = f"world_{k:06d}"
        ids.append(key)
        Image.fromarray(sample.image).save(base / "JPEGImages" / f"{key}.png")
        mask = Image.fromarray(voc_labels(sample), mode="P")
        mask.putpalette([v for c in range(256) for v in (c, c, c)])
        mask.save(base / "SegmentationClass" / f"{key}.png")
    (base / "ImageSets/Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return base
