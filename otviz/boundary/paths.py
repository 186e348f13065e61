"""Paths people name (rows of an uploaded captions file, members of an uploaded zip, a
folder typed under the server's data root) confined to the folder they may read, and
uploads unpacked within a size cap.

:func:`confine` is the one confinement function: a path written absolute, with ``..``, or
that resolves (symlinks followed) outside its root is refused, and callers report a refused
path exactly like a missing one (:data:`NOT_FOUND`), so an answer never tells whether a
file outside exists. Messages show paths as the person wrote them or relative to the upload;
:func:`scrub_server_paths` is the last guard that no server folder reaches a page.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import unicodedata
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath

from otviz.errors import InputError

#: How a refused path and a missing one are both answered.
NOT_FOUND = "not found or not allowed"
#: Uploaded (or unzipped) bytes at most.
MAX_UPLOAD_BYTES = 500 * 2**20
_CHUNK = 2**20


def inside(root: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether ``path`` resolves (symlinks followed) to ``root`` or below it."""
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL in the name
        return False


def confine(root: str | os.PathLike, base: Path, name: str) -> Path | None:
    """``base / name`` when ``name`` is relative, has no ``..`` and resolves inside ``root``
    (symlinks followed); ``None`` otherwise (the caller answers :data:`NOT_FOUND`). A name
    that is not there is looked up in its other Unicode normal form (``café`` composed or
    decomposed), as a file saved on another system is named."""
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if not name or "\0" in name:
        return None
    if posix.is_absolute() or windows.is_absolute() or windows.drive:
        return None
    if ".." in posix.parts or ".." in windows.parts:
        return None
    path = base / posix
    if not path.exists():  # saved under the other Unicode normal form (macOS writes NFD)
        path = next((base / form for form in _normal_forms(name) if (base / form).exists()),
                    path)
    return path if inside(root, path) else None


def _normal_forms(name: str) -> list[str]:
    """``name`` composed (NFC) and decomposed (NFD), where these differ from it."""
    return [form for form in (unicodedata.normalize(f, name) for f in ("NFC", "NFD"))
            if form != name]


def unpack_uploads(files: Sequence[str | os.PathLike], target: Path) -> Path:
    """Uploaded files into one folder ``target``: a single ``.zip`` is extracted (its one
    top folder, if it has just one, becomes the root), otherwise the files are copied flat
    by name. Refuses members that :func:`confine` refuses and more than
    :data:`MAX_UPLOAD_BYTES`, counted while unpacking (a zip's headers may lie)."""
    paths = [Path(f if isinstance(f, (str, os.PathLike)) else f.name) for f in files or []]
    if not paths:
        raise InputError("no files uploaded: upload a .zip of the folder, or the images and "
                         "their captions file")
    target.mkdir(parents=True, exist_ok=True)
    if len(paths) == 1 and paths[0].suffix.lower() == ".zip":
        return _unzip(paths[0], target)
    if sum(p.stat().st_size for p in paths) > MAX_UPLOAD_BYTES:
        raise InputError(f"the upload is over {MAX_UPLOAD_BYTES // 2**20} MB")
    for f, p in zip(files, paths, strict=True):
        shutil.copyfile(p, target / upload_name(f))
    return target


def upload_name(file: str | os.PathLike) -> str:
    """The name an uploaded ``file`` is copied under: the name it had on the visitor's
    machine (its ``orig_name``, set by the app's file inputs) when that is a plain file
    name, else its name on the server. Gradio's upload cache strips characters such as
    ``<>:"|?*$!{}`` from the names it stores, so a captions file naming ``<b>cat<b>.png``
    would otherwise not find it, while a .zip's members keep their names."""
    server = Path(file if isinstance(file, (str, os.PathLike)) else file.name).name
    original = getattr(file, "orig_name", None)
    if not isinstance(original, str) or original in ("", ".", ".."):
        return server
    plain = original == PurePosixPath(original).name == PureWindowsPath(original).name
    if plain and original.isprintable() and len(original.encode()) <= 255:
        return original
    return server


def _unzip(archive: Path, target: Path) -> Path:
    over = f"the archive unpacks to over {MAX_UPLOAD_BYTES // 2**20} MB"
    try:
        with zipfile.ZipFile(archive) as z:
            members = [m for m in z.infolist() if not m.is_dir()]
            if sum(m.file_size for m in members) > MAX_UPLOAD_BYTES:
                raise InputError(over)
            destinations = []
            for m in members:
                dest = confine(target, target, m.filename)
                if dest is None:
                    raise InputError(f"the archive member {m.filename!r} points outside it")
                destinations.append(dest)
            written = 0
            for m, dest in zip(members, destinations, strict=True):
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(m) as src, open(dest, "wb") as out:
                    while chunk := src.read(_CHUNK):
                        written += len(chunk)
                        if written > MAX_UPLOAD_BYTES:
                            raise InputError(over)
                        out.write(chunk)
    except InputError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
            OSError, ValueError):
        raise InputError(f"{archive.name} is not a readable .zip file") from None
    tops = [p for p in target.iterdir() if not p.name.startswith(("__MACOSX", "."))]
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else target


def _server_roots() -> list[str]:
    roots = {tempfile.gettempdir(), os.getcwd(), str(Path.home()), sys.prefix,
             str(Path(__file__).resolve().parents[2])}
    return sorted((r.rstrip("/") for r in roots if len(r.rstrip("/")) > 1), key=len,
                  reverse=True)


def scrub_server_paths(message: str) -> str:
    """``message`` with every path below a server folder (the temp dir, the working
    directory, the home folder, the Python prefix, the install) cut to its last part. Only
    paths below one are cut, starting where a path starts: a folder's own name alone
    (``/root`` typed by a person) and a longer name that merely begins like one
    (``/rooted``) are the person's text and stay as written."""
    for root in _server_roots():
        pattern = r"(?<![\w./~-])" + re.escape(root) + r"/[^\s'\",;:)\]]+"
        message = re.sub(pattern, lambda m: Path(m.group()).name or "…", message)
    return message
