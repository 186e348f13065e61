"""How otviz starts its worker processes (the data-parallel pretraining processes, the
parallel world renderers): forked from a fork server that imported torch, open_clip and
otviz's training modules once, instead of spawned (a spawned worker imports them itself:
about 6 s of CPU each on the 2-core machine, before its first step). The server is a
fresh single-threaded interpreter started on first use, so the workers inherit no thread
or lock of the calling process, as with spawn; it ends with the calling process."""

from __future__ import annotations

import multiprocessing
import os
import select
import threading
import time
from multiprocessing.context import BaseContext

#: What the fork server imports before it forks the first worker.
PRELOAD = ("torch", "otviz.train.pretrain", "otviz.data.rendered")


def worker_context() -> BaseContext:
    """The ``forkserver`` context, its server preloading :data:`PRELOAD` (the preload
    list takes effect when the server starts, on the first worker of the process)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this worker once the process ``parent`` that started it is gone (a stopped run
    must not leave its workers working on). Its parent by the process tree is the fork
    server, which stays while any worker lives (workers hold its liveness pipe), so the
    worker watches ``parent`` itself: a pidfd where Linux has them (no confusion with a
    later process of the same pid), else ``parent``'s pid every ``poll_s`` seconds."""
    try:
        handle = os.pidfd_open(parent)
    except (AttributeError, OSError):
        handle = None

    def watch() -> None:
        if handle is not None:
            select.select([handle], [], [])  # readable once ``parent`` has ended
        else:
            while _alive(parent):
                time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True
