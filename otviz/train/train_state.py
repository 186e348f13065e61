"""Resumable training state, without pickle.

Everything a run needs to continue exactly where it was, in one :mod:`otviz.checkpoints.store`
directory (written atomically, so an interrupted save leaves the previous state intact):

* tensors: the trainable module's state dict (``model.*``), every tensor of the optimiser
  state (``optim.<param>.<name>``), the RNG states of torch (CPU and CUDA) and numpy;
* JSON: the optimiser's other state and its parameter groups, the LR scheduler's state
  (plain numbers), Python's RNG state, the step, the loss history, the TrainConfig.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from otviz.checkpoints.store import (
    CheckpointError,
    load_checkpoint,
    load_meta,
    load_state_dict_strict,
    save_checkpoint,
)

STATE_KIND = "otviz-train-state"


def _optimizer_split(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, entry in sd["state"].items():
        for name, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"optim.{pid}.{name}"] = value
            else:
                scalars.setdefault(str(pid), {})[name] = value
    return tensors, {"scalars": scalars, "param_groups": sd["param_groups"]}


def _optimizer_join(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            pid, name = key[len("optim.") :].split(".", 1)
            state.setdefault(int(pid), {})[name] = value
    for pid, entry in meta["scalars"].items():
        state.setdefault(int(pid), {}).update(entry)
    groups = [
        {k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]
    ]
    return {"state": state, "param_groups": groups}


def _rng_split() -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(keys.astype(np.int64))
    version, py_state, py_gauss = random.getstate()
    meta = {
        "numpy": [kind, int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(py_state), py_gauss],
    }
    return tensors, meta


def _rng_restore(tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    if torch.cuda.is_available():
        cuda = [tensors[f"rng.cuda.{i}"] for i in range(torch.cuda.device_count())
                if f"rng.cuda.{i}" in tensors]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    kind, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state((kind, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss,
                         gauss))
    version, py_state, py_gauss = meta["python"]
    random.setstate((version, tuple(py_state), py_gauss))


def save_train_state(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    progress: dict[str, Any],
    config: dict[str, Any],
) -> Path:
    """Write the state of a run (``progress``: step, history, ...; JSON-able)."""
    opt_tensors, opt_meta = _optimizer_split(optimizer)
    rng_tensors, rng_meta = _rng_split()
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update(opt_tensors)
    tensors.update(rng_tensors)
    meta = {
        "kind": STATE_KIND,
        "progress": progress,
        "config": config,
        "optimizer": opt_meta,
        "scheduler": sched,
        "rng": rng_meta,
    }
    return save_checkpoint(path, tensors, meta)


def has_train_state(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a (complete) checkpoint."""
    return (Path(path) / "config.json").is_file()


def saved_config(path: str | os.PathLike) -> dict[str, Any]:
    """The TrainConfig (as a dict) of the run whose state is at ``path``."""
    meta = load_meta(path)
    if meta.get("kind") != STATE_KIND or not isinstance(meta.get("config"), dict):
        raise CheckpointError(f"{path} is not an otviz training state")
    return meta["config"]


def load_train_state(
    path: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Restore a run's state into freshly built ``model``, ``optimizer`` and ``scheduler``
    (and the global RNGs); returns its ``progress``. Raises :class:`CheckpointError` on a
    corrupt or mismatched state."""
    tensors, meta = load_checkpoint(path, expect={"kind": STATE_KIND})
    model_sd = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    load_state_dict_strict(model, model_sd)
    try:
        optimizer.load_state_dict(_optimizer_join(tensors, meta["optimizer"]))
        scheduler.load_state_dict({**meta["scheduler"], "lr_lambdas": [None]})
        _rng_restore(tensors, meta["rng"])
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise CheckpointError(f"training state {path} does not fit this run: {e}") from e
    return meta["progress"]
