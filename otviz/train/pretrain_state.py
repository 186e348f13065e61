"""Resumable pre-training: the state a stopped ``otviz pretrain`` run continues from.

Every ``save_every`` steps each data-parallel process writes its own file
``rank<r>-step<n>.pt`` (model, optimiser and schedule state, its generator, its epoch order
and cursor, and on rank 0 the log and the last metrics), each written to a temporary name
and renamed. Once every process has written step ``n`` (a barrier), rank 0 records ``n`` in
``state.json`` (also renamed into place) and removes the older files. A run stopped at any
moment therefore finds either the previous complete step or the new one, never a mix.

Resuming needs the same recipe: a state written for another configuration (other than the
fields that only say where and how often to save) is refused with a message rather than
silently continued. The state is local scratch (torch pickles of this run's own tensors,
never shipped); the finished checkpoint is safetensors + JSON as always.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from otviz.process_group import DistInfo, barrier
from otviz.train.pretrain_config import PretrainConfig

_OPERATIONAL = ("out", "save_every", "resume", "threads", "eval_every", "device", "data_cache",
                "render_workers")
"""Fields that may differ between a run and the one resuming it."""


def _recipe(config: PretrainConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _OPERATIONAL}


@dataclass
class SavedState:
    """One process's saved training state at ``step``."""

    step: int
    payload: dict[str, Any]

    def restore(
        self, model: nn.Module, optimizer: torch.optim.Optimizer,
        schedule: torch.optim.lr_scheduler.LRScheduler, generator: torch.Generator,
    ) -> tuple[int, int, Tensor, list[dict[str, float]], dict[str, float]]:
        """Load the saved state into the live objects; returns ``(step, cursor, order, log,
        metrics)`` for the loop to continue from."""
        p = self.payload
        model.load_state_dict(p["model"])
        optimizer.load_state_dict(p["optimizer"])
        schedule.load_state_dict(p["schedule"])
        generator.set_state(p["generator"])
        return self.step, p["cursor"], p["order"], p["log"], p["metrics"]


class TrainingState:
    """The resumable state of one run in ``path`` (``None``: nothing is saved)."""

    def __init__(self, path: Path | None, info: DistInfo) -> None:
        self.path = path
        self.info = info

    def _file(self, rank: int, step: int) -> Path:
        assert self.path is not None
        return self.path / f"rank{rank}-step{step}.pt"

    def load(self, config: PretrainConfig) -> SavedState | None:
        """This process's state of the last complete step, or ``None`` when there is none."""
        if self.path is None or not (self.path / "state.json").is_file():
            return None
        info = json.loads((self.path / "state.json").read_text())
        if info.get("recipe") != _recipe(config):
            raise ValueError(
                f"{self.path} holds the state of a run with another recipe; remove it or "
                "pass --no-resume to start afresh"
            )
        step = int(info["step"])
        payload = torch.load(self._file(self.info.rank, step), weights_only=False,
                             map_location="cpu")  # a run may move between CPU and GPU
        return SavedState(step, payload)

    def save(
        self, config: PretrainConfig, step: int, model: nn.Module,
        optimizer: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LRScheduler,
        generator: torch.Generator, order: Tensor, cursor: int,
        log: list[dict[str, float]], metrics: dict[str, float],
    ) -> None:
        """Write this process's state at ``step``; rank 0 commits the step once all have."""
        assert self.path is not None
        self.path.mkdir(parents=True, exist_ok=True)
        is_main = self.info.is_main
        payload = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "schedule": schedule.state_dict(),
            "generator": generator.get_state(),
            "order": order,
            "cursor": cursor,
            "log": log if is_main else [],
            "metrics": metrics if is_main else {},
        }
        target = self._file(self.info.rank, step)
        tmp = target.with_suffix(".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, target)
        barrier(self.info)
        if is_main:
            info = {"step": step, "recipe": _recipe(config)}
            tmp_json = self.path / "state.json.tmp"
            tmp_json.write_text(json.dumps(info, indent=1))
            os.replace(tmp_json, self.path / "state.json")
            for old in self.path.glob("rank*-step*.pt"):
                if not old.name.endswith(f"-step{step}.pt"):
                    old.unlink()

    def clear(self) -> None:
        """Remove the state once the finished checkpoint is written."""
        if self.path is not None and self.path.exists():
            shutil.rmtree(self.path)
