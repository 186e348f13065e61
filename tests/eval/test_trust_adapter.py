"""The Quantus adapter: its model scores phrases as the backbone does, every method, explainer
and baseline is an explanation function of patch maps at pixel size, MPRT re-initialises the
image tower's top blocks only, and the install has one cv2."""

from __future__ import annotations

from copy import deepcopy
from importlib import metadata

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from otviz.backbone import Backbone
from otviz.eval.trust import adapter as T
from otviz.explainers import EXPLAINERS, phrase_embeddings
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from otviz.world import World, WorldConfig
from tests.helpers import random_tiny_clip, world_trust_inputs


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Backbone:
    torch.set_num_threads(1)
    return Backbone.from_checkpoint(random_tiny_clip(tmp_path_factory.mktemp("bb") / "bb", 3))


@pytest.fixture(scope="module")
def inputs(backbone) -> T.TrustInputs:
    return world_trust_inputs(backbone, seed=0, n=2)


def test_one_cv2_and_quantus_import() -> None:
    import cv2  # noqa: F401
    import pytorch_grad_cam  # noqa: F401
    import quantus  # noqa: F401

    installed = set()
    for name in ("opencv-python", "opencv-python-headless", "opencv-contrib-python"):
        try:
            metadata.version(name)
            installed.add(name)
        except metadata.PackageNotFoundError:
            pass
    assert installed == {"opencv-python-headless"}


def test_class_scores_are_the_backbone_similarities(backbone, inputs) -> None:
    scorer = inputs.scorer
    scores = scorer(torch.as_tensor(inputs.pixels))
    world = World(WorldConfig(negatives=False), "test", 0)
    images = [world.sample(i).image for i in inputs.image_of]
    captions = [p.caption for p in scorer.phrases]
    image_global = F.normalize(backbone.encode(images, captions).image_global, dim=-1)
    text = phrase_embeddings(backbone, [p.text for p in scorer.phrases])
    assert scores.shape == (len(captions), len(captions))
    assert torch.allclose(scores, image_global @ text.T, atol=1e-5)


def test_every_source_gives_patch_maps_at_pixel_size(backbone, inputs) -> None:
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip", "powerclip"))
    sources = T.heatmap_sources(suite.methods, tuple(EXPLAINERS))
    assert [s.name for s in sources] == ["filip", "powerclip", *EXPLAINERS, "colour_oracle",
                                        "centre_prior", "uniform"]
    side, (h, w) = inputs.pixels.shape[-1], backbone.grid
    for source in sources:
        maps = source(inputs.scorer, inputs.pixels, inputs.targets)
        assert maps.shape == (len(inputs.targets), 1, side, side), source.name
        assert (maps >= 0).all()
        patches = maps[:, 0].reshape(len(maps), h, side // h, w, side // w)
        assert np.allclose(patches, patches[:, :, :1, :, :1]), source.name  # one value a patch
    assert [s.model_free for s in sources].count(True) == 3


def test_method_map_is_the_grounding_tables_heatmap(backbone, inputs) -> None:
    """The adapter's FILIP map equals the method's heatmap of the pair's encoded features."""
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip",))
    entry = suite.methods["filip"]
    source = T.heatmap_sources(suite.methods, (), baselines=False)[0]
    scorer = inputs.scorer
    maps = source.patch_maps(scorer, torch.as_tensor(inputs.pixels),
                             torch.as_tensor(inputs.targets))
    world = World(WorldConfig(negatives=False), "test", 0)
    images = [world.sample(i).image for i in inputs.image_of]
    feats = backbone.to_space(backbone.encode(images, [p.caption for p in scorer.phrases]),
                              "projected")
    with torch.no_grad():
        expected = entry.method.phrase_patch_map(entry.method(feats.pair_batch()),
                                                 scorer.select)
    assert torch.allclose(maps, expected, atol=1e-5)


def test_gold_masks_are_the_cells_of_the_tokens_that_look_in_the_box() -> None:
    boxes = torch.tensor([[8.0, 8.0, 24.0, 20.0]], dtype=torch.float64)
    mask = T.gold_masks(boxes, TokenGeometry.cell_centred((4, 4), (32, 32)))[0, 0]
    # patch centres at 4, 12, 20, 28: x in {12, 20}, y in {12}
    expected = torch.zeros(32, 32)
    expected[8:16, 8:24] = 1
    assert torch.equal(mask, expected)
    # a stem whose tokens look 3.5 px up-left of their cells: centres 0.5, 8.5, 16.5, 24.5;
    # x and y in {8.5, 16.5}; their cells [4.5, 12.5) and [12.5, 20.5) on each axis
    stem = TokenGeometry((4, 4), (32, 32), (8.0, 8.0), (0.5, 0.5))
    shifted = T.gold_masks(boxes, stem)[0, 0]
    expected = torch.zeros(32, 32)
    expected[4:20, 4:20] = 1  # pixel k's centre k + 0.5 in [4.5, 20.5)
    assert torch.equal(shifted, expected)


def test_randomisation_layers_are_the_top_blocks(backbone, inputs) -> None:
    blocks = backbone.image_tower.randomisation_blocks()
    scorer = T.PhraseScorer(backbone, inputs.scorer.phrases, blocks=1)
    layers = [n for n, m in scorer.named_modules() if hasattr(m, "reset_parameters")]
    assert layers == ["units.0"]
    copy = deepcopy(scorer)
    before = {k: v.clone() for k, v in copy.backbone.model.state_dict().items()}
    torch.manual_seed(1)
    copy.units[0].reset_parameters()
    after = copy.backbone.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    top = {f"visual.transformer.resblocks.{len(blocks) - 1}."}
    assert changed and all(any(k.startswith(t) for t in top) for k in changed)
    assert all(torch.equal(v, backbone.model.state_dict()[k]) for k, v in before.items())
    # the explainers read the randomised copy's weights as they are now: Grad-CAM's map of
    # the copy equals Grad-CAM on a model built with those weights from the start
    source = T.ExplainerSource("gradcam", "Grad-CAM")
    pixels = torch.as_tensor(inputs.pixels[:1])
    targets = torch.as_tensor(inputs.targets[:1])
    fresh = deepcopy(copy)
    assert torch.equal(source.patch_maps(copy, pixels, targets),
                       source.patch_maps(fresh, pixels, targets))
    assert not torch.equal(source.patch_maps(copy, pixels, targets),
                           source.patch_maps(scorer, pixels, targets))


def test_box_to_model_pixels_follows_the_centre_crop() -> None:
    shortest = {"resize_mode": "shortest"}
    assert T.box_to_model_pixels((0, 0, 80, 80), (80, 80), (80, 80), shortest) == (0, 0, 80, 80)
    # 160 x 80 image -> 160 x 80 at scale 1, the centre 80 x 80 cut from x = 40
    assert T.box_to_model_pixels((40, 0, 60, 10), (160, 80), (80, 80), shortest) == (
        0, 0, 20, 10)


def test_a_phrase_with_several_boxes_has_their_union_as_gold_region(backbone) -> None:
    """A Flickr30k Entities phrase naming two objects: its gold region is the union of the
    two boxes' regions (each box alone gives a part of it)."""
    from dataclasses import replace

    sample = World(WorldConfig(), "test", 0).sample(0)
    phrase = T.world_phrases(sample)[0]
    a, b = (tuple(float(v) for v in o.box) for o in sample.objects[:2])
    masks = T.trust_inputs(backbone, [sample.image] * 3, [
        [replace(phrase, box=a)], [replace(phrase, box=b)],
        [replace(phrase, box=None, boxes=(a, b))]]).masks
    assert masks is not None and masks[0].any() and masks[1].any()
    assert not np.array_equal(masks[0], masks[1])
    np.testing.assert_array_equal(masks[2], np.maximum(masks[0], masks[1]))
