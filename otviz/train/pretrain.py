"""Train the embedded tiny CLIP from scratch on the synthetic world.

Symmetric contrastive loss over the batch: CLIP's two InfoNCE losses (OT-CLIP Eq. 3-4),
which OT-CLIP Sec. 3.1 reads as inverse entropic OT with one marginal constraint each
(Eq. 5-6); optionally with the world's hard-negative captions as extra image->text
negatives; or another OT-CLIP loss kind (Eq. 7-10; both in :mod:`otviz.train.losses`).
Optionally a local term next to it (``local_weight``): FILIP's token-wise late-interaction
loss between patch and caption tokens (:mod:`otviz.train.local_alignment`). A run may start
from a saved checkpoint's weights (``init_from``) and run under bfloat16 autocast (``bf16``).
AdamW with linear warm-up and cosine decay, held-out retrieval (``held_out``, e.g.
:class:`otviz.eval.held_out.HeldOutRetrieval`), and a checkpoint written atomically
(safetensors + JSON with the recipe, the world version, the metrics and the training log).

Data-parallel on the training engine of :mod:`otviz.train.distributed` (``torch.distributed``
under ``torchrun``): each process renders its share of the training set and embeds its
share of every batch; the contrastive loss is taken over the whole gathered batch and the
gradients are summed, so a step is the same full-batch step as on one process.

Command line (flags are the :class:`PretrainConfig` fields; the defaults reproduce the
shipped ``checkpoints/tiny-clip``)::

    otviz pretrain --steps 300 --out /tmp/tiny-clip             # --processes 2 by default
    torchrun --nproc-per-node 4 -m otviz pretrain --out /tmp/tiny-clip
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from otviz.data.rendered import (
    RenderedSplit,
    draw_negatives,
    negative_weights,
    normalise,
    random_shift,
    render_split,
    render_split_cached,
)
from otviz.process_group import DistInfo
from otviz.tiny_clip.model import (
    TINY_CLIP_NAME,
    create_tiny_clip,
    load_tiny_clip,
    restrict_token_rows,
    save_tiny_clip,
)
from otviz.train import distributed as D
from otviz.train.distributed import gather
from otviz.train.global_head import check_global_loss
from otviz.train.local_alignment import content_mask, encode_with_tokens, filip_loss
from otviz.train.losses import contrastive_loss
from otviz.train.pretrain_config import PretrainConfig
from otviz.train.pretrain_state import TrainingState
from otviz.world import World, WorldConfig

Progress = Callable[[int, int, dict[str, float]], None]


class HeldOut(Protocol):
    """A held-out evaluation of the model being trained (run on rank 0)."""

    ceiling: dict[str, float]  # facts of the held-out data, reported with the metrics

    def __call__(self, model: nn.Module) -> dict[str, float]: ...


#: Builds the :class:`HeldOut` of a run from ``(world, seed, n_test, context_length)``.
HeldOutFactory = Callable[[WorldConfig, int, int, int], HeldOut]


def pretrain(config: PretrainConfig, progress: Progress | None = None,
             held_out: HeldOutFactory | None = None) -> dict[str, Any]:
    """Train a tiny CLIP with ``config``; returns the final metrics (also saved with the
    checkpoint in ``config.out`` unless it is empty). ``progress(step, total, log_entry)`` is
    called after every step. ``held_out`` builds the held-out evaluation run every
    ``eval_every`` steps and at the end (:class:`otviz.eval.held_out.HeldOutRetrieval`:
    Recall@K on the world's test split); ``None``: the loss alone.

    Processes (:mod:`otviz.train.distributed`): inside a ``torchrun`` job, this process is
    one of the job's (``processes`` becomes the job's size); else with ``processes > 1``
    the run starts such a job of that many processes (one CPU core each at ``threads=1``,
    which on small matrices scales far better than threads inside one process) and
    returns rank 0's result; else it trains here. The caller's thread count is kept.
    """
    if D.in_job():
        config = dataclasses.replace(config, processes=D.job_size())
    _check(config)
    if config.processes > 1 and not D.in_job():
        return D.launch(_process, (config, held_out), config.processes, progress)
    return _process(config, held_out, progress)


def _check(config: PretrainConfig) -> None:
    check_global_loss(config.loss)
    if config.hard_negatives and config.loss != "infonce":
        raise ValueError(
            f"hard_negatives needs loss='infonce' (for loss={config.loss!r} pass "
            "--hard-negatives 0: the OT-CLIP losses have no extra text negatives)"
        )
    if config.processes < 1 or config.batch_size % config.processes:
        raise ValueError("batch_size must be a positive multiple of processes")
    device = torch.device(config.device)  # refuses a malformed name
    if device.type != "cpu" and config.processes > 1:
        raise ValueError(f"--device {config.device} runs in one process: pass --processes 1")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {config.device}: no CUDA device is available here")


def _process(config: PretrainConfig, held_out: HeldOutFactory | None,
             progress: Progress | None) -> dict[str, Any]:
    """This process's part of the run, in the process group of the ``torchrun`` job it
    belongs to (alone: none); ``progress`` is called on rank 0 only."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    info = D.setup("cpu")  # several processes compute on the CPU (checked above)
    try:
        return _pretrain(config, progress if info.is_main else None, held_out, info)
    finally:
        D.teardown(info)
        torch.set_num_threads(threads)


def training_split(config: PretrainConfig, info: DistInfo | None = None) -> RenderedSplit:
    """This process's share of the rendered training set (all of it in one process, from
    ``config.data_cache`` when set, rendered there first if missing)."""
    info = info or DistInfo()
    train_cfg = dataclasses.replace(config.world_config(), negatives=config.hard_negatives > 0)
    if config.data_cache and not info.distributed:
        return render_split_cached(config.data_cache, "train", config.n_train, config.seed,
                                   config.context_length, train_cfg, config.render_workers)
    return render_split("train", config.n_train, config.seed, config.context_length, train_cfg,
                        shard=(info.rank, info.world_size))


@dataclass
class _Run:
    """One process's pre-training run: its data, model, optimiser, schedule, random stream,
    epoch order and log."""

    config: PretrainConfig
    info: DistInfo
    train: RenderedSplit
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    generator: torch.Generator
    order: Tensor
    negative_weights: Tensor | None = None
    cursor: int = 0
    step: int = 0
    log: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return torch.device(self.config.device)

    @property
    def local_batch(self) -> int:
        return self.config.batch_size // self.info.world_size

    @property
    def mean_std(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        pp = self.model.visual.preprocess_cfg
        return tuple(pp["mean"]), tuple(pp["std"])


def _build_model(config: PretrainConfig, train: RenderedSplit, info: DistInfo) -> nn.Module:
    """The tiny CLIP at its start, the same in every process: seeded weights (or those of
    ``init_from``), token rows restricted to the ids any process's data uses."""
    cfg = config.model_config()
    model = create_tiny_clip(cfg, seed=config.seed)
    if config.init_from:
        _load_initial_weights(model, config.init_from, cfg)
    vocab = model.text.token_embedding.weight.shape[0]
    ids = train.ids if train.negative_ids is None else torch.cat(
        [train.ids.reshape(-1), train.negative_ids.reshape(-1)])
    restrict_token_rows(model, D.union(ids, vocab, info))
    return model.to(torch.device(config.device)).train()


def _start(config: PretrainConfig, train: RenderedSplit, model: nn.Module,
           info: DistInfo) -> _Run:
    """Optimiser, schedule and this process's random stream and epoch order."""
    optimizer = _optimizer(model, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config))
    generator = torch.Generator().manual_seed(config.seed + 7919 * info.rank)
    order = torch.randperm(len(train), generator=generator)
    return _Run(config, info, train, model, optimizer, schedule, generator, order,
                negative_weights(config.negative_weights))


def _resume(run: _Run, state: TrainingState) -> None:
    """Continue from the state a stopped run left (``resume``), if any."""
    if not run.config.resume or (saved := state.load(run.config)) is None:
        return
    run.step, run.cursor, run.order, run.log, run.metrics = saved.restore(
        run.model, run.optimizer, run.schedule, run.generator)
    if run.info.is_main:
        tqdm.write(f"resuming from step {run.step} ({state.path})")


def _next_batch(run: _Run, images: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """This process's images (shifted, normalised) and captions (then their hard negatives)
    of the next step, drawn in epoch order (a new order once an epoch is used up)."""
    config, batch = run.config, run.local_batch
    if run.cursor + batch > len(run.order):
        run.order, run.cursor = torch.randperm(len(run.train), generator=run.generator), 0
    idx = run.order[run.cursor : run.cursor + batch]
    run.cursor += batch
    on_device = idx.to(run.device)
    mean, std = run.mean_std
    shifted = random_shift(images[on_device], config.max_shift, run.generator)
    texts = ids[on_device]
    if config.hard_negatives:
        negatives = draw_negatives(run.train, idx, config.hard_negatives, run.generator,
                                   run.negative_weights)
        texts = torch.cat([texts, negatives.to(run.device)])
    return normalise(shifted, mean, std), texts


def _train_step(run: _Run, images: Tensor, texts: Tensor) -> dict[str, float]:
    """One optimiser step on the whole batch: the loss over the gathered batch, this
    process's share of its gradient summed over the processes (the logit scale, which
    every process differentiates in full, averaged), AdamW, the schedule, the logit-scale
    clamp. Returns the step's log entry."""
    config, model = run.config, run.model
    with torch.autocast(run.device.type, torch.bfloat16, enabled=config.bf16):
        loss = batch_loss(model, images, texts, config, run.info, run.local_batch)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    D.sum_gradients(model, run.info)
    if run.info.distributed:
        model.logit_scale.grad.div_(run.info.world_size)
    run.optimizer.step()
    run.schedule.step()
    with torch.no_grad():
        model.logit_scale.clamp_(0, math.log(100))
    run.step += 1
    return {"step": run.step, "loss": loss.item(), "lr": run.schedule.get_last_lr()[0],
            "logit_scale": model.logit_scale.exp().item()}


def _pretrain(config: PretrainConfig, progress: Progress | None,
              held_out: HeldOutFactory | None, info: DistInfo) -> dict[str, Any]:
    """The run on this process (rank 0 evaluates, reports and saves); see :func:`pretrain`."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    torch.manual_seed(config.seed)
    train = training_split(config, info)
    evaluation = None
    if info.is_main and held_out is not None:
        evaluation = held_out(config.world_config(), config.seed, config.n_test,
                              config.context_length)
    t_data = time.perf_counter() - t_start
    run = _start(config, train, _build_model(config, train, info), info)
    state = TrainingState(config.state_dir(), info)
    _resume(run, state)
    images, ids = train.images.to(run.device), train.ids.to(run.device)
    bar = tqdm(range(run.step + 1, config.steps + 1), desc="pretrain", unit="step",
               mininterval=2.0, disable=not info.is_main, initial=run.step, total=config.steps)
    t_train = time.perf_counter()
    for step in bar:
        entry = _train_step(run, *_next_batch(run, images, ids))
        due = step == config.steps or (config.eval_every and step % config.eval_every == 0)
        if evaluation is not None and due:
            run.metrics = evaluation(run.model)
            entry.update(run.metrics, cpu_time_s=time.process_time() - cpu_start)
            tqdm.write(f"step {step}: loss {entry['loss']:.3f} " + " ".join(
                f"{k} {v:.3f}" for k, v in run.metrics.items()))
        run.log.append(entry)
        bar.set_postfix(loss=f"{entry['loss']:.3f}")
        if progress is not None:
            progress(step, config.steps, entry)
        if state.path is not None and step % config.save_every == 0 and step < config.steps:
            state.save(config, step, run.model, run.optimizer, run.schedule, run.generator,
                       run.order, run.cursor, run.log, run.metrics)
    train_time = time.perf_counter() - t_train
    run.model.eval()
    if not info.is_main:
        return {}
    result: dict[str, Any] = {
        **run.metrics,
        **(evaluation.ceiling if evaluation is not None else {}),
        "n_test": config.n_test,
        "final_loss": run.log[-1]["loss"],
        "first_loss": run.log[0]["loss"],
        "epochs": config.steps * config.batch_size / config.n_train,
        "n_params": sum(p.numel() for p in run.model.parameters()),
        "data_time_s": t_data,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - t_start,
        "cpu_time_s": time.process_time() - cpu_start,  # of the main process
        "threads": config.threads,
        "processes": config.processes,
    }
    if config.out:
        result["checkpoint_bytes"] = _save(config, run, result)
    state.clear()
    return result


def _save(config: PretrainConfig, run: _Run, result: dict[str, Any]) -> int:
    """Write the checkpoint (weights, recipe, command, world version, metrics, log) to
    ``config.out``; its size in bytes."""
    world_cfg = config.world_config()
    meta = {
        "model_name": TINY_CLIP_NAME,
        "world_version": world_version(world_cfg),
        "world_config": _world_meta(world_cfg),
        "recipe": dataclasses.asdict(config),
        "command": command_line(config),
        "metrics": result,
        "log": run.log,
    }
    path = save_tiny_clip(config.out, run.model, config.model_config(), meta)
    return sum(f.stat().st_size for f in Path(path).iterdir())


def batch_loss(model: nn.Module, images: Tensor, texts: Tensor, config: PretrainConfig,
               info: DistInfo, local_batch: int) -> Tensor:
    """The step's loss over the whole (gathered) batch: the global contrastive loss, plus
    ``local_weight`` times FILIP's token-wise loss (:mod:`otviz.train.local_alignment`) over
    the batch's matched captions (its cost grows with the square of the batch, so the hard
    negative captions stay global-only)."""

    def gather_texts(x: Tensor) -> Tensor:  # captions of every process, then their negatives
        return torch.cat([gather(part, info) for part in x.split(
            [local_batch, len(x) - local_batch]) if len(part)])

    if not config.local_weight:
        image_emb, text_emb, scale = model(images, texts)
        return contrastive_loss(gather(image_emb, info), gather_texts(text_emb), scale,
                                config.loss)
    image_emb, text_emb, patches, tokens = encode_with_tokens(model, images, texts)
    scale = model.logit_scale.exp()
    global_loss = contrastive_loss(gather(image_emb, info), gather_texts(text_emb), scale,
                                   config.loss)
    captions = slice(0, local_batch)  # the matched captions only: the B x B pairs
    local_loss = filip_loss(gather(patches, info), gather(tokens[captions], info),
                            content_mask(gather(texts[captions], info)), scale)
    return global_loss + config.local_weight * local_loss


def _load_initial_weights(model: nn.Module, path: str, cfg: dict[str, Any]) -> None:
    """Copy a tiny-CLIP checkpoint's weights into ``model`` (a run continued from it with a
    new recipe); its architecture must be ``cfg``."""
    source, meta = load_tiny_clip(path)
    if meta["model_cfg"] != cfg:
        raise ValueError(f"--init-from {path}: its model config differs from this recipe's")
    model.load_state_dict(source.state_dict())


def command_line(config: PretrainConfig, program: str = "otviz pretrain") -> str:
    """The command reproducing ``config`` (non-default fields as flags)."""
    default = PretrainConfig()
    parts = shlex.split(program)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        flag = f.name.replace("_", "-")
        if value == getattr(default, f.name):
            continue
        if isinstance(value, bool):
            parts.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            parts += [f"--{flag}", str(value)]
    return shlex.join(parts)


def _optimizer(model: nn.Module, config: PretrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on gains, biases, embeddings of positions/class and the
    temperature (the usual CLIP split)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        flat = p.ndim < 2 or "logit_scale" in name or "positional" in name or "class_emb" in name
        (no_decay if flat else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
        fused=True,  # one kernel for all parameters (CPU and CUDA), not a loop over tensors
    )


def _lr_lambda(config: PretrainConfig) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_steps``, then cosine decay to zero at ``steps``."""

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        span = max(1, config.steps - config.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - config.warmup_steps) / span)))

    return factor


def _world_meta(cfg: WorldConfig) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def world_version(config: WorldConfig | None = None, per_split: int = 16) -> str:
    """A fingerprint of what the world renders (SHA-256, first 16 hex digits) over the first
    ``per_split`` samples of each split at seed 0: image bytes, caption, gold tree, objects
    and negatives. Refactoring the world's code keeps it; any change to a sample changes it,
    so a checkpoint records the data it was trained on rather than the code's text."""
    digest = hashlib.sha256()
    for split in ("train", "test", "compositional"):
        world = World(config, split=split, seed=0)
        for i in range(per_split):
            s = world.sample(i)
            digest.update(s.image.tobytes())
            fields = (s.caption, str(s.tree), repr(s.objects), sorted(s.negatives.items()))
            digest.update(repr(fields).encode() + b"\0")
    return digest.hexdigest()[:16]

