"""The Browse view: per-(image, phrase, method) rows whose hit and IoU are the grounding
metrics' on the same heatmaps, phrase kinds against the world's meaning and scene, filters
and orders against brute force on a constructed table, page bounds, uploads (only their own
files), the in-memory cache, and the tab inside the app with one callback giving a picture
and a table and a row opening in Align."""

from __future__ import annotations

import math
import shutil
import threading
import time
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch

from otviz.eval import browse as B
from otviz.eval.grounding_baselines import colour_shared
from otviz.eval.grounding_metrics import grounding_scores, pointing_hits
from otviz.eval.segmentation import reading
from otviz.explain import InputError
from otviz.suite import METHOD_LABELS
from otviz.ui.align import align_view
from otviz.ui.app import BROWSE_TITLE, build_app, tab_id
from otviz.ui.browse_tab import (
    TABLE_TITLE,
    UPLOAD_SOURCE,
    WORLD_SOURCE,
    BrowseSources,
    browse_view,
    load_table,
    open_row,
    skipped_note,
)
from otviz.ui.context import AppContext
from otviz.ui.examples import load_examples
from otviz.ui.trust_browse import ALL, NO_METRIC
from tests.helpers import api_parameters, write_caption_folder

N_IMAGES = 12


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> AppContext:
    return AppContext.default(heads_root=tmp_path_factory.mktemp("no-heads"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> BrowseSources:
    root = tmp_path_factory.mktemp("browse")
    return BrowseSources(B.BrowseCache(), root / "features", root / "uploads")


@pytest.fixture(scope="module")
def world(ctx, checkpoint, sources) -> B.BrowseTable:
    return load_table(ctx, sources, checkpoint, WORLD_SOURCE, N_IMAGES, "test")


# ----------------------------------------------------------------------- rows
def test_rows_are_the_grounding_metrics_of_the_same_heatmaps(world):
    assert world.gold is not None and world.hits is not None and world.iou is not None
    for k, name in enumerate(world.methods):
        heat = world.heatmaps[:, k]
        scores = grounding_scores(heat, world.geometries, world.gold, world.threshold)
        expected = pointing_hits(heat, world.geometries, world.gold)
        assert torch.equal(world.hits[:, k], expected == 1)  # a sure hit: the whole tied peak
        assert scores["pointing"] == pytest.approx(float(expected.mean()))
        assert scores["mean_iou"] == pytest.approx(float(world.iou[:, k].mean())), name
        assert scores["hit@0.5"] == pytest.approx(float((world.iou[:, k] >= 0.5).double().mean()))


def test_world_items_are_the_gold_phrases_with_their_kinds(ctx, checkpoint, world):
    from otviz.eval.world_set import EvalSet, world_config_of

    backbone = ctx.suite(checkpoint).backbone
    samples = EvalSet.build(backbone, N_IMAGES, "test", cache_dir="unused",
                            config=world_config_of(backbone, negatives=False)).samples
    expected = []
    for j, s in enumerate(samples):
        related = {k for a, _, b in s.meaning.relations() for k in (a, b)}
        for k, p in enumerate(s.phrases):
            kinds = {B.COLOUR_SHARED} if colour_shared(s, p.object_index) else set()
            kinds |= {B.RELATION} if k in related else set()
            kinds |= {B.SIZE} if any(w in ("small", "large") for w in p.text.split()) else set()
            expected.append((j, p.text, p.start, p.end, tuple(p.box), frozenset(kinds)))
    got = [(it.image, it.phrase, it.start, it.end, tuple(int(v) for v in world.gold[q]),
            it.kinds) for q, it in enumerate(world.items)]
    assert got == expected
    assert all(set(B.KINDS) & {k for it in world.items for k in it.kinds})


# ----------------------------------------------------------------------- filters
def constructed(n: int = 40, gold: bool = True, seed: int = 0) -> B.BrowseTable:
    """A table of ``n`` queries and three methods with seeded hits, IoUs (with ties) and
    kinds."""
    g = torch.Generator().manual_seed(seed)
    kinds = [frozenset(k for k in B.KINDS if torch.rand(1, generator=g) < 0.5) for _ in range(n)]
    items = [B.BrowseItem(q // 3, "c", f"p{q}", 0, 1, kinds[q]) for q in range(n)]
    iou = (torch.randint(0, 5, (n, 3), generator=g) / 4).double()
    return B.BrowseTable(
        items, ("filip", "conceptot", "qc_align"), (2, 2), torch.rand(n, 3, 4, generator=g),
        torch.zeros(n, 3, 4, dtype=torch.long), torch.full((n, 2), 8),
        torch.zeros(n, 4) if gold else None,
        torch.rand(n, 3, generator=g) < 0.5 if gold else None, iou if gold else None,
        lambda j: np.zeros((8, 8, 3), np.uint8), 0.5,
    )


@pytest.mark.parametrize("hit_filter", B.HIT_FILTERS)
def test_hit_filters_select_exactly_the_rows_that_satisfy_them(hit_filter):
    t = constructed()
    a, b = t.hits[:, 1].tolist(), t.hits[:, 0].tolist()
    rule = {
        B.ALL_ROWS: lambda x, y: True,
        B.A_HITS_B_MISSES: lambda x, y: x and not y,
        B.A_MISSES: lambda x, y: not x,
        B.BOTH_MISS: lambda x, y: not x and not y,
        B.DISAGREE: lambda x, y: x != y,
    }[hit_filter]
    got = B.select_rows(t, "conceptot", "filip", hit_filter).tolist()
    assert got == [q for q in range(len(t)) if rule(a[q], b[q])]


@pytest.mark.parametrize("kinds", [[], [B.RELATION], [B.SIZE, B.COLOUR_SHARED], list(B.KINDS)])
def test_kind_filter_keeps_rows_with_every_ticked_kind(kinds):
    t = constructed()
    got = B.select_rows(t, "conceptot", "filip", B.A_MISSES, kinds).tolist()
    misses = (~t.hits[:, 1]).tolist()
    assert got == [q for q, it in enumerate(t.items) if set(kinds) <= it.kinds and misses[q]]


def test_orders_sort_by_iou_with_ties_in_set_order():
    t = constructed()
    rows = torch.arange(len(t))
    ia, ib = t.iou[:, 1].tolist(), t.iou[:, 2].tolist()
    assert B.sort_rows(t, rows, B.SET_ORDER, "conceptot", "qc_align").tolist() == list(rows)
    assert B.sort_rows(t, rows, B.IOU_UP, "conceptot", "qc_align").tolist() == sorted(
        range(len(t)), key=lambda q: (ia[q], q))
    assert B.sort_rows(t, rows, B.IOU_DOWN, "conceptot", "qc_align").tolist() == sorted(
        range(len(t)), key=lambda q: (-ia[q], q))
    assert B.sort_rows(t, rows, B.IOU_GAP, "conceptot", "qc_align").tolist() == sorted(
        range(len(t)), key=lambda q: (-(ia[q] - ib[q]), q))
    subset = torch.tensor([5, 1, 9])
    assert sorted(B.sort_rows(t, subset, B.IOU_UP, "conceptot", "filip").tolist()) == [1, 5, 9]


def test_without_gold_boxes_hits_and_iou_orders_are_messages():
    t = constructed(gold=False)
    assert B.select_rows(t, "conceptot", "filip", B.ALL_ROWS, [B.SIZE]).numel() > 0
    with pytest.raises(InputError, match="no gold boxes"):
        B.select_rows(t, "conceptot", "filip", B.A_HITS_B_MISSES)
    with pytest.raises(InputError, match="no gold boxes"):
        B.select_rows(t, "conceptot", "filip", order=B.IOU_UP)
    for bad in ({"a": "sparse_magic"}, {"hit_filter": "maybe"}, {"kinds": ["shiny"]},
                {"order": "random"}):
        args = {"a": "conceptot", "b": "filip", "hit_filter": B.A_MISSES, **bad}
        with pytest.raises(InputError):
            B.select_rows(constructed(), **args)


@pytest.mark.parametrize(
    ("page", "per_page", "number", "ids"),
    [(1, 12, 1, range(0, 12)), (3, 12, 3, range(24, 30)), (4, 12, 3, range(24, 30)),
     (0, 12, 1, range(0, 12)), (-7, 12, 1, range(0, 12)), (float("nan"), 12, 1, range(0, 12)),
     (None, 12, 1, range(0, 12)), ("x", 12, 1, range(0, 12)), (1e12, 12, 3, range(24, 30)),
     (2, 0, 2, range(1, 2)), (2, 10**6, 2, range(24, 30)), (2.6, 12, 3, range(24, 30))],
)
def test_pages_are_clamped(page, per_page, number, ids):
    shown = B.page_of(torch.arange(30), page, per_page)
    assert shown.number == number and shown.rows.tolist() == list(ids)
    assert shown.n_pages == math.ceil(30 / shown.per_page)
    assert (shown.first, shown.last) == (ids[0] + 1, ids[-1] + 1)


def test_every_row_on_exactly_one_page_and_empty_is_one_page():
    rows = torch.randperm(50, generator=torch.Generator().manual_seed(1))
    pages = [B.page_of(rows, p, 12) for p in range(1, 6)]
    assert torch.equal(torch.cat([p.rows for p in pages]), rows)
    empty = B.page_of(torch.zeros(0, dtype=torch.long), 3, 12)
    assert (empty.number, empty.n_pages, empty.first, empty.last) == (1, 1, 0, 0)


def test_cache_computes_a_key_once_when_requests_race():
    cache, calls = B.BrowseCache(size=2), []

    def compute():
        calls.append(1)
        time.sleep(0.05)
        return constructed()

    threads = [threading.Thread(target=cache.get, args=("k", compute)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    cache.get("x", compute), cache.get("y", compute), cache.get("k", compute)
    assert len(calls) == 4  # "k" was the least recently used of three in a cache of two


# ----------------------------------------------------------------------- uploads
@pytest.fixture()
def caption_zip(tmp_path) -> Path:
    """Four example images with captions (one naming a colour twice) in a .zip."""
    folder = write_caption_folder(tmp_path / "pairs", 4,
                                  {0: "a red circle to the left of a red star"})
    archive = tmp_path / "pairs.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in folder.iterdir():
            z.write(f, f"pairs/{f.name}")
    return archive


def test_an_uploaded_folder_browses_its_noun_phrases(ctx, checkpoint, sources, caption_zip):
    t = load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(caption_zip)])
    assert t.gold is None and t.hits is None
    first = [it for it in t.items if it.image == 0]
    assert [it.phrase for it in first] == ["a red circle", "a red star"]
    assert all({B.COLOUR_SHARED, B.RELATION} <= it.kinds for it in first)
    assert {it.image for it in t.items} == {0, 1, 2, 3}
    v = browse_view(t, ["conceptot"], hit_filter=B.ALL_ROWS)
    assert v.image is not None and list(v.frame["ConceptOT"]) == ["—"] * len(v.rows)
    with pytest.raises(InputError, match="no gold boxes"):
        browse_view(t, ["conceptot"], hit_filter=B.A_MISSES)


def test_a_flickr30k_upload_has_the_world_s_gold_boxes_and_hits(ctx, checkpoint, sources,
                                                               world, tmp_path):
    """The world draw behind ``world``, uploaded as a Flickr30k Entities .zip (PNG): the
    same phrases, gold boxes, hits and IoU, row for row; the hit filters work on it."""
    from otviz.data.grounding_sets.export import export_flickr30k, world_draw
    from otviz.eval.world_set import world_config_of

    backbone = ctx.suite(checkpoint).backbone
    root = export_flickr30k(world_draw(N_IMAGES, "test", 0, world_config_of(backbone)),
                            tmp_path / "flickr", lossless=True)
    archive = tmp_path / "flickr.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                z.write(f, f"flickr/{f.relative_to(root)}")
    t = load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(archive)])
    assert [(it.image, it.phrase, it.start, it.end) for it in t.items] == [
        (it.image, it.phrase, it.start, it.end) for it in world.items]
    assert torch.equal(t.gold, world.gold.to(t.gold.dtype))
    assert torch.equal(t.hits, world.hits) and torch.allclose(t.iou, world.iou)
    misses = B.select_rows(t, "conceptot", "filip", B.A_MISSES)
    assert misses.tolist() == torch.nonzero(~world.hits[:, world.method_index("conceptot")]
                                            ).flatten().tolist()
    assert browse_view(t, ["conceptot"], hit_filter=B.A_MISSES).image is not None


def test_an_upload_may_only_name_its_own_files(ctx, checkpoint, sources, tmp_path):
    """A file outside the upload and a missing one get the same answer (the Train view's),
    and a refused upload leaves no unpacked folder."""
    outside = tmp_path / "secret.png"
    shutil.copy(load_examples()[0].image_path, outside)
    messages, kept = [], sources.uploads.entries()
    for name in (outside, tmp_path / "secret.png.missing", "../secret.png",
                 "../secret.png.missing"):
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("captions.csv", f'path,caption\n{name},"a red circle"\n')
        with pytest.raises(InputError, match="not found or not allowed") as refused:
            load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[str(archive)])
        messages.append(str(refused.value).replace(".missing", ""))
    assert messages[0] == messages[1] and messages[2] == messages[3]
    assert sources.uploads.entries() == kept
    with pytest.raises(InputError, match="no files uploaded"):
        load_table(ctx, sources, checkpoint, UPLOAD_SOURCE, files=[])
    for n in (0, MAX := B.MAX_IMAGES + 1, None):
        with pytest.raises(InputError, match="number of images"):
            load_table(ctx, sources, checkpoint, WORLD_SOURCE, n)
    assert MAX > B.MAX_IMAGES
    with pytest.raises(InputError, match="unknown split"):
        load_table(ctx, sources, checkpoint, WORLD_SOURCE, 4, "train/../../etc")


def test_an_upload_beyond_the_cap_says_what_was_skipped(ctx, checkpoint, tmp_path):
    """Browse reads the first ``max_images`` images of an upload and says how many it
    skipped and why, in the status of every page."""
    root = tmp_path / "browse"
    few = BrowseSources(B.BrowseCache(), root / "features", root / "uploads", max_images=3)
    archive = tmp_path / "five.zip"
    folder = write_caption_folder(tmp_path / "five", 5)
    with zipfile.ZipFile(archive, "w") as z:
        for f in folder.iterdir():
            z.write(f, f"five/{f.name}")
    notes: list[str] = []
    t = load_table(ctx, few, checkpoint, UPLOAD_SOURCE, files=[str(archive)], notes=notes)
    assert {it.image for it in t.items} == {0, 1, 2}
    assert notes == ["2 of the upload's 5 images skipped: Browse reads the first 3"]
    v = browse_view(t, ["conceptot"], per_page=2, source_notes=notes)
    assert v.status == (f"rows 1–2 of {len(t)} passing (of {len(t)} phrases in 3 images) · "
                        f"page 1 of {math.ceil(len(t) / 2)} · 2 of the upload's 5 images "
                        "skipped: Browse reads the first 3")
    again: list[str] = []  # a page turn reads the kept table, and its note
    assert load_table(ctx, few, checkpoint, UPLOAD_SOURCE, files=[str(archive)],
                      notes=again) is t and again == notes
    assert skipped_note(10_000, 500) == ("9,500 of the upload's 10,000 images skipped: "
                                         "Browse reads the first 500")
    assert skipped_note(500, 500) is None


def test_an_uploaded_caption_obeys_the_caption_rule(ctx, checkpoint, sources, tmp_path):
    """A 1,900-character caption, refused by every text box, is refused in an upload too,
    and the refused upload leaves no unpacked folder."""
    kept = sources.uploads.entries()
    folder = write_caption_folder(tmp_path / "long", 2, {1: "a red circle " * 146 + "xy"})
    with pytest.raises(InputError) as refused:
        load_table(ctx, sources, checkpoint, UPLOAD_SOURCE,
                   files=[str(p) for p in folder.iterdir()])
    assert str(refused.value) == ("cannot read the uploaded folder: captions.csv, line 3: the "
                                  "caption is over 1000 characters (1900)")
    assert sources.uploads.entries() == kept


# ----------------------------------------------------------------------- the view
def test_the_tab_builds_in_the_app_and_opens_rows_in_align(ctx, checkpoint, sources, world):
    app = build_app(ctx, browse=sources)
    assert isinstance(app, gr.Blocks)
    tabs = {b.label: b for b in app.blocks.values() if isinstance(b, gr.Tab)}
    assert tabs[BROWSE_TITLE].id == tab_id(BROWSE_TITLE)
    # the first page and a picked page: the same form, by its components' names
    form = ["checkpoint", "features", "image_size", "source", "n_images", "split", "files",
            "methods", "method_a", "method_b", "hit_filter", "kinds", "order", "trust_metric",
            "trust_keep", "page", "per_page"]
    endpoints = api_parameters(app)
    assert endpoints["/browse"] == endpoints["/browse_page"] == form
    # the page's table is the view's, titled with the reading its maps were drawn on
    on_browse = next(f.fn for f in app.fns.values() if f.api_name == "browse")
    args = {"checkpoint": checkpoint, "features": "last", "image_size": 0,
            "source": WORLD_SOURCE, "n_images": N_IMAGES,
            "split": "test", "files": None, "methods": ["filip"], "method_a": "filip",
            "method_b": "filip", "hit_filter": B.ALL_ROWS, "kinds": [], "order": B.SET_ORDER,
            "trust_metric": NO_METRIC, "trust_keep": ALL, "page": 1, "per_page": 12}
    _, table, *_ = on_browse(*(args[name] for name in form))
    backbone = ctx.suite(checkpoint).backbone
    assert table.label == f"{TABLE_TITLE} ({reading(backbone)})"
    assert f"features {backbone.features}, {backbone.image_size} px" in table.label
    assert table.value["headers"] == list(browse_view(world, ["filip"], "filip", "filip",
                                                      per_page=12).frame.columns)

    methods = ["filip", "conceptot", "qc_align"]
    v = browse_view(world, methods, "conceptot", "filip", B.ALL_ROWS, [], B.IOU_UP, 1, 12)
    assert v.image.ndim == 3 and v.image.shape[1] <= 1400 and v.image.std() > 0
    assert list(v.frame.columns) == ["#", "image", "phrase", "kinds"] + [
        METHOD_LABELS[m] for m in methods]
    assert len(v.frame) == len(v.rows) == 12 and v.page == 1
    ious = world.iou[v.rows, world.method_index("conceptot")].tolist()
    assert ious == sorted(ious)
    mark = v.frame["ConceptOT"].iloc[0]
    assert mark[0] in "✓✗" and float(mark[2:]) == pytest.approx(ious[0], abs=0.005)

    image, caption, phrase = open_row(world, v.rows, 3)
    item = world.items[v.rows[3]]
    assert caption == item.caption and np.array_equal(image, world.load_image(item.image))
    opened = align_view(ctx.explainer(checkpoint), ctx.suite(checkpoint), image, caption,
                        phrase=phrase)
    assert phrase == f"span:{item.start}:{item.end}"  # the row's span, kept with its words
    assert opened.phrase == f"{phrase}:{' '.join(caption.split()[item.start:item.end])}"
    with pytest.raises(InputError, match="not on this page"):
        open_row(world, v.rows, 12)


def test_a_server_stop_ends_a_table_load_at_its_next_batch(ctx, checkpoint, caption_zip,
                                                           tmp_path, monkeypatch):
    """A stop (SIGTERM) while Browse encodes a world split or an uploaded folder ends the
    encoding at its next batch with the stopping message, nothing kept; once the server
    runs again, the same load builds its table (the aborted build broke no cache)."""
    from otviz.ui import shutdown

    fresh = BrowseSources(B.BrowseCache(), tmp_path / "features", tmp_path / "uploads")
    monkeypatch.setattr(shutdown, "stopping", lambda: True)
    for source, args, what in [
            (WORLD_SOURCE, {"n_images": 2}, "loading the table not finished"),
            (UPLOAD_SOURCE, {"files": [str(caption_zip)]},  # refused before it starts
             "the Browse table of the upload not finished")]:
        with pytest.raises(InputError, match=f"{what}: the server is stopping"):
            load_table(ctx, fresh, checkpoint, source, **args)
    monkeypatch.setattr(shutdown, "stopping", lambda: False)
    assert len(load_table(ctx, fresh, checkpoint, WORLD_SOURCE, 2).items) > 0
