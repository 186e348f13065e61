"""The Align view's Trust panel without a browser: localisation for a world example's gold
phrase, the model-based metrics only (and why) for an upload, every map's fast metrics before
any slow one, rows kept once computed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from otviz.backbone import Backbone
from otviz.eval.segmentation import reading
from otviz.eval.trust.adapter import heatmap_sources, trust_inputs
from otviz.eval.trust.metrics import (
    LOCALISATION,
    METRICS,
    TABLE_METRICS,
    TrustSettings,
    trust_scores,
)
from otviz.explain import Explainer
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite, flat_map_reasons
from otviz.ui.app import build_app
from otviz.ui.examples import load_examples
from otviz.ui.trust_panel import (
    NO_BOXES,
    SLOW_MARK,
    TABLE_TITLE,
    TrustCache,
    panel_phrases,
    trust_frame,
    trust_rows,
)
from tests.helpers import random_tiny_clip

FAST = TrustSettings(regions=2, fc_runs=2, ms_samples=2, mprt_blocks=1)


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> tuple[Explainer, MethodSuite]:
    torch.set_num_threads(1)
    backbone = Backbone.from_checkpoint(random_tiny_clip(tmp_path_factory.mktemp("bb") / "b", 2))
    return Explainer(backbone), MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20],
                                                         ("filip",))


def _last(rows_iter):
    steps = list(rows_iter)
    return steps, steps[-1]


def test_example_phrase_gets_localisation_and_is_cached(tools) -> None:
    explainer, suite = tools
    example = load_examples()[0]
    encoded = explainer.encode(np.asarray(Image.open(example.image_path).convert("RGB")),
                               example.caption)
    phrases, target = panel_phrases(encoded, [0, 1, 2, 3])
    assert phrases[target].box is not None and len(phrases) >= 2
    cache = TrustCache()
    steps, (rows, status) = _last(trust_rows(explainer, suite, encoded, [0, 1, 2, 3], False,
                                             cache, FAST))
    names = ["FILIP", "Colour oracle (pixels)", "Centre prior"]
    assert [r["Map"] for r in rows] == names
    assert all(m.key in r for r in rows for m in TABLE_METRICS)  # the final yield: them all
    assert NO_BOXES not in status and "computing" in steps[0][1]
    # the first yield with every map has each map's fast metrics and none of the slow ones
    first, note = next((r, n) for r, n in steps if len(r) == len(names))
    fast = {m.key for m in TABLE_METRICS if not m.slow}
    slow = {m.key for m in TABLE_METRICS if m.slow}
    assert fast and slow and all(fast <= set(r) and not slow & set(r) for r in first)
    assert "slow metrics" in note and "computing 1 of 3" in note
    assert all(r["Randomisation"] == "…" for r in first)
    headers = trust_frame(first).columns
    assert {"Pointing (strict) ↑", "Pointing (±15 px) ↑"} <= set(headers)
    assert not any(SLOW_MARK in h for h in headers)
    again, _ = _last(trust_rows(explainer, suite, encoded, [0, 1, 2, 3], False, cache, FAST))
    assert len(again) == 1 and again[0][0] == rows  # read from the cache, nothing computed
    frame = trust_frame(rows)
    assert list(frame["Map"]) == [r["Map"] for r in rows]
    assert f"MPRT similarity ↓{SLOW_MARK}" in frame.columns
    # both pointing conventions: the eval code's values (the trust table's trust_scores on
    # the image's inputs with every phrase, its tolerant regions included) for this phrase
    inputs = trust_inputs(explainer.backbone, [encoded.image], [phrases])
    k = next(i for i, p in enumerate(inputs.scorer.phrases) if p is phrases[target])
    sources = {s.label: s for s in heatmap_sources(suite.methods, ())}
    for row in rows:
        ref = trust_scores(inputs.scorer, sources[row["Map"]], inputs.pixels, inputs.targets,
                           inputs.masks, FAST, metrics=["pointing", "pointing_tol"],
                           near=inputs.near).values
        assert row["pointing"] == pytest.approx(ref["pointing"][k], abs=1e-9)
        assert row["pointing_tol"] == pytest.approx(ref["pointing_tol"][k], abs=1e-9)
        assert row["pointing_tol"] >= row["pointing"]  # the grown box holds the box
    for key, header in (("pointing", "Pointing (strict) ↑"),
                        ("pointing_tol", "Pointing (±15 px) ↑")):
        assert frame[header].tolist() == [round(r[key], 3) for r in rows]


def test_the_panel_s_table_title_names_its_reading(ctx, checkpoint) -> None:
    """The app's panel: its table, from the first step on, is titled with the reading the
    maps are drawn on (the model, its features and input size, as otviz eval's tables)."""
    app = build_app(ctx)
    on_trust = next(f.fn for f in app.fns.values() if f.api_name == "align_trust")
    example = load_examples()[0]
    steps = on_trust(str(example.image_path), example.caption, checkpoint, "last", 0, None,
                     False)
    table, _ = next(steps)
    steps.close()
    backbone = ctx.explainer(checkpoint).backbone
    assert table.label == f"{TABLE_TITLE} ({reading(backbone)})"
    assert f"features {backbone.features}" in table.label
    assert f"{backbone.image_size} px" in table.label


def test_a_row_with_only_its_fast_part_cached_gets_its_slow_part(tools) -> None:
    """A panel stopped after the fast pass (the page closed, say) keeps what it computed: the
    next call reads the fast parts and computes only the slow ones."""
    explainer, suite = tools
    rng = np.random.default_rng(1)
    encoded = explainer.encode(rng.integers(0, 255, size=(64, 64, 3), dtype=np.uint8),
                               "a red circle and a blue square")
    cache = TrustCache()
    steps = trust_rows(explainer, suite, encoded, [0, 1, 2], False, cache, FAST)
    rows = next(r for r, note in steps if "slow metrics" in note)  # every fast part, no slow
    steps.close()
    rest = list(trust_rows(explainer, suite, encoded, [0, 1, 2], False, cache, FAST))
    assert all("slow metrics" in note for _, note in rest[:-1])  # no fast part computed again
    assert len(rest) == len(rows) + 1
    assert all("mprt" in r and "sparseness" in r for r in rest[-1][0])


def test_upload_gets_the_model_based_metrics_and_says_why(tools) -> None:
    explainer, suite = tools
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, size=(64, 96, 3), dtype=np.uint8)
    encoded = explainer.encode(image, "a red circle and a blue square")
    _, (rows, status) = _last(trust_rows(explainer, suite, encoded, [0, 1, 2], False,
                                         TrustCache(), FAST))
    assert NO_BOXES in status
    local = {m.key for m in METRICS if m.needs_boxes}
    assert all(not (local & set(r)) for r in rows)
    assert all("deletion" in r and "mprt" in r for r in rows)


def test_a_map_flat_by_construction_gets_no_scores_and_its_reason(tools) -> None:
    """Global+Patch's map is one value everywhere: the panel scores only its localisation
    (the tie rule's chance: AUC 1/2, relevance rank = relevance mass = the region's share of
    the pixels) and says why in words (its uniform plan), not just that Quantus refused it."""
    explainer, _ = tools
    suite = MethodSuite.training_free(explainer.backbone, WORLD_FIT_CAPTIONS[:20],
                                      ("global_patch",))
    example = load_examples()[0]
    encoded = explainer.encode(np.asarray(Image.open(example.image_path).convert("RGB")),
                               example.caption)
    _, (rows, status) = _last(trust_rows(explainer, suite, encoded, [0, 1, 2, 3], False,
                                         TrustCache(), FAST))
    flat = next(r for r in rows if r["Map"] == "Global+Patch")
    scored = [m for m in METRICS if m.group == LOCALISATION]
    assert all(np.isnan(flat[m.key]) and m.key in flat["refused"]
               for m in METRICS if m not in scored)
    assert not any(m.key in flat["refused"] for m in scored)
    assert flat["auc"] == 0.5 and flat["rank"] == pytest.approx(flat["mass"])
    assert 0 < flat["pointing"] < 1 and 0 < flat["mass"] < 1
    assert f"Global+Patch: {flat_map_reasons()['global_patch']}" in status
