"""Data-parallel training on PyTorch's own engine: the process group of the ``torchrun`` job
(:mod:`otviz.process_group`: :func:`setup`, :func:`teardown`, :func:`barrier`, re-exported
here) and DistributedDataParallel. Without ``torchrun``'s variables (or with
``WORLD_SIZE=1``) everything here is a no-op on one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from otviz.process_group import DistInfo, barrier, setup, teardown

__all__ = ["DistInfo", "any_all", "barrier", "setup", "shard", "sum_all", "teardown", "wrap"]


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
