"""Browse on a PASCAL VOC 2012 folder in its published layout written here (palette masks
with void bands, two image sizes): one row per (image, class in its gold mask); each row's
IoU recomputed from the gold and predicted masks; the predictions the segmentation table's
own (their counts summed over the set equal ``otviz eval --dataset voc:DIR``'s, row by
row), and so is the rows' pointing (averaged per class, the table's per-class pointing
game); the drawing paints the gold mask's pixels exactly; the kinds detected from the
layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from otviz.cli import evaluate
from otviz.data.segmentation_classes import VOC_NAMES
from otviz.data.segmentation_sets import VOC_CLASSES, VOID, load_segmentation_set
from otviz.eval.browse_segmentation import detect_segmentation_kind, segmentation_set_browse
from otviz.eval.config import EvalConfig
from otviz.eval.dataset_models import dataset_backbone, dataset_suite
from otviz.eval.dataset_segmentation import PROMPT, class_chunks
from otviz.eval.segmentation_metrics import SegmentationCounts
from otviz.text.words import split_words
from otviz.viz.browse_masks import (
    CLASS_COLOUR,
    OTHER_COLOUR,
    TITLE_PX,
    VOID_COLOUR,
    panel_x,
    row_masks_image,
)
from tests.eval.test_dataset_segmentation import write_voc

METHODS = ("filip", "dense_uot", "conceptot")


def _masks() -> dict[str, np.ndarray]:
    """Two images (64x48 and 40x56): background, two classes each with a void band, one of
    them touching the border."""
    a = np.zeros((48, 64), dtype=np.uint8)
    a[4:20, 6:30] = VOID
    a[5:19, 7:29] = 15  # person
    a[30:48, 40:64] = VOID
    a[31:48, 41:64] = 12  # dog
    b = np.zeros((56, 40), dtype=np.uint8)
    b[10:40, 5:25] = VOID
    b[11:39, 6:24] = 1  # aeroplane
    b[44:52, 28:38] = 20  # tvmonitor, no void band
    return {"2008_000001": a, "2008_000002": b}


@pytest.fixture(scope="module")
def voc(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("segbrowse") / "VOC2012"
    masks = _masks()
    write_voc(root, masks, np.random.default_rng(0))
    return root, masks


@pytest.fixture(scope="module")
def suite(voc):
    """The suite ``otviz eval --dataset voc:`` builds (the tiny CLIP, training-free methods
    fitted on the set's class captions)."""
    root, _ = voc
    config = EvalConfig(dataset=f"voc:{root}", tables="segmentation", methods=",".join(METHODS))
    backbone = dataset_backbone(config)
    data = load_segmentation_set("voc", root)
    return dataset_suite(backbone, config,
                         data.as_grounding(PROMPT, class_chunks(backbone, data.names)))[0]


@pytest.fixture(scope="module")
def browsed(voc, suite, tmp_path_factory):
    """``(table, notes, feature cache)`` of the Browse table on ``suite``."""
    cache = tmp_path_factory.mktemp("segbrowse-cache")
    table, notes = segmentation_set_browse(suite, voc[0], "voc", cache, methods=METHODS)
    return table, notes, cache


def test_one_row_per_class_in_the_gold_mask(voc, browsed) -> None:
    _, masks = voc
    table, notes, _ = browsed
    assert notes == []
    expected = [(i, VOC_NAMES[v - 1]) for i, m in enumerate(masks.values())
                for v in np.unique(m) if v not in (0, VOID)]
    assert [(it.image, it.phrase) for it in table.items] == expected
    assert table.methods == METHODS
    for q, it in enumerate(table.items):
        words = [w.text for w in split_words(it.caption)]
        assert words[it.start:it.end] == it.phrase.split()
        assert tuple(table.image_sizes[q].tolist()) == masks[list(masks)[it.image]].shape[::-1]


def test_each_row_s_iou_is_its_class_iou_from_the_masks(voc, browsed) -> None:
    _, masks = voc
    table, _, _ = browsed
    golds = list(masks.values())
    for q, it in enumerate(table.items):
        gold, label = golds[it.image], table.labels[q]
        assert np.array_equal(table.gold_labels(q), gold)
        assert table.gold[q].tolist() == _box(gold == label)
        keep = gold != VOID
        for k in range(len(METHODS)):
            pred = table.predicted_labels(q, k)
            inter = ((gold == label) & (pred == label) & keep).sum()
            union = (((gold == label) | (pred == label)) & keep).sum()
            assert float(table.iou[q, k]) == pytest.approx(inter / union, abs=1e-6)


def test_predictions_and_pointing_are_the_segmentation_table_s(voc, browsed, tmp_path
                                                               ) -> None:
    """The per-image predictions summed over the set give the counts of ``otviz eval
    --dataset voc:DIR --tables segmentation``, and the rows' pointing (both conventions)
    averaged per class its per-class pointing game, method by method."""
    root, masks = voc
    table, _, cache = browsed
    out = tmp_path / "out"
    assert evaluate.main(["--dataset", f"voc:{root}", "--tables", "segmentation",
                          "--methods", ",".join(METHODS), "--threads", "1", "--quiet",
                          "--cache-dir", str(cache), "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "segmentation.json").read_text())[
        "tables"]["segmentation"]["rows"]}
    first = {it.image: q for q, it in reversed(list(enumerate(table.items)))}
    for k, name in enumerate(METHODS):
        counts = SegmentationCounts(len(VOC_CLASSES))
        for image, gold in enumerate(masks.values()):
            counts.add(gold, table.predicted_labels(first[image], k), np.arange(21))
        assert [int(v) for v in counts.intersect] == rows[name]["intersect"], name
        assert [int(v) for v in counts.union()] == rows[name]["union"], name
        for key, shares in (("pointing", table.pointing), ("pointing_tol", table.pointing_tol)):
            for c, cls in enumerate(VOC_CLASSES):
                mine = [float(shares[q, k]) for q in range(len(table)) if table.labels[q] == c]
                if mine:
                    assert np.mean(mine) == pytest.approx(
                        rows[name][f"{key}_per_class"][cls]), (name, key, cls)
        assert torch.equal(table.hits[:, k], table.pointing[:, k] == 1)


def test_the_drawing_shows_the_gold_mask_s_pixels_exactly(voc, browsed) -> None:
    _, masks = voc
    table, _, _ = browsed
    for q, it in enumerate(table.items):
        gold, label = list(masks.values())[it.image], table.labels[q]
        height, width = gold.shape
        image = row_masks_image(table, q, ["conceptot", "filip"])
        assert image.shape == (TITLE_PX + height, panel_x(3, width) - 6, 3)
        expected = np.empty((height, width, 3), dtype=np.uint8)
        expected[:] = OTHER_COLOUR
        expected[gold == label] = CLASS_COLOUR
        expected[gold == VOID] = VOID_COLOUR
        assert np.array_equal(image[TITLE_PX:, :width], expected)
        pred = table.predicted_labels(q, table.method_index("filip"))
        shown = image[TITLE_PX:, panel_x(2, width):panel_x(2, width) + width]
        assert np.array_equal(np.all(shown == CLASS_COLOUR, axis=2),
                              (pred == label) & (gold != VOID))
        assert np.array_equal(np.all(shown == VOID_COLOUR, axis=2), gold == VOID)


def test_the_kind_is_detected_from_the_layout(voc, tmp_path) -> None:
    root, masks = voc
    assert detect_segmentation_kind(root) == "voc"
    renamed = tmp_path / "voc20"
    write_voc(renamed, masks, np.random.default_rng(0))
    assert detect_segmentation_kind(renamed) == "voc20"
    assert detect_segmentation_kind(tmp_path) is None


def _box(mask: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(mask)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def test_progress_is_called_after_each_block_of_images(voc, suite, browsed, monkeypatch
                                                        ) -> None:
    """The served app's stop check runs between blocks of images (here one image each)."""
    from otviz.eval import browse_segmentation

    root, masks = voc
    table, _, cache = browsed
    monkeypatch.setattr(browse_segmentation, "BLOCK_IMAGES", 1)
    calls: list[tuple[int, int]] = []
    again, _ = segmentation_set_browse(suite, root, "voc", cache, methods=METHODS,
                                       progress=lambda done, total: calls.append((done, total)))
    assert [c for c in calls if c[1] == len(masks)][-2:] == [(1, 2), (2, 2)]
    assert torch.equal(again.iou, table.iou) and torch.equal(again.hits, table.hits)
