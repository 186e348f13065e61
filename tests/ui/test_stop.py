"""A served app (``app.py`` in a process of its own, as a Space starts it) stops on SIGTERM
or SIGINT within :data:`~otviz.ui.shutdown.STOP_DEADLINE_S` with exit status 0: idle, and
mid-training, where the run is stopped at its next step and recorded as stopped
(:mod:`otviz.ui.shutdown`). Before, 3 of 4 stops mid-training aborted (SIGABRT, exit 134).

Each app is ``app.py`` run as ``python app.py --port P`` runs it, in a session of its own, by
a child forked from an interpreter that has imported Gradio and the app's modules
(:mod:`tests.preloaded`, one per test process): the 8-9 s of CPU those imports take are paid
once, not per app. What the app does is unchanged: app.py's own code runs from its first
line (its ``__main__``, ``sys.argv``, working folder, environment and log as before);
:func:`otviz.cli.app.main` installs its signal handlers as it does in a fresh process, where
the child starts from a fresh interpreter's signal dispositions and mask (what the imports
set is undone; they set none); its ``from otviz.ui.app import launch`` finds the module
already imported, which imported it under the same environment (nothing of otviz or
Gradio's own reads the app's folder, the one variable that differs, on import). The
forking interpreter started no thread (checked before each fork), and the test signals the
app's process and kills its group as before."""

from __future__ import annotations

import json
import signal
import subprocess
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
from tests.preloaded import PreloadedPython

#: Start-up of the served app on the loaded 2-core machine took 40-85 s.
START_TIMEOUT_S = 240.0

pytestmark = pytest.mark.slow

#: What app.py imports, imported by the forking interpreter (torch and open_clip with them).
APP_IMPORTS = ("gradio", "otviz.cli.app", "otviz.ui.app")


def app_env() -> dict[str, str]:
    """The served app's environment, less its folder (:func:`ServedApp`)."""
    return {**child_env(), "PYTHONFAULTHANDLER": "1"}


@pytest.fixture(scope="session")
def preloaded_app() -> PreloadedPython:
    """The forking interpreter of the apps, with the environment app.py has as it imports
    them (it sets ``GRADIO_ANALYTICS_ENABLED`` first)."""
    python = PreloadedPython({**app_env(), "GRADIO_ANALYTICS_ENABLED": "False"}, APP_IMPORTS)
    yield python
    python.close()


class ServedApp:
    """``python app.py`` on a free port in the working folder ``cwd``, writing under
    ``cwd / "app"`` (its root, :mod:`otviz.ui.app_dirs`), forked from ``python``."""

    def __init__(self, python: PreloadedPython, cwd: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = cwd / "server.log"
        self.log.touch()
        self.proc = python.start([str(ROOT / "app.py"), "--port", str(self.port)], cwd,
                                 {**app_env(), APP_DIR_ENV: str(cwd / "app")},
                                 stdout=self.log, stderr=None, new_session=True)
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
        """SIGKILL to the app's process group (its session)."""
        self.proc.kill()


def assert_clean_stop(app: ServedApp, signum: int) -> None:
    status, seconds = app.stop(signum)
    log = app.log.read_text()
    assert status == 0, f"exit status {status} after {seconds:.1f} s\n{log[-3000:]}"
    assert seconds < STOP_DEADLINE_S, f"{seconds:.1f} s\n{log[-3000:]}"
    assert "Traceback" not in log and "terminate called" not in log, log[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_idle_server_stops_cleanly(tmp_path, signum, preloaded_app):
    assert_clean_stop(ServedApp(preloaded_app, tmp_path), signum)


def run_records(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (cwd / "app" / RUNS).rglob(RECORD_FILE)]


def test_sigterm_mid_training_stops_the_run_and_the_server(tmp_path, preloaded_app):
    app = ServedApp(preloaded_app, tmp_path)
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
