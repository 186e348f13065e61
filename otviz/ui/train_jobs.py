"""Training method heads from the app: the form's request checked and turned into
:class:`~otviz.train.config.TrainConfig` s, one run at a time per server in a background
thread, through the same :func:`otviz.train.loop.train_method` the command line uses.

A job trains its methods one after the other, records every progress report, registers the
finished heads in the :class:`~otviz.ui.context.AppContext` (a new checkpoint-picker
entry) and scores them on the examples gallery's compositional probe next to their
training-free configuration. Runs are bounded: at most :func:`step_cap` optimiser steps per
method (fewer on a public Space), a bounded number of training pairs, bounded uploads.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from otviz.boundary.images import ImageInputError, check_headers
from otviz.boundary.paths import NOT_FOUND, inside, unpack_uploads
from otviz.data.datasets import CaptionFolder, DatasetError, load_image_captions
from otviz.data.disk_lru import OWNER_FILE, disk_bytes, evict_oldest, owner_alive, write_owner
from otviz.data.feature_cache import FeatureCache
from otviz.errors import UserInputError
from otviz.explain import InputError
from otviz.suite import ALIGN_METHODS, METHOD_LABELS, MethodSuite
from otviz.train.config import TrainConfig
from otviz.train.loop import ENCODING, TrainResult, train_method
from otviz.ui.budget import ComputeBudget, Work, server_budget, visitor
from otviz.ui.context import AppContext, on_space
from otviz.ui.head_registry import load_head_sets, register_head_set
from otviz.ui.probe_tab import run_batch_probe
from otviz.ui.upload_cache import discarded_if_refused, lone_archive

log = logging.getLogger("otviz.ui.train_jobs")

WORLD, FOLDER, UPLOAD = "world", "local folder", "upload"
#: Optimiser steps per method at most, on a public Space and elsewhere;
#: ``OTVIZ_TRAIN_MAX_STEPS`` overrides.
SPACE_MAX_STEPS, LOCAL_MAX_STEPS = 200, 5000
#: Training pairs at most (world samples or a folder's captions), Space / elsewhere.
SPACE_MAX_PAIRS, LOCAL_MAX_PAIRS = 5000, 200_000
MAX_EPOCHS = 100
RUNS_ROOT = Path("runs") / "app"
#: The only server folder the "local folder" data source may read (unset: no such source).
DATA_ROOT_ENV = "OTVIZ_DATA_ROOT"
#: The feature cache is cut back to this many MB (least recently used entries first) at
#: start and after every run, Space / elsewhere; ``OTVIZ_FEATURE_CACHE_MB`` overrides.
SPACE_CACHE_MB, LOCAL_CACHE_MB = 2048, 8192
#: The runs folder is cut back to this many MB (oldest finished run first) at start, before
#: a run unpacks its upload and after every run, Space / elsewhere; ``OTVIZ_RUNS_MB``
#: overrides. A run in progress may add one upload (at most the 500 MB unpack cap) on top.
SPACE_RUNS_MB, LOCAL_RUNS_MB = 1024, 10240
#: Head sets trained here that the picker keeps, Space / elsewhere (``OTVIZ_MAX_TRAINED_HEADS``
#: overrides): beyond, the oldest leaves the picker and its run may be evicted.
SPACE_MAX_HEAD_SETS, LOCAL_MAX_HEAD_SETS = 20, 200
#: The folder of a run that holds its unpacked upload (removed when the run ends).
UPLOAD_DIR = "data"


class TrainingBusyError(InputError):
    """Another training run holds this server."""


def step_cap() -> int:
    """The most optimiser steps a method may take here."""
    env = os.environ.get("OTVIZ_TRAIN_MAX_STEPS")
    if env:
        return max(1, int(env))
    return SPACE_MAX_STEPS if on_space() else LOCAL_MAX_STEPS


def pair_cap() -> int:
    """The most training pairs a run may use here."""
    return SPACE_MAX_PAIRS if on_space() else LOCAL_MAX_PAIRS


def data_root() -> Path | None:
    """The folder whose contents the "local folder" source may read: ``$OTVIZ_DATA_ROOT``
    if it is a folder, never on a Space."""
    root = os.environ.get(DATA_ROOT_ENV, "").strip()
    if on_space() or not root or not Path(root).is_dir():
        return None
    return Path(root).resolve()


def data_sources() -> list[str]:
    """The data choices: server folders only under a configured data root (never on a
    Space)."""
    return [WORLD, UPLOAD] if data_root() is None else [WORLD, FOLDER, UPLOAD]


def _cap_bytes(env_name: str, space_mb: int, local_mb: int) -> int:
    env = os.environ.get(env_name)
    mb = int(env) if env else (space_mb if on_space() else local_mb)
    return max(0, mb) * 2**20


def cache_cap_bytes() -> int:
    """The feature cache's size cap in bytes."""
    return _cap_bytes("OTVIZ_FEATURE_CACHE_MB", SPACE_CACHE_MB, LOCAL_CACHE_MB)


def runs_cap_bytes() -> int:
    """The runs folder's size cap in bytes."""
    return _cap_bytes("OTVIZ_RUNS_MB", SPACE_RUNS_MB, LOCAL_RUNS_MB)


def head_sets_cap() -> int:
    """How many head sets trained here the picker keeps."""
    env = os.environ.get("OTVIZ_MAX_TRAINED_HEADS")
    cap = int(env) if env else (SPACE_MAX_HEAD_SETS if on_space() else LOCAL_MAX_HEAD_SETS)
    return max(1, cap)


@dataclass
class TrainRequest:
    """What the Train form asks for (the papers' hyperparameters by their symbols).

    ``tau`` is the mass temperature of both sides (tau_v = tau_t, ConceptOT Eq. 3),
    ``tau_local`` the local loss temperature tau_l (Eq. 9), ``max_steps`` 0 means
    ``epochs`` full passes."""

    methods: list[str]
    data: str = WORLD
    n_train: int = 2000
    folder: str = ""
    uploads: list[str] = field(default_factory=list)
    split: str = "train"
    eps: float = TrainConfig.eps
    tau: float = TrainConfig.tau_v
    tau_local: float = TrainConfig.tau_local
    rank: int = TrainConfig.rank
    n_iters: int = TrainConfig.n_iters
    lambda_local: float = TrainConfig.lambda_local
    hard_negatives: int = TrainConfig.hard_negatives
    epochs: int = TrainConfig.epochs
    max_steps: int = 0
    batch_size: int = TrainConfig.batch_size
    lr: float = TrainConfig.lr


def _check_range(name: str, value: float, low: float, high: float, low_open: bool = False):
    bad = value <= low if low_open else value < low
    if bad or value > high or value != value:
        lo = "(" if low_open else "["
        raise InputError(f"{name} must be in {lo}{low:g}, {high:g}], got {value:g}")


def check_request(request: TrainRequest) -> None:
    """Raise :class:`InputError` for a request no run should start with."""
    if not request.methods:
        raise InputError("pick at least one method to train")
    unknown = [m for m in request.methods if m not in ALIGN_METHODS]
    if unknown:
        raise InputError(f"unknown method(s) {unknown}; choose from {list(ALIGN_METHODS)}")
    if request.data not in data_sources():
        raise InputError(f"unknown data source {request.data!r}; choose one of {data_sources()}")
    _check_range("eps", request.eps, 0.0, 10.0, low_open=True)
    _check_range("tau", request.tau, 0.0, 10.0, low_open=True)
    _check_range("tau_l", request.tau_local, 0.0, 10.0, low_open=True)
    _check_range("r (anchors)", request.rank, 1, 1024)
    _check_range("L (Sinkhorn iterations)", request.n_iters, 1, 200)
    _check_range("lambda_l", request.lambda_local, 0.0, 100.0)
    _check_range("batch size", request.batch_size, 2, 1024)
    _check_range("K_h (hard negatives)", request.hard_negatives, 1, request.batch_size - 1)
    _check_range("epochs", request.epochs, 1, MAX_EPOCHS)
    _check_range("max steps", request.max_steps, 0, 10**7)
    _check_range("learning rate", request.lr, 0.0, 1.0, low_open=True)


# --------------------------------------------------------------------- data
def data_folder(typed: str) -> Path:
    """The folder (or annotation file) ``typed`` in the form, under :func:`data_root`:
    relative to it, or absolute inside it; no ``..``. Anything else, and what does not
    exist, is "not found or not allowed" alike."""
    root = data_root()
    if root is None:
        raise InputError("this server reads no local folders: upload the data instead")
    typed = typed.strip()
    if not typed:
        raise InputError("type the path of an image-caption folder (or its CSV / JSON) under "
                         "the server's data root")
    path = root / typed  # an absolute ``typed`` replaces the root, then must be inside it
    if ".." in Path(typed).parts or not inside(root, path) or not path.exists():
        raise InputError(f"{typed}: {NOT_FOUND} (give a path under the server's data root)")
    return path


def _checked_folder(path: Path, split: str, root: Path | None) -> CaptionFolder:
    """The image-caption folder at ``path``, read confined to ``root``: its captions pass
    the text boxes' rule (the loaders check them) and every image's header the images'
    (:func:`~otviz.boundary.images.check_headers`: pixels, aspect ratio; every bad image
    named in one message), so that a bad folder is refused before training starts."""
    try:
        dataset = load_image_captions(path, split=split, root=root)
        check_headers(dataset.image_paths)
    except (DatasetError, ImageInputError) as e:
        raise InputError(f"cannot train on this data: {e}") from None
    except OSError:
        raise InputError(f"cannot train on this data: a file is {NOT_FOUND}") from None
    return dataset


def resolve_data(request: TrainRequest, upload_dir: Path) -> tuple[str, int]:
    """``(TrainConfig.data, number of training pairs)`` of the request, the folder read and
    checked (every image present) now, so that a bad folder fails before training. Only
    files under the data root (local folder) or among the uploads are read."""
    cap = pair_cap()
    if request.data == WORLD:
        _check_range("world samples", request.n_train, request.batch_size, cap)
        return WORLD, int(request.n_train)
    if request.data == FOLDER:
        path = data_folder(request.folder or "")
        dataset = _checked_folder(path, request.split, data_root())
    else:
        with discarded_if_refused(lone_archive(request.uploads)):  # a refused .zip goes
            path = unpack_uploads(request.uploads, upload_dir)
            dataset = _checked_folder(path, request.split, upload_dir)
    if len(dataset) > cap:
        raise InputError(f"the data has {len(dataset)} pairs; at most {cap} here")
    if len(dataset) < request.batch_size:
        raise InputError(
            f"the data has {len(dataset)} pairs, fewer than one batch of {request.batch_size}: "
            "lower the batch size"
        )
    return str(path), len(dataset)


def train_configs(
    request: TrainRequest,
    data: str,
    n_pairs: int,
    backbone: dict[str, str],
    out: Path,
    cache_dir: str | None = None,
) -> tuple[list[TrainConfig], list[str]]:
    """One :class:`TrainConfig` per method (run directory ``out/<method>``, fresh, on
    ``backbone``'s TrainConfig fields, features cached in ``cache_dir``, default
    TrainConfig's), with the step cap applied, and notes on the caps."""
    cap = step_cap()
    steps_per_epoch = max(1, n_pairs // request.batch_size)
    planned = request.max_steps or request.epochs * steps_per_epoch
    notes = []
    max_steps = request.max_steps
    if planned > cap:
        max_steps = cap
        notes.append(f"capped at {cap} steps per method on this server (asked: {planned})")
    base = TrainConfig(
        data=data,
        split=request.split,
        n_train=n_pairs if data == WORLD else TrainConfig.n_train,
        epochs=request.epochs,
        max_steps=max_steps,
        batch_size=request.batch_size,
        lr=request.lr,
        eps=request.eps,
        tau_v=request.tau,
        tau_t=request.tau,
        n_iters=request.n_iters,
        rank=request.rank,
        lambda_local=request.lambda_local,
        tau_local=request.tau_local,
        hard_negatives=request.hard_negatives,
        resume=False,
        threads=torch.get_num_threads(),  # the server's setting stays as it is
        log_every=0,
        **backbone,
    )
    if cache_dir:
        base = replace(base, cache_dir=str(cache_dir))
    configs = [replace(base, method=m, out=str(out / m)) for m in request.methods]
    return configs, notes


# --------------------------------------------------------------------- jobs
@dataclass
class JobStatus:
    """A consistent copy of a job's state for the page."""

    job_id: str
    state: str  # "running", "finished", "stopped", "failed"
    method: str
    phase: str  # "encoding", "training", "evaluating", ""
    step: int
    total: int
    methods: list[str]
    histories: dict[str, list[dict[str, float]]]
    results: dict[str, TrainResult]
    notes: list[str]
    error: str | None
    picker_entry: str | None
    probe: dict[str, dict[str, float]]
    seconds: float

    @property
    def done(self) -> bool:
        return self.state != "running"


class TrainingJob:
    """One run of one or more methods in a background thread."""

    def __init__(self, ctx: AppContext, backbone: str, configs: list[TrainConfig],
                 notes: list[str], evaluate: bool = True, registry: Path | None = None,
                 on_end: Callable[[], None] | None = None) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.ctx, self.checkpoint, self.configs = ctx, backbone, configs
        self.evaluate, self.registry, self.on_end = evaluate, registry, on_end
        self.stop_event = threading.Event()
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._state, self._phase, self._method = "running", "", configs[0].method
        self._step, self._total = 0, 0
        self._histories: dict[str, list[dict[str, float]]] = {c.method: [] for c in configs}
        self._results: dict[str, TrainResult] = {}
        self._notes = list(notes)
        self._error: str | None = None
        self._entry: str | None = None
        self._probe: dict[str, dict[str, float]] = {}
        self._start = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name=f"otviz-train-{self.id}",
                                       daemon=True)

    def status(self) -> JobStatus:
        with self._lock:
            return JobStatus(
                self.id, self._state, self._method, self._phase, self._step, self._total,
                [c.method for c in self.configs],
                {m: list(h) for m, h in self._histories.items()}, dict(self._results),
                list(self._notes), self._error, self._entry,
                {m: dict(p) for m, p in self._probe.items()},
                time.perf_counter() - self._start,
            )

    def _progress(self, step: int, total: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self._step, self._total = step, total
            if ENCODING in metrics:
                self._phase = ENCODING
            else:
                self._phase = "training"
                self._histories[self._method].append(dict(metrics))

    def _run(self) -> None:
        try:
            heads = self._train_all()
            if heads:  # the methods that finished saved their heads: offered, Stop or not
                self._register_and_probe(heads)
            state = "stopped" if self._cut_short() else "finished"
            with self._lock:
                self._state = state
        except UserInputError as e:
            self._fail(str(e))
        except Exception as e:  # a failed run must end the job and say why, not hang it
            error_id = uuid.uuid4().hex[:8]
            log.exception("training job %s failed (error id %s)", self.id, error_id)
            self._fail(f"training failed: {type(e).__name__}: {e} (error id {error_id})")
        finally:
            with self._lock:
                self._phase = ""
            if self.on_end is not None:
                self.on_end()
            self.finished.set()

    def _cut_short(self) -> bool:
        """Whether Stop ended a method before its end (or before it began); a Stop that
        came after the last step changed nothing."""
        with self._lock:
            results = [self._results.get(c.method) for c in self.configs]
        return any(r is None or r.status == "stopped" for r in results)

    def _fail(self, message: str) -> None:
        """End the job as failed, leaving nothing behind: unless its heads are already in the
        picker, its run directory (unpacked data, partial states) goes; a stopped run keeps
        its resume state instead."""
        with self._lock:
            self._state, self._error = "failed", message
            registered = self._entry is not None
        if not registered:
            shutil.rmtree(Path(self.configs[0].out).parent, ignore_errors=True)

    def _train_all(self) -> dict[str, Path]:
        heads: dict[str, Path] = {}
        for config in self.configs:
            if self.stop_event.is_set():
                break
            with self._lock:
                self._method, self._step, self._total = config.method, 0, 0
            result = train_method(config, self._progress, self.stop_event)
            with self._lock:
                self._results[config.method] = result
                self._notes += result.notes
                if result.status == "skipped":
                    self._notes.append(f"{config.method}: {result.message}")
            if result.head_checkpoint:
                heads[config.method] = Path(result.head_checkpoint)
        return heads

    def _register_and_probe(self, heads: dict[str, Path]) -> None:
        entry = register_head_set(self.ctx, self.registry, self.checkpoint,
                                  "trained here: " + "+".join(heads), heads, head_sets_cap())
        with self._lock:
            self._entry, self._phase = entry, "evaluating"
        if not self.evaluate or self.stop_event.is_set():
            return
        free = self.ctx.suite(self.checkpoint)
        trained = self.ctx.suite(entry)
        explainer = self.ctx.explainer(entry)
        names = list(heads)
        before = run_batch_probe(explainer, _subset(free, names, "free")).accuracy()
        after = run_batch_probe(explainer, _subset(trained, names, "trained")).accuracy()
        with self._lock:
            self._probe = {
                m: {"training-free": before[m]["overall"], "trained": after[m]["overall"]}
                for m in names
            }


def _running_elsewhere(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run in progress of a live process (its owner file, which
    the run's end removes)."""
    return (run_dir / OWNER_FILE).is_file() and owner_alive(run_dir)


def _subset(suite: MethodSuite, names: list[str], tag: str) -> MethodSuite:
    return MethodSuite(suite.backbone, {n: suite.methods[n] for n in names},
                       f"{suite.label} [{tag}]")


class TrainingJobs:
    """The one training slot of a server. At creation it offers again the heads trained
    here before (the registry under ``runs_root``), removes the feature cache's half-built
    entries and cuts it to :func:`cache_cap_bytes`, and cuts the runs folder to
    :func:`runs_cap_bytes` (:meth:`trim_runs`). A run holds one slot of the server's compute
    budget (:mod:`otviz.ui.budget`) while it runs; when it ends its unpacked upload goes and
    both caps are applied again.

    Args:
        ctx: where finished heads are registered.
        runs_root: where run directories (and unpacked uploads) and the head registry go.
        cache_dir: the frozen-backbone feature cache (default: TrainConfig's; on a Space,
            in the temp dir).
        evaluate: score finished heads on the examples gallery's probe.
        budget: the compute budget runs take a slot of (default: the server's).
    """

    def __init__(self, ctx: AppContext, runs_root: Path | None = None,
                 cache_dir: Path | None = None, evaluate: bool = True,
                 budget: ComputeBudget | None = None) -> None:
        self.ctx = ctx
        self.budget = budget or server_budget()
        tmp = Path(tempfile.gettempdir())
        self.runs_root = Path(runs_root or (tmp / "otviz-runs" if on_space() else RUNS_ROOT))
        self.cache_dir = cache_dir or (tmp / "otviz-features" if on_space() else None)
        self.evaluate = evaluate
        self._lock = threading.RLock()  # start() trims the runs, which reads the job
        self._job: TrainingJob | None = None
        for head_set in load_head_sets(self.runs_root):
            if any(b.label == head_set.backbone for b in ctx.backbones):
                ctx.add_head_set(head_set.backbone, head_set.label, head_set.heads)
        FeatureCache(self.feature_cache_dir).remove_stale_builds()
        self.trim_cache()
        self.trim_runs()

    @property
    def feature_cache_dir(self) -> Path:
        return Path(self.cache_dir or TrainConfig.cache_dir)

    def trim_cache(self) -> None:
        """Cut the feature cache to :func:`cache_cap_bytes` (least recently used first)."""
        FeatureCache(self.feature_cache_dir).evict(cache_cap_bytes())

    def run_dirs(self) -> list[Path]:
        """The run directories, oldest first (their names start with their start time)."""
        if not self.runs_root.is_dir():
            return []
        return sorted(d for d in self.runs_root.iterdir()
                      if d.is_dir() and not d.name.startswith("."))

    def trim_runs(self) -> list[Path]:
        """Cut the runs folder to :func:`runs_cap_bytes`: finished runs go oldest first; the
        run in progress and the runs holding a head the picker offers stay. Returns the
        removed run directories."""
        job = self.current()
        kept = set()
        if job is not None and not job.finished.is_set():
            kept.add(Path(job.configs[0].out).parent.resolve())
        for head_set in self.ctx.head_sets:
            kept.update(p.resolve().parent.parent for p in head_set.heads.values())
        runs = self.run_dirs()
        sizes = [disk_bytes(d, recursive=True) for d in runs]
        return evict_oldest(runs, sizes, runs_cap_bytes(),
                            keep=[d.resolve() in kept or _running_elsewhere(d) for d in runs])

    def _run_ended(self, job: TrainingJob, work: Work) -> None:
        """A run's end: its unpacked upload goes, and the resume state of each method that
        finished (its head stays; a stopped method keeps its state), and its owner file
        (another server may now evict it); its budget slot is freed, its measured time per
        step updates the budget's estimate, both caps are applied."""
        run_dir = Path(job.configs[0].out).parent
        shutil.rmtree(run_dir / UPLOAD_DIR, ignore_errors=True)
        (run_dir / OWNER_FILE).unlink(missing_ok=True)
        self.budget.release(work)
        for result in job.status().results.values():
            if result.status == "finished" and result.state_checkpoint:
                shutil.rmtree(result.state_checkpoint, ignore_errors=True)
            if result.seconds_per_step:
                self.budget.costs.record("train_step", result.seconds_per_step)
        self.trim_cache()
        self.trim_runs()

    def current(self) -> TrainingJob | None:
        with self._lock:
            return self._job

    def start(self, request: TrainRequest, checkpoint: str) -> TrainingJob:
        """Check the request and its data, then start training it in the background.

        Raises:
            TrainingBusyError: another run is in progress on this server.
            InputError: a bad request or data (missing files, empty folder, ...).
        """
        with self._lock:
            if self._job is not None and not self._job.finished.is_set():
                raise TrainingBusyError(self._busy_message(self._job.status()))
            check_request(request)
            choice = self.ctx.backbone_choice(checkpoint)
            steps = min(request.max_steps or step_cap(), step_cap())
            work = self.budget.acquire(
                visitor(), "training", len(request.methods) * steps
                * self.budget.costs.unit("train_step"), capped=False)
            self.trim_runs()  # room for this run's upload
            run_dir = self.runs_root / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            try:
                run_dir.mkdir(parents=True)
                write_owner(run_dir)  # in progress: no server sharing the folder evicts it
                data, n_pairs = resolve_data(request, run_dir / UPLOAD_DIR)
                configs, notes = train_configs(request, data, n_pairs, choice.train_backbone,
                                               run_dir, self.cache_dir)
            except BaseException:  # a refused request leaves no files and frees its slot
                shutil.rmtree(run_dir, ignore_errors=True)
                self.budget.release(work)
                raise
            job = TrainingJob(self.ctx, choice.label, configs, notes, self.evaluate,
                              self.runs_root)
            job.on_end = functools.partial(self._run_ended, job, work)
            self._job = job
            job.thread.start()
            return job

    def stop(self, job_id: str | None) -> bool:
        """Ask the run ``job_id`` to stop after its current step; False when that run is
        not the one in progress (only its starter holds its id)."""
        with self._lock:
            job = self._job
        if job is None or job.id != job_id or job.finished.is_set():
            return False
        job.stop_event.set()
        return True

    @staticmethod
    def _busy_message(status: JobStatus) -> str:
        where = f"step {status.step}/{status.total}" if status.total else "starting"
        method = METHOD_LABELS.get(status.method, status.method)
        return (
            f"A training run is already in progress on this server ({method}, {where}). "
            "One run at a time: try again when it has finished."
        )


def status_record(status: JobStatus) -> dict[str, Any]:
    """The job's outcome as JSON-able data (downloads, tests)."""
    return {
        "state": status.state,
        "methods": status.methods,
        "results": {
            m: {"status": r.status, "message": r.message, "steps": r.steps,
                "total_steps": r.total_steps, "head": r.head_checkpoint,
                "seconds_per_step": r.seconds_per_step}
            for m, r in status.results.items()
        },
        "probe_accuracy": status.probe,
        "notes": status.notes,
        "error": status.error,
        "picker_entry": status.picker_entry,
    }
