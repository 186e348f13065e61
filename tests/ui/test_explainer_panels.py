"""The Align grid's explainer panels: off by default (the grid is the methods' alone), on
they follow the methods' panels, each the explainer's map of the phrase's words (as
:func:`otviz.explainers.explain_pairs` gives it), drawn like a readout with its box."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

import otviz.ui.explainer_panels as panels
from otviz.explainers import EXPLAINERS, explain_pairs
from otviz.suite import ALIGN_METHODS
from otviz.ui.align import (
    AlignSettings,
    align_runs,
    align_view,
    phrase_maps,
    phrase_text,
    phrase_view,
)
from otviz.ui.examples import load_examples
from otviz.ui.explainer_panels import explained_by, explainer_maps, explainer_panels
from otviz.viz.panels import compose_heatmaps


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, str]:
    example = load_examples()[0]
    return np.asarray(Image.open(example.image_path).convert("RGB")), example.caption


def test_off_by_default_and_on_adds_the_explainer_panels(tools, sample):
    explainer, suite = tools
    off = align_view(explainer, suite, *sample)
    on = align_view(explainer, suite, *sample, settings=AlignSettings(explainers=True))
    encoded = explainer.encode(*sample)
    assert explained_by(explainer.backbone, encoded, False) is None
    text = phrase_text(encoded, off.phrase)
    maps = explainer_maps(explainer.backbone, encoded, text)
    assert list(maps) == list(EXPLAINERS)
    for name, heat in maps.items():
        expected = explain_pairs(explainer.backbone, name, [encoded.image], [text]).maps[0]
        np.testing.assert_allclose(heat.reshape(-1), expected.numpy())
    assert on.grid.shape[0] > off.grid.shape[0]  # a row more of panels
    layout = phrase_maps(align_runs(*tools, encoded), encoded, off.phrase,
                         explained_by(explainer.backbone, encoded, True)).layout(encoded, False)
    assert layout["titles"][len(ALIGN_METHODS):] == [t for t, _ in explainer_panels(maps)]
    assert len(layout["heats"]) == len(ALIGN_METHODS) + len(EXPLAINERS)
    np.testing.assert_array_equal(on.grid, compose_heatmaps(encoded.image, **layout))
    again, _ = phrase_view(explainer, suite, *sample, off.phrase,
                           settings=AlignSettings(explainers=False))
    np.testing.assert_array_equal(again, off.grid)


def test_browse_computes_the_explainers_once_one_is_picked(ctx, checkpoint, tmp_path):
    from otviz.eval.browse import BrowseCache
    from otviz.explainers import explainers_needed
    from otviz.ui.browse_tab import WORLD_SOURCE, BrowseSources, browse_view, load_table

    sources = BrowseSources(BrowseCache(), tmp_path / "features", tmp_path / "uploads")
    plain = load_table(ctx, sources, checkpoint, WORLD_SOURCE, 4, "test",
                       explainers=explainers_needed(["conceptot", "filip"]))
    assert plain.methods == tuple(ALIGN_METHODS)
    picked = load_table(ctx, sources, checkpoint, WORLD_SOURCE, 4, "test",
                        explainers=explainers_needed(["conceptot", "legrad"]))
    assert picked.methods == (*ALIGN_METHODS, *EXPLAINERS)
    assert np.array_equal(picked.heatmaps[:, : len(ALIGN_METHODS)], plain.heatmaps)
    view = browse_view(picked, ["conceptot", "legrad"], "conceptot", "legrad")
    assert view.image is not None and "LeGrad" in view.frame.columns


class _Model:
    """A stand-in model: the cache reads nothing of it but its identity."""

    def __init__(self, tag: str) -> None:
        self.tag = tag


def test_a_model_at_a_freed_models_address_gets_its_own_maps(monkeypatch):
    """The maps are kept per model; a model freed and followed by another at the same address
    (the same ``id``) is served the new model's maps, not the freed one's."""
    monkeypatch.setattr(panels, "_MAPS", OrderedDict())
    monkeypatch.setattr(panels, "unavailable",
                        lambda backbone, name: f"{name} of {backbone.model.tag}")
    encoded = SimpleNamespace(key=("pixels", "caption"))
    first = _Model("first")
    address = id(first)
    maps = explainer_maps(SimpleNamespace(model=first), encoded, "a phrase")
    assert maps["gradcam"] == "gradcam of first"
    del first
    kept = [_Model("second") for _ in range(64)]  # CPython hands the freed block out again
    second = next((m for m in kept if id(m) == address), None)
    if second is None:
        pytest.skip("this interpreter gave no new object the freed address")
    maps = explainer_maps(SimpleNamespace(model=second), encoded, "a phrase")
    assert maps["gradcam"] == "gradcam of second"
