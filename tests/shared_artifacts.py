"""What costs seconds of CPU and hundreds of MB of disk to make, made once per test run and
shared by its test processes: a random full-size ViT-B-16 saved to weight files (seeds 0 and
1, a truncated copy, a foreign file, a snapshot folder), ConceptOT heads trained on the seed-0
file from webdataset shards, and one app served on them per test process.

Under pytest-xdist the files go to the folder the workers' temp folders share (pytest-xdist's
recipe: ``tmp_path_factory.getbasetemp().parent``, guarded by a ``filelock.FileLock``);
without it, to the run's temp folder. A maker writes a folder under a temp name and renames
it when complete, so a maker that crashed leaves no folder a reader would take for done; each
making is logged in ``NAME.made`` beside the folder (one line per making: a second line in a
run means the sharing failed). Registered as a plugin by tests/conftest.py; torch, open_clip
and otviz are imported where a fixture needs them (pytest-xdist's controller loads this file
too)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

#: The architecture of the weight files.
VIT = "ViT-B-16"
#: The feature source the heads are trained on (not the default ``last``: a head-set entry
#: opens at the reading it was trained on).
TRAINED_ON = "clearclip"
#: The short training run of every trained-heads test: 8 pairs, 2 steps of 4, a 16-wide
#: concept space (the head's start is each caller's: random on the tiny CLIP, the default on
#: the ViT-B-16).
SMALL = ["--n-train", "8", "--batch-size", "4", "--max-steps", "2", "--concept-dim", "16",
         "--threads", "1", "--device", "cpu", "--quiet"]


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this run sees: the workers' common parent under
    pytest-xdist, else the run's temp folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], None]) -> Path:
    """The run's folder ``name``, made by ``make(folder)`` in the first process that asks
    (the others wait on the lock, then read it): made under a temp name and renamed, and the
    making logged in ``name.made``."""
    root = shared_root(tmp_path_factory)
    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not folder.exists():
            started = time.perf_counter()
            partial = root / f"{name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            make(partial)
            partial.rename(folder)
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with (root / f"{name}.made").open("a") as log:
                log.write(f"{worker} pid {os.getpid()}: "
                          f"{time.perf_counter() - started:.1f} s\n")
    return folder


def train_heads(root: Path, *flags: str) -> Path:
    """ConceptOT heads trained (:data:`SMALL`) at :data:`TRAINED_ON` with ``flags`` (the
    backbone's and the data's; none: the embedded tiny CLIP on world samples), published to
    ``root/my-heads`` with its manifest next to it: ``otviz train ... --publish DIR``."""
    from otviz.cli import main as otviz_main

    heads = root / "my-heads"
    argv = ["train", "--method", "conceptot", "--features", TRAINED_ON, *SMALL, *flags,
            "--cache-dir", str(root / "cache"), "--out", str(root / "runs"), "--publish",
            str(heads)]
    assert otviz_main(argv) == 0
    return heads


@dataclass(frozen=True)
class VitFiles:
    """The random ViT-B-16 weight files: ``files`` (seeds 0 and 1), ``truncated`` (the seed-0
    file's first MiB), ``foreign`` (another model's tensor names and shapes), ``snapshot`` (a
    Hugging Face style folder: open_clip_config.json and the seed-0 weights) and ``missing``
    (a path with no file), in a folder whose name must not reach a page."""

    files: tuple[Path, Path]
    truncated: Path
    foreign: Path
    snapshot: Path
    missing: Path


def _make_vit_files(folder: Path) -> None:
    import open_clip
    import torch
    from safetensors.torch import save_file

    for seed in (0, 1):
        torch.manual_seed(seed)
        torch.save(open_clip.create_model(VIT, pretrained=None).state_dict(),
                   folder / f"vit-{seed}.pt")
    with (folder / "vit-0.pt").open("rb") as src:
        (folder / "vit-b-16-truncated.pt").write_bytes(src.read(2**20))
    save_file({"visual.conv1.weight": torch.zeros(64, 3, 7, 7), "logit_scale": torch.ones(())},
              str(folder / "not-vit-b-16.safetensors"))
    snapshot = folder / "snapshot"
    snapshot.mkdir()
    (snapshot / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": open_clip.get_model_config(VIT), "preprocess_cfg": {}}))
    os.link(folder / "vit-0.pt", snapshot / "open_clip_pytorch_model.bin")


@pytest.fixture(scope="session")
def vit_files(tmp_path_factory: pytest.TempPathFactory) -> VitFiles:
    folder = made_once(tmp_path_factory, "server-only-folder-vit-b-16", _make_vit_files)
    return VitFiles((folder / "vit-0.pt", folder / "vit-1.pt"),
                    folder / "vit-b-16-truncated.pt", folder / "not-vit-b-16.safetensors",
                    folder / "snapshot", folder / "gone.pt")


@dataclass(frozen=True)
class VitHeads:
    """ConceptOT heads trained on ``weights`` (the seed-0 ViT-B-16 file) from 8 world pairs
    in 2 webdataset shards of 4, streamed (``cache`` is the feature cache folder the command
    was given: a streamed run writes none), published to ``heads``; ``printed`` is what the
    command printed."""

    weights: Path
    cache: Path
    heads: Path
    printed: str


@pytest.fixture(scope="session")
def vit_heads(vit_files: VitFiles, tmp_path_factory: pytest.TempPathFactory) -> VitHeads:
    """Issue 51's end-to-end route: ``otviz train --open-clip-model ViT-B-16 --pretrained
    vit-0.pt --data SHARDS --workers 0 --features clearclip ... --publish DIR`` (the default
    start: the head starts from the ViT's own projections)."""
    weights = vit_files.files[0]

    def make(folder: Path) -> None:
        from otviz.world.export import export_shards

        export_shards(folder / "shards", 8, "train", per_shard=4)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            train_heads(folder, "--open-clip-model", VIT, "--pretrained", str(weights),
                        "--data", str(folder / "shards"), "--workers", "0")
        (folder / "printed.txt").write_text(printed.getvalue())

    root = made_once(tmp_path_factory, "server-only-folder-vit-b-16-heads", make)
    return VitHeads(weights, root / "cache", root / "my-heads",
                    (root / "printed.txt").read_text())


@pytest.fixture(scope="session")
def vit_app(vit_files: VitFiles, vit_heads: VitHeads,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The app served offline (one per test process) with the embedded model, the seed-0
    and seed-1 files with the heads beside each, and the truncated copy: ``otviz app --model
    ViT-B-16 --pretrained vit-0.pt --heads DIR --model ViT-B-16 --pretrained vit-1.pt --heads
    DIR --model ViT-B-16 --pretrained vit-b-16-truncated.pt``. Yields its context and a
    client."""
    from otviz.ui.app import build_app
    from otviz.ui.context import AppContext
    from otviz.ui.model_sources import ModelSource
    from otviz.ui.upload_cache import own_upload_cache
    from tests.conftest import launch_locally
    from tests.helpers import api_client

    own_upload_cache(tmp_path_factory.mktemp("gradio"))
    models = [ModelSource(VIT, str(f)) for f in (*vit_files.files, vit_files.truncated)]
    heads = str(vit_heads.heads)
    ctx = AppContext.default(models, heads_root=tmp_path_factory.mktemp("no-heads"),
                             heads=[(1, heads), (2, heads)], found_heads=[])
    app = build_app(ctx)
    yield ctx, api_client(launch_locally(app))
    app.close()
