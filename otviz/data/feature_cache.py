"""Frozen-backbone features computed once and kept on disk, memory-mapped.

Training the method heads (projections, mass heads, anchors) on a frozen backbone needs the
same patch and token features every epoch; :class:`FeatureCache` computes them in one pass
and later epochs read them back from ``.npy`` files opened with ``numpy.load(mmap_mode="r")``,
so a batch costs a gather from the page cache and the heads, not a backbone forward.

Layout of one cache entry (a directory named by its key):

* ``patches.npy`` ``[n_images, N, Dv]`` and ``tokens.npy`` ``[n_texts, L, Dt]`` in the
  storage dtype (float16 by default: round-to-nearest keeps every element within a relative
  ``2**-11`` of the float32 feature, tested, and halves the disk and page-cache footprint;
  ``dtype="float32"`` stores them exactly);
* ``token_mask.npy`` (bool), ``token_word.npy`` and ``token_ids.npy`` (int32) ``[n_texts,
  L]``, ``image_global.npy`` ``[n_images, E]``, ``text_global.npy`` ``[n_texts, E]``
  (float32), ``pair_image.npy`` ``[n_texts]`` (int64);
* ``meta.json``: key, fingerprints, shapes, captions; written last.

Images are stored once however many captions they have (COCO: five), pairs point to them.

The key hashes the backbone (a hash of its weights, name, feature space, context length,
patch grid, preprocessing) and the data (:meth:`ImageCaptionDataset.fingerprint`: the world's
config, split, seed and n, or a folder's files with sizes and modification times, and the
captions), plus the storage dtype and any caller ``key_info``. A change to any of them gives
another key, so stale features are never read.

An entry is built in a hidden temporary directory next to it and renamed into place only
when complete (``os.rename`` of a directory is atomic on POSIX), so a crash or an exception
mid-way never leaves a readable half-written entry; an entry that fails validation (missing
``meta.json``, a key mismatch, an array of the wrong shape or a truncated file) is discarded
and rebuilt.

Housekeeping: a build records its process id in its temporary directory, so that
:meth:`FeatureCache.remove_stale_builds` can delete the leftovers of a process that died
mid-build (a server stopped while encoding) and leave builds in progress alone; every read
of an entry marks it used (its ``meta.json``'s modification time), and
:meth:`FeatureCache.evict` deletes the least recently used entries beyond a size cap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.lib.format import open_memmap
from torch import Tensor

from otviz.backbone import Backbone
from otviz.checkpoints.identity import backbone_fingerprint
from otviz.data.datasets import ImageCaptionDataset
from otviz.data.disk_lru import (
    discard,
    disk_bytes,
    evict_least_recent,
    owner_alive,
    write_owner,
)
from otviz.errors import OtvizError
from otviz.methods.base import PairBatch

FORMAT = "otviz-feature-cache/1"
META_FILE = "meta.json"
BUILDING_SUFFIX = ".building"
STORAGE_DTYPES = ("float16", "float32")
_FLOAT16_MAX = float(np.finfo(np.float16).max)
Progress = Callable[[int, int], None]


class FeatureCacheError(OtvizError, RuntimeError):
    """Features cannot be cached (non-finite features, float16 overflow, bad arguments)."""


@dataclass
class CachedFeatures:
    """Memory-mapped features of a dataset (see the module docstring for the arrays).

    Index pairs (captions) with ``0..n_pairs-1`` and images with ``0..n_images-1``;
    ``pair_image[i]`` is the image of pair ``i``.
    """

    directory: Path
    meta: dict[str, Any]
    patches: np.ndarray
    tokens: np.ndarray
    token_mask: np.ndarray
    token_word: np.ndarray
    token_ids: np.ndarray
    image_global: np.ndarray
    text_global: np.ndarray
    pair_image: np.ndarray

    @property
    def n_pairs(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_images(self) -> int:
        return self.patches.shape[0]

    @property
    def grid(self) -> tuple[int, int]:
        h, w = self.meta["grid"]
        return int(h), int(w)

    @property
    def captions(self) -> list[str]:
        return self.meta["captions"]

    def groups(self) -> list[list[int]]:
        """``groups()[j]``: the pairs of image ``j`` (retrieval ground truth)."""
        out: list[list[int]] = [[] for _ in range(self.n_images)]
        for i, j in enumerate(self.pair_image.tolist()):
            out[j].append(i)
        return out

    def pairs(
        self, image_idx: Tensor | Sequence[int], text_idx: Tensor | Sequence[int],
        device: torch.device | str | None = None,
    ) -> PairBatch:
        """A :class:`PairBatch` of the pairs ``(image_idx[p], text_idx[p])``, which need not
        match (negatives, retrieval candidates); features as float32. Each distinct image and
        caption is read once; when pairs repeat them the batch carries
        :class:`~otviz.methods.base.PairSides` (:meth:`PairBatch.index`)."""
        img = _indices(image_idx, self.n_images)
        txt = _indices(text_idx, self.n_pairs)
        if img.shape != txt.shape:
            raise ValueError(f"{img.size} image indices but {txt.size} text indices")
        images, image_of = np.unique(img, return_inverse=True)
        texts, text_of = np.unique(txt, return_inverse=True)
        patches = _gather(self.patches, images, device)
        pool = PairBatch(
            patches=patches,
            tokens=_gather(self.tokens, texts, device),
            patch_mask=torch.ones(patches.shape[:2], dtype=torch.bool, device=patches.device),
            token_mask=_gather(self.token_mask, texts, device, float_=False),
            image_global=_gather(self.image_global, images, device),
            text_global=_gather(self.text_global, texts, device),
            grid=self.grid,
        )
        return pool.index(
            torch.from_numpy(image_of.reshape(-1)).to(patches.device),
            torch.from_numpy(text_of.reshape(-1)).to(patches.device),
        )

    def pair_batch(
        self, indices: Tensor | Sequence[int], device: torch.device | str | None = None
    ) -> PairBatch:
        """The matching pairs ``indices`` (each caption with its own image)."""
        txt = _indices(indices, self.n_pairs)
        return self.pairs(self.pair_image[txt], txt, device)

    def token_words(self, indices: Tensor | Sequence[int]) -> Tensor:
        """``[B, L]`` long: caption word of each token position of pairs ``indices``."""
        return torch.from_numpy(self.token_word[_indices(indices, self.n_pairs)].astype(np.int64))

    def global_embeddings(self) -> tuple[Tensor, Tensor]:
        """``(image_global [n_images, E], text_global [n_pairs, E])`` (for global scores)."""
        return torch.from_numpy(np.array(self.image_global)), torch.from_numpy(
            np.array(self.text_global)
        )


class FeatureCache:
    """A directory of cache entries, one per (backbone, data, dtype, key_info).

    Args:
        root: the cache directory (created when needed).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def key(
        self,
        backbone: Backbone,
        dataset: ImageCaptionDataset,
        key_info: dict[str, Any] | None = None,
        dtype: str = "float16",
    ) -> tuple[str, dict[str, Any]]:
        """The entry key (hex) and the JSON record it hashes."""
        record = {
            "format": FORMAT,
            "backbone": backbone_fingerprint(backbone),
            "data": dataset.fingerprint(),
            "dtype": dtype,
            "extra": key_info or {},
        }
        text = json.dumps(record, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest(), json.loads(text)

    def get_or_build(
        self,
        backbone: Backbone,
        dataset: ImageCaptionDataset,
        key_info: dict[str, Any] | None = None,
        batch_size: int = 64,
        progress: Progress | None = None,
        dtype: str = "float16",
    ) -> CachedFeatures:
        """The cached features of ``dataset`` under ``backbone``; computed (once) if no valid
        entry exists.

        Args:
            backbone: the frozen backbone.
            dataset: any :class:`~otviz.data.datasets.ImageCaptionDataset`.
            key_info: extra JSON-able identity (e.g. a preprocessing variant).
            batch_size: pairs per backbone forward while building.
            progress: ``progress(done_pairs, total_pairs)`` while building.
            dtype: storage of patches and tokens, ``"float16"`` or ``"float32"``.
        """
        if dtype not in STORAGE_DTYPES:
            raise FeatureCacheError(f"dtype must be one of {STORAGE_DTYPES}, got {dtype!r}")
        if batch_size < 1:
            raise FeatureCacheError("batch_size must be positive")
        key, record = self.key(backbone, dataset, key_info, dtype)
        final = self.root / key[:24]
        cached = _open_entry(final, key)
        if cached is not None:
            _mark_used(final)
            return cached
        if final.exists():  # invalid (half-written by something else, truncated, foreign)
            discard(final)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:24]}.", suffix=BUILDING_SUFFIX,
                                    dir=self.root))
        try:
            write_owner(tmp)
            captions = _build(tmp, backbone, dataset, batch_size, progress, dtype)
            _write_meta(tmp, key, record, backbone, captions)
            try:
                os.rename(tmp, final)
            except OSError:  # another process finished the same entry first
                if _open_entry(final, key) is None:
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        cached = _open_entry(final, key)
        if cached is None:
            raise FeatureCacheError(f"cache entry {final} did not validate after building")
        return cached

    def entries(self) -> list[Path]:
        """The complete entries, least recently used first."""
        if not self.root.is_dir():
            return []
        found = [d for d in self.root.iterdir()
                 if not d.name.startswith(".") and (d / META_FILE).is_file()]
        return sorted(found, key=lambda d: (d / META_FILE).stat().st_mtime_ns)

    def evict(self, max_bytes: int) -> list[Path]:
        """Delete the least recently used entries until the complete ones take at most
        ``max_bytes`` on disk (the most recently used entry always stays); returns the
        deleted entries."""
        entries = self.entries()
        return evict_least_recent(entries, [disk_bytes(d) for d in entries], max_bytes)

    def remove_stale_builds(self) -> list[Path]:
        """Delete the temporary directories of builds whose process is gone (and of
        discards that a crash interrupted); returns them."""
        if not self.root.is_dir():
            return []
        stale = [d for d in self.root.glob(f".*{BUILDING_SUFFIX}") if not owner_alive(d)]
        stale += list(self.root.glob(".discard.*"))
        for d in stale:
            shutil.rmtree(d, ignore_errors=True)
        return stale


# --------------------------------------------------------------------- building
_ARRAYS = (
    "patches", "tokens", "token_mask", "token_word", "token_ids",
    "image_global", "text_global", "pair_image",
)


@torch.inference_mode()
def _build(
    directory: Path,
    backbone: Backbone,
    dataset: ImageCaptionDataset,
    batch_size: int,
    progress: Progress | None,
    dtype: str,
) -> list[str]:
    """Encode ``dataset`` into ``.npy`` memmaps in ``directory``; returns the captions."""
    n_pairs, n_images = len(dataset), dataset.n_images
    if n_pairs < 1:
        raise FeatureCacheError("empty dataset")
    pair_image = np.array([dataset.image_of(i) for i in range(n_pairs)], dtype=np.int64)
    first_pair = np.full(n_images, -1, dtype=np.int64)
    for i in range(n_pairs - 1, -1, -1):
        first_pair[pair_image[i]] = i
    if (first_pair < 0).any():
        raise FeatureCacheError(f"images {np.flatnonzero(first_pair < 0)[:5]} have no caption")
    h, w = backbone.grid
    L, E = backbone.context_length, backbone.embed_dim
    shapes = {
        "patches": ((n_images, h * w, backbone.patch_dim), dtype),
        "tokens": ((n_pairs, L, backbone.token_dim), dtype),
        "token_mask": ((n_pairs, L), "bool"),
        "token_word": ((n_pairs, L), "int32"),
        "token_ids": ((n_pairs, L), "int32"),
        "image_global": ((n_images, E), "float32"),
        "text_global": ((n_pairs, E), "float32"),
    }
    out = {
        name: open_memmap(directory / f"{name}.npy", mode="w+", dtype=dt, shape=shape)
        for name, (shape, dt) in shapes.items()
    }
    np.save(directory / "pair_image.npy", pair_image)
    captions: list[str] = []
    for s in range(0, n_pairs, batch_size):
        idx = np.arange(s, min(s + batch_size, n_pairs))
        items = [dataset.item(int(i)) for i in idx]
        new = [k for k, i in enumerate(idx) if first_pair[pair_image[i]] == i]
        # the image tower needs at least one image: re-encode this chunk's first if none new
        pixels = backbone.image_tensor([items[k][0] for k in (new or [0])])
        captions += [caption for _, caption in items]
        text = backbone.words(captions[s:])
        patches, tokens, img_g, txt_g = backbone.forward_tensors(pixels, text.ids)
        if new:
            rows = pair_image[idx[new]]
            out["patches"][rows] = _storable(patches, dtype, "patch")
            out["image_global"][rows] = _storable(img_g, "float32", "image global")
        out["tokens"][idx] = _storable(tokens, dtype, "token")
        out["text_global"][idx] = _storable(txt_g, "float32", "text global")
        out["token_mask"][idx] = text.mask.numpy()
        out["token_word"][idx] = text.token_word.numpy()
        out["token_ids"][idx] = text.ids.numpy()
        if progress is not None:
            progress(int(idx[-1]) + 1, n_pairs)
    for array in out.values():
        array.flush()
    del out
    return captions


def _storable(x: Tensor, dtype: str, what: str) -> np.ndarray:
    a = x.detach().float().cpu().numpy()
    if not np.isfinite(a).all():
        raise FeatureCacheError(f"the backbone produced non-finite {what} features")
    if dtype == "float16" and np.abs(a).max(initial=0.0) > _FLOAT16_MAX:
        raise FeatureCacheError(
            f"{what} features exceed the float16 range ({np.abs(a).max():.3g}); "
            "use dtype='float32'"
        )
    return a.astype(dtype)


def _write_meta(
    directory: Path, key: str, record: dict[str, Any], backbone: Backbone, captions: list[str]
) -> None:
    shapes = {}
    for name in _ARRAYS:
        a = np.load(directory / f"{name}.npy", mmap_mode="r")
        shapes[name] = {"shape": list(a.shape), "dtype": str(a.dtype)}
    meta = {
        "format": FORMAT,
        "key": key,
        "record": record,
        "arrays": shapes,
        "grid": list(backbone.grid),
        "space": backbone.space,
        "captions": captions,
    }
    (directory / META_FILE).write_text(json.dumps(meta), encoding="utf-8")


# --------------------------------------------------------------------- reading
def _open_entry(directory: Path, key: str) -> CachedFeatures | None:
    """The entry at ``directory`` if it is complete and belongs to ``key``, else None."""
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT or meta.get("key") != key:
            return None
        arrays = {}
        for name in _ARRAYS:
            a = np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            want = meta["arrays"][name]
            if list(a.shape) != want["shape"] or str(a.dtype) != want["dtype"]:
                return None
            arrays[name] = a
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(meta.get("captions", [])) != arrays["tokens"].shape[0]:
        return None
    return CachedFeatures(directory=directory, meta=meta, **arrays)


def _mark_used(directory: Path) -> None:
    try:
        os.utime(directory / META_FILE)
    except OSError:  # a read-only cache still serves its entries
        pass


def _indices(idx: Tensor | Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    a = idx.detach().cpu().numpy() if isinstance(idx, Tensor) else np.asarray(idx)
    a = a.astype(np.int64).reshape(-1)
    if a.size and (a.min() < 0 or a.max() >= n):
        raise IndexError(f"indices outside [0, {n})")
    return a


def _gather(
    array: np.ndarray, idx: np.ndarray, device: torch.device | str | None, float_: bool = True
) -> Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array[idx]))
    if float_:
        t = t.float()
    return t if device is None else t.to(device)
