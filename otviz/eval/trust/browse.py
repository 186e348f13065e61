"""One trust metric for every row of a Browse table: the metric of one method's (or
explainer's, or baseline's) map of each (image, phrase) query, all queries in one Quantus
call per metric (the classes: every phrase of the table; random logit: the phrases of the
query's own caption)."""

from __future__ import annotations

import torch
from torch import Tensor

from otviz.eval.browse import BrowseTable
from otviz.eval.trust.adapter import TrustPhrase, heatmap_sources, phrase_colour, trust_inputs
from otviz.eval.trust.metrics import METRIC_BY_KEY, TrustSettings, trust_scores
from otviz.explainers import EXPLAINERS
from otviz.suite import MethodSuite


def browse_trust_values(
    suite: MethodSuite, table: BrowseTable, name: str, metric: str,
    settings: TrustSettings | None = None,
) -> Tensor:
    """``[P]`` float64: the ``metric`` of the map ``name`` (a method, explainer or baseline)
    for each query of ``table``; NaN where it does not apply (no gold box for a localisation
    metric, a phrase the model reads no word of, maps Quantus refuses); ``settings`` default
    to :class:`TrustSettings`."""
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
    phrases = [[_phrase(table, q) for q in queries] for queries in by_image.values()]
    inputs = trust_inputs(suite.backbone, [table.load_image(j) for j in by_image], phrases,
                          settings.mprt_blocks or None)
    row_of = {id(p): k for k, p in enumerate(inputs.scorer.phrases)}
    scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets, inputs.masks,
                          settings, metrics=[metric])
    values = scores.values.get(metric)
    if values is None:
        return out
    for queries, own in zip(by_image.values(), phrases, strict=True):
        for q, phrase in zip(queries, own, strict=True):
            if id(phrase) in row_of:  # left out: the model reads none of its words
                out[q] = float(values[row_of[id(phrase)]])
    return out


def _phrase(table: BrowseTable, q: int) -> TrustPhrase:
    """Query ``q`` of the table as a trust phrase (its gold box when the table has them)."""
    it = table.items[q]
    box = None if table.gold is None else tuple(float(v) for v in table.gold[q])
    return TrustPhrase(it.caption, tuple(range(it.start, it.end)), it.phrase, box,
                       phrase_colour(it.phrase))
