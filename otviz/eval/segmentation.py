"""The segmentation table: every row of the grounding table (methods, explainers, model-free
baselines) and the gold masks, read as an open-vocabulary semantic segmentation and scored
by per-class IoU and mIoU (:mod:`otviz.eval.segmentation_metrics`).

Per image the candidate classes are its caption's phrases (on a data set with classes,
:mod:`otviz.eval.dataset_segmentation`, the class names, each a phrase of one caption that
lists them all) plus background. Each candidate's map is the row's phrase map
(:func:`~otviz.eval.alignment_tables.phrase_heatmaps` for a method: ``Alignment.heatmap``,
the plan's mass from each patch to the phrase's tokens, or the method's own
``phrase_patch_map``; an explainer's map of the phrase's text; a baseline's map), drawn
from the token grid onto the image's pixels bilinearly between token centres
(:meth:`~otviz.patch_grid.tokens.TokenGeometry.upsample`), then read by
:func:`~otviz.eval.segmentation_metrics.predict_labels`. A transport plan read this way is a
segmenter: the patch goes to the phrase that receives, relative to that phrase's own range
over the image, the most of its mass.

On the world the labels are exact: each pixel is labelled by the object that covers it
(:func:`otviz.world.render.object_labels`), the object's phrase when the caption names it,
background where no object is or the object is a distractor the caption does not name;
the pixels of an object whose phrase lost every token to the context length are void. The
world's classes are background and the eight shapes (the object's category, as VOC's
classes are categories), with two objects of one shape in one image told apart
(:class:`~otviz.eval.segmentation_metrics.SegmentationCounts`).

Sanity rows: the gold masks themselves as maps (mIoU 1) and the uniform map (every map
flat: background everywhere, so its mIoU is the background's IoU over the number of
classes labelled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np
import torch
from torch import Tensor

from otviz.backbone import Backbone
from otviz.eval.alignment_tables import (
    CHUNK,
    PhraseQueries,
    baseline_maps,
    phrase_heatmaps,
    phrase_queries,
)
from otviz.eval.grounding_metrics import TOLERANCE_PX
from otviz.eval.segmentation_metrics import (
    THRESHOLD,
    VOID,
    PointingTargets,
    SegmentationCounts,
    predict_labels,
)
from otviz.eval.table import Column, Table
from otviz.eval.world_set import EvalSet
from otviz.explainers import EXPLAINERS, explain_pairs, phrase_embeddings, unavailable
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import METHOD_LABELS, MethodSuite, flat_map_reasons
from otviz.text.templates import TEMPLATE_SETS, ensembled
from otviz.world import SHAPES
from otviz.world.render import object_labels

StageProgress = Callable[[str, int, int], None]
#: The world's classes: background, then the shapes.
WORLD_CLASSES = ("background", *SHAPES)


@dataclass
class ScoredImage:
    """What one image is scored on: ``rows[k]`` the row of the phrase queries holding
    candidate ``k``'s map (-1: the candidate lost every token; its map is empty), ``gold``
    the local labels (0 background, ``k + 1`` candidate ``k``, :data:`VOID`), ``classes``
    the set's class of each local label."""

    rows: list[int]
    gold: np.ndarray
    classes: np.ndarray

    @cached_property
    def targets(self) -> PointingTargets:
        """The pointing game's targets on ``gold`` (one distance transform a candidate
        present), computed once and shared by every map scored on this image."""
        return PointingTargets.of(self.gold, len(self.rows))


def candidate_rows(data: EvalSet, q: PhraseQueries) -> list[list[int]]:
    """Per image, the phrase-query row of each of its sample's phrases (-1 where the
    phrase kept no token and :func:`~otviz.eval.alignment_tables.phrase_queries` dropped
    it)."""
    out = [[-1] * len(s.phrases) for s in data.samples]
    spans = {(j, s, e): r for r, (j, (s, e)) in enumerate(zip(q.image.tolist(),
                                                               q.spans.tolist(), strict=True))}
    for j, sample in enumerate(data.samples):
        for n, p in enumerate(sample.phrases):
            out[j][n] = spans.get((j, p.start, p.end), -1)
    return out


def world_images(data: EvalSet, q: PhraseQueries) -> list[ScoredImage]:
    """The world's images with their exact labels (module docstring)."""
    images = []
    for sample, rows in zip(data.samples, candidate_rows(data, q), strict=True):
        objects = object_labels(sample.objects, sample.image.shape[0])
        by_object = np.zeros(len(sample.objects) + 1, dtype=np.int64)  # unnamed: background
        for n, p in enumerate(sample.phrases):
            by_object[p.object_index + 1] = n + 1 if rows[n] >= 0 else VOID
        classes = [0] + [1 + SHAPES.index(sample.objects[p.object_index].shape)
                         for p in sample.phrases]
        images.append(ScoredImage(rows, by_object[objects], np.asarray(classes)))
    return images


PixelMaps = Callable[[int, ScoredImage], Tensor]
#: A row's ``(label, name, flags, [P, N] token maps)``, or its note instead of maps.
RowMaps = tuple[str, str, dict[str, bool], Tensor | str]
#: A row's ``(label, name, flags, counts)``, or its note instead of counts.
RowCounts = tuple[str, str, dict[str, bool], SegmentationCounts | str]


def picked(maps: Tensor, rows: Sequence[int]) -> Tensor:
    """``[k, N]`` float64: the token maps ``maps[rows[c]]`` of the candidates (an empty, flat
    map where ``rows[c]`` is -1). Double precision throughout: a flat map (Global+Patch's)
    must stay flat once drawn, and single precision's rounding would give it a range."""
    out = torch.zeros(len(rows), maps.shape[1], dtype=torch.float64)
    for c, r in enumerate(rows):
        if r >= 0:
            out[c] = maps[r]
    return out


def token_maps(maps: Tensor, geometry: TokenGeometry) -> PixelMaps:
    """Image ``j``'s candidates' ``[k, H, W]`` pixel maps from ``[P, N]`` token maps (one
    per phrase query, :func:`picked`), upsampled on ``geometry`` to the image's labels'
    size."""

    def draw(j: int, image: ScoredImage) -> Tensor:
        height, width = image.gold.shape
        return geometry.upsample(picked(maps, image.rows), width, height)

    return draw


def gold_maps(j: int, image: ScoredImage) -> Tensor:
    """The gold masks as maps: candidate ``k``'s map is 1 on its labelled pixels."""
    gold = torch.from_numpy(image.gold.astype(np.int64))
    return (gold[None] == torch.arange(1, len(image.rows) + 1)[:, None, None]).double()


def segment(images: Sequence[ScoredImage], pixel_maps: PixelMaps, n_classes: int,
            threshold: float = THRESHOLD, background: bool = True) -> SegmentationCounts:
    """The counts of ``images`` segmented by ``pixel_maps``
    (:func:`~otviz.eval.segmentation_metrics.predict_labels`), and each candidate's
    pointing game on the same pixel maps (:meth:`SegmentationCounts.point`)."""
    counts = SegmentationCounts(n_classes)
    for j, image in enumerate(images):
        maps = pixel_maps(j, image)
        counts.add(image.gold, predict_labels(maps, threshold, background), image.classes)
        counts.point(maps, image.targets, image.classes)
    return counts


def reading(backbone: Backbone) -> str:
    """The reading a table's title names: the model, its patch features and input side."""
    return f"{backbone.name}, features {backbone.features}, {backbone.image_size} px input"


def iou_key(name: str) -> str:
    return f"iou_{name}"


def segmentation_columns(classes: Sequence[str]) -> list[Column]:
    """Method, mIoU, the per-class pointing game in both conventions, pixel accuracy, then
    each class's IoU."""
    return ([Column("method", "Method", "text"), Column("miou", "mIoU"),
             Column("pointing", "Pointing game (per class)"),
             Column("pointing_tol", f"Pointing, {TOLERANCE_PX:g} px tolerance (per class)"),
             Column("acc", "Pixel acc.")] + [Column(iou_key(c), c) for c in classes])


def segmentation_row(label: str, name: str, counts: SegmentationCounts,
                     classes: Sequence[str], **flags: bool) -> dict:
    """One row: mIoU, the pointing game averaged per class (``pointing``, ``pointing_tol``),
    pixel accuracy, per-class IoU (NaN: never labelled nor predicted) and per class its
    labelled pixels (``pixels``), its pointing trials (image-candidate pairs) and
    accuracies (NaN: no trial), intersection and union."""
    iou = counts.iou()

    def per_class(values: np.ndarray) -> dict[str, float]:
        return {c: float(v) for c, v in zip(classes, values, strict=True)}

    return {"method": label, "name": name, "miou": counts.miou(),
            "pointing": counts.pointing(), "pointing_tol": counts.pointing(tolerant=True),
            "acc": counts.pixel_accuracy(),
            **{iou_key(c): float(v) for c, v in zip(classes, iou, strict=True)},
            "pixels": {c: int(v) for c, v in zip(classes, counts.labelled, strict=True)},
            "pointing_trials": {c: int(v) for c, v in zip(classes, counts.trials, strict=True)},
            "pointing_per_class": per_class(counts.class_pointing()),
            "pointing_tol_per_class": per_class(counts.class_pointing(tolerant=True)),
            "intersect": [int(v) for v in counts.intersect],
            "union": [int(v) for v in counts.union()], **flags}


def template_embeddings(backbone: Backbone, texts: Sequence[str], templates: Sequence[str]
                        ) -> Tensor:
    """``[P, E]`` unit embeddings of ``texts``, each the ensemble of ``templates`` filled
    with it (:func:`otviz.text.templates.ensembled`), every distinct text encoded once."""
    unique = list(dict.fromkeys(texts))
    where = {t: k for k, t in enumerate(unique)}
    embedded = ensembled(partial(phrase_embeddings, backbone), unique, templates)
    return embedded[[where[t] for t in texts]]


def row_token_maps(
    suite: MethodSuite, data: EvalSet, q: PhraseQueries, explainers: Sequence[str] = (),
    chunk: int = CHUNK, progress: StageProgress | None = None, seed: int | None = None,
    text: Tensor | None = None,
) -> list[RowMaps]:
    """``(label, name, flags, [P, N] maps)`` of every row the grounding table scores: the
    methods with a patch-token plan (:func:`method_token_maps`), then the explainers and
    the model-free baselines (:func:`other_token_maps`)."""
    return (method_token_maps(suite, data, q, chunk, progress)
            + other_token_maps(data, q, explainers, seed, text))


def method_token_maps(suite: MethodSuite, data: EvalSet, q: PhraseQueries, chunk: int = CHUNK,
                      progress: StageProgress | None = None) -> list[RowMaps]:
    """The rows of the methods with a patch-token plan: each phrase query's phrase map
    (:func:`~otviz.eval.alignment_tables.phrase_heatmaps`)."""
    out: list[RowMaps] = []
    for name, entry in suite.methods.items():
        if not entry.method.has_plan:
            continue  # no patch-token plan (Global-only)
        stage = None if progress is None else (
            lambda d, t, name=name: progress(f"segmentation {name}", d, t))
        out.append((METHOD_LABELS.get(name, name), name, {}, phrase_heatmaps(
            entry, data, q.image, data.positives[q.image], q.select, chunk, stage)))
    return out


def other_token_maps(data: EvalSet, q: PhraseQueries, explainers: Sequence[str] = (),
                     seed: int | None = None, text: Tensor | None = None) -> list[RowMaps]:
    """The rows of the explainers (an unavailable one: its note instead of maps; ``text``:
    the phrase queries' ``[P, E]`` embeddings they read, e.g. :func:`template_embeddings`,
    else each phrase's text encoded) and of the model-free baselines
    (:func:`~otviz.eval.alignment_tables.baseline_maps`)."""
    out: list[RowMaps] = []
    images = [data.samples[int(j)].image for j in q.image]
    for name in explainers:
        note = unavailable(data.backbone, name)
        out.append((EXPLAINERS[name].label, name, {"explainer": True},
                    note if note is not None
                    else explain_pairs(data.backbone, name, images, q.texts,
                                       text=text).maps))
    return out + [(label, name, {"baseline": True}, maps)
                  for label, name, maps in baseline_maps(data, q, seed)]


def segmented(
    rows: Sequence[RowMaps], images: Sequence[ScoredImage], draw: Callable[[Tensor], PixelMaps],
    n_classes: int, threshold: float = THRESHOLD, background: bool = True,
) -> list[RowCounts]:
    """Each of ``rows`` segmented and counted, its token maps drawn on the images' pixels by
    ``draw(maps)`` (e.g. :func:`token_maps`; an unavailable row keeps its note), then the
    gold masks' counts (``"gold_masks"``)."""
    out: list[RowCounts] = [
        (label, name, flags, maps if isinstance(maps, str) else segment(
            images, draw(maps), n_classes, threshold, background))
        for label, name, flags, maps in rows]
    gold = segment(images, gold_maps, n_classes, threshold, background)
    return out + [("Gold masks", "gold_masks", {"baseline": True}, gold)]


def scored_rows(rows: Sequence[RowCounts], classes: Sequence[str]) -> list[dict]:
    """The table's rows of :func:`segmented`'s counts."""
    return [{"method": counts, "name": name, **flags} if isinstance(counts, str)
            else segmentation_row(label, name, counts, classes, **flags)
            for label, name, flags, counts in rows]


def rule_note(threshold: float, background: bool) -> str:
    """The table's note on how maps become a segmentation."""
    rule = ("each candidate's map scaled to [0, 1] by its own min and max over the image "
            "(a flat map: 0), the pixel to the highest")
    if background:
        rule += (f", background where that is below {threshold:g} (SCLIP's probability "
                 "threshold, read on scaled maps)")
    return (f"segmentation: {rule}; IoU per class from the pixels summed over the set "
            "(mmseg), not a mean of per-image IoUs; mIoU over the classes labelled or "
            "predicted; void pixels (255) count nowhere; pointing (TorchRay's per-class "
            "pointing game): per image and candidate with labelled pixels, the peak of its map "
            "on the image's pixels on them (strict) or closer than "
            f"{TOLERANCE_PX:g} px (tolerant), a tie scored as the expected hit; accuracy per "
            "class, then the mean over the classes with a trial")


def prompts_reading(templates: str) -> str:
    """What a table's title says of the prompts its explainers read (``--templates``)."""
    if templates == "single":
        return "one prompt a class"
    return f"prompts: {templates} ensemble of {len(TEMPLATE_SETS[templates])} templates"


def segmentation_table(
    suite: MethodSuite, data: EvalSet, explainers: Sequence[str] = (),
    threshold: float = THRESHOLD, chunk: int = CHUNK, progress: StageProgress | None = None,
    seed: int | None = None, templates: str = "single",
) -> Table:
    """The world's segmentation table (module docstring) on ``data``; ``templates``
    (:data:`~otviz.text.templates.TEMPLATE_SETS`): ``"single"`` reads each phrase as
    written, an ensemble gives each explainer the phrase's ensembled embedding
    (:func:`template_embeddings`)."""
    q = phrase_queries(data)
    images = world_images(data, q)
    text = (template_embeddings(data.backbone, q.texts, TEMPLATE_SETS[templates])
            if templates != "single" and explainers else None)
    counts = segmented(row_token_maps(suite, data, q, explainers, chunk, progress, seed, text),
                       images, lambda maps: token_maps(maps, data.geometry),
                       len(WORLD_CLASSES), threshold)
    table = Table("segmentation", f"Open-vocabulary segmentation of {data.n_images} world "
                  f"{data.split} images ({q.image.numel()} phrases as classes; "
                  f"{reading(data.backbone)}; {prompts_reading(templates)})",
                  segmentation_columns(WORLD_CLASSES))
    table.rows = scored_rows(counts, WORLD_CLASSES)
    pixels = table.rows[-1]["pixels"]
    table.notes += [
        "candidates per image: its caption's phrases and background; labels: the object "
        "covering the pixel (coverage >= 0.5), background off objects and on the objects "
        "the caption does not name; classes: background and the object's shape, two objects "
        "of one shape in one image told apart",
        rule_note(threshold, True),
        "methods: the phrase map of the plan (mass from each patch to the phrase's tokens), "
        "or the method's own phrase map; explainers: the phrase's map from its text" + (
            "" if templates == "single" else
            f" (its {templates} ensemble: the templates filled with it)") + "; "
        "drawn on the pixels bilinearly between token centres",
        "labelled pixels: " + ", ".join(f"{c} {n:,}" for c, n in pixels.items()),
        "sanity rows: gold masks (the labels as maps: 100), uniform map (background "
        "everywhere: the background's IoU over the classes labelled)"]
    table.notes += [f"{METHOD_LABELS.get(n, n)}: {why}" for n, why in flat_map_reasons().items()
                    if n in suite.methods]
    return table
