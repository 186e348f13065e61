"""A world split prepared for evaluation: its samples, each image's true caption and hard
negatives, encoded once by a frozen backbone through the feature cache.

:class:`WorldProbeDataset` lists, for images ``0..n-1`` of a world split, the true caption
of each image followed by its SugarCrepe-style hard negatives (the categories of
:data:`~otviz.world.NEGATIVE_CATEGORIES` that apply to the scene), so one cache entry holds
everything the tables need: retrieval uses the true pairs, the probe the negatives, the
grounding the gold phrases of the true captions. Every caption carries its gold
constituency tree (negatives too, realised from their meanings), which PowerCLIP's nodes
come from.

:class:`EvalSet` gathers any ``(image, caption)`` pairs of the set as a
:class:`~otviz.methods.PairBatch` in the feature space a method consumes (``"width"`` for
trained heads, ``"projected"`` for training-free methods), with the parse-tree nodes and
the token axis cut to the batch's last content token (padding positions never change a
score; fewer positions cost less). An :class:`EvalSet` over :class:`ParsedCaptions` (an
image-caption folder whose captions are parsed) serves the same features, pairs and nodes;
the world-only parts (positives, negatives) need a :class:`WorldProbeDataset`.
:class:`GroundingProbeDataset` serves a real grounding set (Flickr30k Entities, RefCOCO,
Visual Genome: :mod:`otviz.data.grounding_sets`) as world-like samples, each image fitted to
the model's input, so the grounding table reads it as it reads the world.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from otviz.backbone import Backbone, Space
from otviz.data.datasets import CaptionFolder, WorldDataset
from otviz.data.feature_cache import CachedFeatures, FeatureCache
from otviz.data.grounding_sets import GroundingSet
from otviz.methods.base import PairBatch
from otviz.patch_grid.tokens import TokenGeometry
from otviz.text.parse import batch_node_masks, parse_caption
from otviz.text.tree import Tree
from otviz.text.words import split_words
from otviz.world import (
    NEGATIVE_CATEGORIES,
    Meaning,
    Phrase,
    Sample,
    SceneObject,
    WorldConfig,
    realise,
)

Progress = Callable[[int, int], None]


class WorldProbeDataset(WorldDataset):
    """Images ``0..n-1`` of ``World(config, split, seed)``; pair ``p`` is either an image's
    true caption (listed first) or one of its hard negatives. Samples are rendered once.

    Attributes:
        samples: the ``n`` world samples.
        captions, pair_image, categories, trees: per pair its text, image, negative category
            (``None`` for the true caption) and gold constituency tree.
        positives: ``[n]`` long, the pair index of each image's true caption.
    """

    def __init__(
        self, n: int, split: str = "test", seed: int = 0, config: WorldConfig | None = None
    ) -> None:
        super().__init__(n, split, seed, config)
        self.samples: list[Sample] = [self.world.sample(i) for i in range(n)]
        self.captions: list[str] = []
        self.pair_image: list[int] = []
        self.categories: list[str | None] = []
        self.trees: list[Tree] = []
        positives = []
        for j, s in enumerate(self.samples):
            positives.append(len(self.captions))
            self._add(j, s.caption, None, s.tree)
            for cat in NEGATIVE_CATEGORIES:
                if cat in s.negatives:
                    self._add(j, s.negatives[cat], cat, realise(s.negative_meanings[cat]).tree)
        self.positives = torch.tensor(positives, dtype=torch.long)

    def _add(self, image: int, caption: str, category: str | None, tree: Tree) -> None:
        self.pair_image.append(image)
        self.captions.append(caption)
        self.categories.append(category)
        self.trees.append(tree)

    def __len__(self) -> int:
        return len(self.captions)

    def sample(self, i: int) -> Sample:
        return self.samples[i]

    def item(self, i: int) -> tuple[Any, str]:
        from PIL import Image

        return Image.fromarray(self.samples[self.pair_image[i]].image), self.captions[i]

    def image_of(self, i: int) -> int:
        return self.pair_image[i]

    def groups(self) -> list[list[int]]:
        """Each image's true caption only (the retrieval ground truth)."""
        return [[int(p)] for p in self.positives]

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "kind": "world-probe",
                "negatives": list(NEGATIVE_CATEGORIES)}

    def negative_items(self) -> tuple[Tensor, Tensor, list[str]]:
        """``(image [n_items], negative pair [n_items], categories)``: every (image, hard
        negative) probe item, in image order and, within an image, category order."""
        idx = [p for p, c in enumerate(self.categories) if c is not None]
        images = torch.tensor([self.pair_image[p] for p in idx], dtype=torch.long)
        return images, torch.tensor(idx, dtype=torch.long), [self.categories[p] for p in idx]


class ParsedCaptions:
    """An image-caption folder with each caption's constituency tree
    (:func:`~otviz.text.parse.parse_caption`: benepar where installed, else the built-in
    parser), as an :class:`~otviz.data.datasets.ImageCaptionDataset` with ``trees``."""

    def __init__(self, folder: CaptionFolder) -> None:
        self.folder = folder
        self.trees: list[Tree] = [parse_caption(c).tree for c in folder.captions]

    @property
    def n_images(self) -> int:
        return self.folder.n_images

    def __len__(self) -> int:
        return len(self.folder)

    def item(self, i: int) -> tuple[Any, str]:
        return self.folder.item(i)

    def image_of(self, i: int) -> int:
        return self.folder.image_of(i)

    def groups(self) -> list[list[int]]:
        return self.folder.groups()

    def fingerprint(self) -> dict[str, Any]:
        return self.folder.fingerprint()


class GroundingProbeDataset:
    """A real grounding set (:class:`~otviz.data.grounding_sets.GroundingSet`) as world-like
    samples: item ``i`` is one caption with its own copy of its image, resized (bicubic) to
    the model's input ``frame`` ``(width, height)`` without cropping, so the patch grid
    covers the whole image and every gold box, scaled by the same factors
    (``Sample.pixel_scale``); its phrases keep every gold box (``Phrase.boxes``). An image
    already of the frame's size is not resampled. Captions are parsed
    (:func:`~otviz.text.parse.parse_caption`) for the methods that read trees; there are
    no object colours and no hard negatives."""

    def __init__(self, data: GroundingSet, frame: tuple[int, int]) -> None:
        self.data = data
        self.frame = frame
        self.split = str(data.source.get("split", ""))
        self.source_name = str(data.source.get("format", "data set"))
        self.samples: list[Sample] = [self._sample(i) for i in range(len(data))]
        self.captions = [s.caption for s in self.samples]
        self.trees: list[Tree] = [s.tree for s in self.samples]
        self.positives = torch.arange(len(self.samples))

    def _sample(self, i: int) -> Sample:
        item = self.data.items[i]
        image = self.data.load_image(i)
        if image.size != self.frame:
            image = image.resize(self.frame, Image.Resampling.BICUBIC)
        sx, sy = self.frame[0] / item.size[0], self.frame[1] / item.size[1]

        def scaled(b: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
            return (b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy)

        phrases, objects = [], []
        for k, p in enumerate(item.phrases):
            box = scaled(p.box)
            phrases.append(Phrase(p.start, p.end, p.text, k, box,  # type: ignore[arg-type]
                                  tuple(scaled(b) for b in p.boxes)))
            objects.append(SceneObject("", "", "", box))  # type: ignore[arg-type]
        return Sample(np.asarray(image), item.caption, [w.text for w in split_words(
            item.caption)], parse_caption(item.caption).tree, phrases, objects, {},
            Meaning(()), self.split, i, pixel_scale=(sx, sy))

    @property
    def n_images(self) -> int:
        return len(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def sample(self, i: int) -> Sample:
        return self.samples[i]

    def item(self, i: int) -> tuple[Any, str]:
        return Image.fromarray(self.samples[i].image), self.captions[i]

    def image_of(self, i: int) -> int:
        return i

    def groups(self) -> list[list[int]]:
        return [[i] for i in range(len(self.samples))]

    def fingerprint(self) -> dict[str, Any]:
        """The set's digest (annotations read, images' sizes and times) and the frame."""
        return {"kind": "grounding-set", "source": self.data.source,
                "digest": self.data.digest(), "frame": list(self.frame)}


def model_input_size(backbone: Backbone) -> tuple[int, int]:
    """The model's input ``(width, height)`` (its preprocessing's size)."""
    size = backbone.preprocess_cfg["size"]
    h, w = (size, size) if isinstance(size, int) else size
    return int(w), int(h)


def world_config_of(backbone: Backbone, negatives: bool = True) -> WorldConfig:
    """The world configuration the backbone was trained on (its checkpoint's recorded
    ``world_config``; the default world for a model without one), with ``negatives`` set.
    Recorded fields this code's :class:`WorldConfig` does not know are ignored."""
    recorded = backbone.info.get("world_config") or {}
    known = {f.name for f in dataclasses.fields(WorldConfig)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items() if k in known}
    return dataclasses.replace(WorldConfig(**values), negatives=negatives)


def trim_tokens(batch: PairBatch) -> PairBatch:
    """``batch`` with the token axis cut after the last content token of any row (the
    padding positions after it are masked out of every method's score)."""
    valid = batch.token_mask.any(0).nonzero()
    length = int(valid.max()) + 1 if valid.numel() else 1
    return batch if length == batch.tokens.shape[1] else batch.cut_tokens(length)


def backbone_in_space(backbone: Backbone, space: Space) -> Backbone:
    """The same model giving features in ``space`` (a shallow copy when it differs)."""
    if backbone.space == space:
        return backbone
    other = copy.copy(backbone)
    other.space = space
    return other


@dataclass
class EvalSet:
    """A :class:`WorldProbeDataset` with its cached features per feature space.

    Build with :meth:`build`; ``features(space)`` encodes (once, cached on disk) on first
    use of a space.
    """

    dataset: WorldProbeDataset | ParsedCaptions | GroundingProbeDataset
    backbone: Backbone
    cache: FeatureCache
    progress: Progress | None = None
    _features: dict[str, CachedFeatures] = field(default_factory=dict)
    _nodes: tuple[Tensor, Tensor] | None = None

    @classmethod
    def build(
        cls,
        backbone: Backbone,
        n: int,
        split: str = "test",
        seed: int = 0,
        cache_dir: str = ".cache/otviz-features",
        progress: Progress | None = None,
        config: WorldConfig | None = None,
    ) -> EvalSet:
        """Samples ``0..n-1`` of the world ``split`` (seed ``seed``) for ``backbone``, drawn
        with ``config`` (default: the world the backbone was trained on,
        :func:`world_config_of`)."""
        config = config or world_config_of(backbone)
        return cls(WorldProbeDataset(n, split, seed, config), backbone, FeatureCache(cache_dir),
                   progress)

    @property
    def split(self) -> str:
        if isinstance(self.dataset, GroundingProbeDataset):
            return self.dataset.split
        return self.dataset.world.split

    @property
    def is_world(self) -> bool:
        """Whether the set is the world's (objects with colours, hard negatives)."""
        return isinstance(self.dataset, WorldProbeDataset)

    @property
    def source_name(self) -> str:
        """``"world"`` or the real set's format (``flickr30k_entities``, ``refcoco``...)."""
        return "world" if self.is_world else getattr(self.dataset, "source_name", "folder")

    @property
    def n_images(self) -> int:
        return self.dataset.n_images

    @property
    def samples(self) -> list[Sample]:
        return self.dataset.samples

    @property
    def positives(self) -> Tensor:
        return self.dataset.positives

    @property
    def grid(self) -> tuple[int, int]:
        return self.backbone.grid

    @property
    def geometry(self) -> TokenGeometry:
        """Where each token looks on the set's pictures (the world's are all one size)."""
        height, width = self.samples[0].image.shape[:2]
        return self.backbone.geometry_on(width, height)

    def features(self, space: Space) -> CachedFeatures:
        """The set's features in ``space`` (built through the feature cache once)."""
        if space not in self._features:
            self._features[space] = self.cache.get_or_build(
                backbone_in_space(self.backbone, space), self.dataset, progress=self.progress
            )
        return self._features[space]

    def nodes(self) -> tuple[Tensor, Tensor]:
        """``([n_pairs, K, L] nodes, [n_pairs, K] node mask)``: the gold tree's phrase nodes
        of every caption as token sets (PowerCLIP's nodes)."""
        if self._nodes is None:
            feats = self.features(self.backbone.space)
            token_word = feats.token_words(torch.arange(feats.n_pairs))
            self._nodes = batch_node_masks(self.dataset.trees, token_word)
        return self._nodes

    def pairs(self, image_idx: Tensor, text_idx: Tensor, space: Space) -> PairBatch:
        """The pairs ``(image_idx[p], pair text_idx[p])`` in ``space``, with nodes, trimmed
        by :func:`trim_tokens`."""
        batch = self.features(space).pairs(image_idx, text_idx)
        nodes, node_mask = self.nodes()
        batch.nodes, batch.node_mask = nodes[text_idx], node_mask[text_idx]
        return trim_tokens(batch)

    def global_embeddings(self) -> tuple[Tensor, Tensor]:
        """``(images [n, E], true captions [n, E])`` pooled embeddings (the same in both
        spaces)."""
        img, txt = self.features(self.backbone.space).global_embeddings()
        return img, txt[self.positives]

    def text_tokens(self, text_idx: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
        """``(token_word [P, L], token_mask [P, L])`` of pairs ``text_idx`` (untrimmed): the
        caption word of each token position and whether it is a content token."""
        feats = self.features(self.backbone.space)
        idx = torch.as_tensor(text_idx, dtype=torch.long)
        return feats.token_words(idx), torch.from_numpy(feats.token_mask[idx.numpy()])
