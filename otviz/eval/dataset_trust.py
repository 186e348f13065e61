"""The trust table's localisation metrics on a real grounding set (``otviz eval --dataset
KIND:PATH --tables grounding,trust``): pointing game, relevance mass and rank accuracy, AUC
(:data:`~otviz.eval.trust.metrics.TABLE_METRICS` of the localisation group, both pointing
conventions among them, computed per phrase with one rule for ties as the world's trust
table computes them, :mod:`otviz.eval.trust.localisation`); the other groups (faithfulness,
randomisation, robustness, complexity) cost seconds per map and are not computed on a data
set.

Each shard's phrases are the :class:`~otviz.eval.world_set.GroundingProbeDataset` samples'
own: the image already resized to the tower's input without cropping and every gold box
scaled with it, so the eval transform leaves the image as it is and the boxes pass through
:func:`~otviz.eval.trust.adapter.box_to_model_pixels` unchanged; a phrase's gold region is
the union of its boxes. :func:`shard_trust` keeps each row's value per phrase (a shard file),
:func:`dataset_trust_table` pools the shards' phrases, so each value is the mean over the
whole set's phrases, as one batch would give it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from otviz.eval.table import Table
from otviz.eval.trust.adapter import TrustPhrase, heatmap_sources, trust_inputs
from otviz.eval.trust.localisation import empty_masks
from otviz.eval.trust.metrics import (
    LOCALISATION,
    TABLE_METRICS,
    TrustScores,
    TrustSettings,
    trust_scores,
)
from otviz.eval.trust.table import (
    MAPS_NOTE,
    QUANTUS_NOTE,
    empty_note,
    refusal_notes,
    trust_columns,
    trust_row,
)
from otviz.eval.world_set import GroundingProbeDataset
from otviz.suite import MethodSuite
from otviz.world import Sample

#: The metrics computed on a data set: the localisation group.
DATASET_TRUST_METRICS = tuple(m.key for m in TABLE_METRICS if m.group == LOCALISATION)


def dataset_phrases(sample: Sample) -> list[TrustPhrase]:
    """A data-set sample's gold phrases with every gold box (pixels of the sample's image, the
    model input's frame); no colour (a real set names none the oracle could read)."""
    return [TrustPhrase(sample.caption, tuple(range(p.start, p.end)), p.text,
                        tuple(p.box), None, sample.tree, p.gold_boxes, sample.pixel_scale)
            for p in sample.phrases]


def shard_trust(probe: GroundingProbeDataset, suite: MethodSuite, explainers: Sequence[str],
                settings: TrustSettings) -> dict[str, Any]:
    """Per row (every method with a plan, each explainer, the centre prior and uniform map),
    each localisation metric's value per phrase of the shard, its wall time and Quantus'
    refusals; JSON-ready."""
    inputs = trust_inputs(suite.backbone, [Image.fromarray(s.image) for s in probe.samples],
                          [dataset_phrases(s) for s in probe.samples])
    rows = {}
    for source in heatmap_sources(suite.methods, explainers):
        if source.name == "colour_oracle":  # no colour words to read
            continue
        scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets,
                              inputs.masks, settings, DATASET_TRUST_METRICS, near=inputs.near)
        rows[source.name] = {"label": source.label, "kind": source.kind,
                             "values": {k: v.tolist() for k, v in scores.values.items()},
                             "ms": scores.ms, "refused": scores.refused}
    empty = 0 if inputs.masks is None else int(empty_masks(inputs.masks).sum())
    return {"rows": rows, "phrases": len(inputs.targets), "images": len(probe.samples),
            "empty": empty}


def dataset_trust_table(results: Sequence[dict[str, Any]], title: str,
                        settings: TrustSettings) -> Table:
    """The trust table of the shards ``results`` (:func:`shard_trust`): each row's values
    over all their phrases pooled, each metric's mean over those with a value."""
    results = [r for r in results if r["rows"]]
    n_images = sum(r["images"] for r in results)
    n_phrases = sum(r["phrases"] for r in results)
    table = Table("trust", f"Localisation of {n_phrases} gold phrases ({title}; otviz's tie rule)",
                  trust_columns(DATASET_TRUST_METRICS))
    for name, first in results[0]["rows"].items():
        parts = [r["rows"][name] for r in results]
        scores = TrustScores(
            {k: np.concatenate([np.asarray(p["values"][k], dtype=np.float64) for p in parts])
             for k in DATASET_TRUST_METRICS},
            {k: sum(p["ms"].get(k, 0.0) for p in parts) for k in first["ms"]},
            {k: v for p in parts for k, v in p["refused"].items()})
        row = trust_row(first["label"], name, first["kind"], scores, n_images, settings)
        row.pop("randomisation")  # no MPRT on a data set
        table.rows.append(row)
    table.notes += [f"metrics: {', '.join(DATASET_TRUST_METRICS)} (localisation) only; "
                    "the faithfulness, randomisation, robustness and complexity metrics of "
                    "the world's trust table are not computed on a data set",
                    "gold region: the union of the phrase's gold boxes; each image resized "
                    "to the model's input without cropping"]
    table.notes += [MAPS_NOTE, QUANTUS_NOTE, *refusal_notes(table),
                    empty_note(sum(r.get("empty", 0) for r in results))]
    return table
