"""Gradio's upload cache, owned by the app: where Gradio keeps what people upload (and the
files it serves back), under the app's data folder, cleaned at start and on a schedule.

* **Where.** :func:`own_upload_cache` points Gradio's cache (``GRADIO_TEMP_DIR``, which
  Gradio reads when a component is built, when the server starts and on every request) at
  one folder per server process under the app's ``gradio`` folder
  (:mod:`otviz.ui.app_dirs`), next to the feature cache and the unpacked uploads. A folder
  the host chose (``GRADIO_TEMP_DIR`` set before the app starts) is kept as it is.
* **At start.** The folders of servers that are gone are removed (each records its owner
  process, as the store of unpacked uploads does: :mod:`otviz.data.disk_lru`).
* **On a schedule.** Gradio's own mechanism, ``gr.Blocks(delete_cache=DELETE_CACHE)``:
  every hour, the files this server cached that are older than :data:`DELETE_CACHE`'s age
  go; all of them go when the server stops. And every :data:`CAP_EVERY_S` seconds the cache
  is cut back to its size cap (:func:`cap_upload_cache`, oldest upload first: a visitor who
  uploads a lot cannot fill the disk within the six hours).
* **Refused uploads** are removed at once by the input that refused them
  (:func:`discard_upload`): an image that is not one, too large or too thin, a file of a
  type the input does not take, an uploaded .zip the view cannot read (an image refused by
  its upload event :data:`PREVIEW_GRACE_S` later: the page fetches the file it just sent to
  show its preview, and a file removed while the server sends it is a traceback in the
  log). Later events that
  name a removed upload are told why it was refused (:func:`why_gone`). Their emptied
  folders go a minute later (:func:`remove_empty_folders`, run with every refusal).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from gradio.utils import get_upload_folder

from otviz.boundary.paths import inside
from otviz.data.disk_lru import (
    discard,
    disk_bytes,
    evict_least_recent,
    last_change_ns,
    owner_alive,
    write_owner,
)
from otviz.errors import UserInputError
from otviz.ui.app_dirs import GRADIO, app_dir, upload_cache_cap_bytes

#: ``gr.Blocks(delete_cache=(frequency, age))``: every hour, the cached files older than
#: six hours are deleted (an upload stays long enough for a session's page turns).
DELETE_CACHE = (3600, 6 * 3600)
_GRADIO_TEMP_DIR = "GRADIO_TEMP_DIR"
#: Why the latest refused uploads were refused, by their path in the cache (at most
#: :data:`_REMEMBERED`, the oldest forgotten first).
_REFUSED: OrderedDict[str, str] = OrderedDict()
_REMEMBERED = 4096
_REFUSED_LOCK = threading.Lock()
#: An emptied upload folder is removed once it has stayed empty this long. Gradio keeps every
#: upload of the same bytes in one folder (named by their hash): a folder removed the moment
#: it empties can vanish between Gradio's ``mkdir`` and its move of a concurrent upload of
#: the same bytes into it, which fails that upload (seen as a 500 in the hostile catalogue).
EMPTY_FOLDER_AGE_S = 60.0
#: How long a refused image upload stays for the page's fetch of its preview (served in
#: milliseconds; the refusal clears the preview).
PREVIEW_GRACE_S = 10.0
#: How often the upload cache is cut back to its size cap, in seconds.
CAP_EVERY_S = 60.0
#: What the events naming an upload the cap removed are told (:func:`why_gone`).
EVICTED = ("this upload was removed: the server's upload cache was full and it was among the "
           "oldest; upload it again")


def own_upload_cache(parent: Path | None = None) -> Path:
    """Point Gradio's upload cache at this process's folder under ``parent`` (default: the
    app's, :mod:`otviz.ui.app_dirs`) unless the host set ``GRADIO_TEMP_DIR``, after removing
    the folders of processes that are gone. Call it before the app's components are built.
    Returns the cache folder."""
    host = os.environ.get(_GRADIO_TEMP_DIR)
    if host:
        return Path(host)
    parent = parent or app_dir(GRADIO)
    parent.mkdir(parents=True, exist_ok=True)
    for entry in parent.iterdir():
        if entry.is_dir() and not entry.name.startswith(".") and not owner_alive(entry):
            discard(entry)
    folder = (parent / str(os.getpid())).resolve()
    folder.mkdir(exist_ok=True)
    write_owner(folder)
    os.environ[_GRADIO_TEMP_DIR] = str(folder)
    _keep_capped(folder)
    return folder


def cap_upload_cache(cache: Path, max_bytes: int) -> list[Path]:
    """Cut Gradio's upload cache ``cache`` back to ``max_bytes``: its uploads (Gradio keeps
    each in a folder named by its bytes' hash) go least recently changed first, the newest
    always stays; the events that name a removed file later are told why
    (:data:`EVICTED`, :func:`why_gone`). Returns the folders removed."""
    uploads = sorted((f for f in cache.iterdir() if f.is_dir() and not f.name.startswith(".")),
                     key=last_change_ns)
    sizes = [disk_bytes(f, recursive=True) for f in uploads]
    if sum(sizes) <= max_bytes:
        return []
    files = {f: [str(p) for p in f.rglob("*")] for f in uploads}  # their names, before
    removed = evict_least_recent(uploads, sizes, max_bytes)
    for folder in removed:
        for path in files[folder]:
            _remember(path, EVICTED)
    return removed


def _keep_capped(cache: Path) -> None:
    """Cut ``cache`` back to its cap every :data:`CAP_EVERY_S` seconds, in a daemon thread
    (it ends with the server)."""
    def sweep() -> None:
        while True:
            time.sleep(CAP_EVERY_S)
            with contextlib.suppress(OSError):  # the cache removed at stop: nothing to cut
                cap_upload_cache(cache, upload_cache_cap_bytes())

    threading.Thread(target=sweep, name="otviz-upload-cap", daemon=True).start()


def discard_upload(path: str | os.PathLike, reason: str | None = None) -> bool:
    """Remove an uploaded file from Gradio's cache (its folder, left empty, a minute later),
    only when it lies inside the cache: a path anywhere else is never touched. ``reason``
    (why it was refused) is kept for the events that name the upload later
    (:func:`why_gone`). Returns whether it was removed."""
    cache = Path(get_upload_folder()).resolve()
    if not inside(cache, path):
        return False
    file = Path(path).resolve()
    if not file.is_file():
        return False
    if reason is not None:
        _remember(str(path), reason)  # before the file goes: a concurrent event reads it
    file.unlink(missing_ok=True)
    remove_empty_folders(cache)
    return True


def remove_empty_folders(cache: Path, min_age_s: float = EMPTY_FOLDER_AGE_S) -> int:
    """Remove the folders of ``cache`` that are empty and unchanged for ``min_age_s``
    seconds (see :data:`EMPTY_FOLDER_AGE_S`); how many were removed."""
    cutoff, removed = time.time() - min_age_s, 0
    for folder in cache.iterdir():
        with contextlib.suppress(OSError):  # filled or removed meanwhile: kept or gone
            if folder.is_dir() and folder.stat().st_mtime <= cutoff and not any(
                    folder.iterdir()):
                folder.rmdir()
                removed += 1
    return removed


def why_gone(path: str | os.PathLike) -> str | None:
    """Why the upload at ``path`` was refused and removed (``None``: not by this server,
    or long ago). The page sends a refused upload again with every event that reads its
    input (an Align click after the upload's own check): each is told the same reason."""
    with _REFUSED_LOCK:
        return _REFUSED.get(str(path))


def _remember(path: str, reason: str) -> None:
    with _REFUSED_LOCK:
        _REFUSED[path] = reason
        _REFUSED.move_to_end(path)
        while len(_REFUSED) > _REMEMBERED:
            _REFUSED.popitem(last=False)


def lone_archive(uploads: Sequence[str | os.PathLike]) -> list[str | os.PathLike]:
    """``uploads`` when they are a single .zip, whose folder a refusal is about; none
    otherwise (a captions file uploaded alone may be refused for the images missing
    beside it, and the person may send it again with them)."""
    if len(uploads) == 1 and Path(uploads[0]).suffix.lower() == ".zip":
        return list(uploads)
    return []


@contextlib.contextmanager
def discarded_if_refused(uploads: Sequence[str | os.PathLike],
                         delay_s: float = 0.0) -> Iterator[None]:
    """Remove ``uploads`` from Gradio's cache when the block refuses them with a user
    error (``delay_s`` seconds later, its reason known to :func:`why_gone` at once); only
    one upload at a time, whose refusal is certainly about it (an image, a
    .zip: :func:`lone_archive`). Several files uploaded side by side stay (the person may
    remove the bad one and send the rest again); Gradio's schedule removes them."""
    try:
        yield
    except UserInputError as e:
        if len(uploads) == 1 and delay_s > 0:
            _remember(str(uploads[0]), str(e))
            timer = threading.Timer(delay_s, discard_upload, (uploads[0], str(e)))
            timer.daemon = True
            timer.start()
        elif len(uploads) == 1:
            discard_upload(uploads[0], str(e))
        raise
