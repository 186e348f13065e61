"""One trust metric for every row of a Browse table: the metric of one method's (or
explainer's, or baseline's) map of each (image, phrase) query, streamed over the table's
images in chunks of at most :data:`CHUNK_ROWS` queries (one Quantus call per chunk; the
classes: every phrase of the chunk; random logit: the phrases of the query's own caption),
so the memory it takes is bounded by a chunk's, whatever the number of images."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from otviz.eval.browse import BrowseTable
from otviz.eval.trust.adapter import (
    HeatmapSource,
    TrustPhrase,
    UnreadPhrasesError,
    heatmap_sources,
    phrase_colour,
    trust_inputs,
)
from otviz.eval.trust.metrics import METRIC_BY_KEY, TrustScores, TrustSettings, trust_scores
from otviz.explainers import EXPLAINERS
from otviz.suite import MethodSuite

#: The queries one chunk holds at most (all of an image's queries stay in one chunk; an
#: image with more is a chunk of its own): Quantus' own batch size, so that a chunk is one
#: batch of its model and explanation calls.
CHUNK_ROWS = 64
#: Why a row has no value (:func:`blank_reason`), ``{metric}`` its label.
NO_BOX = "no {metric}: the phrase has no gold box"
UNREAD = "no {metric}: the model reads none of the phrase's words (all past its context)"
FLAT_MAP = ("no {metric}: the map of this phrase is {value:g} everywhere (its explainer "
            "found nothing for it), and a flat map has no order or norm to measure")
REFUSED = "no {metric}: Quantus refused the maps ({why})"
ONE_PHRASE = "no {metric}: the caption has no other phrase to draw"
NO_VALUE = "no {metric}: Quantus gave no value"


def browse_trust_values(
    suite: MethodSuite, table: BrowseTable, name: str, metric: str,
    settings: TrustSettings | None = None, chunk_rows: int = CHUNK_ROWS,
    reasons: dict[int, str] | None = None, before_chunk: Callable[[], None] | None = None,
) -> Tensor:
    """``[P]`` float64: the ``metric`` of the map ``name`` (a method, explainer or baseline)
    for each query of ``table``; NaN where it does not apply (no gold box for a localisation
    metric, a phrase the model reads no word of, maps Quantus refuses); ``settings`` default
    to :class:`TrustSettings`. The images are taken in chunks of at most ``chunk_rows``
    queries (:func:`image_chunks`), each scored on its own: the random draws (noise,
    subsets, the other phrase of random logit) are seeded per chunk. ``before_chunk`` runs
    before each chunk (the served app's stop check: it raises to end the work there)."""
    settings = settings or TrustSettings()
    if metric not in METRIC_BY_KEY:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRIC_BY_KEY)}")
    out = torch.full((len(table.items),), float("nan"), dtype=torch.float64)
    needs_boxes = METRIC_BY_KEY[metric].needs_boxes
    reasons = {} if reasons is None else reasons
    if not table.items or (needs_boxes and table.gold is None):
        reasons.update(dict.fromkeys(range(len(table.items)),
                                     NO_BOX.format(metric=METRIC_BY_KEY[metric].label)))
        return out
    sources = heatmap_sources(suite.methods, [n for n in EXPLAINERS if n == name])
    source = next((s for s in sources if s.name == name), None)
    if source is None:
        raise ValueError(f"{name!r} is no method with a plan, explainer or baseline here")
    by_image: dict[int, list[int]] = {}
    for q, it in enumerate(table.items):
        by_image.setdefault(it.image, []).append(q)
    for chunk in image_chunks(by_image, chunk_rows):
        if before_chunk is not None:
            before_chunk()
        _score_chunk(suite, table, source, metric, settings, chunk, out, reasons)
    return out


def image_chunks(by_image: dict[int, list[int]], rows: int) -> Iterator[dict[int, list[int]]]:
    """``by_image`` (image -> its queries) in consecutive chunks of whole images, each of at
    most ``rows`` queries unless one image alone has more."""
    chunk: dict[int, list[int]] = {}
    size = 0
    for image, queries in by_image.items():
        if chunk and size + len(queries) > rows:
            yield chunk
            chunk, size = {}, 0
        chunk[image] = queries
        size += len(queries)
    if chunk:
        yield chunk


def _score_chunk(suite: MethodSuite, table: BrowseTable, source: HeatmapSource, metric: str,
                 settings: TrustSettings, by_image: dict[int, list[int]], out: Tensor,
                 reasons: dict[int, str]) -> None:
    """The ``metric`` of the queries of ``by_image`` (image -> its queries), written into
    ``out`` at their rows; a row left NaN gets its reason in ``reasons``."""
    label = METRIC_BY_KEY[metric].label
    phrases = [[_phrase(table, q) for q in queries] for queries in by_image.values()]
    try:
        inputs = trust_inputs(suite.backbone, [table.load_image(j) for j in by_image],
                              phrases, settings.mprt_blocks or None)
    except UnreadPhrasesError:
        reasons.update(dict.fromkeys((q for qs in by_image.values() for q in qs),
                                     UNREAD.format(metric=label)))
        return
    row_of = {id(p): k for k, p in enumerate(inputs.scorer.phrases)}
    scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets, inputs.masks,
                          settings, metrics=[metric], near=inputs.near)
    for queries, own in zip(by_image.values(), phrases, strict=True):
        for q, phrase in zip(queries, own, strict=True):
            if id(phrase) not in row_of:  # left out: the model reads none of its words
                reasons[q] = UNREAD.format(metric=label)
                continue
            row = row_of[id(phrase)]
            if metric in scores.values:
                out[q] = float(scores.values[metric][row])
            if out[q].isnan():
                reasons[q] = blank_reason(scores, metric, row, inputs.scorer.phrases)


def blank_reason(scores: TrustScores, metric: str, row: int, phrases: list[TrustPhrase]) -> str:
    """Why ``scores`` has no ``metric`` value at ``row`` (of the scored ``phrases``): Quantus
    refused the batch's maps; the row's map is flat (e.g. Grad-CAM's ``ReLU`` map of a phrase
    it finds no positive evidence for is 0 everywhere, and max-sensitivity's ratio
    ``|a - a'| / |a|``, Yeh et al. 2019 Eq. 2 with Quantus' normalised maps, is then
    ``0 / 0``); random logit's caption has one phrase; else Quantus returned NaN."""
    label = METRIC_BY_KEY[metric].label
    if metric in scores.refused:
        return REFUSED.format(metric=label, why=scores.refused[metric])
    heat = scores.maps[row] if scores.maps is not None else None
    if heat is not None and float(heat.max()) == float(heat.min()):
        return FLAT_MAP.format(metric=label, value=float(heat.max()))
    if metric == "random_logit":
        caption = phrases[row].caption
        if sum(p.caption == caption for p in phrases) < 2:
            return ONE_PHRASE.format(metric=label)
    return NO_VALUE.format(metric=label)


def _phrase(table: BrowseTable, q: int) -> TrustPhrase:
    """Query ``q`` of the table as a trust phrase (its gold box when the table has them)."""
    it = table.items[q]
    box = None if table.gold is None else tuple(float(v) for v in table.gold[q])
    return TrustPhrase(it.caption, tuple(range(it.start, it.end)), it.phrase, box,
                       phrase_colour(it.phrase))
