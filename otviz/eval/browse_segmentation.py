"""Browsing a segmentation set in its published layout (:mod:`otviz.data.segmentation_sets`:
VOC, Context, ADE20K, Cityscapes, COCO-Stuff, COCO-Object): one Browse row per (image, class
present in its gold mask), the class name as the phrase, every method's and explainer's map
of that class, and as the row's score the class's IoU between the method's predicted mask
and the gold mask.

The prediction is the segmentation table's (``otviz eval --dataset KIND:DIR --tables
segmentation`` without a sliding window, :mod:`otviz.eval.dataset_segmentation`): each image
read with captions listing the candidate classes (:func:`~otviz.eval.dataset_segmentation.
class_chunks`), resized to the model's input without cropping; every candidate's map drawn
onto the mask's own pixels (:func:`~otviz.eval.segmentation.token_maps`) and read by
:func:`~otviz.eval.segmentation_metrics.predict_labels` (its background threshold where the
set scores a background). A row's IoU is its class's IoU on its image alone
(:class:`~otviz.eval.segmentation_metrics.SegmentationCounts` of that image: the table sums
the same counts over the set), void pixels counting nowhere. The background class has no map
and no row; a class the text tower's context cut has no map, its rows are left out and
counted in the notes.

Pointing is the segmentation table's too, TorchRay's per-class pointing game on the same
pixel maps (:func:`~otviz.eval.segmentation_metrics.pointing_shares`): ``pointing`` the
expected hit of the map's peak on the class's gold pixels, ``pointing_tol`` within 15 px of
them; Browse's ✓ (``hits``) is a sure strict hit. A row's gold box is the enclosing box of
its class's pixels (drawn on the image; the trust sort's localisation metrics read it).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from otviz.data.datasets import DatasetError
from otviz.data.feature_cache import FeatureCache, Progress
from otviz.data.grounding_sets import GroundingSet
from otviz.data.segmentation_sets import LAYOUTS, SegmentationSet, load_segmentation_set
from otviz.errors import InputError
from otviz.eval.alignment_tables import phrase_queries
from otviz.eval.browse import (
    MAX_IMAGES,
    BrowseItem,
    BrowseQueries,
    BrowseTable,
    method_boxes,
    query_heatmaps,
)
from otviz.eval.dataset_models import decodable_items
from otviz.eval.dataset_segmentation import PROMPT, class_chunks
from otviz.eval.segmentation import ScoredImage, candidate_rows, token_maps
from otviz.eval.segmentation_metrics import (
    THRESHOLD,
    SegmentationCounts,
    pointing_shares,
    predict_labels,
)
from otviz.eval.world_set import EvalSet, GroundingProbeDataset, model_input_size
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import ALIGN_METHODS, MethodSuite

#: Images whose candidate maps are computed at once (bounds the memory of a large set's
#: ``images x classes x methods`` maps; only the rows' own maps are kept).
BLOCK_IMAGES = 16


@dataclass(kw_only=True)
class SegmentationBrowseTable(BrowseTable):
    """A :class:`~otviz.eval.browse.BrowseTable` of a segmentation set (module docstring):
    ``iou`` the class's mask IoU, ``hits`` strict pointing in the gold mask, and besides

    Attributes:
        data: the set (its gold masks, read back per row).
        labels: per row, its class's local label in the image's labels
            (:meth:`~otviz.data.segmentation_sets.SegmentationSet.load_labels`).
        pointing: ``[P, K]`` float64, the expected strict pointing hit (``hits``: where 1).
        pointing_tol: ``[P, K]`` float64, the same within the tolerance.
        predictions: ``(image, method index)`` -> the predicted local labels ``uint8
            [H, W]``, zlib-compressed.
    """

    data: SegmentationSet
    labels: list[int]
    pointing: Tensor
    pointing_tol: Tensor
    predictions: dict[tuple[int, int], bytes]

    def gold_labels(self, row: int) -> np.ndarray:
        """Row ``row``'s image's gold local labels ``uint8 [H, W]`` (void pixels kept)."""
        return self.data.load_labels(self.items[row].image)

    def predicted_labels(self, row: int, k: int) -> np.ndarray:
        """Method ``k``'s predicted local labels of row ``row``'s image, ``uint8 [H, W]``."""
        image = self.items[row].image
        width, height = self.data.items[image].size
        raw = zlib.decompress(self.predictions[(image, k)])
        return np.frombuffer(raw, dtype=np.uint8).reshape(height, width)


def detect_segmentation_kind(root: str | Path) -> str | None:
    """The segmentation kind (:data:`~otviz.data.segmentation_sets.LAYOUTS`) whose default
    split's image and mask folders (and split list, where it has one) are in ``root``, with
    a mask of its suffix when it has no list; among kinds of one layout (``voc`` and
    ``voc20``, ``context60`` and ``context59``) the one ``root`` is named after, else the
    first. ``None``: no segmentation layout."""
    base = Path(root)
    found = [kind for kind, lay in LAYOUTS.items() if _holds(base, kind)]
    named = [kind for kind in found if kind == base.name.lower()]
    return (named or found or [None])[0]


def _holds(base: Path, kind: str) -> bool:
    lay = LAYOUTS[kind]
    images, masks = (base / f.format(split=lay.split) for f in (lay.images, lay.masks))
    if not (images.is_dir() and masks.is_dir()):
        return False
    if lay.listing is not None:
        return (base / lay.listing.format(split=lay.split)).is_file()
    return next(masks.rglob(f"*{lay.mask_suffix}"), None) is not None


def segmentation_set_browse(
    suite: MethodSuite, root: str | Path, kind: str, cache_dir: str | Path,
    max_images: int = MAX_IMAGES, threshold: float = 0.5, explainers: Sequence[str] = (),
    progress: Progress | None = None, methods: Sequence[str] = ALIGN_METHODS,
) -> tuple[SegmentationBrowseTable, list[str]]:
    """``(table, notes)``: the :class:`SegmentationBrowseTable` of the set ``kind`` at
    ``root`` (confined to it), its first ``max_images`` images that decode, encoded through
    the feature cache with ``progress`` as :func:`~otviz.eval.browse.grounding_set_browse`
    does; ``threshold`` is the heatmap boxes' (the prediction's background threshold is the
    table's, :data:`~otviz.eval.segmentation_metrics.THRESHOLD`); ``notes`` says what was
    left out."""
    try:
        full = load_segmentation_set(kind, root, limit=max_images)
        rows, names, unavailable, unreadable = _browsed(suite, full, cache_dir, explainers,
                                                        progress, methods)
    except DatasetError as e:  # the set's layout, or a mask read on the way
        raise InputError(f"cannot read the {kind} folder: {e}") from None
    notes = [f"{kind}: skipped " + ", ".join(f"{n} {why}" for why, n in
                                             sorted(full.skipped.counts.items()))
             ] if full.skipped.counts else []
    notes += [f"{kind}: {len(unreadable)} image(s) do not decode, left out"] if unreadable else []
    if rows.cut:
        notes.append(f"{rows.cut} (image, class) row(s) not shown: the text tower's context "
                     "cut the class from the caption (no map)")
    if not rows.items:
        raise InputError(f"{kind}: no image has a labelled class with a map to browse")
    return rows.table(names, unavailable, threshold), notes


def _browsed(suite: MethodSuite, full: SegmentationSet, cache_dir: str | Path,
             explainers: Sequence[str], progress: Progress | None, methods: Sequence[str]
             ) -> tuple[_Rows, tuple[str, ...], dict[str, str], list[str]]:
    """``(rows, method names, unavailable explainers, undecodable images)`` of the set's
    images that decode, :data:`BLOCK_IMAGES` at a time, ``progress`` called after each
    block (images done, images)."""
    kept, unreadable = decodable_items(full)
    if not kept:
        raise InputError(f"{full.source['format']}: no image decodes "
                         f"({'; '.join(unreadable[:3])})")
    data = full.subset(kept)
    chunks = class_chunks(suite.backbone, data.names)
    grounding = data.as_grounding(PROMPT, chunks)
    evalset = EvalSet(GroundingProbeDataset(grounding, model_input_size(suite.backbone)),
                      suite.backbone, FeatureCache(cache_dir), progress)
    q = phrase_queries(evalset)
    per = len(chunks)
    item_rows = candidate_rows(evalset, q)
    candidates = [sum(item_rows[i * per : (i + 1) * per], []) for i in range(len(data))]
    rows = _Rows(data)
    for start in range(0, len(data), BLOCK_IMAGES):
        block = range(start, min(start + BLOCK_IMAGES, len(data)))
        needed = sorted({r for i in block for r in candidates[i] if r >= 0})
        at = {r: n for n, r in enumerate(needed)}
        index = torch.tensor(needed, dtype=torch.long)
        queries = BrowseQueries([], q.image[index], evalset.positives[q.image[index]],
                                q.select[index], None)
        heats, names, unavailable = query_heatmaps(
            suite, evalset, queries, lambda j: evalset.samples[j].image, methods, explainers,
            [q.texts[r] for r in needed])
        for i in block:
            local = [at.get(r, -1) for r in candidates[i]]
            rows.add_image(grounding, chunks, i, local, heats, evalset.geometry)
        if progress is not None:  # the served app's stop check, between blocks too
            progress(block.stop, len(data))
    return rows, names, unavailable, unreadable


class _Rows:
    """The rows of a segmentation Browse table, gathered image by image."""

    def __init__(self, data: SegmentationSet) -> None:
        self.data = data
        self.items: list[BrowseItem] = []
        self.labels: list[int] = []
        self.heats: list[Tensor] = []
        self.iou: list[Tensor] = []
        self.pointing: list[Tensor] = []
        self.pointing_tol: list[Tensor] = []
        self.gold: list[Tensor] = []
        self.geometries: list[TokenGeometry] = []
        self.sizes: list[tuple[int, int]] = []
        self.predictions: dict[tuple[int, int], bytes] = {}
        self.cut = 0

    def add_image(self, grounding: GroundingSet, chunks: list[tuple[int, int]], i: int,
                  local: list[int], heats: Tensor, frame: TokenGeometry) -> None:
        """Image ``i``'s predictions (every method's, the table's protocol) and its rows:
        ``local[c]`` the row of ``heats`` (``[Q, K, N]``) holding candidate ``c``'s maps,
        ``frame`` the token geometry on the model's input, ``grounding`` the set's class
        captions, ``len(chunks)`` per image."""
        data = self.data
        gold = data.load_labels(i)
        height, width = gold.shape
        scored = ScoredImage(local, gold, data.local_classes())
        ious, shares = [], []
        for k in range(heats.shape[1]):
            maps = token_maps(heats[:, k], frame)(i, scored)
            pred = predict_labels(maps, THRESHOLD, data.background)
            counts = SegmentationCounts(len(data.classes))
            counts.add(gold, pred, scored.classes)
            ious.append(torch.from_numpy(counts.iou()))
            shares.append(torch.from_numpy(np.stack(pointing_shares(maps, scored.targets)[:2],
                                                              1)))
            self.predictions[(i, k)] = zlib.compress(pred.astype(np.uint8).tobytes())
        geometry = frame.scaled(width, height)
        hit = torch.stack(shares, 1)  # [candidates, K, 2]
        present = [int(v) for v in np.unique(gold) if 1 <= v <= len(local)]
        for label in present:
            c = label - 1
            if local[c] < 0:
                self.cut += 1
                continue
            chunk = next(n for n, (s, e) in enumerate(chunks) if s <= c < e)
            item = grounding.items[i * len(chunks) + chunk]
            phrase = item.phrases[c - chunks[chunk][0]]
            self.items.append(BrowseItem(i, item.caption, data.names[c], phrase.start,
                                         phrase.end, frozenset()))
            self.labels.append(label)
            self.heats.append(heats[local[c]])  # [K, N]
            self.iou.append(torch.stack([v[int(scored.classes[label])] for v in ious]))
            self.pointing.append(hit[c, :, 0])
            self.pointing_tol.append(hit[c, :, 1])
            self.gold.append(mask_box(torch.from_numpy(gold == label)))
            self.geometries.append(geometry)
            self.sizes.append((width, height))

    def table(self, names: tuple[str, ...], unavailable: dict[str, str], threshold: float
              ) -> SegmentationBrowseTable:
        data = self.data
        heats = torch.stack(self.heats).float()
        pointing = torch.stack(self.pointing)

        def load(i: int) -> np.ndarray:
            return np.asarray(data.load_image(i))

        return SegmentationBrowseTable(
            self.items, names, self.geometries, heats,
            method_boxes(heats, self.geometries, threshold),
            torch.tensor(self.sizes, dtype=torch.long), torch.stack(self.gold),
            pointing == 1, torch.stack(self.iou).float(), load, threshold, unavailable,
            data=data, labels=self.labels, pointing=pointing,
            pointing_tol=torch.stack(self.pointing_tol), predictions=self.predictions)


def mask_box(mask: Tensor) -> Tensor:
    """The enclosing half-open pixel box ``(x0, y0, x1, y1)`` of a non-empty mask."""
    ys, xs = torch.nonzero(mask, as_tuple=True)
    return torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float64)

