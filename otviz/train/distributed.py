"""Data-parallel training on PyTorch's own engine: ``torch.distributed`` process groups and
DistributedDataParallel, started by ``torchrun`` (which sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``).

Backend: ``nccl`` when the process trains on a GPU, ``gloo`` on CPU. Without those
variables (or with ``WORLD_SIZE=1``) everything here is a no-op on one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel


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


def shard(n: int, info: DistInfo) -> slice:
    """This process's contiguous share of ``n`` items (sizes differ by at most one)."""
    base, extra = divmod(n, info.world_size)
    start = info.rank * base + min(info.rank, extra)
    return slice(start, start + base + (info.rank < extra))


def wrap(module: nn.Module, info: DistInfo) -> nn.Module:
    """``module`` in DistributedDataParallel on a multi-process job (parameters broadcast
    from rank 0, gradients averaged); the module itself alone."""
    if not info.distributed:
        return module
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, find_unused_parameters=True)


def sum_all(x: Tensor, info: DistInfo) -> Tensor:
    """Sum of a (detached) tensor over the processes."""
    if not info.distributed:
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def any_all(flag: bool, info: DistInfo) -> bool:
    """True on every process when ``flag`` is True on any (agreeing on stopping)."""
    if not info.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()
