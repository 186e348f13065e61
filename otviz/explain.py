"""From an image and a caption to per-word and per-method heatmaps: the one path that the
CLI (``otviz explain``) and the app share. Features are cached per (image, caption), so
changing the phrase or the method does not re-encode.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.backbone import Backbone, TokenFeatures
from otviz.boundary.images import ImageInput, to_rgb
from otviz.boundary.text import MAX_CAPTION_CHARS, check_caption  # noqa: F401 (re-exported)
from otviz.errors import InputError  # noqa: F401 (re-exported: the views import it here)
from otviz.methods import Alignment, PairBatch
from otviz.patch_grid.masks import cell_layout, grid_cells, paper_boxes, superpixels
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import MethodSuite
from otviz.text.parse import ParseResult, batch_node_masks, parse_caption
from otviz.text.words import Word


class NotComputedError(InputError):
    """A read of cached results (``compute=False``) found the pair not encoded or aligned
    yet."""

    def __init__(self) -> None:
        super().__init__("this image and caption are not aligned yet (or no longer cached): "
                         "click Align")


REGION_KINDS: tuple[str, ...] = ("grid", "boxes", "segments")


@dataclass
class Encoded:
    """One encoded (image, caption) pair.

    Attributes:
        image: the RGB image as the user gave it (uint8 ``[H, W, 3]``), for drawing.
        caption: the caption.
        features: the backbone's features of the pair (batch of one).
        parse: the caption's constituency tree and the parser that made it.
        key: the cache key of the pair: the image's hash, the caption and the backbone's
            feature choice (:func:`feature_choice_key`).
        geometry: where each image token looks on ``image`` (the tower's token geometry
            through the preprocessing's resize and crop): what every view draws with.
    """

    image: np.ndarray
    caption: str
    features: TokenFeatures
    parse: ParseResult
    key: tuple[str, str, str]
    geometry: TokenGeometry

    @property
    def words(self) -> list[Word]:
        return self.features.words[0]

    @property
    def grid(self) -> tuple[int, int]:
        return self.features.grid

    @property
    def kept_words(self) -> list[int]:
        """Indices of the caption words the model reads (those with a token inside the
        context length), in order."""
        return sorted({int(w) for w in self.features.token_word[0][self.features.token_mask[0]]})

    def token_select(self, word_indices: list[int] | range) -> Tensor:
        """``[1, L]`` bool mask of the BPE tokens of the given caption words."""
        if not len(word_indices):
            raise InputError("pick at least one word of the caption")
        kept = set(self.kept_words)
        missing = [self.words[w].text for w in word_indices if w not in kept]
        if len(missing) == len(word_indices):
            raise InputError(
                f"the words {missing} are past the model's context length and were cut"
            )
        return self.features.text.word_mask(0, list(word_indices)).unsqueeze(0)


@dataclass
class MethodRun:
    """One method's alignment of one pair, with its wall time and provenance."""

    name: str
    alignment: Alignment
    ms: float
    source: str


def region_masks(encoded: Encoded, kind: str, n_regions: int = 9, seed: int = 0) -> Tensor:
    """``[R, N]`` region masks on the pair's patch grid: ``"grid"`` cells, seeded random
    ``"boxes"`` (PowerCLIP Sec. 3.2, 5 to 15 of them) or ``"segments"``, scikit-image's SLIC
    superpixels of the picture put on the tokens through the pair's token geometry."""
    grid = encoded.grid
    if kind == "grid":
        return grid_cells(grid, *cell_layout(grid, n_regions))
    if kind == "boxes":
        return paper_boxes(grid, n_regions, seed)
    if kind == "segments":
        return superpixels(np.asarray(encoded.image), encoded.geometry, n_regions)
    raise InputError(f"unknown region kind {kind!r}; choose one of {REGION_KINDS}")


def feature_choice_key(backbone: Backbone) -> str:
    """``"<source>@<side>px"``: which features of the model a backbone reads
    (:meth:`otviz.backbone.Backbone.with_features`), part of every cache key here, so a
    change of source or input size re-encodes once and is then cached like an image."""
    return f"{backbone.features}@{backbone.image_size}px"


class Explainer:
    """Encodes (image, caption) pairs with a backbone, with an LRU feature cache.

    Args:
        backbone: the model giving patch and token features. Similarity maps are computed
            in the model's shared embedding space, so a ``"width"`` backbone's features are
            projected with the model's own projections for them. ``backbone`` may be
            replaced by a view reading other features
            (:meth:`~otviz.backbone.Backbone.with_features`): the caches key on that choice.
        cache_size: how many encoded pairs to keep.
    """

    def __init__(self, backbone: Backbone, cache_size: int = 32) -> None:
        self.backbone = backbone
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str, str], Encoded] = OrderedDict()
        self._projected: OrderedDict[tuple[str, str, str], TokenFeatures] = OrderedDict()
        self._runs: OrderedDict[tuple[str, ...], MethodRun] = OrderedDict()
        self._lock = threading.Lock()  # the caches are read and written from server threads

    def _cached(self, cache: OrderedDict, key: tuple, compute: bool):
        """``cache[key]`` (marked most recent) or None; with ``compute=False`` a miss is a
        :class:`NotComputedError`."""
        with self._lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
        if hit is None and not compute:
            raise NotComputedError()
        return hit

    def _store(self, cache: OrderedDict, key: tuple, value: object, size: int) -> None:
        with self._lock:
            cache[key] = value
            while len(cache) > size:
                cache.popitem(last=False)

    def encode(self, image: ImageInput | None, caption: str | None,
               compute: bool = True) -> Encoded:
        """Encode one pair (cached). Raises :class:`InputError` on unusable input and, with
        ``compute=False`` (a read of cached results only, for requests served outside the
        queue), :class:`NotComputedError` when the pair is not cached."""
        if image is None:
            raise InputError("no image: upload one or pick an example")
        caption = check_caption(caption)
        rgb = np.asarray(to_rgb(image))
        key = (hashlib.sha1(rgb.tobytes() + str(rgb.shape).encode()).hexdigest(), caption,
               feature_choice_key(self.backbone))
        hit = self._cached(self._cache, key, compute)
        if hit is not None:
            return hit
        features = self.backbone.encode([rgb], [caption])
        if not features.words[0] or not bool(features.token_mask.any()):
            raise InputError("the caption has no words the model can read")
        geometry = self.backbone.geometry_on(rgb.shape[1], rgb.shape[0])
        encoded = Encoded(rgb, caption, features, parse_caption(caption), key, geometry)
        self._store(self._cache, key, encoded, self.cache_size)
        return encoded

    def align(
        self, encoded: Encoded, suite: MethodSuite, names: list[str], regions: str = "grid",
        compute: bool = True,
    ) -> dict[str, MethodRun]:
        """Run the named methods of ``suite`` on the pair (each result cached, so a phrase
        change re-reads the plan without re-solving); ``compute=False`` as in
        :meth:`encode`."""
        runs = {}
        for name in names:
            key = (*encoded.key, suite.label, name, regions)
            run = self._cached(self._runs, key, compute)
            if run is None:
                entry = suite.methods[name]
                n_regions = int(entry.method.config.extra.get("n_regions", 9))  # PowerCLIP's M
                batch = self.pair_batch(encoded, entry.space, regions, n_regions)
                start = time.perf_counter()
                with torch.no_grad():
                    alignment = entry.method(batch)
                elapsed = 1000 * (time.perf_counter() - start)
                run = MethodRun(name, alignment, elapsed, entry.source)
                self._store(self._runs, key, run, self.cache_size * 16)
            runs[name] = run
        return runs

    def pair_batch(
        self, encoded: Encoded, space: str, regions: str = "grid", n_regions: int = 9
    ) -> PairBatch:
        """The method input of the pair: features in ``space``, ``n_regions`` region masks
        of kind ``regions`` on the patch grid (seed 0, as PowerCLIP's evaluation proposals),
        and the caption's parse-tree nodes as token sets."""
        feats = encoded.features if space == "width" else self.projected(encoded)
        batch = feats.pair_batch()
        batch.regions = region_masks(encoded, regions, n_regions)[None]
        batch.nodes, batch.node_mask = batch_node_masks([encoded.parse.tree], feats.token_word)
        return batch

    def projected(self, encoded: Encoded) -> TokenFeatures:
        """The pair's features in the model's joint embedding space (cached)."""
        cached = self._cached(self._projected, encoded.key, compute=True)
        if cached is None:
            cached = self.backbone.to_space(encoded.features, "projected")
            self._store(self._projected, encoded.key, cached, self.cache_size)
        return cached

    def method_word_maps(self, encoded: Encoded, suite: MethodSuite, name: str) -> Tensor:
        """``[n_words, H, W]``: each caption word's patch map under the method ``name`` of
        ``suite`` (its phrase map of the word's tokens,
        :meth:`~otviz.methods.base.AlignmentMethod.phrase_patch_map`: the plan's column sum,
        ConceptOT Sec. 2.6, or the method's own readout); zeros for a word past the context
        length. The run is cached as :meth:`align`'s."""
        run = self.align(encoded, suite, [name])[name]
        method = type(suite.methods[name].method)
        h, w = encoded.grid
        maps = torch.zeros(len(encoded.words), h * w)
        for k in encoded.kept_words:
            maps[k] = method.phrase_patch_map(run.alignment, encoded.token_select([k]))[0]
        return maps.reshape(-1, h, w)

    def word_similarity(self, encoded: Encoded) -> Tensor:
        """``[n_words, H, W]``: cosine similarity of each caption word with every patch, in
        the model's shared embedding space (a word of several BPE tokens takes their mean)."""
        feats = self.projected(encoded)
        patches = F.normalize(feats.patches[0], dim=-1)
        tokens = F.normalize(feats.tokens[0], dim=-1)
        word_of = feats.token_word[0]
        valid = feats.token_mask[0]
        h, w = feats.grid
        maps = torch.zeros(len(encoded.words), h * w, dtype=patches.dtype)
        for k in range(len(encoded.words)):
            sel = valid & (word_of == k)
            if sel.any():
                maps[k] = patches @ F.normalize(tokens[sel].mean(0), dim=-1)
        return maps.reshape(-1, h, w)
