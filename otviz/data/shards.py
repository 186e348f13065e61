"""Webdataset shards as img2dataset writes them, read as hostile input.

A shard is a plain (uncompressed) POSIX tar whose members come in samples: consecutive
members sharing a key (the member path up to the first dot of its file name, webdataset's
``base_plus_ext`` rule), here ``KEY.jpg|jpeg|png|webp`` (the image) and ``KEY.txt`` (the
caption); other members of a sample (img2dataset's ``KEY.json``) are passed over.

``--data`` names shards three ways (:func:`shard_paths`): one ``.tar`` file, a folder (its
``*.tar`` files, listed here and sorted by name: ``webdataset.WebDataset`` given a folder
waits on it instead), or a brace pattern ``shards/{000000..000099}.tar`` (zero padding kept).

:func:`index_shards` reads every tar header once (seeking past the data, reading only each
caption and the first bytes of each image, whose header :func:`otviz.boundary.images.header_size`
checks against the pixel limit), and returns a :class:`ShardIndex`: per pair its shard, the
image member's offset and size, its name and its caption. Nothing is extracted: a member is a
byte range of its shard, read into memory under a size cap (:func:`read_member`), so a member
path never reaches the file system and a link is never followed. What cannot be used is
counted by reason and named (:class:`Skips`, one summary line), never raised mid-run:

* a member path absolute or with ``..``, a link or device member, a member over its cap;
* an image without caption, a caption without image, a second image or caption of a key;
* a caption that is not UTF-8 or fails :func:`otviz.boundary.text.check_caption`, an image
  whose header fails (over the pixel limit, not an image: a decompression bomb is refused
  from its header, before any pixel is decoded);
* a shard that is missing, not a tar, or truncated (the members before the damage are kept);
* a garbage header mid-shard: Python's ``tarfile`` stops there as at the end of the archive,
  losing the rest silently; here the bytes after the offset where iteration stopped must be
  the end-of-archive zeros, else the shard is counted with the offset and the bytes unread.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import numpy as np
from torch import Generator, randperm

from otviz.boundary.images import UNREADABLE_IMAGE, ImageInputError, header_size
from otviz.boundary.text import MAX_CAPTION_CHARS, check_caption
from otviz.data.datasets import DatasetError, EmptyDatasetError
from otviz.errors import InputError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
CAPTION_EXTENSION = "txt"
#: The largest image member read (a 50 MP JPEG is far below it).
MAX_IMAGE_BYTES = 64 * 2**20
#: The largest caption member read: the longest caption, four UTF-8 bytes a character.
MAX_CAPTION_BYTES = 4 * MAX_CAPTION_CHARS
#: Bytes of an image read at indexing to check its header (the whole member if that fails).
HEADER_BYTES = 64 * 2**10
#: The most shards a brace pattern may name.
MAX_SHARDS = 1_000_000
#: Names shown per reason in the summary line (the others are counted), and their length.
SHOWN = 3
SHOWN_CHARS = 200
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_SCAN = 2**20

# the reasons a sample or a shard is skipped, as the summary line names them
UNSAFE = "unsafe member path"
LINK = "link or special member"
TOO_LARGE = "member over its size cap"
NO_CAPTION = "image without caption"
NO_IMAGE = "caption without image"
DUPLICATE = "second image or caption of a key"
BAD_CAPTION = "unusable caption"
BAD_IMAGE = "image refused"
MISSING = "missing shard"
UNREADABLE = "unreadable or truncated shard"
GARBAGE = "garbage header mid-shard"


class ShardError(DatasetError):
    """Shards cannot be listed (a pattern or folder naming no shard)."""


@dataclass
class Skips:
    """What was skipped, by reason: a count and the first :data:`SHOWN` names of each."""

    counts: dict[str, int] = field(default_factory=dict)
    names: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        """Count one skip; ``where`` is shown with every unprintable character (a newline in
        a member's name) as ``?`` and cut at :data:`SHOWN_CHARS`, so the summary stays one
        line."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.names.setdefault(reason, [])
        if len(shown) < SHOWN:
            shown.append("".join(c if c.isprintable() else "?" for c in where[:SHOWN_CHARS]))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self, n_shards: int, n_pairs: int) -> str:
        """One line: shards and pairs read, then each reason's count and first names."""
        head = f"shards: {n_shards} listed, {n_pairs} pairs"
        if not self.counts:
            return head + ", nothing skipped"
        parts = []
        for reason, count in sorted(self.counts.items()):
            more = count - len(self.names[reason])
            tail = f" and {more} more" if more > 0 else ""
            parts.append(f"{count} {reason} ({', '.join(self.names[reason])}{tail})")
        return f"{head}; skipped {self.total}: " + "; ".join(parts)


@dataclass
class ShardIndex:
    """The usable pairs of a list of shards, in shard order then file order.

    Attributes:
        shards: the shard files.
        shard: ``[n]`` int32, the shard of each pair; offset, size: ``[n]`` int64, the byte
            range of its image member.
        names: the image member's name of each pair; captions: its caption.
        skips: what was skipped while indexing (and later, while decoding).
    """

    shards: list[Path]
    shard: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    names: list[str]
    captions: list[str]
    skips: Skips

    def __len__(self) -> int:
        return len(self.captions)

    def where(self, i: int) -> str:
        """Pair ``i``'s image as ``shard.tar:member``."""
        return f"{self.shards[int(self.shard[i])].name}:{self.names[i]}"

    def image_bytes(self, i: int) -> bytes:
        """The encoded image of pair ``i`` (see :func:`read_member`)."""
        return read_member(self.shards[int(self.shard[i])], int(self.offset[i]), int(self.size[i]))

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The pairs of ``epoch``: the shards in an order drawn from ``(seed, epoch)``, each
        shard's pairs in file order (so each reader walks its shards forward)."""
        gen = Generator().manual_seed(seed * 1_000_003 + epoch)
        shards = randperm(len(self.shards), generator=gen).numpy()
        starts = np.searchsorted(self.shard, np.arange(len(self.shards) + 1))
        return np.concatenate([np.arange(starts[s], starts[s + 1]) for s in shards])

    def summary(self) -> str:
        return self.skips.summary(len(self.shards), len(self))


def is_shard_spec(data: str) -> bool:
    """True when ``--data`` names shards: a ``.tar`` file, a brace pattern, or a folder
    holding ``*.tar`` files."""
    if data.endswith(".tar") or _BRACE.search(data):
        return True
    path = Path(data)
    return path.is_dir() and any(path.glob("*.tar"))


def shard_paths(spec: str) -> list[Path]:
    """The shard files of ``spec`` (see the module docstring); files of a pattern that do
    not exist are listed too (:func:`index_shards` counts them as missing)."""
    match = _BRACE.search(spec)
    if match is not None:
        first, last = match.group(1), match.group(2)
        if int(last) < int(first):
            raise ShardError(f"shard pattern {{{first}..{last}}} counts down")
        if int(last) - int(first) >= MAX_SHARDS:
            raise ShardError(f"shard pattern {{{first}..{last}}} names over {MAX_SHARDS} shards")
        width = len(first) if first.startswith("0") else 0
        shards = [Path(spec[: match.start()] + str(k).zfill(width) + spec[match.end():])
                  for k in range(int(first), int(last) + 1)]
        if any(_BRACE.search(str(p)) for p in shards):
            raise ShardError("a shard pattern may hold one {A..B} range")
        return shards
    path = Path(spec)
    if path.is_dir():
        shards = sorted(p for p in path.glob("*.tar") if p.is_file())
        if not shards:
            raise ShardError(f"{path.name}: no .tar shard in the folder")
        return shards
    return [path]


def index_shards(spec: str, progress: Callable[[int, int], None] | None = None) -> ShardIndex:
    """Index every shard of ``spec`` (module docstring); ``progress(shards done, shards)``.
    :class:`~otviz.data.datasets.EmptyDatasetError` (with the summary) when no pair is left."""
    shards = shard_paths(spec)
    skips = Skips()
    columns: tuple[list[int], list[int], list[int], list[str], list[str]] = ([], [], [], [], [])
    for k, path in enumerate(shards):
        for offset, size, name, caption in _samples(path, skips):
            for column, value in zip(columns, (k, offset, size, name, caption), strict=True):
                column.append(value)  # type: ignore[attr-defined]
        if progress is not None:
            progress(k + 1, len(shards))
    index = ShardIndex(shards, np.array(columns[0], dtype=np.int32),
                       np.array(columns[1], dtype=np.int64), np.array(columns[2], dtype=np.int64),
                       columns[3], columns[4], skips)
    if not len(index):
        raise EmptyDatasetError(f"no usable image-caption pair: {index.summary()}")
    return index


def read_member(path: Path, offset: int, size: int) -> bytes:
    """``size`` bytes of ``path`` at ``offset`` (at most :data:`MAX_IMAGE_BYTES`);
    :class:`InputError` when the file ends before them (truncated since indexing)."""
    if size > MAX_IMAGE_BYTES:
        raise InputError(f"{path.name}: member over {MAX_IMAGE_BYTES} bytes")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise InputError(f"{path.name}: ends inside a member")
    return data


# --------------------------------------------------------------------- one shard
@dataclass
class _Sample:
    """The members of one key seen so far."""

    key: str
    image: tuple[int, int, str] | None = None  # offset, size, member name
    caption: str | None = None
    problem: tuple[str, str] | None = None  # reason, where
    had_caption: bool = False


def _samples(path: Path, skips: Skips) -> Iterator[tuple[int, int, str, str]]:
    """``(image offset, image size, image name, caption)`` of the usable samples of one
    shard, every problem counted in ``skips``. A shard that breaks off (truncated, not a
    tar) is counted once; the sample it broke off in goes with it."""
    try:
        f = open(path, "rb")
    except OSError:
        skips.add(MISSING, path.name)
        return
    with f:
        current: _Sample | None = None
        try:
            for member in _members(path, f, skips):
                name = member.name
                if _unsafe(name):
                    skips.add(UNSAFE, f"{path.name}:{name}")
                    continue
                if member.isdir():
                    continue
                if not member.isfile():
                    skips.add(LINK, f"{path.name}:{name}")
                    continue
                key, ext = _split_key(name)
                if current is None or key != current.key:
                    if current is not None:
                        yield from _finished(current, path, skips)
                    current = _Sample(key)
                _add_member(current, member, ext.lower(), path, f, skips)
        except _BrokenShard:
            return
        if current is not None:
            yield from _finished(current, path, skips)


class _BrokenShard(Exception):
    """A shard broke off mid-way (already counted)."""


def _unsafe(name: str) -> bool:
    """A member path that would leave the data if it were ever extracted: absolute (POSIX
    or a Windows drive) or with a ``..`` component."""
    return (name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) is not None
            or ".." in PurePosixPath(name.replace("\\", "/")).parts)


def _members(path: Path, f: BinaryIO, skips: Skips) -> Iterator[tarfile.TarInfo]:
    """The tar members of ``f``, then a check that iteration stopped at the archive's end;
    :class:`_BrokenShard` when the shard breaks off."""
    try:
        tar = tarfile.TarFile(fileobj=f, mode="r")
        while (member := tar.next()) is not None:
            tar.members.clear()  # nothing is looked up by name: keep memory flat
            yield member
    except (tarfile.TarError, OSError, EOFError, UnicodeError):
        skips.add(UNREADABLE, path.name)
        raise _BrokenShard from None
    stopped = tar.offset
    unread = _nonzero_tail(f, stopped)
    if unread:
        skips.add(GARBAGE, f"{path.name} at byte {stopped}, {unread} bytes unread")


def _nonzero_tail(f: BinaryIO, start: int) -> int:
    """The bytes from ``start`` to the end of ``f`` when any is not zero, else 0 (an
    archive ends in zero blocks)."""
    end = f.seek(0, 2)
    f.seek(start)
    while chunk := f.read(_SCAN):
        if chunk.count(0) != len(chunk):
            return end - start
    return 0


def _split_key(name: str) -> tuple[str, str]:
    """``(key, extension)``: the key is the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def _add_member(sample: _Sample, member: tarfile.TarInfo, ext: str, path: Path, f: BinaryIO,
                skips: Skips) -> None:
    where = f"{path.name}:{member.name}"
    if ext in IMAGE_EXTENSIONS:
        if sample.image is not None:
            skips.add(DUPLICATE, where)
        elif member.size > MAX_IMAGE_BYTES:
            skips.add(TOO_LARGE, where)
            sample.problem = (TOO_LARGE, where)
        elif (problem := _image_problem(f, member)) is not None:
            sample.problem = (BAD_IMAGE, f"{where}: {problem}")
        else:
            sample.image = (member.offset_data, member.size, member.name)
    elif ext == CAPTION_EXTENSION:
        if sample.had_caption:
            skips.add(DUPLICATE, where)
            return
        sample.had_caption = True
        if member.size > MAX_CAPTION_BYTES:
            skips.add(TOO_LARGE, where)
            sample.problem = sample.problem or (TOO_LARGE, where)
            return
        f.seek(member.offset_data)
        raw = f.read(member.size)
        try:
            sample.caption = check_caption(raw.decode("utf-8").strip(), "the caption")
        except (UnicodeDecodeError, InputError) as e:
            reason = "not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
            sample.problem = sample.problem or (BAD_CAPTION, f"{where}: {reason}")


def _image_problem(f: BinaryIO, member: tarfile.TarInfo) -> str | None:
    """Why an image member's header is refused (:func:`header_size`), or None: its first
    :data:`HEADER_BYTES` are tried, then the whole member."""
    problem = None
    for size in (min(member.size, HEADER_BYTES), member.size):
        f.seek(member.offset_data)
        try:
            header_size(f.read(size), "it")
            return None
        except ImageInputError as e:
            problem = str(e).removeprefix("it ")
            if size == member.size or UNREADABLE_IMAGE not in problem:
                break
    return problem


def _finished(sample: _Sample, path: Path, skips: Skips) -> Iterator[tuple[int, int, str, str]]:
    """The sample's pair, or its problem counted."""
    if sample.problem is not None:
        if sample.problem[0] != TOO_LARGE:  # counted where it was seen
            skips.add(*sample.problem)
        return
    if sample.image is not None and sample.caption is not None:
        yield (*sample.image, sample.caption)
    elif sample.image is not None:
        skips.add(NO_CAPTION, f"{path.name}:{sample.image[2]}")
    elif sample.had_caption:
        skips.add(NO_IMAGE, f"{path.name}:{sample.key}.{CAPTION_EXTENSION}")
