"""Visual Genome region descriptions (Krishna et al.): a phrase and a box per region.

Layout::

    <root>/region_descriptions.json   a list, one entry per image: ``{"id": image id,
                                      "regions": [{"region_id", "image_id", "phrase",
                                      "x", "y", "width", "height"}, ...]}``
    <root>/<split>.txt                optional: the image ids of a split, one a line
                                      (Visual Genome publishes no grounding split; without
                                      this file the split is every image, ``all``)
    <images>/<image id>.jpg           the images (default: ``<root>/VG_100K`` and
                                      ``<root>/VG_100K_2``, as published, else
                                      ``<root>/images``)

Each region is one item: its phrase (the whole description) and its box. ``limit`` caps
the number of images read (the file describes 108,077).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import otviz.data.grounding_sets.items as common
from otviz.data.datasets import EmptyDatasetError, MalformedDatasetError

REGIONS = "region_descriptions.json"
IMAGE_FOLDERS = ("VG_100K", "images")
SECOND_FOLDER = "VG_100K_2"  # the published images come in two folders
ALL = "all"


def load_visual_genome(
    root: str | os.PathLike, split: str = ALL, images: str | os.PathLike | None = None,
    limit: int = 0,
) -> common.GroundingSet:
    """The regions of the first ``limit`` (0: all) images of ``split`` (``all``, or the ids
    in ``<root>/<split>.txt``); files confined to ``root``."""
    base = Path(root)
    wanted = None
    if split != ALL:
        wanted = _ids(common.annotation_file(base, f"{split}.txt", "split list"), f"{split}.txt")
    folder, image_root = common.images_folder(base, images, IMAGE_FOLDERS)
    folders = [folder] + ([base / SECOND_FOLDER] if images is None and folder.name == "VG_100K"
                          and (base / SECOND_FOLDER).is_dir() else [])
    path = common.annotation_file(base, REGIONS, "region descriptions")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError:
        raise MalformedDatasetError(f"{REGIONS}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise MalformedDatasetError(f"{REGIONS}: not valid JSON (line {e.lineno}, column "
                                    f"{e.colno})") from None
    if not isinstance(data, list):
        raise MalformedDatasetError(f"{REGIONS}: not a list of images at the top level")
    skipped = common.Skipped()
    items: list[common.GroundingItem] = []
    n_images = 0
    for k, entry in enumerate(data):
        where = f"{REGIONS}: [{k}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("regions"), list):
            raise MalformedDatasetError(f"{where} lacks a list 'regions'")
        image_id = entry.get("id", entry.get("image_id"))
        if wanted is not None and str(image_id) not in wanted:
            continue
        if limit and n_images >= limit:
            break
        n_images += 1
        items += _image_items(image_id, entry["regions"], folders, image_root, skipped, where)
    if not n_images:
        raise EmptyDatasetError(f"{REGIONS}: no image in split {split!r}")
    source = {"format": "visual_genome", "split": split, "file": REGIONS, "images": n_images,
              "limit": limit}
    return common.GroundingSet(items, skipped, source)


def _ids(path: Path, name: str) -> set[str]:
    try:
        return {line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()}
    except UnicodeDecodeError:
        raise MalformedDatasetError(f"{name}: not UTF-8 text") from None


def _image_items(image_id: Any, regions: list[Any], folders: list[Path], image_root: Path,
                 skipped: common.Skipped, where: str) -> list[common.GroundingItem]:
    if not isinstance(image_id, (int, str)) or not str(image_id).isalnum():
        raise MalformedDatasetError(f"{where}.id is not an image id")
    path = common.find_image(folders, str(image_id), image_root)
    size = common.image_size(path, f"{image_id}.jpg", skipped, where)
    if path is None or size is None:
        return []
    items = []
    for n, region in enumerate(regions):
        at = f"{where}.regions[{n}]"
        if not isinstance(region, dict) or not isinstance(region.get("phrase"), str):
            raise MalformedDatasetError(f"{at} lacks a text 'phrase'")
        x, y, w, h = (common.number(region.get(f), f"{at}.{f}")
                      for f in ("x", "y", "width", "height"))
        box = common.clip_box((x, y, x + w, y + h), size, skipped, at)
        caption = common.checked_caption(region["phrase"], f"{at}: the phrase", skipped)
        if caption is None:
            continue
        phrases = common.whole_caption(caption, (box,)) if box is not None else ()
        if phrases:
            items.append(common.GroundingItem(path, size, caption, phrases,
                                       f"{image_id}#{region.get('region_id', n)}"))
    return items
