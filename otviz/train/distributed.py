"""Data-parallel training on PyTorch's own engine, for method heads and tiny-CLIP
pre-training alike: the process group of the ``torchrun`` job (:mod:`otviz.process_group`:
:func:`setup`, :func:`teardown`, :func:`barrier`, re-exported here), DistributedDataParallel
(:func:`wrap`, the heads), gathered rows and summed gradients (:func:`gather`,
:func:`sum_gradients`, pre-training's loss over the whole gathered batch), and
:func:`launch`, which starts such a job from inside a process (``otviz pretrain --processes
N``) with the launcher behind the ``torchrun`` command. Without ``torchrun``'s variables (or
with ``WORLD_SIZE=1``) everything here but :func:`launch` is a no-op on one process.
"""

from __future__ import annotations

import os
import threading
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from otviz.process_group import DistInfo, barrier, setup, teardown
from otviz.worker_processes import exit_with_parent, worker_context

__all__ = ["DistInfo", "any_all", "barrier", "gather", "in_job", "job_size", "launch", "setup",
           "shard", "sum_all", "sum_gradients", "teardown", "union", "wrap"]

#: ``report(*args)``: what a launched job's rank 0 passes on to the caller's ``progress``.
Report = Callable[..., None]


def in_job() -> bool:
    """True in a process of a ``torchrun`` job (of any size: its variables are set)."""
    return "WORLD_SIZE" in os.environ


def job_size() -> int:
    """The number of processes of this process's ``torchrun`` job (1 outside one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


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


def gather(x: Tensor, info: DistInfo) -> Tensor:
    """Rows of ``x`` from every process, concatenated in rank order; differentiable in this
    process's own rows (the others are constants here)."""
    if not info.distributed:
        return x
    parts = [torch.empty_like(x) for _ in range(info.world_size)]
    dist.all_gather(parts, x.detach().contiguous())
    parts[info.rank] = x
    return torch.cat(parts)


def sum_gradients(model: nn.Module, info: DistInfo) -> None:
    """Sum every parameter's gradient over the processes (one all-reduce of them all
    flattened). A process that back-propagated a loss over :func:`gather`-ed rows through
    its own rows only holds its share of the gradient; the sum is the full-batch one."""
    if not info.distributed:
        return
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def union(ids: Tensor, size: int, info: DistInfo) -> Tensor:
    """The ids (values below ``size``) present in any process's ``ids``, sorted."""
    present = torch.zeros(size, dtype=torch.int32)
    present[ids.reshape(-1).long()] = 1
    if info.distributed:
        dist.all_reduce(present, op=dist.ReduceOp.MAX)
    return present.nonzero().squeeze(1)


def launch(entry: Callable[..., Any], args: tuple[Any, ...], processes: int,
           progress: Callable[..., None] | None = None) -> Any:
    """Run ``entry(*args, report)`` in each of ``processes`` new processes that form one
    ``torchrun`` job (``torch.distributed.launcher``, the launcher of the ``torchrun``
    command, standalone on this machine): each finds ``RANK``, ``WORLD_SIZE`` and the
    rendezvous address in its environment and joins the group with :func:`setup`, as under
    ``torchrun``. The processes fork from :func:`~otviz.worker_processes.worker_context`'s
    server (torch and the training modules already imported) and end with this process.

    Rank 0's ``report(*values)`` calls ``progress(*values)`` in a thread of this process
    (the other ranks' ``report`` is ``None``). Returns rank 0's return value; a process
    that fails raises ``RuntimeError`` here with its traceback.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    context = worker_context()  # sets the fork server's preload before its first start
    messages = context.Queue()
    errors: list[str] = []
    relay = threading.Thread(target=_relay, args=(messages, progress, errors), daemon=True)
    relay.start()
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=processes,
                          run_id=uuid.uuid4().hex, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.1,
                          start_method="forkserver")
    try:
        results = elastic_launch(config, _launched)(entry, args, messages, os.getpid())
    except ChildFailedError as e:
        failed: Exception | None = e
    else:
        failed = None
    finally:
        messages.put(None)
        relay.join()
    if failed is not None:
        raise RuntimeError("a data-parallel process failed:\n"
                           + (errors[0] if errors else str(failed))) from None
    return results[0]


def _launched(entry: Callable[..., Any], args: tuple[Any, ...], messages: Any,
              parent: int) -> Any:
    """One process of a :func:`launch`-ed job."""
    exit_with_parent(parent)  # a stopped run must not leave its processes working on
    rank = int(os.environ["RANK"])
    report = (lambda *values: messages.put(("progress", values))) if rank == 0 else None
    try:
        return entry(*args, report)
    except Exception:
        messages.put(("error", f"rank {rank}: {traceback.format_exc()}"))
        raise


def _relay(messages: Any, progress: Callable[..., None] | None, errors: list[str]) -> None:
    """Pass rank 0's reports on to ``progress``, and note the processes' errors, until
    ``None`` arrives."""
    while (item := messages.get()) is not None:
        kind, payload = item
        if kind == "error":
            errors.append(payload)
        elif progress is not None:
            progress(*payload)
