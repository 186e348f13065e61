"""A served app (``app.py`` in a process of its own, as a Space starts it) stops on SIGTERM
or SIGINT within :data:`~otviz.ui.shutdown.STOP_DEADLINE_S` with exit status 0: idle, and
mid-training, where the run is stopped at its next step and recorded as stopped
(:mod:`otviz.ui.shutdown`). Before, 3 of 4 stops mid-training aborted (SIGABRT, exit 134)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from otviz.train.loop import STATE_DIR
from otviz.ui.app_dirs import APP_DIR_ENV, RUNS
from otviz.ui.context import EMBEDDED, SEPARATOR, TRAINING_FREE
from otviz.ui.shutdown import STOP_DEADLINE_S
from otviz.ui.train_jobs import RECORD_FILE
from tests.conftest import free_port
from tests.helpers import ROOT, api_client, child_env, train_api_args

#: Start-up of the served app on the loaded 2-core machine took 40-85 s.
START_TIMEOUT_S = 240.0

pytestmark = pytest.mark.slow


class ServedApp:
    """``python app.py`` on a free port in the working folder ``cwd``, writing under
    ``cwd / "app"`` (its root, :mod:`otviz.ui.app_dirs`)."""

    def __init__(self, cwd: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = cwd / "server.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "app.py"), "--port", str(self.port)], cwd=cwd,
                env={**child_env(), "PYTHONFAULTHANDLER": "1", APP_DIR_ENV: str(cwd / "app")},
                stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_up()

    def _wait_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                urllib.request.urlopen(self.url + "config", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        self.kill()
        pytest.fail(f"the app did not answer in {START_TIMEOUT_S:.0f} s")

    def stop(self, signum: int) -> tuple[int | None, float]:
        """Send ``signum``; the exit status (None: still running after twice the deadline,
        then killed) and the seconds to exit."""
        start = time.monotonic()
        self.proc.send_signal(signum)
        try:
            status = self.proc.wait(2 * STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None, time.monotonic() - start
        return status, time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def assert_clean_stop(app: ServedApp, signum: int) -> None:
    status, seconds = app.stop(signum)
    log = app.log.read_text()
    assert status == 0, f"exit status {status} after {seconds:.1f} s\n{log[-3000:]}"
    assert seconds < STOP_DEADLINE_S, f"{seconds:.1f} s\n{log[-3000:]}"
    assert "Traceback" not in log and "terminate called" not in log, log[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_idle_server_stops_cleanly(tmp_path, signum):
    assert_clean_stop(ServedApp(tmp_path), signum)


def run_records(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (cwd / "app" / RUNS).rglob(RECORD_FILE)]


def test_sigterm_mid_training_stops_the_run_and_the_server(tmp_path):
    app = ServedApp(tmp_path)
    try:
        client = api_client(app.url)
        checkpoint = f"{EMBEDDED}{SEPARATOR}{TRAINING_FREE}"
        # 64 pairs to encode before the first step; 2000 steps, far more than the 2 s before
        # the signal
        client.submit(*train_api_args(checkpoint, "world", "", [], ["conceptot"],
                                      n_train=64, batch_size=32, max_steps=2000),
                      api_name="/train")
        deadline = time.monotonic() + 120  # until its steps have begun (encoding done)
        while "conceptot: local loss" not in app.log.read_text():
            assert time.monotonic() < deadline, app.log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)  # a few steps in
        assert_clean_stop(app, signal.SIGTERM)
    finally:
        app.kill()
    [record] = run_records(tmp_path)
    assert record["state"] == "stopped", record
    result = record["results"]["conceptot"]
    assert result["status"] == "stopped" and 0 < result["steps"] < result["total_steps"], record
    assert list((tmp_path / "app" / RUNS).rglob(STATE_DIR)), "a stopped run keeps its state"
