"""Training pairs streamed from webdataset shards: each step's images decoded by DataLoader
workers and encoded on the fly by the frozen backbone, on the training device; no feature of
every pair is kept (memory holds the shard index, the captions and a few batches in flight).

Order. An epoch's pairs are :meth:`otviz.data.shards.ShardIndex.epoch_order` (the shards in
an order drawn from ``(seed, epoch)``, each in file order) cut into ``B`` lanes of ``L = n //
B`` consecutive pairs (``B`` the global batch); row ``i`` of step ``b``'s batch is lane
``i``'s pair ``b`` (:func:`batch_pairs`). The order depends on the shards, the seed, the
epoch and ``B`` alone: a ``torchrun`` job of any size, its one-process twin and a resumed run
see the same batches, the state's step says where an epoch stands, and no pair comes twice
in an epoch (``n mod B`` pairs wait for another epoch's order, as the cached loop drops them).

Sharding. Process ``r`` of ``W`` decodes and encodes the rows :func:`otviz.train.distributed.shard`
gives it (consecutive lanes: a stretch of the epoch's shards), its DataLoader worker ``w``
the ``w``-th consecutive part of them (its own lanes, each walked forward); the encoded rows
are gathered so that every process holds the global batch, as with cached features
(:mod:`otviz.train.losses`). A process reads no pair of another's.

Failures. An image whose header passed at indexing but whose data does not decode drops its
row from the step's batch on every process (the rows travel with a valid flag) and is counted
in the index's skips, named in the run's summary line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from otviz.boundary.images import decode_image
from otviz.data.shards import BAD_IMAGE, ShardIndex
from otviz.errors import InputError
from otviz.methods.base import PairBatch
from otviz.methods.start import BackboneStart
from otviz.text.parse import batch_node_masks, parse_caption
from otviz.train import distributed as D
from otviz.train.negatives import caption_ids


def batch_pairs(order: np.ndarray, batch_size: int, b: int, rows: np.ndarray) -> np.ndarray:
    """The pairs at ``rows`` of step ``b``'s global batch in an epoch of ``order``: row
    ``i`` is pair ``b`` of lane ``i``, the ``i``-th run of ``len(order) // batch_size``."""
    return order[rows * (len(order) // batch_size) + b]


class _RankStream(IterableDataset):
    """This process's rows of steps ``first..last-1`` of one epoch: per step and worker,
    ``(its rows, their pixels [k, 3, S, S], valid [k])``."""

    def __init__(self, index: ShardIndex, order: np.ndarray, batch_size: int, rows: np.ndarray,
                 steps: range, preprocess: Any, side: int) -> None:
        self.index, self.order, self.batch_size = index, order, batch_size
        self.rows, self.steps, self.preprocess, self.side = rows, steps, preprocess, side

    def __iter__(self) -> Iterator[tuple[np.ndarray, Tensor, Tensor]]:
        info = get_worker_info()
        part = np.array_split(self.rows, info.num_workers)[info.id] if info else self.rows
        for b in self.steps:
            pairs = batch_pairs(self.order, self.batch_size, b, part)
            pixels = torch.zeros(len(part), 3, self.side, self.side)
            valid = torch.zeros(len(part), dtype=torch.bool)
            for k, i in enumerate(pairs.tolist()):
                try:
                    image = decode_image(self.index.image_bytes(i), self.index.names[i])
                except (InputError, OSError):
                    continue
                pixels[k], valid[k] = self.preprocess(image), True
            yield part, pixels, valid


class StreamedPairs:
    """A :class:`~otviz.train.pairs.PairSource` of shards whose batches come from
    :meth:`step_batch` (see the module docstring).

    Args:
        index: the shards' pairs.
        backbone: the frozen backbone, on ``info.device``.
        identity, logit_scale, start: as :class:`~otviz.train.pairs.CachedPairs`'.
        trees: parse each batch's captions into phrase nodes (PowerCLIP).
        batch_size, seed, workers: the global batch, the data order's seed, DataLoader
            worker processes per training process (0: decode in the training process).
        info: this process's place in the job.
    """

    def __init__(self, index: ShardIndex, backbone: Any, identity: dict[str, Any],
                 logit_scale: float, start: BackboneStart | None, trees: bool,
                 batch_size: int, seed: int, workers: int, info: D.DistInfo) -> None:
        self.index, self.backbone, self.identity = index, backbone, identity
        self.logit_scale, self.start, self.trees = logit_scale, start, trees
        self.nodes = True if trees else None  # phrase nodes: parsed with each batch
        self.batch_size, self.seed, self.info = batch_size, seed, info
        self.rows = np.arange(batch_size)[D.shard(batch_size, info)]
        # every process's row count, for gathering (they differ by at most one)
        self._sizes = [len(range(batch_size)[D.shard(batch_size, D.DistInfo(
            rank=r, world_size=info.world_size))]) for r in range(info.world_size)]
        self.workers = min(workers, len(self.rows))
        self.image_ids = torch.arange(len(index))
        self.text_ids = caption_ids(index.captions)
        self.patch_dim, self.token_dim = backbone.patch_dim, backbone.token_dim
        self.embed_dim = backbone.embed_dim
        self._epoch: tuple[int, np.ndarray] | None = None
        self._stream: tuple[int, Iterator[Any]] | None = None  # (next step, batches)

    @property
    def n_pairs(self) -> int:
        return len(self.index)

    @property
    def steps_per_epoch(self) -> int:
        return self.n_pairs // self.batch_size

    def order(self, epoch: int) -> np.ndarray:
        """The pairs of ``epoch`` in order (kept for the current epoch)."""
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, self.index.epoch_order(self.seed, epoch))
        return self._epoch[1]

    def position(self, step: int) -> dict[str, Any]:
        """Where ``step`` stands: epoch, batch in it, and the next pair of lane 0."""
        epoch, b = divmod(step, self.steps_per_epoch)
        return {"epoch": epoch, "batch": b, "pairs_done_in_epoch": b * self.batch_size,
                "next": self.index.where(int(batch_pairs(self.order(epoch), self.batch_size, b,
                                                        np.zeros(1, dtype=np.int64))[0]))}

    def summary(self) -> str:
        """The shards' one summary line (indexing and decoding skips)."""
        return self.index.summary()

    def step_batch(self, step: int, device: torch.device | str) -> tuple[Tensor, PairBatch]:
        """Step ``step``'s pair indices and their encoded :class:`PairBatch` (rows whose
        image failed to decode left out, on every process alike)."""
        epoch, b = divmod(step, self.steps_per_epoch)
        if self._stream is None or self._stream[0] != step:
            self._stream = (step, self._open(epoch, b))
        parts = [next(self._stream[1]) for _ in range(max(1, self.workers))]
        self._stream = (step + 1, self._stream[1]) if b + 1 < self.steps_per_epoch else None
        rows = np.concatenate([p[0] for p in parts])
        pixels = torch.cat([p[1] for p in parts])
        valid = torch.cat([p[2] for p in parts])
        order = self.order(epoch)
        captions = [self.index.captions[i] for i in batch_pairs(order, self.batch_size, b, rows)]
        features, valid = self._encode(pixels, captions, valid)
        pairs = batch_pairs(order, self.batch_size, b, np.arange(self.batch_size))
        for i in pairs[~valid.cpu().numpy()]:
            self.index.skips.add(BAD_IMAGE, f"{self.index.where(int(i))}: does not decode")
        kept = torch.from_numpy(pairs[valid.cpu().numpy()])
        patches, tokens, token_mask, image_global, text_global = (f[valid] for f in features)
        batch = PairBatch(
            patches=patches.to(device), tokens=tokens.to(device),
            patch_mask=torch.ones(patches.shape[:2], dtype=torch.bool, device=device),
            token_mask=token_mask.bool().to(device), image_global=image_global.to(device),
            text_global=text_global.to(device), grid=self.backbone.grid)
        if self.trees:
            texts = [self.index.captions[i] for i in kept.tolist()]
            nodes, node_mask = batch_node_masks([parse_caption(c).tree for c in texts],
                                                self.backbone.words(texts).token_word)
            batch.nodes, batch.node_mask = nodes.to(device), node_mask.to(device)
        return kept, batch

    def _open(self, epoch: int, first: int) -> Iterator[Any]:
        """The DataLoader of this process's rows from step ``first`` of ``epoch`` on."""
        stream = _RankStream(self.index, self.order(epoch), self.batch_size, self.rows,
                             range(first, self.steps_per_epoch), self.backbone.preprocess,
                             self.backbone.image_size)
        loader = DataLoader(stream, batch_size=None, num_workers=self.workers,
                            prefetch_factor=2 if self.workers else None)
        return iter(loader)

    @torch.no_grad()
    def _encode(self, pixels: Tensor, captions: list[str], valid: Tensor
                ) -> tuple[list[Tensor], Tensor]:
        """This process's rows encoded, then every process's gathered in row order:
        ``([patches, tokens, token_mask, image_global, text_global], valid)``."""
        text = self.backbone.words(captions)
        dev = self.info.device
        patches, tokens, image_global, text_global = self.backbone.forward_tensors(
            pixels.to(dev), text.ids)
        own = [patches, tokens, text.mask.to(dev, torch.uint8), image_global, text_global,
               valid.to(dev, torch.uint8)]
        gathered = [self._gather(x.float() if x.is_floating_point() else x) for x in own]
        return gathered[:-1], gathered[-1].bool()

    def _gather(self, x: Tensor) -> Tensor:
        """Every process's rows of ``x`` in rank order (padded to equal shapes to travel)."""
        if not self.info.distributed:
            return x
        most = -(-self.batch_size // self.info.world_size)
        padded = x.new_zeros((most, *x.shape[1:]))
        padded[: len(x)] = x
        parts = D.gather(padded, self.info).reshape(self.info.world_size, most, *x.shape[1:])
        return torch.cat([parts[r, :n] for r, n in enumerate(self._sizes)])
