"""Browsing many images: per (image, phrase) query, every method's phrase heatmap with, where
a gold box exists, its pointing-game hit and box IoU (ConceptOT Sec. 2.6), the phrase's
kind, and the filters, orders and pages of the Browse view.

Queries come from a world split (every gold noun phrase of the true captions, with its gold
box: :func:`world_queries`), from a grounding data set in a published layout (Flickr30k
Entities, RefCOCO, Visual Genome: every phrase with a box, its images fitted to the model's
input, the same queries: :func:`grounding_set_browse`) or from an image-caption folder
(each image's first caption, its base noun phrases from the parse tree, no gold box:
:func:`folder_queries`); a segmentation set's rows, one per class in a gold mask scored by
its mask IoU, are :mod:`otviz.eval.browse_segmentation`'s. Features
come from the on-disk feature cache (:class:`~otviz.eval.world_set.EvalSet`); heatmaps of
all methods are computed once, batched (:func:`browse_table`), and kept in memory
(:class:`BrowseCache`), so filtering, sorting and paging only index tensors.

Phrase kinds (:data:`KINDS`): ``"colour shared"`` (another object of the scene has the
phrase's colour, so colour alone cannot point to it; for a folder, without a scene: another
noun phrase of the caption names the same colour), ``"relation"`` (the phrase is the
subject or the landmark of a spatial relation: its noun phrase has a PP sibling or a PP
parent in the tree) and ``"size"`` (the phrase has a size word).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from otviz.boundary.images import header_size
from otviz.data.datasets import CaptionFolder, DatasetError
from otviz.data.feature_cache import FeatureCache, Progress
from otviz.data.grounding_sets import load_grounding_set
from otviz.eval.alignment_tables import phrase_heatmaps, phrase_queries
from otviz.eval.grounding_metrics import box_iou, phrase_token_select, pointing_hits
from otviz.eval.world_set import (
    EvalSet,
    GroundingProbeDataset,
    ParsedCaptions,
    model_input_size,
    world_config_of,
)
from otviz.explain import InputError
from otviz.explainers import EXPLAINERS, explain_pairs
from otviz.explainers import unavailable as explainer_unavailable
from otviz.patch_grid.boxes import Geometries, heatmap_boxes
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import ALIGN_METHODS, METHOD_LABELS, MethodSuite
from otviz.text.tree import Tree
from otviz.world.vocab import COLOURS, SIZES

COLOUR_SHARED, RELATION, SIZE = "colour shared", "relation", "size"
KINDS: tuple[str, ...] = (COLOUR_SHARED, RELATION, SIZE)
#: Size and colour words recognised in free captions (the world's and a few common ones).
SIZE_WORDS = frozenset(SIZES) | {"big", "little", "tiny", "huge", "tall", "short"}
COLOUR_WORDS = frozenset(COLOURS) | {"black", "grey", "gray", "brown", "pink"}

ALL_ROWS = "all rows"
A_HITS_B_MISSES = "A hits, B misses"
A_MISSES = "A misses"
BOTH_MISS = "A and B miss"
DISAGREE = "A and B disagree"
HIT_FILTERS: tuple[str, ...] = (ALL_ROWS, A_HITS_B_MISSES, A_MISSES, BOTH_MISS, DISAGREE)

SET_ORDER = "set order"
IOU_UP = "IoU of A, lowest first"
IOU_DOWN = "IoU of A, highest first"
IOU_GAP = "IoU of A − IoU of B, largest first"
ORDERS: tuple[str, ...] = (SET_ORDER, IOU_UP, IOU_DOWN, IOU_GAP)

MAX_PER_PAGE = 24
MAX_IMAGES = 500


@dataclass(frozen=True)
class BrowseItem:
    """One (image, phrase) query: the image index in its set, the caption, the phrase text
    and caption word span ``[start, end)``, and its kinds (a subset of :data:`KINDS`)."""

    image: int
    caption: str
    phrase: str
    start: int
    end: int
    kinds: frozenset[str]


@dataclass
class BrowseQueries:
    """Queries of a set with what the methods need: per query its image ``[P]`` and caption
    (pair) ``[P]`` indices, token selection ``[P, L]`` and gold pixel box ``[P, 4]``
    (``None``: the set has none)."""

    items: list[BrowseItem]
    image: Tensor
    text: Tensor
    select: Tensor
    gold: Tensor | None


@dataclass
class BrowseTable:
    """Every method's result on every query of a set.

    Attributes:
        items: the queries, in set order.
        methods: method names, the second axis below.
        geometries: per query, where each token looks on its image (the tower's token
            geometry through the preprocessing: :meth:`otviz.backbone.Backbone.geometry_on`).
        heatmaps: ``[P, K, N]`` phrase heatmaps (``Alignment.heatmap``).
        boxes: ``[P, K, 4]`` heatmap boxes in the image's pixels (the cells of the tokens at
            >= ``threshold`` of the peak, enclosing envelope:
            :func:`~otviz.patch_grid.boxes.heatmap_boxes`).
        image_sizes: ``[P, 2]`` ``(width, height)`` of each query's image.
        gold: ``[P, 4]`` gold pixel boxes, or ``None``.
        hits: ``[P, K]`` sure pointing-game hits (every token tied for the peak looks inside
            the gold box: an expected hit of 1, :func:`~otviz.eval.grounding_metrics.pointing_hits`;
            a flat map is no sure hit), or ``None`` without gold boxes.
        iou: ``[P, K]`` IoU of the heatmap box with the gold box, or ``None``.
        load_image: image index -> uint8 ``[H, W, 3]``.
        threshold: the box threshold.
        unavailable: explainer name -> its "not available for <family> towers" note, for
            the asked explainers that cannot read the backbone's tower (no column).
    """

    items: list[BrowseItem]
    methods: tuple[str, ...]
    geometries: list[TokenGeometry]
    heatmaps: Tensor
    boxes: Tensor
    image_sizes: Tensor
    gold: Tensor | None
    hits: Tensor | None
    iou: Tensor | None
    load_image: Callable[[int], np.ndarray]
    threshold: float
    unavailable: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def method_index(self, name: str) -> int:
        if name in self.unavailable:
            raise InputError(self.unavailable[name])
        if name not in self.methods:
            raise InputError(f"unknown method {name!r}; choose one of {list(self.methods)}")
        return self.methods.index(name)


# ----------------------------------------------------------------------- kinds
def _parents(tree: Tree) -> dict[int, Tree]:
    out: dict[int, Tree] = {}
    for node in tree.nodes():
        for child in node.children:
            out[id(child)] = node
    return out


def base_noun_phrases(tree: Tree) -> list[Tree]:
    """The NP nodes with no NP below them, in word order."""
    return [n for n in tree.phrases("NP") if not any(m.label == "NP" for m in n.phrases()[1:])]


def in_relation(tree: Tree, start: int, end: int) -> bool:
    """Whether the noun phrase over words ``[start, end)`` is the landmark (a PP holds it) or
    the subject (its parent NP also holds a PP) of a relation."""
    parents = _parents(tree)
    node = next((n for n in tree.phrases("NP") if (n.start, n.end) == (start, end)), None)
    parent = None if node is None else parents.get(id(node))
    if parent is None:
        return False
    return parent.label == "PP" or any(c.label == "PP" for c in parent.children)


def phrase_kinds(tree: Tree, start: int, end: int, words: Sequence[str],
                 colour_shared: bool) -> frozenset[str]:
    """The :data:`KINDS` of the phrase over words ``[start, end)`` of a caption."""
    kinds = set()
    if colour_shared:
        kinds.add(COLOUR_SHARED)
    if in_relation(tree, start, end):
        kinds.add(RELATION)
    if any(w.lower() in SIZE_WORDS for w in words[start:end]):
        kinds.add(SIZE)
    return frozenset(kinds)


# ----------------------------------------------------------------------- queries
def world_queries(data: EvalSet) -> BrowseQueries:
    """Every gold noun phrase of the set's true captions
    (:func:`~otviz.eval.alignment_tables.phrase_queries`), with its gold box and kinds (the
    colour is shared when another object of the scene, distractors included, has it)."""
    q = phrase_queries(data)
    items = []
    for p, (j, (start, end)) in enumerate(zip(q.image.tolist(), q.spans.tolist(), strict=True)):
        s = data.samples[j]
        kinds = phrase_kinds(s.tree, start, end, s.words, bool(q.shared_colour[p]))
        items.append(BrowseItem(j, s.caption, q.texts[p], start, end, kinds))
    return BrowseQueries(items, q.image, data.positives[q.image], q.select, q.boxes)


def folder_queries(data: EvalSet) -> BrowseQueries:
    """The base noun phrases (:func:`base_noun_phrases`) of every caption of a set over
    :class:`~otviz.eval.world_set.ParsedCaptions`, without gold boxes; a colour counts as
    shared when another noun phrase of the caption names it."""
    dataset = data.dataset
    items, spans, texts = [], [], []
    for p, tree in enumerate(dataset.trees):
        words = tree.leaves()
        nps = base_noun_phrases(tree)
        colours = [{w.lower() for w in words[n.start:n.end]} & COLOUR_WORDS for n in nps]
        for k, node in enumerate(nps):
            others = set().union(*(c for i, c in enumerate(colours) if i != k))
            shared = bool(colours[k] & others)
            kinds = phrase_kinds(tree, node.start, node.end, words, shared)
            items.append(BrowseItem(dataset.image_of(p), dataset.item(p)[1], node.span_text(),
                                    node.start, node.end, kinds))
            spans.append((node.start, node.end))
            texts.append(p)
    if not items:
        raise InputError("no noun phrase in any caption: nothing to browse")
    text = torch.tensor(texts, dtype=torch.long)
    token_word, mask = data.text_tokens(text)
    select = phrase_token_select(token_word, mask, torch.tensor(spans, dtype=torch.long))
    kept = select.any(1)
    if not bool(kept.any()):
        raise InputError("every noun phrase lies past the model's context length")
    keep = kept.tolist()
    image = torch.tensor([it.image for it in items], dtype=torch.long)
    return BrowseQueries([it for it, k in zip(items, keep, strict=True) if k], image[kept],
                         text[kept], select[kept], None)


# ----------------------------------------------------------------------- scoring
def score_heatmaps(
    heatmaps: Tensor, geometry: Geometries, gold: Tensor, threshold: float = 0.5,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(hits [P], iou [P], pixel boxes [P, 4])`` of phrase heatmaps ``[P, N]`` against
    their gold pixel boxes ``[P, 4]``: the sure hits of the pointing game (an expected hit of
    1 under its tie rule, :func:`~otviz.eval.grounding_metrics.pointing_hits`) and the IoU of
    the thresholded heatmap's box (ConceptOT Sec. 2.6), as :func:`grounding_scores` averages
    it."""
    heat = heatmaps.detach().float().cpu()
    boxes = heatmap_boxes(heat, geometry, threshold)
    return pointing_hits(heat, geometry, gold) == 1, box_iou(boxes, gold), boxes


@torch.no_grad()
def query_heatmaps(
    suite: MethodSuite, data: EvalSet, queries: BrowseQueries,
    load_image: Callable[[int], np.ndarray], methods: Sequence[str] = ALIGN_METHODS,
    explainers: Sequence[str] = (), phrases: Sequence[str] | None = None,
) -> tuple[Tensor, tuple[str, ...], dict[str, str]]:
    """``(heatmaps [P, K, N] float64, names, unavailable)``: every method's phrase heatmap of
    every query (batched through the set's cached features,
    :func:`~otviz.eval.alignment_tables.phrase_heatmaps`), then each of ``explainers``'
    (:mod:`otviz.explainers`: from the image and the phrase text, ``phrases`` or the items'),
    the ``K`` names in that order. An explainer that cannot read the backbone's tower gets
    no column, its note in ``unavailable``."""
    missing = [m for m in methods if m not in suite.methods]
    if missing:
        raise InputError(f"the checkpoint has no {', '.join(missing)}")
    unavailable = {e: note for e in explainers
                   if (note := explainer_unavailable(data.backbone, e)) is not None}
    explainers = [e for e in explainers if e not in unavailable]
    images = [load_image(int(j)) for j in queries.image] if explainers else []
    phrases = list(phrases) if phrases is not None else [it.phrase for it in queries.items]
    heats = torch.stack([
        phrase_heatmaps(suite.methods[m], data, queries.image, queries.text, queries.select)
        for m in methods
    ] + [explain_pairs(data.backbone, e, images, phrases).maps.double() for e in explainers],
        dim=1)
    return heats, (*methods, *explainers), unavailable


def method_boxes(heatmaps: Tensor, geometries: Sequence[TokenGeometry], threshold: float
                 ) -> Tensor:
    """``[P, K, 4]`` pixel boxes of ``[P, K, N]`` heatmaps, query ``p``'s on
    ``geometries[p]`` (:func:`~otviz.patch_grid.boxes.heatmap_boxes`)."""
    P, K = heatmaps.shape[:2]
    return heatmap_boxes(heatmaps.reshape(P * K, -1),
                         [g for g in geometries for _ in range(K)], threshold).reshape(P, K, 4)


def browse_table(
    suite: MethodSuite,
    data: EvalSet,
    queries: BrowseQueries,
    image_sizes: Tensor,
    load_image: Callable[[int], np.ndarray],
    methods: Sequence[str] = ALIGN_METHODS,
    threshold: float = 0.5,
    explainers: Sequence[str] = (),
) -> BrowseTable:
    """Every method's and explainer's heatmap of every query (:func:`query_heatmaps`), with
    its box and, where the queries have gold boxes (one image size for the set), hit and
    IoU. ``image_sizes`` is ``[n_images, 2]`` ``(width, height)``."""
    heats, names, unavailable = query_heatmaps(suite, data, queries, load_image, methods,
                                               explainers)
    heats = heats.float()
    sizes = image_sizes[queries.image]
    geometries = [data.backbone.geometry_on(int(w), int(h)) for w, h in sizes.tolist()]
    boxes = method_boxes(heats, geometries, threshold)
    hits = iou = None
    if queries.gold is not None:
        scored = [score_heatmaps(heats[:, k], geometries, queries.gold, threshold)
                  for k in range(len(names))]
        hits = torch.stack([s[0] for s in scored], dim=1)
        iou = torch.stack([s[1] for s in scored], dim=1)
    return BrowseTable(queries.items, names, geometries, heats, boxes, sizes,
                       queries.gold, hits, iou, load_image, threshold, unavailable)


def world_browse(
    suite: MethodSuite, n_images: int, split: str = "test", seed: int = 0,
    cache_dir: str | Path = ".cache/otviz-features", threshold: float = 0.5,
    explainers: Sequence[str] = (), progress: Progress | None = None,
) -> BrowseTable:
    """The :class:`BrowseTable` of images ``0..n-1`` of a world split (the world the suite's
    backbone was trained on, true captions only), encoded through the feature cache (with
    ``progress`` after each batch: the served app's stop check), with the ``explainers``'
    columns after the methods'."""
    if not 1 <= int(n_images) <= MAX_IMAGES:
        raise InputError(f"the number of images must be in [1, {MAX_IMAGES}]")
    config = world_config_of(suite.backbone, negatives=False)
    data = EvalSet.build(suite.backbone, int(n_images), split, seed, str(cache_dir),
                         progress, config=config)
    side = data.samples[0].image.shape
    sizes = torch.tensor([[side[1], side[0]]], dtype=torch.long).expand(data.n_images, 2)
    return browse_table(suite, data, world_queries(data), sizes,
                        lambda j: data.samples[j].image, threshold=threshold,
                        explainers=explainers)


def grounding_set_browse(
    suite: MethodSuite, root: str | Path, layout: tuple[str, str], cache_dir: str | Path,
    max_images: int = MAX_IMAGES, threshold: float = 0.5, explainers: Sequence[str] = (),
    progress: Progress | None = None,
) -> tuple[BrowseTable, list[str]]:
    """``(table, notes)``: the :class:`BrowseTable` of the grounding set ``layout`` =
    ``(kind, split)`` at ``root`` (confined to it;
    :func:`~otviz.data.grounding_sets.detect_layout`), its first ``max_images`` images, every
    phrase with a gold box (hits against the enclosing box of its gold boxes), the images
    fitted to the model's input as the evaluation fits them, encoded with ``progress`` as
    :func:`world_browse` does; ``notes`` says what the reader skipped."""
    try:
        data = load_grounding_set(layout[0], root, layout[1], limit=max_images)
    except DatasetError as e:
        raise InputError(f"cannot read the {layout[0]} folder: {e}") from None
    frame = model_input_size(suite.backbone)
    evalset = EvalSet(GroundingProbeDataset(data, frame), suite.backbone,
                      FeatureCache(cache_dir), progress)
    sizes = torch.tensor([frame], dtype=torch.long).expand(evalset.n_images, 2)
    table = browse_table(suite, evalset, world_queries(evalset), sizes,
                         lambda j: evalset.samples[j].image, threshold=threshold,
                         explainers=explainers)
    counts = data.skipped.counts
    notes = [f"{layout[0]} {layout[1]}: skipped " + ", ".join(
        f"{n} {reason}" for reason, n in sorted(counts.items()))] if counts else []
    return table, notes


def first_captions(folder: CaptionFolder, max_images: int = MAX_IMAGES) -> CaptionFolder:
    """The first caption of each of the first ``max_images`` images of ``folder`` (load it
    confined to its upload: ``load_image_captions(root, root=root)``)."""
    first: dict[int, int] = {}
    for i, j in enumerate(folder.pair_image):
        if j < max_images:
            first.setdefault(j, i)
    images = sorted(first)
    return CaptionFolder([folder.image_paths[j] for j in images],
                         [folder.captions[first[j]] for j in images],
                         list(range(len(images))), folder.source)


def folder_browse(
    suite: MethodSuite, folder: CaptionFolder, cache_dir: str | Path, threshold: float = 0.5,
    explainers: Sequence[str] = (), progress: Progress | None = None,
) -> BrowseTable:
    """The :class:`BrowseTable` of an image-caption folder (one caption per image, e.g. from
    :func:`first_captions`), encoded through the feature cache in ``cache_dir``, with the
    ``explainers``' columns after the methods' (``progress`` as in :func:`world_browse`);
    every image's header is checked against the pixel limit before anything is decoded."""
    sizes = [header_size(p, p.name) for p in folder.image_paths]
    data = EvalSet(ParsedCaptions(folder), suite.backbone, FeatureCache(cache_dir), progress)
    data.features(suite.backbone.space)

    def load(j: int) -> np.ndarray:
        return np.asarray(folder.load_image(j))

    return browse_table(suite, data, folder_queries(data), torch.tensor(sizes), load,
                        threshold=threshold, explainers=explainers)


# ----------------------------------------------------------------------- rows
def hit_mask(table: BrowseTable, a: str, b: str, hit_filter: str) -> Tensor:
    """``[P]`` bool: the queries where methods ``a`` and ``b`` hit or miss as
    ``hit_filter`` (one of :data:`HIT_FILTERS`) asks."""
    if hit_filter not in HIT_FILTERS:
        raise InputError(f"unknown filter {hit_filter!r}; choose one of {list(HIT_FILTERS)}")
    if hit_filter == ALL_ROWS:
        return torch.ones(len(table), dtype=torch.bool)
    if table.hits is None:
        raise InputError("this set has no gold boxes: hits and misses need the world split")
    ha, hb = table.hits[:, table.method_index(a)], table.hits[:, table.method_index(b)]
    return {
        A_HITS_B_MISSES: ha & ~hb,
        A_MISSES: ~ha,
        BOTH_MISS: ~ha & ~hb,
        DISAGREE: ha != hb,
    }[hit_filter]


def kind_mask(table: BrowseTable, kinds: Sequence[str]) -> Tensor:
    """``[P]`` bool: the queries that have every kind in ``kinds``."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise InputError(f"unknown phrase kind(s) {unknown}; choose from {list(KINDS)}")
    wanted = set(kinds)
    return torch.tensor([wanted <= it.kinds for it in table.items], dtype=torch.bool)


def sort_rows(table: BrowseTable, rows: Tensor, order: str, a: str, b: str) -> Tensor:
    """``rows`` (query indices) in ``order`` (one of :data:`ORDERS`); ties keep set order."""
    if order not in ORDERS:
        raise InputError(f"unknown order {order!r}; choose one of {list(ORDERS)}")
    if order == SET_ORDER or rows.numel() == 0:
        return rows
    if table.iou is None:
        raise InputError("this set has no gold boxes: sorting by IoU needs the world split")
    iou_a = table.iou[rows, table.method_index(a)]
    key = {
        IOU_UP: iou_a,
        IOU_DOWN: -iou_a,
        IOU_GAP: -(iou_a - table.iou[rows, table.method_index(b)]),
    }[order]
    return rows[torch.sort(key, stable=True).indices]


def select_rows(
    table: BrowseTable, a: str, b: str, hit_filter: str = ALL_ROWS,
    kinds: Sequence[str] = (), order: str = SET_ORDER,
) -> Tensor:
    """The query indices that pass the hit filter and have the kinds, in ``order``."""
    keep = hit_mask(table, a, b, hit_filter) & kind_mask(table, kinds)
    return sort_rows(table, torch.nonzero(keep).flatten(), order, a, b)


@dataclass(frozen=True)
class Page:
    """One page of rows: its query indices, its number (1-based), the page count, the
    number of rows on all pages and the rows per page."""

    rows: Tensor
    number: int
    n_pages: int
    n_rows: int
    per_page: int

    @property
    def first(self) -> int:
        """1-based position of the page's first row among all rows (0 when empty)."""
        return 0 if self.rows.numel() == 0 else (self.number - 1) * self.per_page + 1

    @property
    def last(self) -> int:
        """1-based position of the page's last row among all rows (0 when empty)."""
        return 0 if self.rows.numel() == 0 else self.first + self.rows.numel() - 1


def page_of(rows: Tensor, page: float | int | None, per_page: float | int | None) -> Page:
    """Page ``page`` (clamped to ``[1, n_pages]``; a missing or non-finite value is 1) of
    ``rows`` at ``per_page`` rows (clamped to ``[1, MAX_PER_PAGE]``)."""
    per = _clamped(per_page, 1, MAX_PER_PAGE, 12)
    n_pages = max(1, math.ceil(rows.numel() / per))
    number = _clamped(page, 1, n_pages, 1)
    start = (number - 1) * per
    return Page(rows[start : start + per], number, n_pages, rows.numel(), per)


def _clamped(value: float | int | None, low: int, high: int, default: int) -> int:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    return default if not math.isfinite(v) else int(min(max(round(v), low), high))


def method_label(name: str) -> str:
    """A method's or an explainer's label (the name itself for neither)."""
    return METHOD_LABELS.get(name) or (EXPLAINERS[name].label if name in EXPLAINERS else name)


# ----------------------------------------------------------------------- cache
class BrowseCache:
    """Computed :class:`BrowseTable` s kept in memory, least recently used dropped past
    ``size``; a key is computed once even when requests for it race."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._tables: OrderedDict[Hashable, BrowseTable] = OrderedDict()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], BrowseTable]) -> BrowseTable:
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._tables:
                    self._tables.move_to_end(key)
                    return self._tables[key]
            table = compute()
            with self._lock:
                self._tables[key] = table
                while len(self._tables) > self.size:
                    old, _ = self._tables.popitem(last=False)
                    self._locks.pop(old, None)
            return table
