"""The "Browse" view: page through many images (a world split with gold boxes, or an
uploaded image-caption folder), every chosen method's phrase heatmap side by side with its
hit/miss mark and IoU, filtered by where methods disagree and by phrase kind, sorted by
IoU; a click on a row opens its image and phrase in Align.

The view composes: tables come from :mod:`otviz.eval.browse` (computed once per checkpoint
and source, kept in memory, features from the on-disk feature cache), the page picture and
table from :mod:`otviz.viz.browse`; uploads go through the Train view's validated unpacking
(:func:`otviz.boundary.paths.unpack_uploads`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd
from torch import Tensor

from otviz.boundary.images import check_headers
from otviz.boundary.paths import NOT_FOUND
from otviz.data.datasets import DatasetError, load_image_captions
from otviz.data.feature_cache import FeatureCache
from otviz.data.grounding_sets import detect_layout, load_grounding_set
from otviz.data.segmentation_sets import load_segmentation_set
from otviz.data.upload_store import UploadStore
from otviz.eval.browse import (
    ALL_ROWS,
    HIT_FILTERS,
    KINDS,
    MAX_IMAGES,
    MAX_PER_PAGE,
    ORDERS,
    SET_ORDER,
    BrowseCache,
    BrowseTable,
    first_captions,
    folder_browse,
    grounding_set_browse,
    page_of,
    select_rows,
    world_browse,
)
from otviz.eval.browse_segmentation import (
    SegmentationBrowseTable,
    detect_segmentation_kind,
    segmentation_set_browse,
)
from otviz.explain import InputError
from otviz.explainers import explainer_choices, explainers_needed
from otviz.suite import method_choices
from otviz.ui.align import AlignLink
from otviz.ui.app_dirs import FEATURES, UPLOADS, UPLOADS_CAP_BYTES, app_dir, cache_cap_bytes
from otviz.ui.browse_budget import admitted_upload, upload_plan
from otviz.ui.budget import server_budget, visitor
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.events import on_edit
from otviz.ui.inputs import CheckedFile, fit_image, user_errors
from otviz.ui.shutdown import refuse_if_stopping
from otviz.ui.trust_browse import TrustValues, trust_controls, trust_sort
from otviz.ui.upload_cache import discarded_if_refused, lone_archive
from otviz.viz.browse import browse_frame, browse_page_image
from otviz.viz.browse_masks import row_masks_image
from otviz.viz.tables import POINTING_LABELS, titled

TAB_TITLE = "Browse"
WORLD_SOURCE, UPLOAD_SOURCE = "world split", "uploaded folder"
SOURCES = (WORLD_SOURCE, UPLOAD_SOURCE)
WORLD_SPLITS = ("test", "compositional")
DEFAULT_IMAGES, DEFAULT_PER_PAGE = 96, 12
DEFAULT_METHODS = ("filip", "dense_uot", "conceptot", "qc_align")
DEFAULT_A, DEFAULT_B = "conceptot", "filip"
#: The table's title; once loaded, it names the reading the maps were drawn on
#: (:func:`~otviz.viz.tables.titled`).
TABLE_TITLE = "Rows (click one to open it in Align)"

HOW_TO_READ = f"""**How to read this view.** Each row is one phrase of one image: a gold noun
phrase of a world caption (with its gold box, green), or a noun phrase of an uploaded
caption (no gold box). Next to the image, each chosen method's phrase heatmap (the plan's
columns summed over the phrase's tokens, ConceptOT Sec. 2.6) on its own colour scale, with
the box of the patches above half its peak (cyan) and its hottest patch (white cross). The
title's ✓/✗ is the strict pointing game (is the hottest patch's centre inside the gold
box?) and the number the IoU of the cyan box with the gold box. *Filters:* compare two
methods A and B (e.g. "A hits, B misses"), keep phrase kinds (*colour shared*: another
object of the scene has the phrase's colour, for an upload another phrase of the caption
names it; *relation*: subject or landmark of a spatial relation; *size*: has a size word),
sort by IoU, or by a trust metric of Method A's map (Quantus, docs/trust.md; computed for
every row the first time it is picked; the pointing game in both conventions,
*{POINTING_LABELS['pointing']}* and *{POINTING_LABELS['pointing_tol']}*, see the picker's
line), keeping the better or worse half if asked. The table's title names the reading
(model, features, input size) the maps were drawn on. Click a row of the table to open that
image and phrase in Align. *An uploaded segmentation set* (any set `otviz eval --dataset`
reads, in its published layout: VOC, Context, ADE20K, ...; a folder named `voc20` or
`context59` is read without background) gives a row per class in each image's gold mask:
the number is that class's IoU between the method's predicted mask (the segmentation
table's argmax with its background threshold) and the gold mask, ✓ a peak inside the gold
mask; clicking a row draws, below the table, the gold mask beside each method's predicted
mask (void pixels cream) and puts the image in Align. The first load encodes and solves
every method on every image (seconds); paging, filters and sorting then read the kept
results."""


@dataclass
class BrowseSources:
    """Where the view's tables come from: computed tables kept in memory, the on-disk
    feature cache (capped, :func:`~otviz.ui.app_dirs.cache_cap_bytes`) and the folder that
    uploads are unpacked into (an :class:`~otviz.data.upload_store.UploadStore` capped at
    ``uploads_cap_bytes``), by default the app's (:mod:`otviz.ui.app_dirs`)."""

    cache: BrowseCache = field(default_factory=BrowseCache)
    features_dir: Path = field(default_factory=lambda: app_dir(FEATURES))
    uploads_dir: Path = field(default_factory=lambda: app_dir(UPLOADS))
    uploads_cap_bytes: int = UPLOADS_CAP_BYTES
    max_images: int = MAX_IMAGES  # images of an upload read (the first ones)
    roots: dict[tuple, Path] = field(default_factory=dict)  # table key -> its unpacked upload
    notes: dict[tuple, str] = field(default_factory=dict)  # table key -> what it left out

    @property
    def uploads(self) -> UploadStore:
        return UploadStore(self.uploads_dir, self.uploads_cap_bytes)

    def kept(self, key: tuple, compute: Callable[[], BrowseTable]) -> BrowseTable:
        """The table of ``key`` (computed on first use, then kept); a computed table's
        features cut the feature cache back to its cap (least recently used first)."""
        def computed() -> BrowseTable:
            table = compute()
            FeatureCache(self.features_dir).evict(cache_cap_bytes())
            return table

        return self.cache.get(key, computed)


@dataclass
class AlignTarget:
    """The Align view as a target: the page's tabs, Align's tab id and its link."""

    tabs: gr.Tabs
    tab_id: str
    link: AlignLink


def _uploaded_paths(files: Any) -> list[str]:
    """The uploads' paths; a path from the file input (a ``str``) kept as it is, with the
    name it was uploaded under (:func:`otviz.boundary.paths.upload_name`)."""
    return [f if isinstance(f, str) else str(getattr(f, "name", f)) for f in files or []]


def stop_check(done: int, total: int) -> None:
    """The progress hook of Browse's feature encoding: a server stop (``SIGTERM``) ends the
    encoding at its next batch with the stopping message (:mod:`otviz.ui.shutdown`)."""
    refuse_if_stopping("loading the table")


def load_table(
    ctx: AppContext, sources: BrowseSources, checkpoint: str, source: str,
    n_images: float | None = DEFAULT_IMAGES, split: str = "test", files: Any = None,
    explainers: tuple[str, ...] = (),
    notes: list[str] | None = None,
) -> BrowseTable:
    """The checkpoint's table of the source (computed on first use, then kept): the first
    ``n_images`` of a world split, or the first ``sources.max_images`` images of the
    uploaded folder (a .zip or its files, each image with its first caption); with the
    ``explainers``' columns (:func:`otviz.explainers.explainers_needed`). What the table
    leaves out of an upload (:func:`skipped_note`) is appended to ``notes`` when given. A
    refused upload is removed from the server at once."""
    if source not in SOURCES:
        raise InputError(f"unknown source {source!r}; choose one of {list(SOURCES)}")
    suite = ctx.suite(checkpoint)
    if source == WORLD_SOURCE:
        if split not in WORLD_SPLITS:
            raise InputError(f"unknown split {split!r}; choose one of {list(WORLD_SPLITS)}")
        try:
            n = int(n_images)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InputError("the number of images is empty") from None
        if not 1 <= n <= MAX_IMAGES:
            raise InputError(f"the number of images must be in [1, {MAX_IMAGES}]")
        return sources.kept(
            (checkpoint, source, split, n, explainers),
            lambda: with_explainers(lambda: world_browse(
                suite, n, split, cache_dir=sources.features_dir, explainers=explainers,
                progress=stop_check),
                n, explainers),
        )
    paths = _uploaded_paths(files)
    key = (checkpoint, source, tuple(paths), explainers)

    def compute() -> BrowseTable:
        budget = server_budget()
        with discarded_if_refused(lone_archive(paths)), sources.uploads.unpacked(paths) as root:
            kind = detect_segmentation_kind(root)  # a segmentation set: gold masks
            layout = detect_layout(root)  # a grounding data set: gold boxes and hits
            if kind is not None or layout is not None:
                plan = upload_plan(budget, "grounding" if kind is None else "segmentation",
                                   set_size(root, kind, layout, sources.max_images),
                                   len(explainers))
                with admitted_upload(budget, plan, len(explainers)):
                    table, skipped = (segmentation_set_browse if kind is not None else
                                      grounding_set_browse)(
                        suite, root, kind or layout, sources.features_dir,
                        sources.max_images if plan.note is None else plan.n_images,
                        explainers=explainers, progress=stop_check)
                sources.roots[key] = root
                skipped += [plan.note] if plan.note else []
                if skipped:
                    sources.notes[key] = "; ".join(skipped)
                return table
            try:
                folder = load_image_captions(root, root=root)
            except DatasetError as e:
                raise InputError(f"cannot read the uploaded folder: {e}") from None
            except OSError:
                raise InputError(f"cannot read the uploaded folder: a file is {NOT_FOUND}"
                                 ) from None
            shown = first_captions(folder, sources.max_images)
            check_headers(shown.image_paths)  # every bad image named at once
            plan = upload_plan(budget, "folder", len(shown.image_paths), len(explainers))
            shown = first_captions(shown, plan.n_images)
            with admitted_upload(budget, plan, len(explainers)):
                table = folder_browse(suite, shown, sources.features_dir,
                                      explainers=explainers, progress=stop_check)
        sources.roots[key] = root
        notes = [skipped_note(folder.n_images, sources.max_images), plan.note]
        if any(notes):
            sources.notes[key] = "; ".join(n for n in notes if n)
        return table

    if not paths:
        raise InputError("no files uploaded: upload a .zip of the folder, or the images and "
                         "their captions file")
    table = sources.kept(key, compute)
    if key in sources.roots:
        sources.uploads.touch(sources.roots[key])
    if notes is not None and key in sources.notes:
        notes.append(sources.notes[key])
    return table


def set_size(root: Path, kind: str | None, layout: tuple[str, str] | None, limit: int) -> int:
    """The images (at most ``limit``) of the segmentation set ``kind`` or the grounding set
    ``layout`` at ``root``, from its listing (no image decoded); a set that cannot be read
    is refused as its table would refuse it."""
    try:
        if kind is not None:
            return len(load_segmentation_set(kind, root, limit=limit))
        assert layout is not None
        return len(load_grounding_set(layout[0], root, layout[1], limit=limit))
    except DatasetError as e:
        raise InputError(f"cannot read the {kind or layout[0]} folder: {e}") from None


def with_explainers(compute: Callable[[], BrowseTable], n_images: int,
                    explainers: tuple[str, ...]) -> BrowseTable:
    """``compute()``, a table of ``n_images`` images; with ``explainers``' columns it draws
    their maps of every image, which the server's compute budget admits first (estimated
    from its cost of an explainer's map, which the Align view's explainer maps measure)."""
    if not explainers:
        return compute()
    budget = server_budget()
    cost = n_images * len(explainers) * budget.costs.unit("explainer")
    with budget.admit(visitor(), "the explainer columns", cost):
        return compute()


def skipped_note(n_images: int, max_images: int) -> str | None:
    """What Browse says of an upload of ``n_images`` captioned images when it reads only
    the first ``max_images`` (``None`` when it reads them all)."""
    if n_images <= max_images:
        return None
    return (f"{n_images - max_images:,} of the upload's {n_images:,} images skipped: Browse "
            f"reads the first {max_images:,}")


@dataclass
class BrowseView:
    """One page of the view: its picture (``None`` when empty), table, status line, page
    number and the query index of each table row."""

    image: np.ndarray | None
    frame: pd.DataFrame
    status: str
    page: int
    rows: list[int]


def browse_view(
    table: BrowseTable, methods: list[str] | None, a: str = DEFAULT_A, b: str = DEFAULT_B,
    hit_filter: str = ALL_ROWS, kinds: list[str] | None = None, order: str = SET_ORDER,
    page: float | None = 1, per_page: float | None = DEFAULT_PER_PAGE,
    source_notes: list[str] | None = None,
    reorder: Callable[[Tensor], Tensor] | None = None,
) -> BrowseView:
    """The rows passing the filters, in ``order`` (then ``reorder``: a trust metric's,
    :mod:`otviz.ui.trust_browse`), page ``page`` (clamped) drawn; a ticked explainer that
    cannot read the backbone's tower is left out, its note in the status after the
    ``source_notes`` (what the table left out of its source)."""
    notes = [*(source_notes or []),
             *(table.unavailable[m] for m in methods or [] if m in table.unavailable)]
    methods = [m for m in methods or [] if m not in table.unavailable]
    if not methods:
        raise InputError(" · ".join([*notes, "tick at least one method to show"]))
    rows = select_rows(table, a, b, hit_filter, kinds or [], order)
    rows = rows if reorder is None else reorder(rows)
    shown = page_of(rows, page, per_page)
    ids = shown.rows.tolist()
    n_images = len({it.image for it in table.items})
    if not ids:
        return BrowseView(None, browse_frame(table, [], methods),
                          " · ".join([f"no phrase of the {len(table)} ({n_images} images) "
                                      "passes these filters", *notes]), 1, [])
    status = (f"rows {shown.first}–{shown.last} of {shown.n_rows} passing "
              f"(of {len(table)} phrases in {n_images} images) · page {shown.number} of "
              f"{shown.n_pages}")
    status = " · ".join([status, *notes])
    return BrowseView(browse_page_image(table, ids, methods), browse_frame(table, ids, methods),
                      status, shown.number, ids)


def open_row(table: BrowseTable, rows: list[int], index: int) -> tuple[np.ndarray, str, str]:
    """``(image, caption, phrase picker value "span:start:end")`` of table row ``index``;
    the image scaled down as an upload is (:func:`~otviz.ui.inputs.fit_image`), so the
    page's image input can show it back."""
    if not 0 <= int(index) < len(rows):
        raise InputError("that row is not on this page")
    q = rows[int(index)]
    if not 0 <= q < len(table):
        raise InputError("that row is not in the table: load it again")
    item = table.items[q]
    image = fit_image(table.load_image(item.image))[0]
    return image, item.caption, f"span:{item.start}:{item.end}"


def row_masks(table: BrowseTable, rows: list[int], index: int, methods: list[str] | None
              ) -> np.ndarray | None:
    """Table row ``index`` of a segmentation set's table: its class's gold mask beside each
    of ``methods``' predicted mask, at the image's size
    (:func:`~otviz.viz.browse_masks.row_masks_image`); ``None`` for another table."""
    if not isinstance(table, SegmentationBrowseTable):
        return None
    shown = [m for m in methods or [] if m not in table.unavailable]
    return row_masks_image(table, rows[int(index)], shown)


def build_browse_tab(
    ctx: AppContext, shared: SharedInputs, align: AlignTarget,
    sources: BrowseSources | None = None,
) -> None:
    """Add the Browse view to the enclosing ``gr.Blocks`` (inside its tab)."""
    sources = sources or BrowseSources()
    sources.uploads.remove_stale()  # the unpacked uploads of servers that are gone
    with gr.Row():
        source = gr.Radio(list(SOURCES), value=WORLD_SOURCE, label="Images", scale=1)
        split = gr.Dropdown(list(WORLD_SPLITS), value="test", label="World split", scale=1)
        n_images = gr.Number(DEFAULT_IMAGES, label=f"World images (1-{MAX_IMAGES})",
                             precision=0, minimum=1, maximum=MAX_IMAGES, scale=1)
        files = CheckedFile(label="Image-caption folder (.zip, or images + captions.csv)",
                            file_count="multiple", scale=2)
        load = gr.Button("Load", variant="primary", scale=1)
    with gr.Row():
        choices = method_choices() + explainer_choices()  # the explainers: docs/explainers.md
        methods = gr.CheckboxGroup(choices, value=list(DEFAULT_METHODS),
                                   label="Methods shown", scale=3)
        a = gr.Dropdown(choices, value=DEFAULT_A, label="Method A", scale=1)
        b = gr.Dropdown(choices, value=DEFAULT_B, label="Method B", scale=1)
    with gr.Row():
        hit_filter = gr.Dropdown(list(HIT_FILTERS), value=ALL_ROWS, label="Hits", scale=1)
        kinds = gr.CheckboxGroup(list(KINDS), value=[], label="Phrase kinds (all ticked)",
                                 scale=1)
        order = gr.Dropdown(list(ORDERS), value=SET_ORDER, label="Sort", scale=1)
        trust_metric, trust_keep = trust_controls()
        per_page = gr.Slider(1, MAX_PER_PAGE, DEFAULT_PER_PAGE, step=1, label="Rows per page",
                             scale=1)
    with gr.Row():
        prev = gr.Button("◀ Previous", scale=1)
        page = gr.Number(1, label="Page", precision=0, minimum=1, scale=1)
        nxt = gr.Button("Next ▶", scale=1)
        status = gr.Markdown(elem_id="browse-status")
    grid = gr.Image(label="Phrase heatmaps per method", format="jpeg", interactive=False,
                    elem_id="browse-grid")
    frame = gr.Dataframe(label=TABLE_TITLE, interactive=False,
                         elem_id="browse-table")
    with gr.Column(visible=False) as masks_box:  # shown by a click on a segmentation row
        masks = gr.Image(label="Opened row: gold class mask beside each method's predicted "
                         "mask", format="png", interactive=False, elem_id="browse-masks")
    rows = gr.State([])
    trusted = TrustValues(server_budget())
    gr.Markdown(HOW_TO_READ)

    def show(checkpoint, features, image_size, source, n_images, split, files, methods,
             method_a, method_b, hit_filter, kinds, order, trust_metric, trust_keep, page,
             per_page):
        notes: list[str] = []
        checkpoint = ctx.read_as(checkpoint, features, image_size)
        table = load_table(ctx, sources, checkpoint, source, n_images, split, files,
                           explainers_needed([*(methods or []), method_a, method_b]), notes)
        suite = ctx.suite(checkpoint)
        by_trust = trust_sort(trusted, suite, table, method_a, trust_metric, trust_keep)
        if by_trust is not None and by_trust.note:
            notes.append(by_trust.note)
        v = browse_view(table, methods, method_a, method_b, hit_filter, kinds, order, page,
                        per_page, notes, by_trust and by_trust.reorder)
        frame = v.frame if by_trust is None else by_trust.annotate(v.frame, v.rows)
        shown = gr.Dataframe(frame, label=titled(TABLE_TITLE, suite.backbone))
        return v.image, shown, v.status, v.page, v.rows

    def first_page(*args):
        return show(*args[:-2], 1, args[-1])

    # the same parameters as show (its page is not read): the API's names for /browse
    first_page.__signature__ = inspect.signature(show)

    def step(delta: int):
        def turn(*args):
            current = args[-2] if isinstance(args[-2], int | float) else 1
            return show(*args[:-2], current + delta, args[-1])
        return turn

    def on_select(checkpoint, features, image_size, source, n_images, split, files, methods,
                  method_a, method_b, shown, evt: gr.SelectData):
        checkpoint = ctx.read_as(checkpoint, features, image_size)
        table = load_table(ctx, sources, checkpoint, source, n_images, split, files,
                           explainers_needed([*(methods or []), method_a, method_b]))
        image, caption, phrase = open_row(table, shown, evt.index[0])
        drawn = row_masks(table, shown, evt.index[0], methods)
        return (image, caption, gr.Dropdown(choices=[(phrase, phrase)], value=phrase),
                gr.skip() if drawn is not None else gr.Tabs(selected=align.tab_id), drawn,
                gr.Column(visible=drawn is not None))

    source_inputs = [*shared.backbone, source, n_images, split, files]
    inputs = [*source_inputs, methods, a, b, hit_filter, kinds, order, trust_metric,
              trust_keep, page, per_page]
    outputs = [grid, frame, status, page, rows]
    hidden = {"api_visibility": "private"}
    load.click(user_errors(first_page), inputs, outputs, api_name="browse").then(
        lambda: gr.Column(visible=False), None, masks_box, **hidden)  # a new table: no row open
    for control in (methods, a, b, hit_filter, kinds, order, trust_metric, trust_keep,
                    per_page):
        on_edit(control, user_errors(first_page), inputs, outputs, **hidden)
    page.submit(user_errors(show), inputs, outputs, api_name="browse_page")
    prev.click(user_errors(step(-1)), inputs, outputs, **hidden)
    nxt.click(user_errors(step(1)), inputs, outputs, **hidden)
    align.link.after(frame.select(
        user_errors(on_select), [*source_inputs, methods, a, b, rows],
        [shared.image, shared.caption, align.link.phrase, align.tabs, masks, masks_box],
        **hidden,
    ), **hidden)
