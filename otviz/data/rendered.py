"""World samples as training tensors: pre-rendered uint8 images and token ids.

The world renders thousands of samples per second, so a training set is rendered once into
a ``[n, H, W, 3]`` uint8 tensor (1/4 of the float memory) and normalised per batch with the
model's own mean/std, the same arithmetic as the model's eval transform on an image of the
model's size (checked in the tests).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from open_clip.tokenizer import SimpleTokenizer
from torch import Tensor

from otviz.worker_processes import worker_context
from otviz.world import NEGATIVE_CATEGORIES, Sample, World, WorldConfig

_CHUNK = 2048  # samples rendered before stacking


@dataclass
class RenderedSplit:
    """``n`` world samples: images ``[n, H, W, 3]`` uint8, token ids ``[n, L]``, captions,
    and optionally the token ids of each sample's hard-negative captions ``[n, C, L]`` (one
    per SugarCrepe category of :data:`NEGATIVE_CATEGORIES`) with their validity ``[n, C]``
    (a category may not apply to a scene)."""

    images: Tensor
    ids: Tensor
    captions: list[str]
    negative_ids: Tensor | None = None
    negative_valid: Tensor | None = None

    def __len__(self) -> int:
        return len(self.captions)


def render_split(
    split: str,
    n: int,
    seed: int,
    context_length: int,
    config: WorldConfig | None = None,
    tokenizer: SimpleTokenizer | None = None,
    shard: tuple[int, int] = (0, 1),
) -> RenderedSplit:
    """Render samples ``0..n-1`` of ``World(config, split, seed)`` and tokenise their captions
    exactly as open_clip does (truncating at ``context_length``). ``shard=(k, m)`` keeps only
    the samples ``i`` with ``i % m == k`` (one process's share in data-parallel training)."""
    k, m = shard
    if n < 1 or not 0 <= k < m or k >= n:
        raise ValueError(f"nothing to render: n={n}, shard={shard}")
    world = World(config or WorldConfig(negatives=False), split=split, seed=seed)
    tokenizer = tokenizer or SimpleTokenizer(context_length=context_length)
    indices = range(k, n, m)
    chunks = [  # in chunks, so the samples' trees and boxes are not all held at once
        split_from_samples([world.sample(i) for i in indices[c : c + _CHUNK]], context_length,
                           tokenizer)
        for c in range(0, len(indices), _CHUNK)
    ]
    return _concat(chunks)


def render_split_parallel(
    split: str, n: int, seed: int, context_length: int, config: WorldConfig | None = None,
    workers: int = 1,
) -> RenderedSplit:
    """:func:`render_split` of all ``n`` samples over ``workers`` processes (each renders
    one shard), put back in sample order: the same tensors as one process renders."""
    workers = max(1, min(workers, n))
    if workers == 1:
        return render_split(split, n, seed, context_length, config)
    with ProcessPoolExecutor(workers, mp_context=worker_context()) as pool:
        shards = [pool.submit(render_split, split, n, seed, context_length, config,
                              shard=(k, workers)) for k in range(workers)]
        parts = [shard.result() for shard in shards]
    return _interleave(parts, n)


def render_split_cached(
    cache: str | os.PathLike, split: str, n: int, seed: int, context_length: int,
    config: WorldConfig | None = None, workers: int = 1,
) -> RenderedSplit:
    """:func:`render_split_parallel`, kept in the folder ``cache`` under a key of every
    argument that changes the samples (several runs on the same data render it once)."""
    config = config or WorldConfig(negatives=False)
    key = hashlib.sha256(repr(
        (split, n, seed, context_length, dataclasses.asdict(config))).encode()).hexdigest()[:16]
    path = Path(cache) / f"{split}-{n}-{key}.pt"
    if path.is_file():
        return RenderedSplit(**torch.load(path, weights_only=False))
    data = render_split_parallel(split, n, seed, context_length, config, workers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(dataclasses.asdict(data), tmp)
    os.replace(tmp, path)
    return data


def _interleave(shards: list[RenderedSplit], n: int) -> RenderedSplit:
    """Shard ``k`` of ``m`` holds the samples ``k, k + m, ...``: merge them back in order."""
    m = len(shards)

    def merge(parts: list[Tensor]) -> Tensor:
        out = parts[0].new_empty((n, *parts[0].shape[1:]))
        for k, part in enumerate(parts):
            out[k::m] = part
        return out

    captions = [""] * n
    for k, shard in enumerate(shards):
        captions[k::m] = shard.captions
    negatives = shards[0].negative_ids is not None
    return RenderedSplit(
        merge([s.images for s in shards]),
        merge([s.ids for s in shards]),
        captions,
        merge([s.negative_ids for s in shards]) if negatives else None,  # type: ignore[misc]
        merge([s.negative_valid for s in shards]) if negatives else None,  # type: ignore[misc]
    )


def split_from_samples(
    samples: list[Sample], context_length: int, tokenizer: SimpleTokenizer | None = None
) -> RenderedSplit:
    """Stack world samples into a :class:`RenderedSplit` (with hard negatives when the
    samples carry them)."""
    images = np.stack([s.image for s in samples])
    captions = [s.caption for s in samples]
    tokenizer = tokenizer or SimpleTokenizer(context_length=context_length)
    ids = tokenizer(captions, context_length=context_length)
    split = RenderedSplit(torch.from_numpy(images), ids, captions)
    if any(s.negatives for s in samples):
        negs = [[s.negatives.get(c, "") for c in NEGATIVE_CATEGORIES] for s in samples]
        flat = [c for row in negs for c in row]
        split.negative_valid = torch.tensor([[bool(c) for c in row] for row in negs])
        split.negative_ids = tokenizer(flat, context_length=context_length).view(
            len(samples), len(NEGATIVE_CATEGORIES), context_length
        )
    return split


def _concat(parts: list[RenderedSplit]) -> RenderedSplit:
    if len(parts) == 1:
        return parts[0]
    negatives = parts[0].negative_ids is not None
    return RenderedSplit(
        torch.cat([p.images for p in parts]),
        torch.cat([p.ids for p in parts]),
        [c for p in parts for c in p.captions],
        torch.cat([p.negative_ids for p in parts]) if negatives else None,
        torch.cat([p.negative_valid for p in parts]) if negatives else None,
    )


def draw_negatives(
    split: RenderedSplit, idx: Tensor, k: int, generator: torch.Generator,
    weights: Tensor | None = None,
) -> Tensor:
    """Token ids ``[len(idx) * k, L]`` of ``k`` hard-negative captions per sample ``idx``,
    drawn among its valid categories (with replacement when fewer than ``k``): uniformly,
    or in proportion to ``weights`` ``[C]`` (one per category of
    :data:`NEGATIVE_CATEGORIES`, see :func:`negative_weights`)."""
    if split.negative_ids is None or split.negative_valid is None:
        raise ValueError("this split was rendered without hard negatives")
    valid = split.negative_valid[idx].float()
    if weights is not None:
        valid = valid * weights
    if (valid.sum(1) == 0).any():
        raise ValueError("a sample has no hard negative")
    pick = torch.multinomial(valid, k, replacement=True, generator=generator)  # [b, k]
    return split.negative_ids[idx.unsqueeze(1), pick].reshape(-1, split.ids.shape[1])


def negative_weights(spec: str) -> Tensor | None:
    """Category weights ``[C]`` from ``"replace_obj:3,swap_obj:2"`` (unnamed categories keep
    weight 1; an empty ``spec`` means uniform: ``None``)."""
    if not spec.strip():
        return None
    weights = torch.ones(len(NEGATIVE_CATEGORIES))
    for item in spec.split(","):
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or name not in NEGATIVE_CATEGORIES:
            raise ValueError(f"negative weight {item!r}: expected CATEGORY:WEIGHT with "
                             f"CATEGORY one of {', '.join(NEGATIVE_CATEGORIES)}")
        weight = float(value)
        if not weight >= 0:
            raise ValueError(f"negative weight {item!r} must be >= 0")
        weights[NEGATIVE_CATEGORIES.index(name)] = weight
    return weights


def normalise(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 ``[B, H, W, 3]`` -> float ``[B, 3, H, W]`` scaled to [0, 1] and standardised."""
    x = images.permute(0, 3, 1, 2).float().div_(255.0)
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def random_shift(images: Tensor, max_shift: int, generator: torch.Generator) -> Tensor:
    """Translate each uint8 ``[B, H, W, 3]`` image by up to ``max_shift`` pixels per axis,
    filling with the replicated border. Translation keeps every caption true (colours,
    shapes, sizes and relative positions are unchanged) as long as no object leaves the
    frame; the world keeps a margin around objects, so small shifts are safe."""
    if max_shift <= 0:
        return images
    B, H, W, _ = images.shape
    x = images.permute(0, 3, 1, 2).float()
    padded = torch.nn.functional.pad(x, (max_shift,) * 4, mode="replicate")
    offsets = torch.randint(0, 2 * max_shift + 1, (B, 2), generator=generator).to(x.device)
    rows = offsets[:, :1] + torch.arange(H, device=x.device)  # [B, H]
    cols = offsets[:, 1:] + torch.arange(W, device=x.device)  # [B, W]
    batch = torch.arange(B, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [B, H, W, 3]
    return out.round().to(torch.uint8)
