"""Where training pairs come from: frozen-backbone features of a dataset, as PairBatches.

A :class:`PairSource` is what the loop needs: ``pair_batch(indices)`` (matched pairs, with
parse-tree nodes where the data has trees), the image and caption identity of every pair
(for excluding false negatives), the feature widths, the backbone's logit scale and its
identity (for checkpoints), and what a head needs to start from the backbone
(:class:`~otviz.methods.start.BackboneStart`, ``None`` where the source has no backbone).
Two implementations:

* :class:`CachedPairs`: a :class:`~otviz.data.feature_cache.CachedFeatures` entry (the
  synthetic world or an image-caption folder encoded once by the frozen backbone), built by
  :func:`build_source`;
* :class:`TensorPairs`: features already in memory (tests, benchmarks, the app's tensors).

Webdataset shards are never cached: :func:`build_source` gives a
:class:`~otviz.train.streamed.StreamedPairs`, whose ``step_batch(step, device)`` decodes and
encodes each step's batch on the fly (the loop asks a source with ``step_batch`` for its
batches instead of gathering ``pair_batch(indices)``). The rule: shards always stream; the
world and the image-caption folders (COCO, Karpathy, CSV) go through the feature cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from otviz.methods.base import PairBatch, method_class
from otviz.methods.start import AUTO, BACKBONE, BackboneStart, affine_map
from otviz.text.parse import batch_node_masks, parse_caption
from otviz.text.tree import Tree
from otviz.train.config import TrainConfig
from otviz.train.negatives import caption_ids


class PairSource(Protocol):
    """Matched (image, caption) pairs ``0..n_pairs-1`` of a training set."""

    n_pairs: int
    patch_dim: int
    token_dim: int
    embed_dim: int
    logit_scale: float
    identity: dict[str, Any]
    image_ids: Tensor  # [n_pairs] long: the image of each pair
    text_ids: Tensor  # [n_pairs] long: equal for identical caption texts
    start: BackboneStart | None  # the backbone's projections (heads started from it)

    def pair_batch(self, indices: Tensor, device: torch.device | str) -> PairBatch: ...


@dataclass
class TensorPairs:
    """In-memory features; images may be shared by several pairs (``pair_image``).

    Attributes:
        patches: ``[n_images, N, Dv]``; tokens: ``[n, M, Dt]``; token_mask: ``[n, M]``;
        image_global: ``[n_images, E]``; text_global: ``[n, E]``; pair_image: ``[n]`` long;
        captions: ``n`` caption texts; grid: patch grid; nodes / node_mask: optional
        ``[n, K, M]`` / ``[n, K]`` parse-tree nodes; logit_scale, identity: of the backbone;
        start: its projections, for heads started from it (None: no backbone behind them).
    """

    patches: Tensor
    tokens: Tensor
    token_mask: Tensor
    image_global: Tensor
    text_global: Tensor
    pair_image: Tensor
    captions: list[str]
    grid: tuple[int, int]
    nodes: Tensor | None = None
    node_mask: Tensor | None = None
    logit_scale: float = 1.0 / 0.07
    identity: dict[str, Any] = field(default_factory=lambda: {"name": "in-memory"})
    start: BackboneStart | None = None

    def __post_init__(self) -> None:
        self.image_ids = self.pair_image.long()
        self.text_ids = caption_ids(self.captions)

    @classmethod
    def random(
        cls,
        n: int,
        grid: tuple[int, int] = (4, 4),
        n_tokens: int = 8,
        patch_dim: int = 24,
        token_dim: int = 20,
        embed_dim: int = 16,
        seed: int = 0,
        n_captions: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> TensorPairs:
        """Seeded Gaussian features of ``n`` pairs (one image each) for tests and timing:
        caption lengths in ``[2, n_tokens - 2]`` after a start token, three parse nodes per
        caption (the whole caption and its two halves), and ``n_captions`` distinct caption
        texts (default ``n``; fewer gives duplicates)."""
        g = torch.Generator().manual_seed(seed)
        n_patches = grid[0] * grid[1]
        lengths = torch.randint(2, max(3, n_tokens - 1), (n,), generator=g).tolist()
        token_mask = torch.zeros(n, n_tokens, dtype=torch.bool)
        nodes = torch.zeros(n, 3, n_tokens, dtype=torch.bool)
        for i, length in enumerate(lengths):
            token_mask[i, 1 : 1 + length] = True
            nodes[i, 0, 1 : 1 + length] = True
            nodes[i, 1, 1 : 1 + length // 2] = True
            nodes[i, 2, 1 + length // 2 : 1 + length] = True
        node_mask = nodes.any(-1)
        return cls(
            patches=torch.randn(n, n_patches, patch_dim, generator=g, dtype=dtype),
            tokens=torch.randn(n, n_tokens, token_dim, generator=g, dtype=dtype),
            token_mask=token_mask,
            image_global=torch.randn(n, embed_dim, generator=g, dtype=dtype),
            text_global=torch.randn(n, embed_dim, generator=g, dtype=dtype),
            pair_image=torch.arange(n),
            captions=[f"caption {i % (n_captions or n)}" for i in range(n)],
            grid=grid,
            nodes=nodes,
            node_mask=node_mask,
            identity={"name": "random", "seed": seed, "n": n},
        )

    @property
    def n_pairs(self) -> int:
        return self.tokens.shape[0]

    @property
    def patch_dim(self) -> int:
        return self.patches.shape[-1]

    @property
    def token_dim(self) -> int:
        return self.tokens.shape[-1]

    @property
    def embed_dim(self) -> int:
        return self.image_global.shape[-1]

    def pair_batch(self, indices: Tensor, device: torch.device | str = "cpu") -> PairBatch:
        img = self.image_ids[indices]
        return PairBatch(
            patches=self.patches[img].to(device),
            tokens=self.tokens[indices].to(device),
            patch_mask=torch.ones(len(indices), self.patches.shape[1], dtype=torch.bool,
                                  device=device),
            token_mask=self.token_mask[indices].to(device),
            image_global=self.image_global[img].to(device),
            text_global=self.text_global[indices].to(device),
            grid=self.grid,
            nodes=None if self.nodes is None else self.nodes[indices].to(device),
            node_mask=None if self.node_mask is None else self.node_mask[indices].to(device),
        )


class CachedPairs:
    """Pairs of a feature-cache entry, with phrase nodes when ``trees`` are given.

    Args:
        features: the cached features.
        identity: the backbone's fingerprint
            (:func:`otviz.data.feature_cache.backbone_fingerprint`).
        logit_scale: the backbone's logit scale.
        trees: one constituency tree per pair (PowerCLIP), or None.
        start: the backbone's projections, for heads started from it (:func:`backbone_start`).
    """

    def __init__(
        self,
        features: Any,
        identity: dict[str, Any],
        logit_scale: float,
        trees: list[Tree] | None = None,
        start: BackboneStart | None = None,
    ) -> None:
        self.features = features
        self.identity = identity
        self.logit_scale = logit_scale
        self.start = start
        self.image_ids = torch.from_numpy(features.pair_image.astype("int64"))
        self.text_ids = caption_ids(features.captions)
        self.nodes = self.node_mask = None
        if trees is not None:
            # PowerCLIP's phrase nodes of every pair, padded to the largest K of the set
            token_word = features.token_words(torch.arange(self.n_pairs))
            self.nodes, self.node_mask = batch_node_masks(trees, token_word)

    @property
    def n_pairs(self) -> int:
        return self.features.n_pairs

    @property
    def patch_dim(self) -> int:
        return self.features.patches.shape[-1]

    @property
    def token_dim(self) -> int:
        return self.features.tokens.shape[-1]

    @property
    def embed_dim(self) -> int:
        return self.features.image_global.shape[-1]

    def pair_batch(self, indices: Tensor, device: torch.device | str = "cpu") -> PairBatch:
        batch = self.features.pair_batch(indices, device)
        if self.nodes is not None:
            batch.nodes = self.nodes[indices].to(device)
            batch.node_mask = self.node_mask[indices].to(device)
        return batch


def build_source(
    config: TrainConfig, progress: Callable[[int, int], None] | None = None,
    validation: bool = False, info: Any = None,
    indexing: Callable[[int, int], None] | None = None,
) -> PairSource:
    """The frozen backbone's cached features of the configured data, or for webdataset
    shards (:func:`otviz.data.shards.is_shard_spec`) the pairs streamed from them
    (:class:`~otviz.train.streamed.StreamedPairs`, on ``info``'s device and share of the
    job; ``indexing(shards done, shards)`` while the shards are indexed).

    Backbone: the tiny-CLIP checkpoint ``config.backbone`` (default: the shipped one) or the
    open_clip model ``config.open_clip_model`` with ``config.pretrained``, reading the patch
    features ``config.features`` at ``config.image_size`` (the head's checkpoint records
    both in the backbone's identity). Data: the world's
    train split (``n_train`` samples, ``world_seed``) or an image-caption folder. Trees
    (gold ones for the world, parsed captions for folders) only for a method that reads them
    (``uses_trees``: PowerCLIP). ``validation``: the world's ``val`` split instead
    (``n_val`` samples; scenes drawn apart from every training sample).
    """
    from otviz.backbone_spec import BackboneSpec
    from otviz.checkpoints.identity import backbone_fingerprint
    from otviz.data.datasets import WorldDataset, load_image_captions
    from otviz.data.feature_cache import FeatureCache
    from otviz.data.shards import index_shards, is_shard_spec

    spec = BackboneSpec.from_fields(config, device="cpu")
    backbone = spec.load()
    streamed = not validation and is_shard_spec(config.data)
    if streamed:  # encodes each step on the training device (a proxy model follows it)
        from otviz.train import distributed as D

        info = info if info is not None else D.DistInfo()
        backbone.model.to(info.device)
    backbone = spec.read(backbone)
    uses_trees = method_class(config.method).uses_trees
    scale = float(backbone.model.logit_scale.detach().exp())
    if streamed:
        from otviz.train.streamed import StreamedPairs

        return StreamedPairs(index_shards(config.data, indexing), backbone,
                             backbone_fingerprint(backbone), scale,
                             requested_start(config.start, backbone, False), uses_trees,
                             config.batch_size, config.seed, config.workers, info)
    if validation:
        if config.data != "world":
            raise ValueError("--n-val draws validation pairs from the world: use --data world")
        dataset: Any = WorldDataset(config.n_val, split="val", seed=config.world_seed)
    elif config.data == "world":
        dataset = WorldDataset(config.n_train, split="train", seed=config.world_seed)
    else:
        dataset = load_image_captions(config.data, split=config.split)
    features = FeatureCache(config.cache_dir).get_or_build(backbone, dataset, progress=progress)
    trees = None
    if uses_trees:
        if isinstance(dataset, WorldDataset):
            trees = [dataset.sample(i).tree for i in range(len(dataset))]
        else:
            trees = [parse_caption(c).tree for c in features.captions]
    start = None if validation else requested_start(config.start, backbone, config.data == "world")
    return CachedPairs(features, backbone_fingerprint(backbone), scale, trees, start)


def requested_start(requested: str, backbone: Any, world: bool) -> BackboneStart | None:
    """The backbone's start for a run that asks for ``requested``: read for "backbone"
    (``ValueError`` where a projection is not an affine map) and "auto" (``None`` there: the
    head starts random), ``None`` for "random"."""
    if requested not in (BACKBONE, AUTO):
        return None
    try:
        return backbone_start(backbone, world)
    except ValueError:
        if requested == BACKBONE:
            raise
        return None


def backbone_start(backbone: Any, world: bool) -> BackboneStart:
    """The projections of ``backbone``'s towers as affine maps
    (:func:`otviz.methods.start.affine_map`) and, for the ``world``, the width-space tokens
    of the captions its training-free configuration fits ConceptOT's anchors on
    (:data:`otviz.suite.WORLD_FIT_CAPTIONS`; other data: none, the anchors start random)."""
    from otviz.suite import WORLD_FIT_CAPTIONS, text_batch

    like = backbone.model.logit_scale.detach()
    image, text = backbone.image_tower, backbone.text_tower
    return BackboneStart(
        patch_map=affine_map(image.project, image.width, like),
        token_map=affine_map(text.project, text.width, like),
        fit_batch=text_batch(backbone, WORLD_FIT_CAPTIONS, "width") if world else None,
    )
