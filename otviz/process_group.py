"""A process's place in a ``torchrun`` job: PyTorch's own engine (``torch.distributed``),
started by ``torchrun``, which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. Data-parallel training (:mod:`otviz.train.distributed`)
and the sharded data-set evaluation (:mod:`otviz.eval.dataset_eval`) both join the job here.

Backend: ``nccl`` when the process computes on a GPU (``cuda:LOCAL_RANK``), ``gloo`` on CPU.
Without those variables (or with ``WORLD_SIZE=1``) everything here is a no-op on one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    """This process's place in the job.

    Attributes:
        rank, world_size, local_rank: as set by torchrun (0, 1, 0 alone).
        device: where this process computes.
        owns_group: True when :func:`setup` created the process group (and must destroy it).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {preference!r} asked for but no CUDA device is available")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def setup(device: str = "auto") -> DistInfo:
    """Join the torchrun job described by the environment (creating the process group if
    nobody has), or describe a single process. ``device``: ``"auto"``, ``"cpu"``, ``"cuda"``."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _pick_device(device, local_rank)
    if world_size <= 1:
        return DistInfo(device=dev)
    owns = False
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        owns = True
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, owns)


def teardown(info: DistInfo) -> None:
    """Destroy the process group if :func:`setup` created it."""
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    """Wait for every process of the job (nothing alone)."""
    if info.distributed:
        dist.barrier()


def gathered(value: object, info: DistInfo) -> list[object]:
    """``value`` of every process, by rank (picklable values; ``[value]`` alone)."""
    if not info.distributed:
        return [value]
    out: list[object] = [None] * info.world_size
    dist.all_gather_object(out, value)
    return out


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a process alone (read from ``RANK``; no group needed)."""
    return int(os.environ.get("RANK", "0")) == 0
