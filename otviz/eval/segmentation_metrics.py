"""Open-vocabulary semantic segmentation scored as the dense-CLIP field scores it: per-class
IoU and mIoU, accumulated over a whole set (mmsegmentation's ``IoUMetric``), from maps read
as a per-pixel class decision.

**Reading maps as a segmentation** (:func:`predict_labels`). Each candidate class has a map
over the image's pixels (a method's phrase heatmap, an explainer's map, upsampled from the
token grid; a gold mask). Maps of different rows are in different units (transported mass,
gradients, cosines), so each is scaled to ``[0, 1]`` over its image by its own minimum and
maximum (a flat map, which points nowhere, scales to 0 everywhere). A pixel takes the
class whose scaled map is highest there; with a background class, it is background where
that best value is below ``threshold``. This is the probability-threshold rule of
SCLIP (Wang et al., ECCV 2024; ``prob_thd`` in its ``configs/cfg_voc21.py``, 0.1 on the
softmax over classes of its ``clip_segmentor.py``), which ClearCLIP and NACLIP reuse, with
the softmax over class logits replaced by the min-max scaling: a transport plan's masses
and an explainer's relevance are not logits. The other rule of the field, a background
class prompt, needs a "background" word the captions do not have. Without a background
class (VOC20, Context59) every pixel takes a class, as there.

**Scoring** (:class:`SegmentationCounts`). Per class ``c``: ``I_c`` = the pixels labelled
``c`` that the prediction gives the same label; ``G_c``, ``P_c`` = the pixels labelled and
predicted ``c``; ``IoU_c = I_c / (G_c + P_c - I_c)``, the sums over the whole set before
the ratio (mmsegmentation's ``intersect_and_union`` then ``total_area_to_metrics``), not a
mean of per-image IoUs; mIoU is the mean over the classes with a non-zero union (a class
never labelled nor predicted is NaN and left out, mmseg's ``nanmean``). Pixels labelled
:data:`VOID` (255, the VOC boundary band) count nowhere. Labels are per image ("local": 0
the background, ``k`` the ``k``-th candidate) with a map ``classes`` to the set's classes,
so that two instances of one class in one image (two circles) are told apart: a pixel of
one predicted as the other counts in the class's union, not its intersection. Where each
local label is its own class (VOC) this is the usual confusion-matrix IoU.

**Pointing per class** (:meth:`SegmentationCounts.point`), TorchRay's pointing game on sets
with classes (facebookresearch/TorchRay, ``torchray/benchmark/pointing_game.py``): per
image and candidate with labelled pixels (on a data set, per image and class present), the
peak of its map on the image's pixels is a hit in the strict convention (``pointing``) when
it lies on the candidate's labelled pixels, in the tolerant one (``pointing_tol``) when it
lies closer than :data:`TOLERANCE_PX` px to one of them (TorchRay's ``evaluate``, lines
58-87: a disc of squared radius below ``tolerance**2``, default 15, line 50, around the
point meeting the mask). Accuracy per class is hits over trials, the figure their mean over
the classes (``class_accuracies`` and ``accuracy``, lines 106-118; TorchRay averages over
every class of VOC07 or COCO14, each with trials there: otviz over the classes with a trial,
NaN when none). A tie for the peak is otviz's pointing-game rule
(:func:`~otviz.eval.grounding_metrics.expected_hits`, read on pixels): the expected hit over
the tied maxima, so a flat map scores the chance of a random pixel; TorchRay takes one
maximiser. Void pixels are not the candidate's: a peak there is a strict miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.ndimage import distance_transform_edt
from torch import Tensor

from otviz.eval.grounding_metrics import TOLERANCE_PX, expected_hits, peak_tokens

#: The label of pixels that count nowhere (VOC's boundary band, mmseg's ``ignore_index``).
VOID = 255
#: The background threshold on a min-max scaled map (the grounding table's box threshold).
THRESHOLD = 0.5
#: :class:`SegmentationCounts`' per-class arrays.
_KEYS = ("intersect", "labelled", "predicted", "hits", "hits_tol", "trials")


def scaled_maps(maps: Tensor) -> Tensor:
    """``[k, H, W]`` maps each scaled to ``[0, 1]`` by its own minimum and maximum (in double
    precision); a flat map (one value everywhere) becomes 0 everywhere (its values minus its
    minimum are all 0, divided by 1)."""
    flat = maps.reshape(maps.shape[0], -1).double()
    low, high = flat.amin(dim=1, keepdim=True), flat.amax(dim=1, keepdim=True)
    span = high - low
    return ((flat - low) / torch.where(span > 0, span, 1)).reshape(maps.shape)


def predict_labels(maps: Tensor, threshold: float = THRESHOLD, background: bool = True
                   ) -> np.ndarray:
    """``int64 [H, W]`` local labels from ``[k, H, W]`` class maps (module docstring):
    ``c + 1`` where the scaled map of class ``c`` is highest (the first on a tie), 0
    (background) where that value is below ``threshold`` when ``background``."""
    if maps.shape[0] == 0:
        return np.zeros(tuple(maps.shape[1:]), dtype=np.int64)
    best, labels = scaled_maps(maps).max(dim=0)
    labels += 1
    if background:
        labels.masked_fill_(best < threshold, 0)
    return labels.cpu().numpy().astype(np.int64)


@dataclass(frozen=True)
class PointingTargets:
    """Where a peak scores on one image's gold local labels, computed once per image and
    shared by every map scored on it (each method's, each explainer's): ``present[c]``
    whether candidate ``c`` (labelled ``c + 1``) has labelled pixels, and for each present
    one ``pixels[row]`` ``[2, H * W]`` bool: its labelled pixels (strict) and the pixels
    closer than ``tolerance`` px to one of them (tolerant; TorchRay's open disc, module
    docstring)."""

    present: np.ndarray
    pixels: Tensor

    @classmethod
    def of(cls, gold: np.ndarray, k: int, tolerance: float = TOLERANCE_PX) -> PointingTargets:
        """The targets of ``k`` candidates on ``gold``: one distance transform a candidate
        present."""
        present = np.asarray([(gold == c + 1).any() for c in range(k)], dtype=bool)
        rows = []
        for c in np.flatnonzero(present):
            inside = gold == c + 1
            near = distance_transform_edt(~inside) < tolerance
            rows.append(np.stack([inside.ravel(), near.ravel()]))
        pixels = (torch.from_numpy(np.stack(rows)) if rows
                  else torch.zeros(0, 2, gold.size, dtype=torch.bool))
        return cls(present, pixels)


def pointing_shares(maps: Tensor, gold: np.ndarray | PointingTargets,
                    tolerance: float = TOLERANCE_PX
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(strict, tolerant, present)``, each ``[k]``, of ``[k, H, W]`` candidate maps on
    ``gold`` local labels (candidate ``c`` labelled ``c + 1``; module docstring), or on their
    :class:`PointingTargets` already computed (``tolerance`` is then theirs): the expected
    hit of each map's peak on the candidate's pixels and within ``tolerance`` px of them (0
    where ``present`` is False: the candidate has no labelled pixel)."""
    k = maps.shape[0]
    targets = (gold if isinstance(gold, PointingTargets)
               else PointingTargets.of(gold, k, tolerance))
    present = targets.present
    strict, tolerant = np.zeros(k), np.zeros(k)
    if not present.any():
        return strict, tolerant, present
    tied = peak_tokens(maps[torch.from_numpy(present)].reshape(int(present.sum()), -1))
    shares = expected_hits(tied[:, None].expand(-1, 2, -1).reshape(-1, tied.shape[1]),
                           targets.pixels.reshape(-1, tied.shape[1])).reshape(-1, 2)
    strict[present], tolerant[present] = shares[:, 0].numpy(), shares[:, 1].numpy()
    return strict, tolerant, present


@dataclass
class SegmentationCounts:
    """Per-class pixel counts over a set (module docstring): ``intersect`` ``I_c``,
    ``labelled`` ``G_c`` and ``predicted`` ``P_c``, and the pointing game's ``hits``
    (strict), ``hits_tol`` (tolerant) and ``trials``, float64 ``[n_classes]``."""

    n_classes: int
    intersect: np.ndarray = field(init=False)
    labelled: np.ndarray = field(init=False)
    predicted: np.ndarray = field(init=False)
    hits: np.ndarray = field(init=False)
    hits_tol: np.ndarray = field(init=False)
    trials: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for key in _KEYS:
            setattr(self, key, np.zeros(self.n_classes))

    def add(self, gold: np.ndarray, pred: np.ndarray, classes: Sequence[int] | np.ndarray
            ) -> None:
        """Count one image: ``gold`` and ``pred`` local labels of one shape (``gold``'s
        :data:`VOID` pixels skipped), ``classes[l]`` the set's class of local label ``l``."""
        if gold.shape != pred.shape:
            raise ValueError(f"gold labels {gold.shape} but predicted {pred.shape}")
        keep = gold != VOID
        g, p = gold[keep].astype(np.int64), pred[keep].astype(np.int64)
        cls = np.asarray(classes, dtype=np.int64)
        n = self.n_classes
        self.labelled += np.bincount(cls[g], minlength=n)
        self.predicted += np.bincount(cls[p], minlength=n)
        self.intersect += np.bincount(cls[g[g == p]], minlength=n)

    def point(self, maps: Tensor, gold: np.ndarray | PointingTargets,
              classes: Sequence[int] | np.ndarray, tolerance: float = TOLERANCE_PX) -> None:
        """Count one image's pointing game (:func:`pointing_shares`; ``gold`` its labels or
        their :class:`PointingTargets`): each candidate with labelled pixels a trial of its
        class ``classes[c + 1]``."""
        strict, tolerant, present = pointing_shares(maps, gold, tolerance)
        cls = np.asarray(classes, dtype=np.int64)[1:][present]
        np.add.at(self.trials, cls, 1.0)
        np.add.at(self.hits, cls, strict[present])
        np.add.at(self.hits_tol, cls, tolerant[present])

    def merged(self, other: SegmentationCounts) -> SegmentationCounts:
        """The counts of both (e.g. two shards of a set)."""
        if other.n_classes != self.n_classes:
            raise ValueError(f"{self.n_classes} classes but {other.n_classes}")
        out = SegmentationCounts(self.n_classes)
        for key in _KEYS:
            setattr(out, key, getattr(self, key) + getattr(other, key))
        return out

    def as_dict(self) -> dict[str, list[float]]:
        """The counts as JSON-ready lists (:meth:`from_dict` reads them back)."""
        return {key: getattr(self, key).tolist() for key in _KEYS}

    @classmethod
    def from_dict(cls, values: dict[str, list[float]]) -> SegmentationCounts:
        out = cls(len(values["labelled"]))
        for key in _KEYS:
            setattr(out, key, np.asarray(values[key], dtype=np.float64))
        return out

    def class_pointing(self, tolerant: bool = False) -> np.ndarray:
        """``[n_classes]`` pointing accuracy per class (strict, or ``tolerant``), NaN for a
        class without a trial."""
        hits = self.hits_tol if tolerant else self.hits
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.trials > 0, hits / np.where(self.trials > 0, self.trials, 1),
                            np.nan)

    def pointing(self, tolerant: bool = False) -> float:
        """The per-class pointing accuracy averaged over the classes with a trial (module
        docstring; NaN when none has one)."""
        acc = self.class_pointing(tolerant)
        return float(np.nanmean(acc)) if np.isfinite(acc).any() else float("nan")

    def union(self) -> np.ndarray:
        return self.labelled + self.predicted - self.intersect

    def iou(self) -> np.ndarray:
        """``[n_classes]`` IoU per class, NaN where the union is empty."""
        union = self.union()
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(union > 0, self.intersect / np.where(union > 0, union, 1), np.nan)

    def miou(self) -> float:
        """The mean IoU over the classes with a non-empty union (NaN when none has one)."""
        iou = self.iou()
        return float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan")

    def pixel_accuracy(self) -> float:
        """The share of the labelled pixels predicted right (mmseg's ``aAcc``)."""
        total = self.labelled.sum()
        return float(self.intersect.sum() / total) if total else float("nan")
