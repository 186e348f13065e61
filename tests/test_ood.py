"""The out-of-distribution notice: the patch-embedding score of :mod:`otviz.ood` calibrated
on the embedded backbone keeps world images (other seeds and splits than the references)
in-world and flags real photographs that calibration never saw; the app says so only for a
backbone that knows only the world."""

from __future__ import annotations

from pathlib import Path

import gradio
import pytest
import sklearn

from otviz.backbone import Backbone
from otviz.ood import N_CROPS, N_HELD_OUT, WorldDistance, patch_embeddings
from otviz.ui.context import EMBEDDED, WORLD_NOTICE, AppContext, BackboneChoice
from otviz.world import World

#: Photographs shipped with dependencies, none of them the calibration photo.
PHOTOS = [
    Path(gradio.__file__).parent / "media_assets" / "images" / "cheetah1.jpg",
    Path(gradio.__file__).parent / "media_assets" / "images" / "tower.jpg",
    Path(sklearn.__file__).parent / "datasets" / "images" / "china.jpg",
    Path(sklearn.__file__).parent / "datasets" / "images" / "flower.jpg",
]


@pytest.fixture(scope="module")
def ctx(app_context) -> AppContext:
    """The test process's :func:`tests.conftest.app_context`: its calibration (about 3.6 s
    of CPU) is the view tests' too."""
    return app_context


@pytest.fixture(scope="module")
def distance(ctx) -> tuple[Backbone, WorldDistance]:
    checkpoint = ctx.checkpoint_choices()[0]
    return ctx.explainer(checkpoint).backbone, ctx.world_distance(checkpoint)


def test_threshold_is_calibrated_between_world_and_photo(distance):
    _, d = distance
    assert d.in_world.shape == (N_HELD_OUT,) and d.photos.shape == (N_CROPS,)
    assert d.photos.max() < d.threshold < d.in_world.min()  # separated on this backbone


def test_world_images_stay_in_world_photos_are_far(distance):
    backbone, d = distance
    world = [s.image for split in ("train", "compositional")
             for s in World(split=split, seed=11).samples(0, 8)]
    scores = d.scores(patch_embeddings(backbone, world))
    assert (scores >= d.threshold).all()
    assert all(d.is_far(backbone, str(p)) for p in PHOTOS)


def test_the_notice_is_for_world_only_backbones(ctx, distance):
    backbone, _ = distance
    checkpoint = ctx.checkpoint_choices()[0]
    assert ctx.world_notice(checkpoint, str(PHOTOS[0])) == WORLD_NOTICE
    assert ctx.world_notice(checkpoint, World(split="test", seed=3).sample(0).image) is None
    assert ctx.world_notice(checkpoint, None) is None
    assert "real CLIP" in WORLD_NOTICE and "OTVIZ_REMOTE_MODELS" in WORLD_NOTICE
    other = AppContext([BackboneChoice("real", lambda: backbone, [], "ViT-B-16", "openai")])
    assert other.world_notice("real", str(PHOTOS[0])) is None
    assert other.world_distance("real") is None and EMBEDDED in checkpoint
