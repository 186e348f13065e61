"""Train the embedded tiny CLIP from scratch on the synthetic world (CPU).

Symmetric contrastive loss over the batch: CLIP's two InfoNCE losses (OT-CLIP Eq. 3-4),
which OT-CLIP Sec. 3.1 reads as inverse entropic OT with one marginal constraint each
(Eq. 5-6); optionally with the world's hard-negative captions as extra image->text
negatives; or another OT-CLIP loss kind of :mod:`otviz.train.otclip_losses` (Eq. 7-10).
Optionally a local term next to it (``local_weight``): FILIP's token-wise late-interaction
loss between patch and caption tokens (:mod:`otviz.train.local_alignment`). A run may start
from a saved checkpoint's weights (``init_from``) and run under bfloat16 autocast (``bf16``).
AdamW with linear warm-up and cosine decay, data-parallel over processes, held-out
retrieval on the world's ``test`` split, and a checkpoint written atomically (safetensors +
JSON with the recipe, the world version, the metrics and the training log).

Command line (flags are the :class:`PretrainConfig` fields; the defaults reproduce the
shipped ``checkpoints/tiny-clip``)::

    python -m otviz.train.pretrain --out checkpoints/tiny-clip
    otviz pretrain --steps 300 --out /tmp/tiny-clip
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import queue as queue_module
import shlex
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
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
    split_from_samples,
)
from otviz.tiny_clip import (
    TINY_CLIP_NAME,
    create_tiny_clip,
    load_tiny_clip,
    restrict_token_rows,
    save_tiny_clip,
)
from otviz.train.local_alignment import content_mask, encode_with_tokens, filip_loss
from otviz.train.pretrain_config import PretrainConfig
from otviz.train.pretrain_state import TrainingState
from otviz.worker_processes import exit_with_parent, worker_context
from otviz.world import World, WorldConfig, ambiguous_caption_share, retrieval_ceiling

Progress = Callable[[int, int, dict[str, float]], None]


def infonce_loss(image_emb: Tensor, text_emb: Tensor, logit_scale: Tensor) -> Tensor:
    """Symmetric InfoNCE of CLIP (OT-CLIP Eq. 3-4) on L2-normalised embeddings, matched pairs
    on the diagonal: the mean of the image->text and text->image cross-entropies. Text rows
    beyond the B images are extra negatives for image->text only (NegCLIP's hard-negative
    captions)."""
    n = image_emb.shape[0]
    logits = logit_scale * image_emb @ text_emb.T  # [B, B + extra]
    target = torch.arange(n, device=logits.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits[:, :n].T, target))


def contrastive_loss(image_emb: Tensor, text_emb: Tensor, logit_scale: Tensor, kind: str) -> Tensor:
    """The batch loss ``kind``: ``"infonce"`` here, any other kind from OT-CLIP's family
    (:func:`otviz.train.otclip_losses.otclip_loss`)."""
    if kind == "infonce":
        return infonce_loss(image_emb, text_emb, logit_scale)
    try:
        from otviz.train.otclip_losses import otclip_loss
    except ImportError as e:
        raise ValueError(f"loss {kind!r} needs otviz.train.otclip_losses ({e})") from e
    return otclip_loss(image_emb, text_emb, logit_scale, kind)


@torch.no_grad()
def embed_split(
    model: nn.Module, data: RenderedSplit, mean, std, batch_size: int = 250
) -> tuple[Tensor, Tensor]:
    """L2-normalised global embeddings ``(images [n, E], texts [n, E])`` of a rendered split
    (on the model's device)."""
    was_training = model.training
    model.eval()
    device = model.logit_scale.device
    imgs, txts = [], []
    for s in range(0, len(data), batch_size):
        images = data.images[s : s + batch_size].to(device)
        imgs.append(model.encode_image(normalise(images, mean, std), normalize=True))
        txts.append(model.encode_text(data.ids[s : s + batch_size].to(device), normalize=True))
    model.train(was_training)
    return torch.cat(imgs), torch.cat(txts)


def retrieval_recalls(sim: Tensor, ks: tuple[int, ...] = (1, 5, 10)) -> dict[str, float]:
    """Recall@k both ways for a square similarity ``[n_images, n_texts]`` whose matches are
    on the diagonal (ties counted against the match)."""
    correct = sim.diagonal()
    out = {}
    for name, s, c in (("i2t", sim, correct), ("t2i", sim.T, correct)):
        rank = (s >= c.unsqueeze(1)).sum(1) - 1  # others scoring at least the match
        for k in ks:
            out[f"{name}_r{k}"] = float((rank < k).float().mean())
    return out


def pretrain(config: PretrainConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Train a tiny CLIP with ``config``; returns the final metrics (also saved with the
    checkpoint in ``config.out`` unless it is empty). ``progress(step, total, log_entry)`` is
    called after every step.

    With ``processes > 1`` the work is data-parallel over that many worker processes (one
    CPU core each at ``threads=1``, which on small matrices scales far better than threads
    inside one process): each renders its share of the training set and embeds its share
    of every batch; the contrastive loss is taken over the whole gathered batch and the
    gradients are summed, so a step is the same full-batch step as on one process.
    """
    _check_loss(config.loss)
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
    if config.processes > 1:
        return _spawn(config, progress)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _pretrain(config, progress, _Group())
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class _Group:
    """This process's place among the data-parallel processes."""

    rank: int = 0
    size: int = 1

    def gather(self, x: Tensor) -> Tensor:
        """Rows of ``x`` from every process, concatenated in rank order; differentiable in
        this process's own rows (the others are constants here)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.detach().contiguous())
        parts[self.rank] = x
        return torch.cat(parts)

    def sum_gradients(self, model: nn.Module) -> None:
        """Sum the gradients over processes. Each process back-propagated the full-batch
        loss through its own rows only, so the sum is the full-batch gradient; the logit
        scale, which every process differentiates in full, is averaged instead."""
        if self.size == 1:
            return
        params = [p for p in model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        model.logit_scale.grad.div_(self.size)

    def union(self, ids: Tensor, size: int) -> Tensor:
        """The ids present in any process's ``ids`` (values below ``size``)."""
        present = torch.zeros(size, dtype=torch.int32)
        present[ids.reshape(-1).long()] = 1
        if self.size > 1:
            dist.all_reduce(present, op=dist.ReduceOp.MAX)
        return present.nonzero().squeeze(1)


def _spawn(config: PretrainConfig, progress: Progress | None) -> dict[str, Any]:
    """Run :func:`_worker` in ``config.processes`` worker processes
    (:func:`~otviz.worker_processes.worker_context`); relay rank 0's progress and return
    its result."""
    ctx = worker_context()
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, config, port, queue, os.getpid()), daemon=True)
             for r in range(config.processes)]
    for p in procs:
        p.start()
    try:
        while True:
            try:
                kind, payload = queue.get(timeout=1.0)
            except queue_module.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a pretrain process died (exit code {dead[0]})") from None
                continue
            if kind == "progress":
                if progress is not None:
                    progress(*payload)
            elif kind == "error":
                raise RuntimeError(f"pretrain process failed:\n{payload}")
            else:
                return payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()


def _worker(rank: int, config: PretrainConfig, port: int, queue: Any, parent: int) -> None:
    exit_with_parent(parent)  # its workers hold no state that the next run needs
    torch.set_num_threads(config.threads)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=config.processes)
        report = (lambda *args: queue.put(("progress", args))) if rank == 0 else None
        result = _pretrain(config, report, _Group(rank, config.processes))
        if rank == 0:
            queue.put(("done", result))
    except Exception:
        queue.put(("error", f"rank {rank}: {traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def training_split(config: PretrainConfig, group: _Group | None = None) -> RenderedSplit:
    """This process's share of the rendered training set (all of it in one process, from
    ``config.data_cache`` when set, rendered there first if missing)."""
    group = group or _Group()
    train_cfg = dataclasses.replace(config.world_config(), negatives=config.hard_negatives > 0)
    if config.data_cache and group.size == 1:
        return render_split_cached(config.data_cache, "train", config.n_train, config.seed,
                                   config.context_length, train_cfg, config.render_workers)
    return render_split("train", config.n_train, config.seed, config.context_length, train_cfg,
                        shard=(group.rank, group.size))


def _pretrain(config: PretrainConfig, progress: Progress | None, group: _Group) -> dict[str, Any]:
    t_start, cpu_start = time.perf_counter(), time.process_time()
    is_main = group.rank == 0
    torch.manual_seed(config.seed)
    world_cfg = config.world_config()
    cfg = config.model_config()
    train = training_split(config, group)
    if is_main:
        test_world = World(world_cfg, split="test", seed=config.seed)
        test_samples = [test_world.sample(i) for i in range(config.n_test)]
        test = split_from_samples(test_samples, config.context_length)
        ceiling = {
            "ambiguous_caption_share": ambiguous_caption_share(test_samples),
            "t2i_r1_ceiling": retrieval_ceiling(test_samples),
        }
    t_data = time.perf_counter() - t_start

    model = create_tiny_clip(cfg, seed=config.seed)  # the same weights in every process
    if config.init_from:
        _load_initial_weights(model, config.init_from, cfg)
    vocab = model.text.token_embedding.weight.shape[0]
    ids = train.ids if train.negative_ids is None else torch.cat(
        [train.ids.reshape(-1), train.negative_ids.reshape(-1)])
    restrict_token_rows(model, group.union(ids, vocab))
    device = torch.device(config.device)
    model.to(device).train()
    train_images, train_ids = train.images.to(device), train.ids.to(device)
    pp = model.visual.preprocess_cfg
    mean, std = tuple(pp["mean"]), tuple(pp["std"])
    optimizer = _optimizer(model, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config))
    gen = torch.Generator().manual_seed(config.seed + 7919 * group.rank)
    weights = negative_weights(config.negative_weights)
    local_batch = config.batch_size // group.size
    order = torch.randperm(len(train), generator=gen)
    cursor = 0
    log: list[dict[str, float]] = []
    metrics: dict[str, float] = {}
    state = TrainingState(config.state_dir(), group)
    start = 0
    if config.resume and (saved := state.load(config)) is not None:
        start, cursor, order, log, metrics = saved.restore(model, optimizer, schedule, gen)
        if is_main:
            tqdm.write(f"resuming from step {start} ({state.path})")
    bar = tqdm(range(start + 1, config.steps + 1), desc="pretrain", unit="step",
               mininterval=2.0, disable=not is_main, initial=start, total=config.steps)
    t_train = time.perf_counter()
    for step in bar:
        if cursor + local_batch > len(order):
            order, cursor = torch.randperm(len(train), generator=gen), 0
        idx = order[cursor : cursor + local_batch]
        cursor += local_batch
        on_device = idx.to(device)
        images = normalise(random_shift(train_images[on_device], config.max_shift, gen), mean,
                           std)
        texts = train_ids[on_device]
        if config.hard_negatives:
            negatives = draw_negatives(train, idx, config.hard_negatives, gen, weights)
            texts = torch.cat([texts, negatives.to(device)])
        with torch.autocast(device.type, torch.bfloat16, enabled=config.bf16):
            loss = batch_loss(model, images, texts, config, group, local_batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        group.sum_gradients(model)
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        entry = {"step": step, "loss": loss.item(), "lr": schedule.get_last_lr()[0],
                 "logit_scale": model.logit_scale.exp().item()}
        evaluate = step == config.steps or (config.eval_every and step % config.eval_every == 0)
        if is_main and evaluate:
            image_all, text_all = embed_split(model, test, mean, std)
            metrics = retrieval_recalls(image_all @ text_all.T)
            entry.update(metrics, cpu_time_s=time.process_time() - cpu_start)
            tqdm.write(f"step {step}: loss {entry['loss']:.3f} " + " ".join(
                f"{k} {v:.3f}" for k, v in metrics.items()))
        log.append(entry)
        bar.set_postfix(loss=f"{entry['loss']:.3f}")
        if progress is not None:
            progress(step, config.steps, entry)
        if state.path is not None and step % config.save_every == 0 and step < config.steps:
            state.save(config, step, model, optimizer, schedule, gen, order, cursor, log,
                       metrics)
    train_time = time.perf_counter() - t_train
    model.eval()
    if not is_main:
        return {}
    result: dict[str, Any] = {
        **metrics,
        **ceiling,
        "n_test": config.n_test,
        "final_loss": log[-1]["loss"],
        "first_loss": log[0]["loss"],
        "epochs": config.steps * config.batch_size / config.n_train,
        "n_params": sum(p.numel() for p in model.parameters()),
        "data_time_s": t_data,
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - t_start,
        "cpu_time_s": time.process_time() - cpu_start,  # of the main process
        "threads": config.threads,
        "processes": config.processes,
    }
    if config.out:
        meta = {
            "model_name": TINY_CLIP_NAME,
            "world_version": world_version(world_cfg),
            "world_config": _world_meta(world_cfg),
            "recipe": dataclasses.asdict(config),
            "command": command_line(config),
            "cli_command": command_line(config, "otviz pretrain"),
            "metrics": result,
            "log": log,
        }
        path = save_tiny_clip(config.out, model, cfg, meta)
        result["checkpoint_bytes"] = sum(f.stat().st_size for f in Path(path).iterdir())
    state.clear()
    return result


def batch_loss(model: nn.Module, images: Tensor, texts: Tensor, config: PretrainConfig,
                group: _Group, local_batch: int) -> Tensor:
    """The step's loss over the whole (gathered) batch: the global contrastive loss, plus
    ``local_weight`` times FILIP's token-wise loss (:mod:`otviz.train.local_alignment`) over
    the batch's matched captions (its cost grows with the square of the batch, so the hard
    negative captions stay global-only)."""

    def gather_texts(x: Tensor) -> Tensor:  # captions of every process, then their negatives
        return torch.cat([group.gather(part) for part in x.split(
            [local_batch, len(x) - local_batch]) if len(part)])

    if not config.local_weight:
        image_emb, text_emb, scale = model(images, texts)
        return contrastive_loss(group.gather(image_emb), gather_texts(text_emb), scale,
                                config.loss)
    image_emb, text_emb, patches, tokens = encode_with_tokens(model, images, texts)
    scale = model.logit_scale.exp()
    global_loss = contrastive_loss(group.gather(image_emb), gather_texts(text_emb), scale,
                                   config.loss)
    captions = slice(0, local_batch)  # the matched captions only: the B x B pairs
    local_loss = filip_loss(group.gather(patches), group.gather(tokens[captions]),
                            content_mask(group.gather(texts[captions])), scale)
    return global_loss + config.local_weight * local_loss


def _load_initial_weights(model: nn.Module, path: str, cfg: dict[str, Any]) -> None:
    """Copy a tiny-CLIP checkpoint's weights into ``model`` (a run continued from it with a
    new recipe); its architecture must be ``cfg``."""
    source, meta = load_tiny_clip(path)
    if meta["model_cfg"] != cfg:
        raise ValueError(f"--init-from {path}: its model config differs from this recipe's")
    model.load_state_dict(source.state_dict())


def _check_loss(kind: str) -> None:
    if kind == "infonce":
        return
    from otviz.train.otclip_losses import KINDS

    if kind not in KINDS:
        raise ValueError(f"unknown loss {kind!r}; known: {list(KINDS)}")


def command_line(config: PretrainConfig, program: str = "python -m otviz.train.pretrain") -> str:
    """The command reproducing ``config`` (non-default fields as flags); ``program`` may be
    ``"otviz pretrain"``, the CLI, whose flags are the same."""
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


if __name__ == "__main__":
    # the ``otviz pretrain`` command, run through the package module so that worker
    # processes find its functions by name
    from otviz.cli import main

    sys.exit(main(["pretrain", *sys.argv[1:]]))
