"""Image-caption datasets from folders, and the synthetic world behind the same protocol.

Formats read:

* COCO captions: ``annotations/captions_<split>.json`` with ``images`` (``id``,
  ``file_name``) and ``annotations`` (``image_id``, ``caption``); images in
  ``<root>/<split>/`` unless another ``image_dir`` is given.
* Karpathy split: ``dataset_coco.json`` (also Flickr8k/30k) with ``images`` each holding
  ``split``, ``filename``, optional ``filepath`` and ``sentences[].raw``; image paths are
  ``image_root / filepath / filename``.
* CSV: rows ``path,caption`` (a header row ``path,caption`` is optional; quoted fields as in
  RFC 4180), paths relative to the CSV file's folder.

Every dataset is a list of (image, caption) pairs, several pairs may share an image (COCO
has five captions per image). Images with no caption are dropped. Pairs are ordered image by
image, so an image's captions are contiguous. Loaders check that every image file exists
(:class:`MissingFilesError` lists the first few that do not), that the annotation file
parses (:class:`MalformedDatasetError` says where it does not), and that something is left
(:class:`EmptyDatasetError`). Messages name files and fields, never quote their values. The
problems of a file's entries (a bad caption, a row of three fields, an entry lacking a field)
and its missing images are reported together, in one message that names the first few and
counts the others, so that a folder with several bad entries is refused once.

Confinement: given a ``root``, a loader reads only files inside it. The annotation file and
every image path must resolve (symlinks followed) inside ``root``; image paths written
absolute or with ``..`` are refused. A refused path is reported exactly like a missing one
("not found or not allowed"), so a message never tells whether a file outside exists, and
paths are shown relative to ``root``. This is how the app reads uploads and its data root.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from PIL import Image

from otviz.boundary.images import to_rgb
from otviz.boundary.paths import NOT_FOUND, confine, inside
from otviz.boundary.problems import listed
from otviz.boundary.text import MAX_CAPTION_CHARS, check_caption
from otviz.errors import InputError, UserInputError
from otviz.world import Sample, World, WorldConfig

_PATH_HEADERS = {"path", "image", "file", "filename", "filepath", "image_path"}
_CAPTION_HEADERS = {"caption", "text", "sentence"}
#: Where :func:`_find_annotation` looks for the files it names when it finds no annotation.
_ANNOTATION_LIKE = ("*.json", "*.csv", "*/*.json", "*/*.csv")
#: What the csv module says of a field over :func:`csv.field_size_limit`.
_FIELD_LIMIT = "field larger than field limit"


class DatasetError(UserInputError, ValueError):
    """A dataset cannot be read."""


class MissingFilesError(DatasetError, FileNotFoundError):
    """Image or annotation files are missing (or, when confined to a root, outside it);
    ``missing`` lists them all."""

    def __init__(self, what: str, missing: Sequence[Path | str], confined: bool = False) -> None:
        self.missing = [Path(p) for p in missing]
        shown = listed([str(p) for p in self.missing])
        state = NOT_FOUND if confined else "missing"
        super().__init__(f"{what}: {len(self.missing)} file(s) {state}: {shown}")


class MalformedDatasetError(DatasetError):
    """An annotation file does not parse or lacks required fields."""


class EmptyDatasetError(DatasetError):
    """A dataset (or the requested split) has no image-caption pair."""


@runtime_checkable
class ImageCaptionDataset(Protocol):
    """What training and evaluation need from a dataset of (image, caption) pairs.

    ``len(ds)`` is the number of pairs; ``n_images`` the number of distinct images;
    ``item(i)`` the pair ``i`` as (an image path / PIL image, caption); ``image_of(i)`` the
    image index of pair ``i``; ``groups()[j]`` the pair indices of image ``j`` (the ground
    truth of :func:`otviz.eval.retrieval.recall_at_k`); ``fingerprint()`` a JSON-able
    identity of the data that changes when the data changes (for caches)."""

    @property
    def n_images(self) -> int: ...

    def __len__(self) -> int: ...

    def item(self, i: int) -> tuple[Any, str]: ...

    def image_of(self, i: int) -> int: ...

    def groups(self) -> list[list[int]]: ...

    def fingerprint(self) -> dict[str, Any]: ...


@dataclass
class CaptionFolder:
    """Image files with captions (what the folder loaders return).

    Attributes:
        image_paths: one path per image.
        captions: one caption per pair.
        pair_image: image index of each pair (non-decreasing).
        source: where the pairs came from (annotation file, format, split).
    """

    image_paths: list[Path]
    captions: list[str]
    pair_image: list[int]
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.captions:
            raise EmptyDatasetError(
                f"no image-caption pairs in the {self.source.get('format', 'dataset')} file")
        if len(self.captions) != len(self.pair_image):
            raise ValueError("one image index per caption needed")

    @property
    def n_images(self) -> int:
        return len(self.image_paths)

    def __len__(self) -> int:
        return len(self.captions)

    def item(self, i: int) -> tuple[Path, str]:
        """Pair ``i`` as (image path, caption)."""
        return self.image_paths[self.pair_image[i]], self.captions[i]

    def image_of(self, i: int) -> int:
        return self.pair_image[i]

    def load_image(self, j: int) -> Image.Image:
        """Image ``j`` as an RGB PIL image (raises ``ImageInputError`` if unreadable)."""
        return to_rgb(self.image_paths[j], self.image_paths[j].name)

    def groups(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.image_paths]
        for i, j in enumerate(self.pair_image):
            out[j].append(i)
        return out

    def fingerprint(self) -> dict[str, Any]:
        """Source, captions and each image's path, size and modification time (hashed), so
        an edited, replaced or touched image file changes it."""
        h = hashlib.sha256()
        missing = []
        for p in self.image_paths:
            try:
                st = p.stat()
            except FileNotFoundError:
                missing.append(p)
                continue
            h.update(f"{p.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        if missing:
            raise MissingFilesError(f"images of {self.source.get('file', self.source)}", missing)
        captions = hashlib.sha256(json.dumps([self.captions, self.pair_image]).encode())
        return {
            "kind": "folder",
            "source": self.source,
            "images": h.hexdigest(),
            "captions": captions.hexdigest(),
        }


# --------------------------------------------------------------------- confinement
def _shown(path: Path, root: str | os.PathLike | None) -> str:
    """``path`` as messages show it: relative to ``root`` when confined."""
    if root is None:
        return str(path)
    try:
        return str(path.resolve().relative_to(Path(root).resolve()))
    except (OSError, RuntimeError, ValueError):
        return path.name


def _annotation(path: Path, root: str | os.PathLike | None) -> str:
    """The shown name of an annotation file that must exist (inside ``root`` if given)."""
    shown = _shown(path, root)
    if not path.is_file() or (root is not None and not inside(root, path)):
        raise MissingFilesError("annotation file", [shown], confined=root is not None)
    return shown


def _image(root: str | os.PathLike | None, base: Path, name: str) -> Path | None:
    """An annotation's image path: ``base / name``, confined to ``root`` if given."""
    return base / name if root is None else confine(root, base, name)


# --------------------------------------------------------------------- loaders
def load_coco_captions(
    annotation_file: str | os.PathLike,
    image_dir: str | os.PathLike | None = None,
    check_files: bool = True,
    root: str | os.PathLike | None = None,
) -> CaptionFolder:
    """A COCO captions file (``captions_<split>.json``), confined to ``root`` if given.

    ``image_dir`` defaults to ``<parent of the annotations folder>/<split>`` where the file
    is ``.../annotations/captions_<split>.json``."""
    path = Path(annotation_file)
    shown = _annotation(path, root)
    data = _read_json(path, shown)
    problems: list[str] = []
    if image_dir is None:
        image_dir = _coco_image_dir(path, shown)
    image_dir = Path(image_dir)
    images = _list_field(data, "images", shown)
    annotations = _list_field(data, "annotations", shown)
    order: dict[Any, int] = {}
    files: list[str] = []
    for k, im in enumerate(images):
        fields = _fields(im, ("id", "file_name"), f"images[{k}]", problems)
        if fields is not None:
            order[fields[0]] = len(files)
            files.append(str(fields[1]))
    by_image: dict[int, list[str]] = {}
    for k, ann in enumerate(annotations):
        where = f"annotations[{k}]"
        fields = _fields(ann, ("image_id", "caption"), where, problems)
        if fields is None:
            continue
        if fields[0] not in order:
            problems.append(f"{where}.image_id is not the id of any entry of images")
            continue
        caption = _caption(fields[1], where, problems)
        if caption is not None:
            by_image.setdefault(order[fields[0]], []).append(caption)
    kept = sorted(by_image)
    return _build(
        [(files[j], _image(root, image_dir, files[j])) for j in kept],
        [by_image[j] for j in kept],
        {"format": "coco", "file": str(path.resolve()), "image_dir": str(image_dir.resolve())},
        check_files,
        root,
        (shown, problems),
    )


def load_karpathy(
    json_file: str | os.PathLike,
    image_root: str | os.PathLike,
    split: str | Sequence[str] = "test",
    check_files: bool = True,
    root: str | os.PathLike | None = None,
) -> CaptionFolder:
    """A Karpathy split file (``dataset_coco.json``, ``dataset_flickr30k.json``), confined
    to ``root`` if given.

    ``split``: one split name or several (e.g. ``("train", "restval")``)."""
    path = Path(json_file)
    images_at = Path(image_root)
    splits = (split,) if isinstance(split, str) else tuple(split)
    shown = _annotation(path, root)
    data = _read_json(path, shown)
    images = _list_field(data, "images", shown)
    paths, captions = [], []
    problems: list[str] = []
    for k, im in enumerate(images):
        where = f"images[{k}]"
        fields = _fields(im, ("split", "filename", "sentences"), where, problems)
        if fields is None or fields[0] not in splits:
            continue
        _, name, sentences = fields
        if not isinstance(sentences, list):
            problems.append(f"{where}.sentences is not a list")
            continue
        raws = (_fields(s, ("raw",), f"{where}.sentences[{n}]", problems)
                for n, s in enumerate(sentences))
        texts = [t for t in (_caption(r[0], where, problems) for r in raws if r is not None)
                 if t is not None]
        if texts:
            relative = str(PurePosixPath(str(im.get("filepath", ""))) / str(name))
            paths.append((relative, _image(root, images_at, relative)))
            captions.append(texts)
    if not paths and not problems:
        raise EmptyDatasetError(f"{shown}: no captioned image in split(s) {list(splits)}")
    source = {
        "format": "karpathy",
        "file": str(path.resolve()),
        "image_root": str(images_at.resolve()),
        "split": list(splits),
    }
    return _build(paths, captions, source, check_files, root, (shown, problems))


def load_caption_csv(
    csv_file: str | os.PathLike,
    check_files: bool = True,
    root: str | os.PathLike | None = None,
) -> CaptionFolder:
    """A CSV of ``path,caption`` rows, confined to ``root`` if given; rows naming the same
    file share one image."""
    path = Path(csv_file)
    shown = _annotation(path, root)
    rows = _csv_rows(path, shown)
    if rows and _is_header(rows[0][1]):
        rows = rows[1:]
    index: dict[Path | str, int] = {}
    paths: list[tuple[str, Path | None]] = []
    captions: list[list[str]] = []
    problems: list[str] = []
    for n, row in rows:
        if len(row) != 2:
            problems.append(f"line {n}: expected 2 fields (path,caption), got {len(row)}")
            continue
        name = row[0].strip()
        caption = _caption(row[1], f"line {n}", problems)
        if not name:
            problems.append(f"line {n}: empty image path")
        if not name or caption is None:
            continue
        image = _image(root, path.parent, name)
        key = image.resolve() if image is not None else name
        if key not in index:
            index[key] = len(paths)
            paths.append((name, image))
            captions.append([])
        captions[index[key]].append(caption)
    source = {"format": "csv", "file": str(path.resolve())}
    return _build(paths, captions, source, check_files, root, (shown, problems))


def load_image_captions(
    path: str | os.PathLike,
    split: str | Sequence[str] = "test",
    image_root: str | os.PathLike | None = None,
    check_files: bool = True,
    root: str | os.PathLike | None = None,
) -> CaptionFolder:
    """Any of the formats, recognised from ``path``: a ``.csv`` file; a JSON file with
    ``annotations`` (COCO) or with ``sentences`` in its images (Karpathy; images under
    ``image_root``, default the JSON's folder); or a folder holding exactly one of
    ``annotations/captions_<split>.json``, ``dataset_*.json``, ``*.csv``. With ``root``
    every file read is confined to it (see the module's docstring)."""
    p = Path(path)
    if p.is_dir() and (root is None or inside(root, p)):
        p = _find_annotation(p, split, root)
    if p.suffix.lower() == ".csv":
        return load_caption_csv(p, check_files, root)
    data = _read_json(p, _annotation(p, root))
    if isinstance(data, dict) and "annotations" in data:
        return load_coco_captions(p, image_root, check_files, root)
    if isinstance(data, dict) and isinstance(data.get("images"), list):
        return load_karpathy(p, image_root or p.parent, split, check_files, root)
    raise MalformedDatasetError(
        f"{_shown(p, root)}: neither COCO captions nor a Karpathy split file")


# --------------------------------------------------------------------- the world
class WorldDataset:
    """Samples ``0..n-1`` of ``World(config, split, seed)`` as an
    :class:`ImageCaptionDataset` (one caption per image, rendered on the fly).

    ``sample(i)`` gives the full :class:`~otviz.world.Sample` (phrases with gold boxes,
    objects, hard negatives) for grounding and the probe."""

    def __init__(
        self, n: int, split: str = "test", seed: int = 0, config: WorldConfig | None = None
    ) -> None:
        if n < 1:
            raise EmptyDatasetError("a world dataset needs n >= 1")
        self.world = World(config, split=split, seed=seed)
        self.n = n

    @property
    def n_images(self) -> int:
        return self.n

    def __len__(self) -> int:
        return self.n

    def sample(self, i: int) -> Sample:
        if not 0 <= i < self.n:
            raise IndexError(f"sample {i} outside [0, {self.n})")
        return self.world.sample(i)

    def item(self, i: int) -> tuple[Image.Image, str]:
        s = self.sample(i)
        return Image.fromarray(s.image), s.caption

    def image_of(self, i: int) -> int:
        return i

    def groups(self) -> list[list[int]]:
        return [[i] for i in range(self.n)]

    def fingerprint(self) -> dict[str, Any]:
        """Config (without ``negatives``, which does not change images or captions), split,
        seed, n and a hash of the world's source code (a code change may change renders)."""
        config = dataclasses.asdict(self.world.config)
        config.pop("negatives")
        return {
            "kind": "world",
            "config": config,
            "split": self.world.split,
            "seed": self.world.seed,
            "n": self.n,
            "code": _world_code_hash(),
        }


# --------------------------------------------------------------------- helpers
def _build(
    images: list[tuple[str, Path | None]],
    captions: list[list[str]],
    source: dict[str, Any],
    check_files: bool,
    root: str | os.PathLike | None,
    problems: tuple[str, list[str]],
) -> CaptionFolder:
    """The folder of ``images`` (``(name as written, path or None where refused)``), or
    one error for all the problems of the annotation file's entries (``(its shown name,
    the problems)``) and its missing images together."""
    missing = [name for name, p in images if p is None or (check_files and not p.is_file())]
    missing_error = None
    if missing:
        what = "images" if root is not None else f"images of {source.get('file', source)}"
        missing_error = MissingFilesError(what, missing, confined=root is not None)
    shown, found = problems
    if found:
        text = (f"{shown}, {found[0]}" if len(found) == 1
                else f"{shown}: {len(found)} problems: {listed(found)}")
        also = f"; and {missing_error}" if missing_error is not None else ""
        raise MalformedDatasetError(text + also)
    if missing_error is not None:
        raise missing_error
    flat = [c for group in captions for c in group]
    pair_image = [j for j, group in enumerate(captions) for _ in group]
    return CaptionFolder([p for _, p in images if p is not None], flat, pair_image, source)


def _read_json(path: Path, shown: str) -> Any:
    """The JSON at ``path`` (checked to exist by :func:`_annotation`)."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise MalformedDatasetError(
            f"{shown}: not valid JSON (line {e.lineno}, column {e.colno})") from e
    except UnicodeDecodeError as e:
        raise MalformedDatasetError(f"{shown}: not UTF-8 text") from e


def _list_field(data: Any, key: str, shown: str) -> list[Any]:
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise MalformedDatasetError(f"{shown}: no list {key!r} at the top level")
    return data[key]


def _fields(entry: Any, keys: tuple[str, ...], where: str,
            problems: list[str]) -> tuple[Any, ...] | None:
    """``entry[k]`` for each of ``keys``, or None with the problem added to ``problems``."""
    if not isinstance(entry, dict):
        problems.append(f"{where} is not an object")
        return None
    missing = [k for k in keys if k not in entry]
    if missing:
        problems.append(f"{where} lacks {missing}")
        return None
    return tuple(entry[k] for k in keys)


def _caption(value: Any, where: str, problems: list[str]) -> str | None:
    """A caption of an annotation file, checked by the text boxes' rule
    (:func:`~otviz.boundary.text.check_caption`: not empty, at most
    :data:`~otviz.boundary.text.MAX_CAPTION_CHARS` characters, a letter or digit), or None
    with the problem added to ``problems``."""
    if not isinstance(value, str):
        problems.append(f"{where}: the caption is not text")
        return None
    try:
        return check_caption(value, f"{where}: the caption")
    except InputError as e:
        problems.append(str(e))
        return None


def _csv_rows(path: Path, shown: str) -> list[tuple[int, list[str]]]:
    """The non-empty rows of a UTF-8 CSV with their line numbers. A field over the csv
    module's limit (:func:`csv.field_size_limit`, far above any caption) is answered as the
    over-long caption it is, with its line."""
    rows: list[tuple[int, list[str]]] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, strict=True)
            for row in reader:
                if row:
                    rows.append((reader.line_num, row))
    except UnicodeDecodeError as e:
        raise MalformedDatasetError(f"{shown}: not a readable UTF-8 CSV ({type(e).__name__})"
                                    ) from e
    except csv.Error as e:
        if _FIELD_LIMIT in str(e):
            raise MalformedDatasetError(
                f"{shown}, line {reader.line_num}: the caption is over {MAX_CAPTION_CHARS} "
                f"characters (over {csv.field_size_limit()})") from None
        raise MalformedDatasetError(f"{shown}, line {reader.line_num}: not a readable CSV "
                                    f"row ({e})") from e
    return rows


def _is_header(row: list[str]) -> bool:
    cells = [c.strip().lower() for c in row]
    return len(cells) == 2 and cells[0] in _PATH_HEADERS and cells[1] in _CAPTION_HEADERS


def _coco_image_dir(annotation_file: Path, shown: str) -> Path:
    stem = annotation_file.stem
    if not stem.startswith("captions_"):
        raise DatasetError(f"cannot infer the image folder of {shown}; pass image_dir")
    root = annotation_file.parent
    if root.name == "annotations":
        root = root.parent
    return root / stem[len("captions_") :]


def _find_annotation(folder: Path, split: str | Sequence[str],
                     root: str | os.PathLike | None) -> Path:
    """The one annotation file of ``folder`` (see :func:`load_image_captions`); where there
    is none or several, a message that says which files are accepted and which were found
    (named relative to ``folder``, never by a server path)."""
    names = [split] if isinstance(split, str) else list(split)
    coco = [f"annotations/captions_{s}.json" for s in names]
    found = [folder / c for c in coco if (folder / c).is_file()]
    found += sorted(folder.glob("dataset_*.json")) + sorted(folder.glob("*.csv"))
    if len(found) == 1:
        return found[0]
    shown = _shown(folder, root)
    where = "" if shown == "." else f"{shown}: "  # the folder given itself: no name needed
    if found:
        several = [p.relative_to(folder).as_posix() for p in found]
        raise DatasetError(f"{where}{len(found)} caption annotation files found "
                           f"({listed(several)}); pass the file itself")
    others = sorted({p.relative_to(folder).as_posix() for pattern in _ANNOTATION_LIKE
                     for p in folder.glob(pattern) if p.is_file()})
    instead = (f"found instead {len(others)} other .json/.csv file(s): {listed(others)}"
               if others else "found no .json or .csv file")
    raise DatasetError(
        f"{where}no caption annotation file found; accepted: a *.csv of path,caption rows, "
        f"{' or '.join(coco)} (COCO captions of split {', '.join(names)}), or a "
        f"dataset_*.json (Karpathy split); {instead}")


@functools.cache
def _world_code_hash() -> str:
    import otviz.world

    h = hashlib.sha256()
    for f in sorted(Path(otviz.world.__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
