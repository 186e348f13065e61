"""otviz's worker processes (:mod:`otviz.worker_processes`): forked from a fork server that
has imported torch and otviz's training modules, so a worker starts with them loaded; a
worker ends once the process that started it is gone, even though its parent is the
server. (This module imports neither torch nor otviz's training code itself: what a worker
finds loaded came from the server.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from otviz.worker_processes import PRELOAD, worker_context
from tests.helpers import ROOT, child_env


def loaded_at_start(queue) -> None:
    """A worker's target: which of the preloaded modules it finds imported, and its parent."""
    queue.put(([m for m in PRELOAD if m in sys.modules], os.getppid()))


def test_a_worker_starts_with_torch_and_the_training_modules_loaded():
    context = worker_context()
    queue = context.Queue()
    worker = context.Process(target=loaded_at_start, args=(queue,))
    worker.start()
    loaded, parent = queue.get(timeout=120)
    worker.join(timeout=30)
    assert worker.exitcode == 0
    assert loaded == list(PRELOAD)
    assert parent != os.getpid()  # forked by the server, not by this process


#: A run's process: starts one worker that watches for its run to end, prints the worker's
#: pid, then waits to be killed.
RUN = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from otviz.worker_processes import exit_with_parent

    def linger(parent):
        exit_with_parent(parent, poll_s=0.05)
        time.sleep(120)

    if __name__ == "__main__":
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["otviz.worker_processes"])
        worker = context.Process(target=linger, args=(os.getpid(),), daemon=True)
        worker.start()
        print(worker.pid, flush=True)
        time.sleep(120)
""")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_worker_ends_when_its_run_is_killed(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    run = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=child_env(),
                           stdout=subprocess.PIPE, text=True)
    try:
        worker = int(run.stdout.readline())
        assert _running(worker)
        run.send_signal(signal.SIGKILL)  # no clean-up of the run's own
        run.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(worker), "the worker outlived its run"
    finally:
        run.kill()
        run.stdout.close()
