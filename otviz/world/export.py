"""Showing samples: a contact sheet image, export of PNGs with a ``captions.json``, and
export as webdataset shards (the layout img2dataset writes, for ``otviz train --data``)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from otviz.world.types import Sample
from otviz.world.world import World

_FEATURES = ("single", "relation", "conjunction", "relation+conjunction", "distractor",
             "there_is", "size_omitted", "two_relations")


def features(sample: Sample) -> set[str]:
    """The caption forms and scene traits a sample shows (used to pick varied examples)."""
    m = sample.meaning
    n_rel = len(m.relations())
    out = set()
    if len(m.descriptions()) == 1:
        out.add("single")
    if n_rel:
        out.add("relation")
    if n_rel >= 2:
        out.add("two_relations")
    if len(m.clauses) > 1:
        out.add("conjunction" if not n_rel else "relation+conjunction")
    if any(not o.mentioned for o in sample.objects):
        out.add("distractor")
    if m.there_is:
        out.add("there_is")
    if any(d.size is None for d in m.descriptions()):
        out.add("size_omitted")
    return out


def render_grid(
    samples: Sequence[Sample], columns: int = 4, gutter: int = 2, boxes: bool = False
) -> np.ndarray:
    """Tile the samples' images into one ``uint8 [H, W, 3]`` contact sheet (white gutters);
    with ``boxes``, outline each mentioned object's gold box in black."""
    if not samples:
        raise ValueError("render_grid needs at least one sample")
    h, w = samples[0].image.shape[:2]
    rows = -(-len(samples) // columns)
    cols = min(columns, len(samples))
    sheet = np.full((rows * (h + gutter) + gutter, cols * (w + gutter) + gutter, 3), 255, np.uint8)
    for k, s in enumerate(samples):
        y, x = gutter + (k // columns) * (h + gutter), gutter + (k % columns) * (w + gutter)
        tile = s.image.copy()
        if boxes:
            for p in s.phrases:
                x0, y0, x1, y1 = p.box
                tile[y0:y1, [x0, x1 - 1]] = 0
                tile[[y0, y1 - 1], x0:x1] = 0
        sheet[y : y + h, x : x + w] = tile
    return sheet


def export_samples(
    out_dir: str | Path, n: int, split: str = "test", seed: int = 0, scale: int = 1
) -> list[dict]:
    """Write ``n`` varied samples as PNGs (upscaled ``scale`` times, nearest neighbour) and
    a ``captions.json`` list of ``{file, caption, phrases, boxes, spans, tree, negatives,
    split, seed, index, scale}``, boxes in the PNG's pixels. Samples are picked greedily
    from index 0 on: each next one shows a caption form or trait not yet covered
    (relation, conjunction, distractor, ...), then any; so the set is deterministic.
    ``n < 1`` or ``scale < 1`` raise ``ValueError`` before anything is written."""
    if n < 1 or scale < 1:
        raise ValueError(f"export_samples needs n >= 1 and scale >= 1, got n={n}, scale={scale}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = World(split=split, seed=seed)
    chosen: list[Sample] = []
    covered: set[str] = set()
    i = 0
    while len(chosen) < n and i < 50 * n + 1000:
        s = world.sample(i)
        new = features(s) - covered
        if new or covered >= set(_FEATURES):
            chosen.append(s)
            covered |= new
        i += 1
    records = []
    for s in chosen:
        name = f"{split}_{seed}_{s.index:05d}.png"
        image = s.image.repeat(scale, axis=0).repeat(scale, axis=1)
        Image.fromarray(image).save(out / name)
        records.append({
            "file": name,
            "caption": s.caption,
            "phrases": [p.text for p in s.phrases],
            "boxes": [[v * scale for v in p.box] for p in s.phrases],
            "spans": [[p.start, p.end] for p in s.phrases],
            "tree": s.tree.to_bracket(),
            "negatives": s.negatives,
            "split": split,
            "seed": seed,
            "index": s.index,
            "scale": scale,
        })
    (out / "captions.json").write_text(json.dumps(records, indent=1) + "\n")
    return records


def export_shards(
    out_dir: str | Path, n: int, split: str = "train", seed: int = 0, per_shard: int = 1000,
    scale: int = 1,
) -> list[Path]:
    """Write samples ``0..n-1`` of ``World(split, seed)`` as webdataset shards
    ``out_dir/000000.tar, 000001.tar, ...`` of ``per_shard`` samples each, every sample a
    ``KEY.png`` (upscaled ``scale`` times) and a ``KEY.txt`` caption with ``KEY`` its index
    in nine digits, as img2dataset names them. Pair ``i`` of the shards, in order, is
    ``WorldDataset(n, split, seed)``'s pair ``i``. Returns the shard paths."""
    if n < 1 or per_shard < 1 or scale < 1:
        raise ValueError(f"export_shards needs n, per_shard and scale >= 1, got {n}, "
                         f"{per_shard}, {scale}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    world = World(split=split, seed=seed)
    paths = []
    for first in range(0, n, per_shard):
        path = out / f"{first // per_shard:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(first, min(first + per_shard, n)):
                s = world.sample(i)
                png = io.BytesIO()
                Image.fromarray(s.image.repeat(scale, axis=0).repeat(scale, axis=1)).save(
                    png, format="PNG")
                _add_bytes(tar, f"{i:09d}.png", png.getvalue())
                _add_bytes(tar, f"{i:09d}.txt", s.caption.encode())
        paths.append(path)
    return paths


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
