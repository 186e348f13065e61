"""Train a method head on a frozen backbone (ConceptOT Sec. 2.4, 3.1, App. E Alg. 2).

:func:`train_method` runs the recipe for any method of the registry: each step takes a
global batch of B cached pairs, computes the global term and the ``[B, B]`` global scores,
mines K_h hard negatives per direction (:mod:`otviz.train.negatives`), scores the
positives and negatives in one batched method call and minimises Eq. 10 (or the method's
own local loss, :mod:`otviz.train.losses`) with AdamW, gradient clipping and a warm-up +
cosine schedule. Only the method's parameters (and an optional global head) train.

Early stopping (``n_val > 0``): after every epoch the objective's loss on the world's
``val`` split (:class:`Validation`); the published head is the one of the best validation
loss, and ``patience`` epochs without improvement end the run early.

Long runs: ``progress(step, total, metrics)`` after every step, ``stop`` (an Event or a
callable) checked after every step, a resume checkpoint every epoch (or every
``checkpoint_every`` steps), on stop and at the end; a later run with the same ``out``
continues from it. Under ``torchrun`` the same entry point trains data-parallel
(:mod:`otviz.train.distributed`); the loss curve equals the one-process curve.

Command line (flags are the :class:`TrainConfig` fields)::

    otviz train --method conceptot --epochs 3 --out runs/conceptot
    otviz train --method all --out runs/heads --publish checkpoints/heads
    torchrun --nproc-per-node 2 -m otviz train --method dense_uot
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

import otviz.methods  # noqa: F401  (importing the package registers every method)
from otviz.checkpoints.heads import save_method_checkpoint
from otviz.methods.base import METHODS, AlignmentMethod, PairBatch, build_method
from otviz.methods.start import BACKBONE, resolve_start
from otviz.patch_grid.masks import random_boxes
from otviz.train import distributed as D
from otviz.train.anchor_tether import hold_anchors
from otviz.train.config import TrainConfig
from otviz.train.global_head import GlobalHead, check_global_loss
from otviz.train.losses import (
    NO_LOCAL,
    StepTerms,
    TrainObjective,
    local_objective,
    local_weight,
)
from otviz.train.negatives import positive_mask
from otviz.train.pairs import PairSource, build_source
from otviz.train.schedule import warmup_cosine
from otviz.train.train_state import (
    has_train_state,
    load_train_state,
    save_train_state,
    saved_config,
)

log = logging.getLogger("otviz.train")

Progress = Callable[[int, int, dict[str, float]], None]
Stop = threading.Event | Callable[[], bool] | None

#: Key of the progress metrics while the feature cache is being built (step = pairs encoded).
ENCODING = "encoding"
#: Key of the progress metrics while shards are indexed (step = shards read).
INDEXING = "indexing"
HEAD_DIR = "head"
STATE_DIR = "state"
#: Per-step records kept in the head checkpoint's metrics (the convergence curve).
CURVE_KEYS = ("step", "loss", "global", "local")


class ResumeConflictError(ValueError):
    """The run directory holds the state of a run with another recipe."""


@dataclass
class TrainResult:
    """Outcome of :func:`train_method`.

    Attributes:
        method: the method name.
        status: ``"finished"``, ``"stopped"`` (stop requested; resumable) or ``"skipped"``
            (nothing to train).
        message: one line for people.
        steps, total_steps: optimiser steps done (including resumed ones) and planned.
        epochs_done: complete passes over the data.
        history: one record per step: step, epoch, loss (Eq. 10 on the global batch),
            global, local, regulariser, lr, grad_norm, seconds.
        notes: facts about the run worth knowing (e.g. a constant global term).
        global_term_trains: whether ``L_global`` has a gradient (a global head).
        head_checkpoint: the method-head checkpoint (finished runs).
        state_checkpoint: the resume state.
        seconds_per_step: mean wall time of the steps of this call.
        validation: ``(step, validation loss)`` of every validation (``n_val > 0``); the
            head is the step of the lowest.
        data_summary: streamed shards' one line of what was read and skipped ("" else).
    """

    method: str
    status: str
    message: str
    steps: int = 0
    total_steps: int = 0
    epochs_done: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    global_term_trains: bool = False
    head_checkpoint: str | None = None
    state_checkpoint: str | None = None
    seconds_per_step: float | None = None
    validation: list[tuple[int, float]] = field(default_factory=list)
    data_summary: str = ""

    def losses(self) -> list[float]:
        return [h["loss"] for h in self.history]


def _stop_requested(stop: Stop) -> bool:
    if stop is None:
        return False
    if isinstance(stop, threading.Event):
        return stop.is_set()
    return bool(stop())


def _permutation(n: int, seed: int, epoch: int) -> Tensor:
    """The data order of ``epoch``: a function of (seed, epoch) only, so a resumed or a
    multi-process run sees the same batches."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen)


def _nothing_to_train(config: TrainConfig) -> str | None:
    if local_objective(config.method) == NO_LOCAL and not config.train_global_head:
        return (
            f"{config.method} has nothing to train: it has no local loss and its score is "
            "the frozen backbone's pooled cosine. Use --train-global-head to train a global "
            "head with an OT-CLIP loss (--global-loss)."
        )
    return None


def objective_value(terms: StepTerms, local: float, config: TrainConfig) -> float:
    """The reported loss of a batch: ``L_global + lambda * L_local + beta * R + R_A``
    (ConceptOT Eq. 10 plus the anchor regulariser and the anchors' pull,
    :mod:`otviz.train.anchor_tether`), with ``local`` the whole batch's ``L_local``."""
    return (float(terms.global_loss) + local_weight(config) * local
            + config.beta * float(terms.regulariser) + float(terms.anchor_pull))


class Validation:
    """Early stopping on held-out pairs: the mean training objective over ``data`` in
    batches of the training batch size (no gradient, every pair its batch's positive), the
    best loss seen, and how many validations since it improved."""

    def __init__(self, data: PairSource, batch_size: int) -> None:
        if data.n_pairs < batch_size:
            raise ValueError(f"--n-val {data.n_pairs} cannot fill one batch of {batch_size}")
        self.data = data
        self.best = math.inf
        self.best_step = 0
        self.since_best = 0
        self.curve: list[tuple[int, float]] = []

    @torch.no_grad()
    def loss(self, objective: TrainObjective, config: TrainConfig, device: torch.device) -> float:
        """Mean of ``g + lambda * local + beta * reg`` over the validation batches (regions,
        for methods that read them, from a fixed seed)."""
        size, total, batches = config.batch_size, 0.0, 0
        rows = torch.arange(size, device=device)
        for start in range(0, self.data.n_pairs - size + 1, size):
            idx = torch.arange(start, start + size)
            batch = self.data.pair_batch(idx, device)
            if objective.method.uses_regions:
                batch.regions = _regions(config, batch.grid, batch.size, 0).to(device)
            excluded = positive_mask(self.data.image_ids[idx], self.data.text_ids[idx])
            _, terms = objective(batch, excluded.to(device), rows)
            total += objective_value(terms, float(terms.local_part), config)
            batches += 1
        return total / batches

    def record(self, step: int, loss: float) -> bool:
        """Note the loss at ``step``; True when it is the best so far."""
        self.curve.append((step, loss))
        if loss < self.best:
            self.best, self.best_step, self.since_best = loss, step, 0
            return True
        self.since_best += 1
        return False

    def state(self) -> dict[str, object]:
        return {"best": self.best, "best_step": self.best_step, "since_best": self.since_best,
                "curve": self.curve}

    def restore(self, state: dict[str, object]) -> None:
        self.best = float(state["best"])  # type: ignore[arg-type]
        self.best_step = int(state["best_step"])  # type: ignore[call-overload]
        self.since_best = int(state["since_best"])  # type: ignore[call-overload]
        self.curve = [(int(s), float(v)) for s, v in state["curve"]]  # type: ignore[union-attr]


def _validate(config: TrainConfig, info: D.DistInfo) -> None:
    if config.method not in METHODS:
        raise ValueError(f"unknown method {config.method!r}; known: {sorted(METHODS)}")
    check_global_loss(config.global_loss)
    if config.batch_size < max(2, info.world_size):
        raise ValueError(
            f"batch_size {config.batch_size} must be at least 2 and at least the number of "
            f"processes ({info.world_size})"
        )
    if config.hard_negatives < 1:
        raise ValueError("hard_negatives must be at least 1")


def _check_resume(config: TrainConfig, state_dir: Path) -> None:
    conflicts = config.resume_conflicts(saved_config(state_dir))
    if conflicts:
        shown = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in
                          ((k, *v) for k, v in sorted(conflicts.items())))
        raise ResumeConflictError(
            f"{state_dir} holds a run with another recipe ({shown}); use another --out or "
            "--no-resume to start over"
        )


def _regions(config: TrainConfig, grid: tuple[int, int], size: int, step: int) -> Tensor:
    """PowerCLIP-R region masks of a step (random boxes, Sec. 3.2), seeded by the step."""
    return random_boxes(grid, config.n_regions, seed=config.seed * 1_000_003 + step,
                        batch_size=size)


def train_method(
    config: TrainConfig,
    progress: Progress | None = None,
    stop: Stop = None,
    source: PairSource | None = None,
    validation_source: PairSource | None = None,
) -> TrainResult:
    """Train ``config.method`` on frozen-backbone features (see the module docstring).

    Args:
        config: the recipe.
        progress: called on the main process after every step with ``(step, total,
            metrics)``; metrics: loss, global, local, regulariser, lr, epoch, seconds.
            While the feature cache is built it is called with ``(pairs done, pairs,
            {"encoding": 1.0})``.
        stop: a ``threading.Event`` or a callable; when set / True after a step, the run
            saves its state and returns with status ``"stopped"``.
        source: the training pairs; default :func:`otviz.train.pairs.build_source` (the
            configured backbone and data through the feature cache).
        validation_source: the validation pairs when ``config.n_val > 0``; default the
            world's ``val`` split through the feature cache.

    Returns:
        A :class:`TrainResult` (status ``"skipped"`` with the reason when nothing trains).
        The caller's torch thread count is restored afterwards.
    """
    reason = _nothing_to_train(config)
    if reason is not None:
        log.info(reason)
        return TrainResult(config.method, "skipped", reason)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, config.threads))
    info = D.setup(config.device)
    try:
        return _train(config, info, progress, stop, source, validation_source)
    finally:
        D.teardown(info)
        torch.set_num_threads(threads)


def _load_source(
    config: TrainConfig, info: D.DistInfo, source: PairSource | None, progress: Progress | None
) -> PairSource:
    if source is not None:
        return source
    if not info.is_main:  # the main process fills the feature cache, the others read it
        D.barrier(info)
    encoding = indexing = None
    if info.is_main and progress is not None:
        def encoding(done: int, total: int) -> None:
            progress(done, total, {ENCODING: 1.0})

        def indexing(done: int, total: int) -> None:
            progress(done, total, {INDEXING: 1.0})
    built = build_source(config, encoding, info=info, indexing=indexing)
    if info.is_main:
        D.barrier(info)
    return built


def _start_method(config: TrainConfig, data: PairSource) -> AlignmentMethod:
    """The method to train, at its start: with ``config.start == "backbone"`` (or
    ``"auto"`` on a backbone whose projections are affine maps) its projections at the
    backbone's own and its concept space the backbone's joint space
    (:mod:`otviz.methods.start`: step 0 is the training-free configuration), else the
    papers' random start. The head records the start it was built with. ConceptOT's
    anchors are taken out of training with ``config.anchor_hold``
    (:func:`otviz.train.anchor_tether.hold_anchors`)."""
    started = resolve_start(config.start, data.start)
    method_config = dataclasses.replace(config.method_config(), start=started)
    if started != BACKBONE:
        method = build_method(config.method, data.patch_dim, data.token_dim, method_config)
    elif data.start is None:
        raise ValueError("these training pairs carry no backbone projection to start the "
                         "head from; train with --start random or auto")
    else:
        joint = int(data.start.patch_map.weight.shape[0])
        method = build_method(config.method, data.patch_dim, data.token_dim,
                              dataclasses.replace(method_config, concept_dim=joint))
        method.start_from_backbone(data.start)
    hold_anchors(method, config)
    return method


class _Run:
    """The state of one training run on this process: the trainable objective, optimiser,
    schedule, data order, progress and history."""

    def __init__(self, config: TrainConfig, info: D.DistInfo, data: PairSource) -> None:
        self.config, self.info, self.data = config, info, data
        self.spe = data.n_pairs // config.batch_size
        if self.spe < 1:
            raise ValueError(f"{data.n_pairs} pairs cannot fill one batch of {config.batch_size}")
        self.total = config.max_steps if config.max_steps > 0 else config.epochs * self.spe
        self.state_dir = Path(config.out) / STATE_DIR
        self.head_dir = Path(config.out) / HEAD_DIR
        torch.manual_seed(config.seed)
        method = _start_method(config, data)
        head = GlobalHead(data.embed_dim, data.logit_scale) if config.train_global_head else None
        self.objective = TrainObjective(method, config, data.logit_scale, head, info.world_size)
        self.objective.to(info.device)
        self.params = [p for p in self.objective.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, weight_decay=config.weight_decay
        ) if self.params else None
        self.scheduler = None if self.optimizer is None else warmup_cosine(
            self.optimizer, self.total, config.warmup_frac
        )
        self.step, self.history, self.times = 0, [], []
        self.validation: Validation | None = None
        self.notes: list[str] = []
        self._perm: tuple[int, Tensor] | None = None

    def describe(self) -> None:
        """Notes on what trains (and what cannot)."""
        cfg, kind = self.config, self.objective.kind
        n_params = sum(p.numel() for p in self.params)
        self.note(f"{cfg.method}: local loss {kind}, lambda {local_weight(cfg)}, {n_params} "
                  f"trainable parameters, {self.info.world_size} process(es)")
        if self.objective.head is None:
            self.note("the global contrastive term is constant (frozen backbone, no trainable "
                      "global part): it is reported in the loss but has no gradient; "
                      "--train-global-head makes it train")
        if self.objective.method.uses_trees and getattr(self.data, "nodes", None) is None:
            self.note(f"no parse trees in the data: {cfg.method} uses single tokens as nodes")

    def note(self, text: str) -> None:
        self.notes.append(text)
        log.info(text)

    def resume(self) -> None:
        """Continue from the saved state of this run directory, if any."""
        if not (self.config.resume and has_train_state(self.state_dir)):
            return
        _check_resume(self.config, self.state_dir)
        saved = load_train_state(self.state_dir, self.objective, self.optimizer, self.scheduler)
        self.step, self.history = int(saved["step"]), list(saved["history"])
        if self.validation is not None and "validation" in saved:
            self.validation.restore(saved["validation"])
        self.note(f"resumed from {self.state_dir} at step {self.step}")

    def batch(self) -> tuple[Tensor, PairBatch]:
        """The current step's pair indices and global batch: from the source's own stream
        where it has one (``step_batch``: shards, :mod:`otviz.train.streamed`), else the
        epoch permutation's slice of its features."""
        step_batch = getattr(self.data, "step_batch", None)
        if step_batch is not None:
            return step_batch(self.step, self.info.device)
        idx = self.indices()
        return idx, self.data.pair_batch(idx, self.info.device)

    def indices(self) -> Tensor:
        """Pair indices of the current step's global batch."""
        epoch, b = divmod(self.step, self.spe)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, _permutation(self.data.n_pairs, self.config.seed, epoch))
        size = self.config.batch_size
        return self._perm[1][b * size : (b + 1) * size]

    def train_step(self, model: torch.nn.Module) -> dict[str, float]:
        """One optimiser step on the global batch (this process scoring its share of the
        positives); returns its record."""
        cfg, dev, t0 = self.config, self.info.device, time.perf_counter()
        idx, batch = self.batch()
        rows = torch.arange(len(idx), device=dev)[D.shard(len(idx), self.info)]
        if self.objective.method.uses_regions:
            batch.regions = _regions(cfg, batch.grid, batch.size, self.step).to(dev)
        excluded = positive_mask(self.data.image_ids[idx], self.data.text_ids[idx]).to(dev)
        self.optimizer.zero_grad(set_to_none=True)
        loss, terms = model(batch, excluded, rows)
        loss.backward()
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        local = float(D.sum_all(terms.local_part, self.info))
        g, reg = float(terms.global_loss), float(terms.regulariser)
        record = {
            "step": self.step + 1,
            "epoch": self.step // self.spe,
            "loss": objective_value(terms, local, cfg),
            "global": g,
            "local": local,
            "regulariser": reg,
            "anchor_pull": float(terms.anchor_pull),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "pairs": float(len(idx)),
            "seconds": time.perf_counter() - t0,
        }
        if not all(math.isfinite(v) for v in record.values()):
            raise FloatingPointError(f"non-finite loss at step {self.step + 1}: {record}")
        self.history.append(record)
        self.times.append(record["seconds"])
        self.step += 1
        return record

    def validate(self, final: bool = False) -> bool:
        """At an epoch's end (and at the ``final`` step) with validation on: measure,
        publish the head when it is the best so far; returns True when patience has run
        out (stop early)."""
        val = self.validation
        if val is None or (self.step % self.spe and not final):
            return False
        if val.curve and val.curve[-1][0] == self.step:  # measured at this step already
            return False
        loss = val.loss(self.objective, self.config, self.info.device)
        if val.record(self.step, loss):
            self.save_head()
        log.info("step %d validation loss %.4f (best %.4f at step %d)", self.step, loss,
                 val.best, val.best_step)
        return 0 < self.config.patience <= val.since_best

    def checkpoint_due(self) -> bool:
        every = self.config.checkpoint_every if self.config.checkpoint_every > 0 else self.spe
        return self.step % every == 0

    def save_state(self) -> None:
        if self.info.is_main:
            progress = {"step": self.step, "history": self.history}
            position = getattr(self.data, "position", None)
            if position is not None:
                progress["position"] = position(self.step)
            if self.validation is not None:
                progress["validation"] = self.validation.state()
            save_train_state(self.state_dir, self.objective, self.optimizer, self.scheduler,
                             progress, self.config.to_dict())
        D.barrier(self.info)

    def save_head(self) -> None:
        last = self.history[-1] if self.history else {}
        metrics = {"final_loss": last.get("loss"), "final_local": last.get("local"),
                   "steps": self.step, "epochs": self.step / self.spe,
                   "curve": {k: [h[k] for h in self.history] for k in CURVE_KEYS}}
        if self.validation is not None:
            metrics["validation"] = {"loss": self.validation.curve[-1][1],
                                     "curve": self.validation.curve}
        if self.info.is_main:
            save_method_checkpoint(self.head_dir, self.objective.method, self.data.identity,
                                   self.config.to_dict(), metrics, self.objective.head)
        D.barrier(self.info)

    def result(self, status: str, message: str) -> TrainResult:
        return TrainResult(
            method=self.config.method,
            status=status,
            message=message,
            steps=self.step,
            total_steps=self.total,
            epochs_done=self.step // self.spe,
            history=self.history,
            notes=self.notes,
            global_term_trains=self.objective.head is not None,
            head_checkpoint=str(self.head_dir) if status == "finished" else None,
            state_checkpoint=str(self.state_dir),
            seconds_per_step=sum(self.times) / len(self.times) if self.times else None,
            validation=list(self.validation.curve) if self.validation is not None else [],
            data_summary=self.data.summary() if hasattr(self.data, "summary") else "",
        )


def _train(
    config: TrainConfig,
    info: D.DistInfo,
    progress: Progress | None,
    stop: Stop,
    source: PairSource | None,
    validation_source: PairSource | None = None,
) -> TrainResult:
    _validate(config, info)
    run = _Run(config, info, _load_source(config, info, source, progress))
    if config.n_val > 0:
        run.validation = Validation(validation_source or build_source(config, validation=True),
                                    config.batch_size)
    if run.optimizer is None:
        msg = f"{config.method} has no trainable parameters in this configuration; skipped"
        return TrainResult(config.method, "skipped", msg)
    run.describe()
    run.resume()
    model = D.wrap(run.objective, info)
    while run.step < run.total:
        record = run.train_step(model)
        if info.is_main and progress is not None:
            progress(run.step, run.total, record)
        if info.is_main and config.log_every > 0 and run.step % config.log_every == 0:
            log.info("step %d/%d loss %.4f local %.4f lr %.2e", run.step, run.total,
                     record["loss"], record["local"], record["lr"])
        if run.validate(final=run.step == run.total):
            run.save_state()
            val = run.validation
            return run.result("finished", f"stopped early at step {run.step}: no better "
                              f"validation loss in {config.patience} epochs; the head is "
                              f"step {val.best_step}'s")  # type: ignore[union-attr]
        if run.step == run.total:
            break
        stop_now = D.any_all(_stop_requested(stop), info)
        if stop_now or run.checkpoint_due():
            run.save_state()
        if stop_now:
            return run.result("stopped", f"stopped at step {run.step}/{run.total}; resumable")
    run.save_state()
    if run.validation is None:
        run.save_head()
        return run.result("finished", f"trained {config.method} for {run.step} steps")
    return run.result("finished", f"trained {config.method} for {run.step} steps; the head is "
                      f"step {run.validation.best_step}'s (best validation loss)")
