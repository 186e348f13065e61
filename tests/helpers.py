"""Helpers shared by test modules (fixtures live in the conftest.py files); otviz is
imported inside them, so importing this module stays cheap."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest

if TYPE_CHECKING:
    from gradio_client import Client

    from otviz.train.config import TrainConfig
    from otviz.ui.context import AppContext
    from otviz.ui.train_policy import TrainRequest

#: The repository's root folder.
ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """The environment of the Python processes the tests start (the docs pages, the command
    line): this one's, with the checkout importable, no download, one compute thread and no
    display."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def torchrun(args: list[str], timeout: float) -> str:
    """Run ``torchrun --standalone --nproc-per-node 2 <args>`` on the CPU; its output (a
    failure shows the tails of both streams). torchrun and its workers run in a session of
    their own, killed together on timeout (killing torchrun alone once left its workers
    blocked for good), so a hung process group never outlives the test."""
    import signal
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", *args]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def fresh_process_group(name: str) -> None:
    """In a process of a ``torchrun`` job whose first process group is gone, create another
    (gloo), its keys under ``name`` in the job's store, so that one job (one start-up of
    torchrun and its interpreters, about 14 s of CPU on the 2-core machine) serves several
    parts. A second group made the default way reuses the first one's key names (torch
    numbers groups from 0 again once the last is destroyed), reads its stale addresses and
    can wait forever to connect."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(minutes=10))
    dist.init_process_group("gloo", store=dist.PrefixStore(name, store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def random_tiny_clip(path: Path, seed: int) -> Path:
    """A randomly initialised small tiny-CLIP checkpoint (no shipped weights needed)."""
    from otviz.tiny_clip.model import create_tiny_clip, save_tiny_clip, tiny_clip_config

    cfg = tiny_clip_config(embed_dim=32, vision_width=32, vision_layers=1, vision_heads=2,
                           text_width=32, text_layers=1, text_heads=2)
    save_tiny_clip(path, create_tiny_clip(cfg, seed=seed), cfg, {})
    return path


def app_context() -> AppContext:
    """The app's default context on the shipped checkpoint; fails (does not skip) when the
    checkpoint is missing. ``OTVIZ_UI_TEST_CHECKPOINT`` points it at another tiny-CLIP
    checkpoint directory instead (development before the shipped one exists)."""
    from otviz.backbone import Backbone
    from otviz.suite import WORLD_FIT_CAPTIONS
    from otviz.tiny_clip.model import DEFAULT_CHECKPOINT
    from otviz.ui.context import EMBEDDED, AppContext, BackboneChoice

    override = os.environ.get("OTVIZ_UI_TEST_CHECKPOINT")
    if override:
        load = lambda: Backbone.from_checkpoint(override)  # noqa: E731
        return AppContext([BackboneChoice(EMBEDDED, load, WORLD_FIT_CAPTIONS,
                                          train_backbone={"backbone": override})])
    if not Path(DEFAULT_CHECKPOINT).is_dir():
        pytest.fail(f"the shipped checkpoint {DEFAULT_CHECKPOINT} is missing")
    return AppContext.default()


def write_caption_folder(folder: Path, n: int, captions: dict[int, str] | None = None) -> Path:
    """``folder`` with the first ``n`` example images and a ``path,caption`` CSV of their
    captions (row ``k`` replaced by ``captions[k]`` where given)."""
    from otviz.ui.examples import load_examples

    folder.mkdir()
    rows = ["path,caption"]
    for k, e in enumerate(load_examples()[:n]):
        shutil.copy(e.image_path, folder / e.image_path.name)
        rows.append(f'{e.image_path.name},"{(captions or {}).get(k, e.caption)}"')
    (folder / "captions.csv").write_text("\n".join(rows) + "\n")
    return folder


def tiny_train_config(tmp_path: Path, **overrides) -> TrainConfig:
    """A training config small enough for a test (a few steps, one thread), with the
    papers' random start (in-memory pairs carry no backbone projection to start from)."""
    from otviz.train.config import TrainConfig

    values = dict(
        batch_size=8,
        max_steps=6,
        concept_dim=16,
        rank=4,
        n_regions=4,
        threads=1,
        device="cpu",
        lr=1e-2,
        warmup_frac=0.0,
        out=str(tmp_path / "run"),
        log_every=0,
        start="random",
    )
    values.update(overrides)
    return TrainConfig(**values)


def moved(obj, device):
    """``obj`` with every tensor in it on ``device`` (``"cpu"``: back for a reference
    check): tensors, and the tensors inside dataclasses (solver results, batches,
    alignments), tuples, lists and dicts; other values as they are."""
    import dataclasses

    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{
            f.name: moved(getattr(obj, f.name), device)
            for f in dataclasses.fields(obj) if f.init
        })
    if isinstance(obj, (tuple, list)):
        return type(obj)(moved(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: moved(v, device) for k, v in obj.items()}
    return obj


def random_ot_problem(seed: int, b: int = 3, n: int = 7, m: int = 5, col_mass: float = 1.0):
    """A seeded batch of ``b`` float64 OT problems: costs ``[b, n, m]`` in [0, 1), marginals
    ``a`` of mass 1 and ``b`` of mass ``col_mass`` (entries bounded away from 0)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    cost = torch.rand(b, n, m, generator=gen, dtype=torch.float64)
    a = torch.rand(b, n, generator=gen, dtype=torch.float64) + 0.1
    bb = torch.rand(b, m, generator=gen, dtype=torch.float64) + 0.1
    return cost, a / a.sum(1, keepdim=True), col_mass * bb / bb.sum(1, keepdim=True)


def png_header(width: int, height: int) -> bytes:
    """A valid 1-bit PNG that declares ``width x height`` pixels in a few dozen bytes (a
    pixel bomb small on disk)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))
            + chunk(b"IEND", b""))


def world_trust_inputs(backbone, seed: int, n: int):
    """:func:`otviz.eval.trust.adapter.trust_inputs` of the first ``n`` world test images of
    ``seed`` with their gold noun phrases."""
    from otviz.eval.trust import adapter
    from otviz.world import World, WorldConfig

    samples = World(WorldConfig(negatives=False), "test", seed).samples(0, n)
    return adapter.trust_inputs(backbone, [s.image for s in samples],
                                [adapter.world_phrases(s) for s in samples])


def gradio_cache_files() -> set[Path]:
    """The files in Gradio's upload cache (``GRADIO_TEMP_DIR``) now."""
    from gradio.utils import get_upload_folder

    return {p for p in Path(get_upload_folder()).rglob("*") if p.is_file()}


# ---------------------------------------------------------------- HTTP to the served app
# The served app listens on loopback over plain HTTP, so no request has a certificate to
# check. Left to check one (httpx's default), every request builds a TLS context from
# certifi's bundle first, about 30 ms of CPU, and gradio_client sends several requests per
# call: a quarter of the hostile catalogue's CPU went there.
PLAIN_HTTP = {"verify": False}


def api_parameters(blocks) -> dict[str, list[str]]:
    """Every public named endpoint of ``blocks`` with its parameter names, as Gradio's API
    page and gradio_client's keyword calls show them."""
    return {name: [p["parameter_name"] for p in info["parameters"]]
            for name, info in blocks.get_api_info()["named_endpoints"].items()}


#: How long a call of :func:`api_client`'s client waits for its event stream to close.
STREAM_CLOSE_S = 30.0


def api_client(url: str) -> Client:
    """A gradio_client of the app served at ``url`` (returns paths, downloads no file) whose
    calls, one after another, each start once the last one's event stream has closed.

    The server closes a session's stream (``close_stream``) right after the last pending
    event's result; gradio_client's reader sees that after the call has returned. A call
    sent in between is registered on the closing stream, the reader then ends it with
    ``CancelledError`` and its result is never read (seen once in the hostile catalogue,
    on a loaded machine). Waiting for the close before the next call leaves no such
    window."""
    import time

    from gradio_client import Client

    class SequentialClient(Client):
        def predict(self, *args, **kwargs):
            try:
                return super().predict(*args, **kwargs)
            finally:
                deadline = time.monotonic() + STREAM_CLOSE_S
                while getattr(self, "stream_open", False) and time.monotonic() < deadline:
                    time.sleep(0.002)

    return SequentialClient(url, verbose=False, download_files=False, ssl_verify=False)


def upload(url: str, name: str, content: bytes | BinaryIO) -> str:
    """The server path of ``content`` uploaded as file ``name``, as the page uploads it."""
    import httpx

    response = httpx.post(f"{url}gradio_api/upload", files={"files": (name, content)},
                          timeout=60, **PLAIN_HTTP)
    response.raise_for_status()
    return response.json()[0]


def file_data(path: str, name: str) -> dict:
    """An uploaded file as an event's input names it (Gradio's ``FileData``)."""
    return {"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def raw_api_call(url: str, api_name: str, data: list) -> str:
    """The event stream of one API call sent as raw JSON (no client-side upload)."""
    import httpx

    post = httpx.post(f"{url}gradio_api/call/{api_name}", json={"data": data}, timeout=60,
                      **PLAIN_HTTP)
    post.raise_for_status()
    return httpx.get(f"{url}gradio_api/call/{api_name}/{post.json()['event_id']}",
                     timeout=300, **PLAIN_HTTP).text


def train_request_of(methods: list[str], source: str = "world", folder: str = "",
                     uploads: list[str] | None = None, **recipe) -> TrainRequest:
    """A Train request of ``methods`` on the app's recipe changed where ``recipe`` says
    (TrainConfig fields)."""
    from dataclasses import replace

    from otviz.ui.train_policy import TrainRequest, app_config

    return TrainRequest(list(methods), replace(app_config(), **recipe), source, folder,
                        list(uploads or []))


#: A one-step recipe on two-pair batches for ``/train`` requests (the form's other fields at
#: their defaults).
TINY_TRAIN_RECIPE = {"n_train": 64, "eps": 0.05, "tau_v": 0.1, "tau_t": 0.1, "tau_local": 0.05,
                     "rank": 16, "n_iters": 10, "lambda_local": 0.5, "hard_negatives": 1,
                     "epochs": 1, "max_steps": 1, "batch_size": 2, "lr": 1e-3}


def train_api_args(checkpoint: str, source: str, folder: str, uploads: list,
                   methods: list[str], features: str = "last", image_size: int = 0,
                   **recipe) -> list:
    """The ``/train`` endpoint's arguments: the checkpoint and its reading (``features``,
    ``image_size``: 0 the native side), the data and methods, then the form's recipe in its
    order (its defaults, changed where ``recipe`` says)."""
    from otviz.ui.train_form import form_fields

    specs = form_fields()
    assert set(recipe) <= {s.name for s in specs}, set(recipe)
    return [checkpoint, features, image_size, source, folder, uploads, methods,
            *(recipe.get(s.name, s.default) for s in specs)]
