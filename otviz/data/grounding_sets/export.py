"""A world draw written in each published grounding format, images and annotation files
in the real layout, so the readers and ``otviz eval --dataset`` can be checked against the
world's own gold boxes (and tried without downloading anything).

* :func:`export_flickr30k`: each sample's caption with its noun phrases bracketed (entity
  ``object index + 1``), its boxes as VOC objects (1-based, inclusive), plus one
  ``nobndbox`` entity for the distractors' absence;
* :func:`export_refcoco`: each noun phrase a ref (split ``split``) whose one sentence is the
  phrase, its object a COCO annotation;
* :func:`export_visual_genome`: each noun phrase a region.

``lossless`` writes PNG images (``<id>.png``) instead of the published JPEG, so features
read back equal the world's to the bit; the readers accept both.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from xml.sax.saxutils import escape

from PIL import Image

from otviz.text.words import split_words
from otviz.world import Sample, World, WorldConfig

_JPEG_QUALITY = 95


def world_draw(n: int, split: str = "test", seed: int = 0,
               config: WorldConfig | None = None) -> list[Sample]:
    """Samples ``0..n-1`` of the world ``split`` (seed ``seed``)."""
    world = World(config, split=split, seed=seed)
    return [world.sample(i) for i in range(n)]


def _write_image(sample: Sample, path: Path, lossless: bool) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(sample.image)
    name = path.name + (".png" if lossless else ".jpg")
    if lossless:
        image.save(path.with_name(name))
    else:
        image.save(path.with_name(name), quality=_JPEG_QUALITY)
    return name


def _bracketed(sample: Sample) -> str:
    """The caption with each noun phrase marked ``[/EN#<object + 1>/other <words>]``."""
    words = split_words(sample.caption)
    out, last = [], 0
    for p in sample.phrases:
        start, end = words[p.start].start, words[p.end - 1].end
        out.append(sample.caption[last:start])
        out.append(f"[/EN#{p.object_index + 1}/other {sample.caption[start:end]}]")
        last = end
    out.append(sample.caption[last:])
    return "".join(out)


def export_flickr30k(samples: list[Sample], root: str | Path, split: str = "test",
                     lossless: bool = False) -> Path:
    """``samples`` as Flickr30k Entities under ``root`` (ids ``1000, 1001, ...``)."""
    base = Path(root)
    for sub in ("Sentences", "Annotations"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    ids = []
    for k, s in enumerate(samples):
        image_id = str(1000 + k)
        ids.append(image_id)
        _write_image(s, base / "flickr30k-images" / image_id, lossless)
        (base / "Sentences" / f"{image_id}.txt").write_text(_bracketed(s) + "\n", "utf-8")
        h, w = s.image.shape[:2]
        objects = "".join(
            f"<object><name>{i + 1}</name><bndbox><xmin>{o.box[0] + 1}</xmin>"
            f"<ymin>{o.box[1] + 1}</ymin><xmax>{o.box[2]}</xmax><ymax>{o.box[3]}</ymax>"
            "</bndbox></object>" for i, o in enumerate(s.objects))
        objects += f"<object><name>{len(s.objects) + 1}</name><nobndbox>1</nobndbox></object>"
        (base / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><filename>{escape(image_id)}.jpg</filename><size><width>{w}</width>"
            f"<height>{h}</height><depth>3</depth></size>{objects}</annotation>\n", "utf-8")
    (base / f"{split}.txt").write_text("\n".join(ids) + "\n", "utf-8")
    return base


def export_refcoco(samples: list[Sample], root: str | Path, split: str = "testA",
                   split_by: str = "unc", lossless: bool = False) -> Path:
    """``samples`` as a RefCOCO folder under ``root``: ``refs(<split_by>).p`` (a pickle of
    plain dicts, protocol 2 as the published files), ``instances.json``, ``images/``."""
    base = Path(root)
    images, annotations, refs = [], [], []
    for k, s in enumerate(samples):
        name = _write_image(s, base / "images" / f"COCO_train2014_{k:012d}", lossless)
        h, w = s.image.shape[:2]
        images.append({"id": k, "file_name": name, "width": w, "height": h})
        for p in s.phrases:
            ann_id = len(annotations)
            x0, y0, x1, y1 = p.box
            annotations.append({"id": ann_id, "image_id": k, "category_id": 1,
                                "bbox": [x0, y0, x1 - x0, y1 - y0]})
            refs.append({"ref_id": len(refs), "ann_id": ann_id, "image_id": k, "split": split,
                         "category_id": 1, "file_name": name,
                         "sentences": [{"sent": p.text, "raw": p.text,
                                        "tokens": p.text.split(), "sent_id": len(refs)}],
                         "sent_ids": [len(refs)]})
    (base / "instances.json").write_text(json.dumps(
        {"images": images, "annotations": annotations,
         "categories": [{"id": 1, "name": "shape"}]}), "utf-8")
    (base / f"refs({split_by}).p").write_bytes(pickle.dumps(refs, protocol=2))
    return base


def export_draw(kind: str, out: str | Path, n: int, split: str = "test", seed: int = 0,
                lossless: bool = False) -> Path:
    """Samples ``0..n-1`` of the world ``split`` written as ``kind`` (``flickr30k``,
    ``refcoco``, ``vg``) under ``out``, in the kind's default split (``test``, ``testA``,
    ``all``)."""
    samples = world_draw(n, split, seed)
    if kind == "flickr30k":
        return export_flickr30k(samples, out, "test", lossless)
    if kind == "refcoco":
        return export_refcoco(samples, out, "testA", lossless=lossless)
    if kind == "vg":
        return export_visual_genome(samples, out, lossless)
    raise ValueError(f"no exporter for {kind!r}; known: flickr30k, refcoco, vg")


def export_visual_genome(samples: list[Sample], root: str | Path,
                         lossless: bool = False) -> Path:
    """``samples`` as Visual Genome region descriptions under ``root`` (image ids
    ``1, 2, ...``; images in ``VG_100K/``)."""
    base = Path(root)
    entries = []
    for k, s in enumerate(samples):
        image_id = k + 1
        _write_image(s, base / "VG_100K" / str(image_id), lossless)
        regions = []
        for p in s.phrases:
            x0, y0, x1, y1 = p.box
            regions.append({"region_id": 100 * image_id + len(regions), "image_id": image_id,
                            "phrase": p.text, "x": x0, "y": y0, "width": x1 - x0,
                            "height": y1 - y0})
        entries.append({"id": image_id, "regions": regions})
    base.mkdir(parents=True, exist_ok=True)
    (base / "region_descriptions.json").write_text(json.dumps(entries), "utf-8")
    return base
