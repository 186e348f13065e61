"""The Browse tab on an uploaded PASCAL VOC 2012 folder (a .zip in its published layout):
the /browse endpoint shows a row per class in a gold mask, its mark the row's mask IoU, and
a click on a row draws the gold mask beside the predictions, the gold panel pixel for pixel;
a folder named ``voc20`` is read without background; a hostile mask is refused naming it,
an id escaping the upload skipped and said."""

from __future__ import annotations

import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from PIL import Image

from otviz.data.segmentation_sets import VOID
from otviz.eval import browse as B
from otviz.eval.browse_segmentation import SegmentationBrowseTable
from otviz.explain import InputError
from otviz.ui.app import build_app
from otviz.ui.browse_tab import UPLOAD_SOURCE, BrowseSources, load_table, row_masks
from otviz.ui.trust_browse import ALL, NO_METRIC
from otviz.viz.browse_masks import CLASS_COLOUR, OTHER_COLOUR, TITLE_PX, VOID_COLOUR
from tests.eval.test_browse_segmentation import _masks
from tests.eval.test_dataset_segmentation import write_voc


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> BrowseSources:
    root = tmp_path_factory.mktemp("segbrowse-ui")
    return BrowseSources(B.BrowseCache(), root / "features", root / "uploads")


def _zipped(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    write_voc(root, _masks(), np.random.default_rng(0))
    archive = tmp_path / f"{name}.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                z.write(f, f"{name}/{f.relative_to(root)}")
    return archive


def test_the_tab_opens_a_voc_upload_and_draws_an_opened_row(ctx, checkpoint, sources,
                                                            tmp_path) -> None:
    archive = _zipped(tmp_path, "VOC2012")
    app = build_app(ctx, browse=sources)
    on_browse = next(f.fn for f in app.fns.values() if f.api_name == "browse")
    args = {"checkpoint": checkpoint, "features": "last", "image_size": 0,
            "source": UPLOAD_SOURCE, "n_images": 1, "split": "test", "files": [str(archive)],
            "methods": ["conceptot", "filip"], "method_a": "conceptot", "method_b": "filip",
            "hit_filter": B.ALL_ROWS, "kinds": [], "order": B.IOU_DOWN,
            "trust_metric": NO_METRIC, "trust_keep": ALL, "page": 1, "per_page": 12}
    grid, frame, status, page, rows = on_browse(*args.values())
    masks = list(_masks().values())
    present = sum(len(set(np.unique(m)) - {0, VOID}) for m in masks)
    assert grid is not None and status.startswith(f"rows 1–{present} of {present} passing")
    table = load_table(ctx, sources, ctx.read_as(checkpoint, "last", 0), UPLOAD_SOURCE,
                       files=[str(archive)])
    assert isinstance(table, SegmentationBrowseTable) and len(table) == present
    k = table.method_index("conceptot")
    shown = isinstance(frame, gr.Dataframe) and frame.value["data"]
    assert [float(r[4][2:]) for r in shown] == pytest.approx(
        [float(table.iou[q, k]) for q in rows], abs=0.005)
    assert [r[2] for r in shown] == [table.items[q].phrase for q in rows]

    # a click on the first row: the masks drawn below the table, the tab stays on Browse
    masks_out = next(b for b in app.blocks.values() if getattr(b, "elem_id", None)
                     == "browse-masks")
    on_select = next(f.fn for f in app.fns.values()
                     if any(o is masks_out for o in f.outputs))
    image, caption, _, tab, drawn, box = on_select(
        *(args[n] for n in ("checkpoint", "features", "image_size", "source", "n_images",
                            "split", "files", "methods", "method_a", "method_b")), rows,
        gr.SelectData(None, {"index": [0, 2], "value": ""}))
    item = table.items[rows[0]]
    assert caption == item.caption and image.shape[:2] == masks[item.image].shape
    assert tab == gr.skip() and box.visible is True  # the masks' box shown (hidden before)
    gold, label = masks[item.image], table.labels[rows[0]]
    expected = np.empty((*gold.shape, 3), dtype=np.uint8)
    expected[:] = OTHER_COLOUR
    expected[gold == label] = CLASS_COLOUR
    expected[gold == VOID] = VOID_COLOUR
    assert np.array_equal(drawn[TITLE_PX:, : gold.shape[1]], expected)
    assert np.array_equal(drawn, row_masks(table, rows, 0, ["conceptot", "filip"]))


def test_a_folder_named_voc20_has_no_background(ctx, checkpoint, sources, tmp_path) -> None:
    table = load_table(ctx, sources, checkpoint, UPLOAD_SOURCE,
                       files=[str(_zipped(tmp_path, "voc20"))])
    assert isinstance(table, SegmentationBrowseTable) and not table.data.background
    assert all(0 not in np.unique(table.predicted_labels(q, 0)) for q in range(len(table)))


@pytest.mark.parametrize("bad", ["size", "values"])
def test_a_hostile_mask_is_refused_naming_it_and_leaves_nothing(ctx, checkpoint, sources,
                                                                tmp_path, bad) -> None:
    """A class mask of another size than its image, or holding a label VOC does not have,
    is refused naming the file; the refused upload leaves no unpacked folder."""
    root = tmp_path / "VOC2012"
    masks = _masks()
    masks["2008_000002"] = (np.zeros((20, 30), dtype=np.uint8) if bad == "size"
                            else np.full((56, 40), 77, dtype=np.uint8))
    write_voc(root, masks, np.random.default_rng(0))
    if bad == "size":  # the image keeps its own size
        Image.new("RGB", (40, 56)).save(root / "JPEGImages" / "2008_000002.jpg")
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                z.write(f, f"VOC2012/{f.relative_to(root)}")
    kept = sources.uploads.entries()
    with pytest.raises(InputError) as refused:
        load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(archive)])
    assert str(refused.value).startswith("cannot read the voc folder: 2008_000002.png: ")
    assert ("class mask is 30x20, its image 40x56" if bad == "size" else
            "holds values [77]") in str(refused.value)
    assert sources.uploads.entries() == kept


def test_an_id_outside_the_upload_is_skipped_and_said(ctx, checkpoint, sources,
                                                      tmp_path) -> None:
    root = tmp_path / "VOC2012"
    write_voc(root, _masks(), np.random.default_rng(0))
    listing = root / "ImageSets/Segmentation/val.txt"
    listing.write_text(listing.read_text() + "../../../etc/passwd\n")
    archive = tmp_path / "escape.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                z.write(f, f"VOC2012/{f.relative_to(root)}")
    notes: list[str] = []
    table = load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(archive)],
                       notes=notes)
    assert {it.image for it in table.items} == {0, 1}
    assert notes == ["voc: skipped 1 missing image"]  # as a missing one: no path told
