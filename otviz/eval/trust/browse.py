"""One trust metric for every row of a Browse table: the metric of one method's (or
explainer's, or baseline's) map of each (image, phrase) query, streamed over the table's
images in chunks of at most :data:`CHUNK_ROWS` queries (one Quantus call per chunk; the
classes: every phrase of the chunk; random logit: the phrases of the query's own caption),
so the memory it takes is bounded by a chunk's, whatever the number of images."""

from __future__ import annotations

from collections.abc import Iterator

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
from otviz.eval.trust.metrics import METRIC_BY_KEY, TrustSettings, trust_scores
from otviz.explainers import EXPLAINERS
from otviz.suite import MethodSuite

#: The queries one chunk holds at most (all of an image's queries stay in one chunk; an
#: image with more is a chunk of its own): Quantus' own batch size, so that a chunk is one
#: batch of its model and explanation calls.
CHUNK_ROWS = 64


def browse_trust_values(
    suite: MethodSuite, table: BrowseTable, name: str, metric: str,
    settings: TrustSettings | None = None, chunk_rows: int = CHUNK_ROWS,
) -> Tensor:
    """``[P]`` float64: the ``metric`` of the map ``name`` (a method, explainer or baseline)
    for each query of ``table``; NaN where it does not apply (no gold box for a localisation
    metric, a phrase the model reads no word of, maps Quantus refuses); ``settings`` default
    to :class:`TrustSettings`. The images are taken in chunks of at most ``chunk_rows``
    queries (:func:`image_chunks`), each scored on its own: the random draws (noise,
    subsets, the other phrase of random logit) are seeded per chunk."""
    settings = settings or TrustSettings()
    if metric not in METRIC_BY_KEY:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRIC_BY_KEY)}")
    out = torch.full((len(table.items),), float("nan"), dtype=torch.float64)
    needs_boxes = METRIC_BY_KEY[metric].needs_boxes
    if not table.items or (needs_boxes and table.gold is None):
        return out
    sources = heatmap_sources(suite.methods, [n for n in EXPLAINERS if n == name])
    source = next((s for s in sources if s.name == name), None)
    if source is None:
        raise ValueError(f"{name!r} is no method with a plan, explainer or baseline here")
    by_image: dict[int, list[int]] = {}
    for q, it in enumerate(table.items):
        by_image.setdefault(it.image, []).append(q)
    for chunk in image_chunks(by_image, chunk_rows):
        _score_chunk(suite, table, source, metric, settings, chunk, out)
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
                 settings: TrustSettings, by_image: dict[int, list[int]], out: Tensor) -> None:
    """The ``metric`` of the queries of ``by_image`` (image -> its queries), written into
    ``out`` at their rows (left NaN for a phrase the model reads none of)."""
    phrases = [[_phrase(table, q) for q in queries] for queries in by_image.values()]
    try:
        inputs = trust_inputs(suite.backbone, [table.load_image(j) for j in by_image],
                              phrases, settings.mprt_blocks or None)
    except UnreadPhrasesError:
        return
    row_of = {id(p): k for k, p in enumerate(inputs.scorer.phrases)}
    scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets, inputs.masks,
                          settings, metrics=[metric])
    values = scores.values.get(metric)
    if values is None:
        return
    for queries, own in zip(by_image.values(), phrases, strict=True):
        for q, phrase in zip(queries, own, strict=True):
            if id(phrase) in row_of:  # left out: the model reads none of its words
                out[q] = float(values[row_of[id(phrase)]])


def _phrase(table: BrowseTable, q: int) -> TrustPhrase:
    """Query ``q`` of the table as a trust phrase (its gold box when the table has them)."""
    it = table.items[q]
    box = None if table.gold is None else tuple(float(v) for v in table.gold[q])
    return TrustPhrase(it.caption, tuple(range(it.start, it.end)), it.phrase, box,
                       phrase_colour(it.phrase))
