"""Files a view offers for download: figures (PNG), raw arrays (.npy + .csv) and JSON, written
into one fresh temporary directory per request and handed to ``gr.File`` /
``gr.DownloadButton`` as paths.

Usage::

    out = DownloadDir()                      # one per callback call
    out.save_figure(fig, "heatmaps")         # -> .../heatmaps.png
    out.save_array(plan, "plan", columns=tokens)   # -> [.../plan.npy, .../plan.csv]
    out.save_json({"FILIP": {...}}, "scores")     # -> .../scores.json
    return [str(p) for p in out.files]       # every file written, in order

A view's own downloads are recorded with the same calls on a :class:`PendingDownloads` and
written after its pictures are on the page (:func:`otviz.ui.events.offer_downloads`):
rendering every figure to PNG a second time stays off the path from click to picture.

Directories live under one root in the system temp dir (which Gradio serves files from);
those older than ``max_age_s`` are removed whenever a new one is made, so a long-running
server does not fill its disk.
"""

from __future__ import annotations

import csv as csvlib
import json
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from otviz.data.disk_lru import disk_bytes, evict_least_recent, last_change_ns
from otviz.ui.app_dirs import DOWNLOADS, DOWNLOADS_CAP_BYTES, app_dir
from otviz.viz.plotly_static import static_figure

MAX_AGE_S = 3600.0
PNG_DPI = 120


def _safe_name(name: str) -> str:
    """A file stem with only ``[A-Za-z0-9._-]`` (no path separators, never empty)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return stem or "file"


def _prune(root: Path, max_age_s: float, max_bytes: int) -> None:
    """Remove request directories under ``root`` older than ``max_age_s`` seconds, then the
    least recently written beyond ``max_bytes`` (the newest always stays)."""
    cutoff = time.time() - max_age_s
    for entry in root.glob("req-*"):
        try:
            if entry.is_dir() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
        except FileNotFoundError:  # pruned concurrently by another request
            continue
    entries = sorted((d for d in root.glob("req-*") if d.is_dir()), key=last_change_ns)
    evict_least_recent(entries, [disk_bytes(d) for d in entries], max_bytes)


def _jsonable(obj: Any) -> Any:
    """Plain JSON values from numpy / torch scalars and arrays; non-finite floats -> None."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "detach"):  # torch tensor
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


class DownloadDir:
    """One request's download directory; every ``save_*`` appends to :attr:`files`.

    Args:
        root: parent of the request directories (default: the app's ``downloads`` folder,
            :mod:`otviz.ui.app_dirs`).
        max_age_s: request directories older than this are removed on creation, and the
            least recently written beyond ``max_bytes``.
    """

    def __init__(self, root: Path | None = None, max_age_s: float = MAX_AGE_S,
                 max_bytes: int = DOWNLOADS_CAP_BYTES) -> None:
        root = Path(root) if root is not None else app_dir(DOWNLOADS)
        root.mkdir(parents=True, exist_ok=True)
        _prune(root, max_age_s, max_bytes)
        self.path = Path(tempfile.mkdtemp(prefix="req-", dir=root))
        self.files: list[Path] = []

    def _target(self, name: str, suffix: str) -> Path:
        path = self.path / f"{_safe_name(name)}{suffix}"
        self.files.append(path)
        return path

    def save_figure(self, fig: Any, name: str, dpi: int = PNG_DPI) -> Path:
        """Write a figure and return its path.

        matplotlib ``Figure`` and images (PIL or ``[H, W, 3|4]`` uint8 arrays) become PNG;
        a plotly figure becomes a PNG of its matplotlib twin
        (:func:`otviz.viz.plotly_static.static_figure`) and, next to it, a self-contained
        interactive HTML file. Returns the PNG's path."""
        if isinstance(fig, Figure):
            path = self._target(name, ".png")
            fig.savefig(path, format="png", dpi=dpi)
        elif isinstance(fig, (Image.Image, np.ndarray)):
            path = self._target(name, ".png")
            image = fig if isinstance(fig, Image.Image) else Image.fromarray(fig)
            image.save(path, format="PNG")
        elif hasattr(fig, "write_html"):
            path = self.save_figure(static_figure(fig), name, dpi)
            fig.write_html(self._target(name, ".html"), include_plotlyjs=True, full_html=True)
        else:
            raise TypeError(f"cannot save a {type(fig).__name__} as a figure")
        return path

    def save_array(
        self,
        array: Any,
        name: str,
        csv: bool = True,
        columns: Sequence[str] | None = None,
    ) -> list[Path]:
        """Write ``array`` (numpy or torch, 1-D or 2-D) as ``.npy`` and, with ``csv``, as
        ``.csv`` (optional header row ``columns``). Returns the paths written."""
        values = _as_numpy(array)
        if values.ndim not in (1, 2):
            raise ValueError(f"expected a 1-D or 2-D array, got shape {values.shape}")
        n_cols = 1 if values.ndim == 1 else values.shape[1]
        if columns is not None and len(columns) != n_cols:
            raise ValueError(f"{len(columns)} column names for {n_cols} columns")
        npy = self._target(name, ".npy")
        np.save(npy, values, allow_pickle=False)
        paths = [npy]
        if csv:
            paths.append(self._write_csv(values, name, columns))
        return paths

    def _write_csv(self, values: np.ndarray, name: str, columns: Sequence[str] | None) -> Path:
        rows = values.reshape(-1, 1) if values.ndim == 1 else values
        path = self._target(name, ".csv")
        with path.open("w", newline="") as handle:
            writer = csvlib.writer(handle)
            if columns is not None:
                writer.writerow(list(columns))
            writer.writerows(rows.tolist())
        return path

    def save_json(self, obj: Any, name: str) -> Path:
        """Write ``obj`` as indented JSON (numpy / torch values converted, NaN -> null)."""
        path = self._target(name, ".json")
        path.write_text(json.dumps(_jsonable(obj), indent=2, allow_nan=False))
        return path

    def save_table(self, table: Any, name: str) -> Path:
        """Write a pandas ``DataFrame`` as CSV (a header row, no index column)."""
        path = self._target(name, ".csv")
        table.to_csv(path, index=False)
        return path


class PendingDownloads:
    """A view's downloads, recorded with :class:`DownloadDir`'s calls while the view computes
    and written by :meth:`write` once its pictures are shown
    (:func:`otviz.ui.events.offer_downloads`)."""

    def __init__(self) -> None:
        self._writes: list[Callable[[DownloadDir], object]] = []

    def save_figure(self, fig: Any, name: str, dpi: int = PNG_DPI) -> None:
        self._writes.append(lambda out: out.save_figure(fig, name, dpi))

    def save_array(self, array: Any, name: str, csv: bool = True,
                   columns: Sequence[str] | None = None) -> None:
        self._writes.append(lambda out: out.save_array(array, name, csv, columns))

    def save_json(self, obj: Any, name: str) -> None:
        self._writes.append(lambda out: out.save_json(obj, name))

    def save_table(self, table: Any, name: str) -> None:
        self._writes.append(lambda out: out.save_table(table, name))

    def write(self, root: Path | None = None) -> list[str]:
        """Write every recorded file into a fresh request directory; their paths, in order."""
        out = DownloadDir(root)
        for write in self._writes:
            write(out)
        return [str(p) for p in out.files]


def write_downloads(pending: PendingDownloads | None) -> tuple[list[str] | None, None]:
    """The ``.then`` step of :func:`offer_downloads`: the files of ``pending`` (none before a
    view has run) and an empty state (the figures are not kept once written)."""
    return (None if pending is None else pending.write()), None


def _as_numpy(array: Any) -> np.ndarray:
    if hasattr(array, "detach"):
        array = array.detach().cpu().numpy()
    return np.asarray(array)
