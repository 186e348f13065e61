"""``otviz eval --tables trust``: the explanation metrics of every heatmap on the world.

:func:`trust_tables` scores, on the gold noun phrases of ``n`` world test images, every method
with a patch-token plan, the chosen explainers and the model-free baselines (colour oracle,
centre prior, uniform map) with the metrics of :mod:`otviz.eval.trust.metrics`, and returns two
tables: the metrics per row (means over the phrases, with the "does not depend on the model"
verdict of the randomisation test) and each metric's cost per image per kind of row. Over
seeds (``otviz eval --seeds``) both get their intervals from :mod:`otviz.eval.seeds`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from otviz.eval.grounding_metrics import pointing_note
from otviz.eval.table import Column, Table
from otviz.eval.trust.adapter import heatmap_sources, trust_inputs, world_phrases
from otviz.eval.trust.lattice import PatchLattice
from otviz.eval.trust.localisation import empty_masks
from otviz.eval.trust.metrics import (
    FLAT,
    TABLE_METRICS,
    TrustScores,
    TrustSettings,
    flat_note,
    trust_scores,
)
from otviz.eval.world_set import world_config_of
from otviz.suite import MethodSuite
from otviz.world import World

StageProgress = Callable[[str, int, int], None]
MODEL_FREE = "does not depend on the model"
#: Metrics shown as percentages (shares of phrases or of relevance); the others as numbers.
PERCENT = ("pointing", "pointing_tol", "mass", "rank")
KINDS = ("method", "explainer", "baseline")
MAPS_NOTE = (
    "maps: each row's token map (negative heat as none) repeated over each token's cell "
    "(the pixels nearer to where it looks than to where any other token looks); "
    "gold region: the cells of the tokens whose centre lies in the phrase's box; "
    "pointing in two conventions: strict (the peak inside the box, what-is-where-by-looking's "
    "reading) and 15 px (inside the box grown by 15 source pixels on every side); "
    "localisation (pointing, relevance mass and rank, AUC) computed by otviz per phrase, "
    "a tie broken uniformly at random and the expected value scored: the pointing game is "
    "the grounding table's (tests/eval/test_trust_localisation.py), relevance rank takes the "
    "pixels tied at the K-th value at random, AUC counts a tied pair 1/2 (Quantus 0.6.0 "
    "counts a tie for the peak as a hit when any tied pixel is in the box: a flat map "
    "pointed everywhere)")
QUANTUS_NOTE = "↑ higher is better, ↓ lower is better; Quantus 0.6.0 (Hedström et al., JMLR 2023)"


def verdict(mprt: float, settings: TrustSettings) -> str:
    """The randomisation verdict of a row from its mean MPRT similarity."""
    if not np.isfinite(mprt):
        return "-"
    return MODEL_FREE if mprt >= settings.model_free_at else "depends on the model"


def refresh_verdicts(tables: Sequence[Table], settings: TrustSettings | None = None) -> None:
    """Set each trust row's verdict from its (mean) MPRT similarity: after the tables are
    aggregated over seeds, the verdict follows the mean, not the first seed."""
    settings = settings or TrustSettings()
    for table in tables:
        if table.key == "trust":
            for row in table.rows:
                row["randomisation"] = verdict(row.get("mprt", float("nan")), settings)


def trust_columns(metrics: Sequence[str] | None = None) -> list[Column]:
    """The trust table's columns for ``metrics`` (default: all of :data:`TABLE_METRICS`); the
    randomisation verdict only with MPRT."""
    shown = [m for m in TABLE_METRICS if metrics is None or m.key in metrics]
    return ([Column("method", "Method", "text")]
            + [Column(m.key, f"{m.label} {'↑' if m.higher else '↓'}",
                      "pct" if m.key in PERCENT else "num") for m in shown]
            + ([Column("randomisation", "Randomisation", "text")]
               if any(m.key == "mprt" for m in shown) else [])
            + [Column("ms_per_image", "ms / image", "ms")])


def trust_tables(
    suite: MethodSuite,
    n_images: int,
    seed: int = 0,
    explainers: Sequence[str] = (),
    settings: TrustSettings | None = None,
    progress: StageProgress | None = None,
    split: str = "test",
    metrics: Sequence[str] | None = None,
) -> tuple[Table, Table]:
    """``(trust, trust_cost)`` tables on images ``0..n_images-1`` of the world ``split`` drawn
    with ``seed`` (module docstring); ``settings`` default to :class:`TrustSettings` with
    ``seed``; ``metrics``: the keys of :data:`TABLE_METRICS` to compute (default: all)."""
    settings = settings or TrustSettings(seed=seed)
    backbone = suite.backbone
    world = World(world_config_of(backbone, negatives=False), split, seed)
    samples = [world.sample(i) for i in range(n_images)]
    inputs = trust_inputs(backbone, [s.image for s in samples],
                          [world_phrases(s) for s in samples], settings.mprt_blocks or None)
    sources = heatmap_sources(suite.methods, explainers)
    n_rows = len(inputs.targets)
    table = Table("trust", f"Which heatmap can you trust? {n_rows} gold noun phrases of "
                  f"{n_images} world {split} images (localisation: otviz's tie rule; the "
                  "rest: Quantus)", trust_columns(metrics))
    cost: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    for k, source in enumerate(sources, start=1):
        scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets,
                              inputs.masks, settings, metrics, near=inputs.near)
        table.rows.append(trust_row(source.label, source.name, source.kind, scores, n_images,
                                    settings))
        for key, ms in scores.ms.items():
            cost[source.kind].setdefault(key, []).append(ms / n_images)
        if progress is not None:
            progress("trust", k, len(sources))
    patch = PatchLattice.on_cells(inputs.scorer.geometry, settings.patch).patch
    table.notes += trust_notes(settings, patch) + refusal_notes(table)
    if inputs.masks is not None:
        table.notes.append(empty_note(int(empty_masks(inputs.masks).sum())))
    return table, _cost_table(cost, n_images, settings, patch)


def empty_note(empty: int) -> str:
    """The localisation tie rule's note, with the phrases whose gold region holds no token."""
    return (f"{pointing_note(empty)}; in relevance mass and rank too, and they have no AUC "
            "(no positives)")


def trust_notes(settings: TrustSettings, patch: int) -> list[str]:
    """What a trust table's maps, gold regions, model and metrics are (its notes)."""
    return [
        f"settings: {settings.describe(patch)}",
        MAPS_NOTE,
        "model: the backbone's cosine similarity of the image with each phrase of the set "
        "(one class per phrase); deletion / insertion: mean drop / gain of the shown "
        "phrase's similarity over the steps (AOPC); randomisation: Spearman similarity of "
        "the map to the map after randomising (MPRT) or to another phrase's map of the same "
        "caption (random logit), identical or both flat maps count 1",
        QUANTUS_NOTE,
    ]


def refusal_notes(table: Table) -> list[str]:
    """Which rows got no value, and why (Quantus refused their maps)."""
    notes = []
    flat = [r for r in table.rows if set(r.get("refused", {}).values()) == {FLAT}]
    if flat:
        notes.append(flat_note([r["name"] for r in flat], [r["refused"] for r in flat]))
    flat_names = {r["name"] for r in flat}
    refused = [f"{r['name']}: {', '.join(r['refused'])}" for r in table.rows
               if r.get("refused") and r["name"] not in flat_names]
    if refused:
        notes.append("refused by Quantus' checks of the maps (no value): " + "; ".join(refused))
    return notes


def trust_row(label: str, name: str, kind: str, scores: TrustScores, n_images: int,
              settings: TrustSettings) -> dict:
    """A trust table's row of a heatmap source: each metric's mean over the phrases where it
    has a value, the randomisation verdict, the wall time per image."""
    row: dict = {"method": label, "name": name, "kind": kind}
    for key, values in scores.values.items():
        finite = values[np.isfinite(values)]
        row[key] = float(finite.mean()) if finite.size else float("nan")
    row["randomisation"] = verdict(row.get("mprt", float("nan")), settings)
    row["ms_per_image"] = sum(scores.ms.values()) / n_images
    if scores.refused:
        row["refused"] = scores.refused
    return row


def _cost_table(cost: dict[str, dict[str, list[float]]], n_images: int,
                settings: TrustSettings, patch: int) -> Table:
    """Each metric's mean wall time per image, per kind of row."""
    columns = [Column("metric", "Metric", "text"), Column("group", "Group", "text")]
    columns += [Column(kind, f"ms / image ({kind}s)", "ms") for kind in KINDS]
    table = Table("trust_cost", f"Cost of each trust metric per image ({n_images} images, "
                  "all its phrases)", columns)
    for key, label, group in [("maps", "The heatmaps (once per row)", "-")] + [
            (m.key, m.label, m.group) for m in TABLE_METRICS]:
        row = {"metric": label, "name": key, "group": group}
        for kind in KINDS:
            values = cost[kind].get(key)
            if values:
                row[kind] = float(np.mean(values))
        table.rows.append(row)
    table.notes.append(f"settings: {settings.describe(patch)}")
    table.notes.append("wall time of Quantus' call over the set's phrases divided by the "
                       "images, mean over the rows of that kind (methods, explainers, "
                       "baselines); the metrics that score a row's own maps (localisation, "
                       "deletion, insertion, faithfulness correlation, sparseness) reuse the "
                       "maps computed once (first line)")
    return table
