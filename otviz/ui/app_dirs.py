"""Where the served app writes, and how much: every folder it writes lives under one root
(:func:`app_root`), each with a size cap (docs/hosting.md, "The resource budget").

The root is ``$OTVIZ_APP_DIR`` when set; on a Hugging Face Space, ``otviz`` in the Space's
temp dir (:func:`tempfile.gettempdir`: what the Space offers as scratch, and what a restart
may empty); elsewhere ``.cache/otviz-app`` in the working folder. Below it:

* ``features/``: the frozen-backbone feature cache of Browse and of app training (one cache:
  :func:`cache_cap_bytes`, cut least recently used first after every Browse table and run);
* ``uploads/``: Browse's unpacked uploads (:data:`UPLOADS_CAP_BYTES`);
* ``gradio/``: Gradio's upload cache (:mod:`otviz.ui.upload_cache`: files older than six
  hours deleted every hour, and the oldest uploads beyond :func:`upload_cache_cap_bytes`
  every minute);
* ``runs/``: the app's training runs and their heads (:func:`runs_cap_bytes`);
* ``downloads/``: the views' download files (:data:`DOWNLOADS_CAP_BYTES`, and an hour's age).

Before issue 43 the feature cache of Browse was ``./.cache/otviz-features`` in the app's
folder, also on a Space, and uncapped (22 MB with a cap of 1 MB set).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: The variable naming the root folder of everything the app writes.
APP_DIR_ENV = "OTVIZ_APP_DIR"
#: The root elsewhere than on a Space (relative to the working folder).
LOCAL_ROOT = Path(".cache") / "otviz-app"
#: The root's name in the Space's temp dir.
SPACE_ROOT_NAME = "otviz"
FEATURES, UPLOADS, GRADIO, RUNS, DOWNLOADS = "features", "uploads", "gradio", "runs", "downloads"
#: The feature cache is cut back to this many MB (least recently used entries first),
#: Space / elsewhere; ``OTVIZ_FEATURE_CACHE_MB`` overrides.
SPACE_CACHE_MB, LOCAL_CACHE_MB = 2048, 8192
#: The runs folder is cut back to this many MB (oldest finished run first) at start, before
#: a run unpacks its upload and after every run, Space / elsewhere; ``OTVIZ_RUNS_MB``
#: overrides. A run in progress may add one upload (at most the 500 MB unpack cap) on top.
SPACE_RUNS_MB, LOCAL_RUNS_MB = 1024, 10240
#: Gradio's upload cache is cut back to this many MB (oldest upload first, every minute),
#: Space / elsewhere; ``OTVIZ_UPLOAD_CACHE_MB`` overrides.
SPACE_GRADIO_MB, LOCAL_GRADIO_MB = 1024, 4096
#: Browse's unpacked uploads kept at most, in bytes.
UPLOADS_CAP_BYTES = 2 * 2**30
#: The download files kept at most, in bytes (oldest request first beyond).
DOWNLOADS_CAP_BYTES = 256 * 2**20


def on_space() -> bool:
    """Whether the app runs as a Hugging Face Space (the Space sets ``SPACE_ID``)."""
    return bool(os.environ.get("SPACE_ID"))


def app_root() -> Path:
    """The folder everything the app writes lives under (module docstring)."""
    chosen = os.environ.get(APP_DIR_ENV, "").strip()
    if chosen:
        return Path(chosen)
    return Path(tempfile.gettempdir()) / SPACE_ROOT_NAME if on_space() else LOCAL_ROOT


def app_dir(name: str) -> Path:
    """The folder ``name`` (:data:`FEATURES`, :data:`UPLOADS`, ...) under :func:`app_root`."""
    return app_root() / name


def _cap_bytes(env_name: str, space_mb: int, local_mb: int) -> int:
    env = os.environ.get(env_name)
    mb = int(env) if env else (space_mb if on_space() else local_mb)
    return max(0, mb) * 2**20


def cache_cap_bytes() -> int:
    """The feature cache's size cap in bytes."""
    return _cap_bytes("OTVIZ_FEATURE_CACHE_MB", SPACE_CACHE_MB, LOCAL_CACHE_MB)


def upload_cache_cap_bytes() -> int:
    """Gradio's upload cache's size cap in bytes."""
    return _cap_bytes("OTVIZ_UPLOAD_CACHE_MB", SPACE_GRADIO_MB, LOCAL_GRADIO_MB)


def runs_cap_bytes() -> int:
    """The runs folder's size cap in bytes."""
    return _cap_bytes("OTVIZ_RUNS_MB", SPACE_RUNS_MB, LOCAL_RUNS_MB)
