"""The segmentation table: per-class IoU and mIoU against closed forms on tiny label maps
(void ignored, sums over the set not per-image means, two instances of one class told
apart), the reading of maps as labels, and the world's table with its sanity rows (gold
masks at 1, the uniform map at the background's IoU over the classes labelled, pixels per
class equal to the rendered masks' counts)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from otviz.eval.segmentation import WORLD_CLASSES, segmentation_table, world_images
from otviz.eval.segmentation_metrics import (
    VOID,
    SegmentationCounts,
    predict_labels,
    scaled_maps,
)
from otviz.world import SHAPES
from otviz.world.render import object_labels, shape_alpha


def _counts(pairs: list[tuple[list, list]], classes: list[int], n: int) -> SegmentationCounts:
    counts = SegmentationCounts(n)
    for gold, pred in pairs:
        counts.add(np.asarray(gold), np.asarray(pred), classes)
    return counts


def test_iou_closed_form_with_void() -> None:
    # valid pixels: (g0, p1), (g1, p1), (g1, p0); the void pixel's prediction counts nowhere
    c = _counts([([[0, 1], [1, VOID]], [[1, 1], [0, 0]])], [0, 1], 2)
    np.testing.assert_array_equal(c.labelled, [1, 2])
    np.testing.assert_array_equal(c.predicted, [1, 2])
    np.testing.assert_array_equal(c.intersect, [0, 1])
    np.testing.assert_allclose(c.iou(), [0 / 2, 1 / 3])
    assert c.miou() == pytest.approx((0 + 1 / 3) / 2)
    assert c.pixel_accuracy() == pytest.approx(1 / 3)


def test_iou_sums_over_the_set_not_a_mean_of_images() -> None:
    # image A perfect (IoU 1), image B swapped (IoU 0): the set's IoU is 4 / 6, not 1/2
    c = _counts([([1, 1, 1, 1], [1, 1, 1, 1]), ([1, 0], [0, 1])], [0, 1], 2)
    assert c.iou()[1] == pytest.approx(4 / 6)
    assert c.iou()[0] == pytest.approx(0.0)


def test_two_instances_of_one_class_are_told_apart() -> None:
    # local labels 1 and 2 are both class 5; swapping them is wrong, not right
    c = _counts([([[1, 2]], [[2, 1]])], [0, 5, 5], 6)
    assert c.iou()[5] == 0.0
    assert math.isnan(c.iou()[0])  # background neither labelled nor predicted: left out
    assert c.miou() == 0.0
    merged = c.merged(_counts([([[1, 2]], [[1, 2]])], [0, 5, 5], 6))
    assert merged.iou()[5] == pytest.approx(2 / 6)  # I = 2, G = P = 4


def test_predict_labels_scales_each_map_and_thresholds_the_best() -> None:
    maps = torch.tensor([[[0.0, 1.0, 2.0, 5.0]], [[2.0, 0.0, 1.0, 5.0]], [[3.0] * 4]])
    np.testing.assert_allclose(scaled_maps(maps)[2], 0.0)  # flat: points nowhere
    np.testing.assert_allclose(scaled_maps(maps)[0, 0], [0.0, 0.2, 0.4, 1.0])
    # px0: map 1 (0.4 vs 0) -> label 2, below 0.5 -> background; px3: both 1, first wins
    np.testing.assert_array_equal(predict_labels(maps, 0.5), [[0, 0, 0, 1]])
    np.testing.assert_array_equal(predict_labels(maps, 0.3), [[2, 0, 1, 1]])
    np.testing.assert_array_equal(predict_labels(maps, 0.3, background=False), [[2, 1, 1, 1]])
    flat = torch.ones(2, 2, 3)
    np.testing.assert_array_equal(predict_labels(flat), np.zeros((2, 3)))


def test_object_labels_are_the_shapes_coverage() -> None:
    from otviz.world.types import SceneObject

    objects = [SceneObject("circle", "red", "large", (2, 3, 22, 23)),
               SceneObject("ring", "blue", "small", (30, 30, 42, 42))]
    labels = object_labels(objects, 48)
    assert (labels == 1).sum() == (shape_alpha("circle", 20) >= 0.5).sum()
    assert (labels == 2).sum() == (shape_alpha("ring", 12) >= 0.5).sum()
    assert labels[0, 0] == 0 and labels[13, 12] == 1 and labels[36, 36] == 0  # ring's hole


@pytest.fixture(scope="module")
def world_suite():
    from otviz.eval.runner import build_suite, load_backbone
    from otviz.eval.world_set import EvalSet

    torch.manual_seed(0)
    backbone = load_backbone()
    suite = build_suite(backbone, "training-free", ("filip", "dense_uot", "conceptot"))
    return suite, EvalSet.build(backbone, 8, "test", 0, ".cache/otviz-features")


@pytest.fixture(scope="module")
def world_table(world_suite):
    suite, data = world_suite
    return data, segmentation_table(suite, data, explainers=("maskclip",))


def test_world_with_the_imagenet_templates(world_suite, world_table) -> None:
    """``templates="imagenet80"`` on the world: named in the title; the methods read the
    world's captions (rows unchanged), the explainer the phrases' ensembled embeddings."""
    suite, data = world_suite
    table = segmentation_table(suite, data, explainers=("maskclip",), templates="imagenet80")
    assert "prompts: imagenet80 ensemble of 80 templates" in table.title
    assert "one prompt a class" in world_table[1].title
    before = {r["name"]: r for r in world_table[1].rows}
    rows = {r["name"]: r for r in table.rows}
    for name in ("filip", "dense_uot", "conceptot", "gold_masks", "uniform"):  # NaN-aware
        assert json.dumps(rows[name], sort_keys=True) == json.dumps(before[name],
                                                                    sort_keys=True), name
    assert rows["maskclip"]["intersect"] != before["maskclip"]["intersect"]


def test_world_sanity_rows_and_pixels(world_table) -> None:
    data, table = world_table
    rows = {r["name"]: r for r in table.rows}
    assert rows["gold_masks"]["miou"] == 1.0
    # pixels per class: the rendered masks, the object's shape where a phrase names it
    expected = dict.fromkeys(WORLD_CLASSES, 0)
    for s in data.samples:
        labels = object_labels(s.objects, s.image.shape[0])
        named = {p.object_index for p in s.phrases}
        for k, obj in enumerate(s.objects):
            cls = obj.shape if k in named else "background"
            expected[cls] += int((labels == k + 1).sum())
        expected["background"] += int((labels == 0).sum())
    assert rows["gold_masks"]["pixels"] == expected
    # uniform: background everywhere -> IoU_bg = share of background pixels, others 0
    total = sum(expected.values())
    labelled = [c for c in WORLD_CLASSES if expected[c]]
    assert rows["uniform"]["iou_background"] == pytest.approx(expected["background"] / total)
    assert rows["uniform"]["miou"] == pytest.approx(expected["background"] / total /
                                                    len(labelled))
    for name in ("filip", "dense_uot", "conceptot", "maskclip", "centre_prior"):
        assert 0.0 <= rows[name]["miou"] <= 1.0
        assert 0.0 <= rows[name]["pointing"] <= rows[name]["pointing_tol"] <= 1.0
    assert set(SHAPES) <= {k[4:] for k in rows["conceptot"] if k.startswith("iou_")}
    # pointing: one trial per phrase whose object has labelled pixels, by its shape
    gold = rows["gold_masks"]
    assert gold["pointing"] == gold["pointing_tol"] == 1.0
    assert sum(gold["pointing_trials"].values()) == sum(len(s.phrases) for s in data.samples)
    assert gold["pointing_trials"]["background"] == 0


def test_world_images_label_each_object_by_its_phrase(world_table) -> None:
    from otviz.eval.alignment_tables import phrase_queries

    data, _ = world_table
    q = phrase_queries(data)
    for sample, image in zip(data.samples, world_images(data, q), strict=True):
        labels = object_labels(sample.objects, sample.image.shape[0])
        for n, p in enumerate(sample.phrases):
            on = labels == p.object_index + 1
            assert (image.gold[on] == n + 1).all()
            assert image.classes[n + 1] == 1 + SHAPES.index(sample.objects[p.object_index].shape)
        assert (image.gold[labels == 0] == 0).all()


def test_a_flat_token_map_stays_flat_once_drawn() -> None:
    """A flat plan map (Global+Patch's) drawn on the pixels is still flat, so it is read as
    pointing nowhere: background everywhere, like the uniform map."""
    from otviz.eval.segmentation import ScoredImage, token_maps
    from otviz.patch_grid.tokens import TokenGeometry

    geometry = TokenGeometry.cell_centred((10, 10), (80, 80))
    maps = torch.full((2, 100), 1.0 / 3000, dtype=torch.float64)  # a mass, not a round number
    image = ScoredImage([0, 1], np.zeros((80, 80), dtype=np.int64), np.array([0, 1, 2]))
    drawn = token_maps(maps, geometry)(0, image)
    assert (drawn.amax(dim=(1, 2)) == drawn.amin(dim=(1, 2))).all()
    assert (predict_labels(drawn) == 0).all()


def _near(mask: np.ndarray, tolerance: float) -> np.ndarray:
    """The pixels closer than ``tolerance`` to a pixel of ``mask``, by brute force."""
    rows, cols = np.nonzero(mask)
    r, c = np.indices(mask.shape)
    d2 = (r[..., None] - rows) ** 2 + (c[..., None] - cols) ** 2
    return (d2 < tolerance**2).any(axis=-1)


def test_pointing_per_class_closed_form() -> None:
    """TorchRay's per-class pointing game on two 20 x 20 images, by hand: class A (blocks
    rows/cols 0-3) pointed 7 px below its block (strict miss, tolerant hit), then by a flat
    map (the chance of a random pixel: 16/400 strict, the share of pixels closer than 15 px
    tolerant); class B hit at its centre; class C (one pixel) pointed exactly 15 px away
    (TorchRay's disc is open: a miss), and a candidate with no pixel is no trial."""
    size = 20
    one = np.zeros((size, size), dtype=np.int64)
    one[:4, :4], one[10:, 10:], one[19, 0] = 1, 2, 3
    one[0, 19] = VOID
    maps = torch.zeros(4, size, size, dtype=torch.float64)
    maps[0, 10, 0] = 1.0  # A: 7 px below (3, 0)
    maps[1, 15, 15] = 1.0  # B: inside
    maps[2, 4, 0] = 1.0  # C: 15 px above (19, 0)
    maps[3, 0, 19] = 1.0  # D: nothing labelled D (its peak on a void pixel)
    two = np.zeros((size, size), dtype=np.int64)
    two[:4, :4] = 1
    flat = torch.ones(1, size, size, dtype=torch.float64)
    counts = SegmentationCounts(5)
    counts.point(maps, one, [0, 1, 2, 3, 4])
    counts.point(flat, two, [0, 1])
    share = _near(two == 1, 15).mean()
    np.testing.assert_array_equal(counts.trials, [0, 2, 1, 1, 0])
    np.testing.assert_allclose(counts.hits, [0, 16 / 400, 1, 0, 0])
    np.testing.assert_allclose(counts.hits_tol, [0, 1 + share, 1, 0, 0])
    acc = counts.class_pointing()
    assert np.isnan(acc[[0, 4]]).all()
    assert counts.pointing() == pytest.approx((16 / 400 / 2 + 1 + 0) / 3)
    assert counts.pointing(tolerant=True) == pytest.approx(((1 + share) / 2 + 1 + 0) / 3)
    # shards add up; the JSON form reads back
    both = counts.merged(SegmentationCounts.from_dict(counts.as_dict()))
    np.testing.assert_allclose(both.hits_tol, 2 * counts.hits_tol)
    assert both.pointing() == pytest.approx(counts.pointing())


def test_pointing_on_an_exact_tie_takes_the_expected_hit() -> None:
    """Two tied maxima, one on the class's pixels: the expected hit 1/2 (otviz's tie rule)."""
    gold = np.zeros((30, 30), dtype=np.int64)
    gold[0, 0] = 1
    maps = torch.zeros(1, 30, 30, dtype=torch.float64)
    maps[0, 0, 0] = maps[0, 29, 29] = 2.0  # the other 41 px away
    counts = SegmentationCounts(2)
    counts.point(maps, gold, [0, 1])
    assert counts.hits[1] == 0.5 and counts.hits_tol[1] == 0.5
