"""Every folder the served app writes lives under one root, each with a cap
(:mod:`otviz.ui.app_dirs`, issue 43.4): on a Space-like start (``SPACE_ID`` set) the root is
in the Space's temp dir, and Browse's feature cache, filled, is cut back to its cap (it was
``./.cache/otviz-features`` in the app's folder and grew to 22 MB with a 1 MB cap)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from otviz.data.disk_lru import disk_bytes
from otviz.data.feature_cache import FeatureCache
from otviz.eval.browse import BrowseCache
from otviz.ui import app_dirs, browse_tab
from otviz.ui.app_dirs import (
    APP_DIR_ENV,
    DOWNLOADS,
    FEATURES,
    GRADIO,
    LOCAL_ROOT,
    RUNS,
    SPACE_ROOT_NAME,
    UPLOADS,
    app_root,
)
from otviz.ui.browse_tab import BrowseSources, load_table
from otviz.ui.downloads import DownloadDir
from otviz.ui.train_jobs import TrainingJobs
from otviz.ui.upload_cache import own_upload_cache


@pytest.fixture
def space(monkeypatch, tmp_path) -> Path:
    """A Space-like environment whose temp dir is the test's; the app root it implies."""
    monkeypatch.setenv("SPACE_ID", "someone/otviz")
    monkeypatch.delenv(APP_DIR_ENV, raising=False)
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)  # own_upload_cache sets it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "space-tmp"))
    return tmp_path / "space-tmp" / SPACE_ROOT_NAME


def test_the_root_follows_the_space_the_environment_and_the_working_folder(
        space, monkeypatch, tmp_path):
    assert app_root() == space
    monkeypatch.setenv(APP_DIR_ENV, str(tmp_path / "chosen"))
    assert app_root() == tmp_path / "chosen"
    monkeypatch.delenv(APP_DIR_ENV)
    monkeypatch.delenv("SPACE_ID")
    assert app_root() == LOCAL_ROOT


def test_every_folder_the_app_writes_is_under_the_spaces_temp_dir(space, ctx):
    jobs = TrainingJobs(ctx, evaluate=False)
    sources = BrowseSources()
    folders = {
        FEATURES: [jobs.cache_dir, sources.features_dir],
        RUNS: [jobs.runs_root],
        UPLOADS: [sources.uploads_dir],
        GRADIO: [own_upload_cache().parent],
        DOWNLOADS: [DownloadDir().path.parent],
    }
    for name, paths in folders.items():
        for path in paths:
            assert Path(path).resolve() == (space / name).resolve(), (name, path)


def test_browse_cuts_the_feature_cache_to_its_cap(ctx, checkpoint, tmp_path, monkeypatch):
    sources = BrowseSources(BrowseCache(), tmp_path / "features", tmp_path / "uploads")
    cache = FeatureCache(sources.features_dir)
    monkeypatch.setenv("OTVIZ_FEATURE_CACHE_MB", "10000")
    for n in (4, 5):
        load_table(ctx, sources, checkpoint, browse_tab.WORLD_SOURCE, n, "test")
    kept = cache.entries()
    assert len(kept) >= 2  # under the cap: every table's features stay (one entry or more each)
    monkeypatch.setenv("OTVIZ_FEATURE_CACHE_MB", "0")
    load_table(ctx, sources, checkpoint, browse_tab.WORLD_SOURCE, 6, "test")
    [newest] = cache.entries()  # over it: the least recently used go, the newest stays
    assert newest not in kept
    assert app_dirs.cache_cap_bytes() == 0


def test_downloads_are_cut_to_their_cap_oldest_first(tmp_path):
    made, now = [], time.time()
    for k in range(4):
        folder = DownloadDir(tmp_path, max_bytes=2500)
        (folder.path / "file.bin").write_bytes(b"x" * 1000)
        os.utime(folder.path, (now - 100 + k, now - 100 + k))  # written in this order
        made.append(folder.path)
    left = sorted(p for p in tmp_path.iterdir())
    assert left == sorted(made[1:])  # the fourth's creation evicted the oldest
    assert sum(disk_bytes(p) for p in made[1:3]) <= 2500
