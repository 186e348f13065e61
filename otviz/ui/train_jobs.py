"""Training method heads from the app: one run at a time per server in a background thread,
through the same :func:`otviz.train.loop.train_method` the command line uses, on the
:class:`~otviz.train.config.TrainConfig` s that :mod:`otviz.ui.train_policy` makes of the
form's request (checked, capped).

A job trains its methods one after the other, records every progress report, registers the
finished heads in the :class:`~otviz.ui.context.AppContext` (a new checkpoint-picker
entry) and scores them on the examples gallery's compositional probe next to their
training-free configuration; Stop ends it after the current step. When a run ends its
unpacked upload goes and the feature cache and the runs folder are cut back to their caps.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otviz.data.disk_lru import (
    OWNER_FILE,
    dated_dirs,
    discard,
    evict_oldest_dirs,
    owner_alive,
    write_owner,
)
from otviz.data.feature_cache import FeatureCache
from otviz.errors import UserInputError
from otviz.explain import InputError
from otviz.suite import METHOD_LABELS, MethodSuite
from otviz.train.config import TrainConfig
from otviz.train.loop import ENCODING, TrainResult, train_method
from otviz.ui.app_dirs import FEATURES, RUNS, app_dir, cache_cap_bytes, runs_cap_bytes
from otviz.ui.budget import SEED_PAIR_STEP_S, ComputeBudget, Work, server_budget, visitor
from otviz.ui.context import AppContext
from otviz.ui.head_registry import load_head_sets, register_head_set
from otviz.ui.probe_tab import run_batch_probe
from otviz.ui.reading import split_reading
from otviz.ui.run_estimate import TRAINING, RunEstimate
from otviz.ui.shutdown import track
from otviz.ui.train_policy import (
    TrainRequest,
    check_request,
    head_sets_cap,
    planned_steps,
    resolve_data,
    train_configs,
)

log = logging.getLogger("otviz.ui.train_jobs")

#: The folder of a run that holds its unpacked upload (removed when the run ends).
UPLOAD_DIR = "data"
#: The record of a run's outcome (:func:`status_record`), written in its folder when it ends.
RECORD_FILE = "run.json"


class TrainingBusyError(InputError):
    """Another training run holds this server."""


class StoppedWhileEncoding(Exception):
    """Stop came while the feature cache was being built (raised from its progress report,
    which the build's cleanup then handles)."""


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
    """One run of one or more methods in a background thread, on ``backbone``: the picked
    backbone's label with the page's reading (:mod:`otviz.ui.reading`), which the heads are
    trained and probed on (the picker's new entry names the model and head set only; a pick
    of it opens the reading its heads record); ``planned`` steps each, guessed at ``step_s``
    seconds a step until the run measures its own (:class:`RunEstimate`)."""

    def __init__(self, ctx: AppContext, backbone: str, configs: list[TrainConfig],
                 notes: list[str], planned: list[int], step_s: float, evaluate: bool = True,
                 registry: Path | None = None, on_end: Callable[[], None] | None = None
                 ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.ctx, self.checkpoint, self.configs = ctx, backbone, configs
        self.planned, self.estimate = planned, RunEstimate(planned, step_s)
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
        if ENCODING in metrics and self.stop_event.is_set():
            raise StoppedWhileEncoding
        phase = ENCODING if ENCODING in metrics else TRAINING
        self.estimate.report(phase, step, total)
        with self._lock:
            self._step, self._total, self._phase = step, total, phase
            if phase == TRAINING:
                self._histories[self._method].append(dict(metrics))

    def remaining_s(self) -> float:
        """Seconds this run still needs to train, never more than it said before
        (:class:`RunEstimate`; the probe that scores the heads after training is not
        counted)."""
        return self.estimate.left_s()

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
        for index, config in enumerate(self.configs):
            if self.stop_event.is_set():
                break
            self.estimate.start_method(index)
            with self._lock:
                self._method, self._step, self._total = config.method, 0, 0
                self._phase = ""
            try:
                result = train_method(config, self._progress, self.stop_event)
            except StoppedWhileEncoding:
                result = TrainResult(config.method, "stopped", "stopped while encoding the data")
            with self._lock:
                self._results[config.method] = result
                self._notes += result.notes
                if result.status == "skipped":
                    self._notes.append(f"{config.method}: {result.message}")
            if result.head_checkpoint:
                heads[config.method] = Path(result.head_checkpoint)
        self.estimate.end()
        return heads

    def _register_and_probe(self, heads: dict[str, Path]) -> None:
        backbone, reading = split_reading(self.checkpoint)
        entry = register_head_set(self.ctx, self.registry, backbone,
                                  "trained here: " + "+".join(heads), heads, head_sets_cap())
        with self._lock:  # the picker's entry; the controls name the reading
            self._entry, self._phase = entry, "evaluating"
        if not self.evaluate or self.stop_event.is_set():
            return
        read = entry + reading.suffix  # the heads read the backbone as they were trained
        free = self.ctx.suite(self.checkpoint)
        trained = self.ctx.suite(read)
        explainer = self.ctx.explainer(read)
        names = list(heads)
        before = run_batch_probe(explainer, _subset(free, names, "free")).accuracy()
        after = run_batch_probe(explainer, _subset(trained, names, "trained")).accuracy()
        with self._lock:
            self._probe = {
                m: {"training-free": before[m]["overall"], "trained": after[m]["overall"]}
                for m in names
            }


def _run_dirs(heads: list[Path]) -> set[Path]:
    """The run folders (resolved) holding ``heads`` (``<run>/<method>/head``)."""
    return {p.resolve().parent.parent for p in heads}


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
        runs_root: where run directories (and unpacked uploads) and the head registry go
            (default: the app's runs folder, :mod:`otviz.ui.app_dirs`).
        cache_dir: the frozen-backbone feature cache (default: the app's, shared with
            Browse).
        evaluate: score finished heads on the examples gallery's probe.
        budget: the compute budget runs take a slot of (default: the server's).
    """

    def __init__(self, ctx: AppContext, runs_root: Path | None = None,
                 cache_dir: Path | None = None, evaluate: bool = True,
                 budget: ComputeBudget | None = None) -> None:
        self.ctx = ctx
        self.budget = budget or server_budget()
        self.runs_root = Path(runs_root or app_dir(RUNS))
        self.cache_dir = Path(cache_dir or app_dir(FEATURES))
        self.evaluate = evaluate
        self._lock = threading.RLock()  # start() trims the runs, which reads the job
        self._job: TrainingJob | None = None
        for head_set in load_head_sets(self.runs_root):
            if any(b.label == head_set.backbone for b in ctx.backbones):
                ctx.add_head_set(head_set.backbone, head_set.label, head_set.heads)
        FeatureCache(self.cache_dir).remove_stale_builds()
        self.remove_dead_runs()
        self.trim_cache()
        self.trim_runs()
        track(self)  # a server stop ends the run in progress at its next step

    def trim_cache(self) -> None:
        """Cut the feature cache to :func:`cache_cap_bytes` (least recently used first)."""
        FeatureCache(self.cache_dir).evict(cache_cap_bytes())

    def remove_dead_runs(self) -> list[Path]:
        """Remove the folders of runs whose server died before the run ended (a stop that
        cut it, a crash): no record (:data:`RECORD_FILE`), an owner process that is gone
        (:func:`~otviz.data.disk_lru.owner_alive`), no head the registry lists (a run cut
        while its heads were probed keeps them offered). Returns the removed folders."""
        registered = load_head_sets(self.runs_root, complete_only=False)
        offered = _run_dirs([p for s in registered for p in s.heads.values()])
        dead = [d for d in dated_dirs(self.runs_root)
                if not (d / RECORD_FILE).exists() and d.resolve() not in offered
                and not owner_alive(d)]
        for run_dir in dead:
            log.info("removing %s: its server stopped before the run ended", run_dir.name)
            discard(run_dir)
        return dead

    def trim_runs(self) -> list[Path]:
        """Cut the runs folder to :func:`~otviz.ui.app_dirs.runs_cap_bytes`: finished
        runs go oldest first; the run in progress (here or in another live process) and the
        runs holding a head the picker offers stay. Returns the removed run directories."""
        job = self.current()
        kept = set()
        if job is not None and not job.finished.is_set():
            kept.add(Path(job.configs[0].out).parent.resolve())
        kept |= _run_dirs([p for s in self.ctx.head_sets for p in s.heads.values()])
        return evict_oldest_dirs(self.runs_root, runs_cap_bytes(), kept)

    def _run_ended(self, job: TrainingJob, work: Work) -> None:
        """A run's end: its record (:data:`RECORD_FILE`) is written, its unpacked upload
        goes, and the resume state of each method that
        finished (its head stays; a stopped method keeps its state), and its owner file
        (another server may now evict it); its budget slot is freed, its measured time per
        step updates the budget's estimate, both caps are applied."""
        run_dir = Path(job.configs[0].out).parent
        if run_dir.is_dir():  # a failed run's folder is gone
            (run_dir / RECORD_FILE).write_text(json.dumps(status_record(job.status())))
        shutil.rmtree(run_dir / UPLOAD_DIR, ignore_errors=True)
        (run_dir / OWNER_FILE).unlink(missing_ok=True)
        self.budget.release(work)
        for result in job.status().results.values():
            if result.status == "finished" and result.state_checkpoint:
                shutil.rmtree(result.state_checkpoint, ignore_errors=True)
            if result.seconds_per_step:
                self.budget.costs.record("train_pair",
                                         result.seconds_per_step / job.configs[0].batch_size)
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
            read, reading = self.ctx.reading(checkpoint)  # heads train on the page's reading
            self.ctx.explainer(checkpoint)  # the tower gives it (a block it has), or a message
            config = request.config
            # a step's guess until the run measures its own: the budget's learned cost, never
            # below its seed bound (a countdown that never goes up must not start low)
            step_s = config.batch_size * max(self.budget.costs.unit("train_pair"),
                                             SEED_PAIR_STEP_S)
            work = self.budget.acquire(
                visitor(), "training", len(request.methods) * step_s
                * planned_steps(config, config.n_train), capped=False)
            self.trim_runs()  # room for this run's upload
            run_dir = self.runs_root / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
            try:
                run_dir.mkdir(parents=True)
                write_owner(run_dir)  # in progress: no server sharing the folder evicts it
                data, n_pairs = resolve_data(request, run_dir / UPLOAD_DIR)
                configs, notes = train_configs(request, data, n_pairs,
                                               {**choice.train_backbone, **reading.train_fields},
                                               run_dir, self.cache_dir)
            except BaseException:  # a refused request leaves no files and frees its slot
                shutil.rmtree(run_dir, ignore_errors=True)
                self.budget.release(work)
                raise
            job = TrainingJob(self.ctx, read, configs, notes,
                              [planned_steps(c, n_pairs) for c in configs], step_s,
                              self.evaluate, self.runs_root)
            job.on_end = functools.partial(self._run_ended, job, work)
            work.remaining = job.remaining_s  # a refusal's "try again in" follows the run
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

    def stop_all(self) -> None:
        """Ask the run in progress, if any, to stop at its next step (the server stops)."""
        job = self.current()
        if job is not None:
            job.stop_event.set()

    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the run in progress, if any, to end (its record
        and resume state written); whether it did."""
        job = self.current()
        return job is None or job.finished.wait(timeout_s)

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
