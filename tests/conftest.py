"""Shared fixtures: the whole app served on localhost (one server per test process, for the
API and browser tests; under pytest-xdist each worker serves its own, so the tests on the app
are spread over the workers like the others)."""

from __future__ import annotations

import gc
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# The world's background textures go through a float32 matrix product, and OpenBLAS picks
# its kernel by CPU: its AVX-512 kernels round differently from its AVX2 ones, so a world
# image can differ in the last bit of a pixel from one x86 CPU to another. The golden world
# digests (tests/world/test_world_golden.py) were recorded with the AVX2 ("Haswell") kernel;
# the tests ask for it before numpy loads OpenBLAS.
if platform.machine().lower() in {"x86_64", "amd64"}:
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
# One compute thread per test process (and the processes the tests start): the suite runs
# on one pytest-xdist worker per core, and torch's own thread pool in each worker would
# oversubscribe the cores (measured on the 2-core machine: 6 min 52 s instead of 7 min 27 s,
# 724 s of CPU instead of 796 s).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

# otviz (torch, open_clip, gradio: 10 s of CPU) is imported where a fixture needs it, not
# here: pytest-xdist's controller process loads this file too, before it starts the workers
if TYPE_CHECKING:
    from otviz.ui.browse_tab import BrowseSources
    from otviz.ui.context import AppContext
    from otviz.ui.train_jobs import TrainingJobs
    from tests.preloaded import PreloadedPython

# The weight files, trained heads and served app shared by the test processes of a run
pytest_plugins = ["tests.shared_artifacts"]


#: What :func:`machine_reference` times, in an interpreter of its own (timed in the controller,
#: whose heap is large after a run, the same work read 106 and 248 ms in two runs).
REFERENCE_CODE = """
import time
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    keys = {str(k): k for k in range(200_000)}
    best = min(best, time.perf_counter() - start)
    del keys
print(1000 * best)
"""


def machine_reference() -> float:
    """Milliseconds a fresh interpreter takes to build a dictionary of 200,000 string keys
    (the best of five): work that allocates and touches memory, as most of the suite's does
    (figures, servers, the models' Python). Printed below every run, measured once the tests
    have ended, so that a run's time can be read against the machine it ran on
    (docs/testing.md, "Eighth pass": one machine ran the suite 2.4 times as long as the
    machines of the earlier passes, the same order and code)."""
    done = subprocess.run([sys.executable, "-c", REFERENCE_CODE], capture_output=True,
                          text=True, check=True, timeout=120)
    return float(done.stdout)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        terminalreporter.write_line(
            f"machine reference: {machine_reference():.0f} ms to build a dictionary of "
            "200,000 string keys (docs/testing.md, Time)")


def freeze_heap() -> None:
    """Collect what is garbage, then take every object left out of the garbage collector's
    full scans, as the served app does with what its start-up built
    (``otviz.ui.app.freeze_startup_heap``, not imported here: the controller process loads
    this file too)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, open_clip, Gradio, every test module: about a million
    objects) lives as long as the test process: frozen (:func:`freeze_heap`). Without it the
    scans took about a tenth of the CPU of the tests on the served app."""
    freeze_heap()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """A session-scoped fixture's objects (models, contexts, servers) live to the end of the
    run too: frozen once built, like collection's (:func:`pytest_collection_finish`)."""
    yield
    if fixturedef.scope == "session":
        freeze_heap()


@dataclass
class LiveApp:
    """The served app: its URL, context (backbones, picker entries) and training slot."""

    url: str
    ctx: AppContext
    jobs: TrainingJobs
    browse: BrowseSources
    blocks: Any  # the served gr.Blocks (its events, their callbacks)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_locally(app: Any) -> str:
    """Serve the built app on a free loopback port, as ``otviz app`` serves it (its
    :func:`otviz.ui.app.serve_options`), without blocking; returns its URL."""
    from otviz.ui.app import serve_options

    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
               quiet=True, ssr_mode=False, **serve_options(app))
    return f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="session")
def app_context() -> AppContext:
    """The app's context on the shipped checkpoint (:func:`tests.helpers.app_context`), one
    per test process for the tests that only read it: what it loads and calibrates (backbone,
    suites, the world-distance calibration: seconds of CPU) is built once. The served app
    (:func:`live_app`) has its own, since its Train view adds picker entries."""
    from tests.helpers import app_context

    return app_context()


@pytest.fixture(scope="session")
def live_app(tmp_path_factory) -> LiveApp:
    """``otviz.ui.app.build_app`` on the embedded checkpoint, queued and limited as
    :func:`launch` does, on 127.0.0.1 and a free port; training runs, Browse's unpacked
    uploads, feature caches and Gradio's upload cache in a temp dir."""
    from otviz.eval.browse import BrowseCache
    from otviz.ui.app import build_app
    from otviz.ui.browse_tab import BrowseSources
    from otviz.ui.context import AppContext
    from otviz.ui.train_jobs import TrainingJobs
    from otviz.ui.upload_cache import own_upload_cache

    root = tmp_path_factory.mktemp("live-app")
    own_upload_cache(root / "gradio")  # this worker's uploads apart from another worker's
    ctx = AppContext.default()
    jobs = TrainingJobs(ctx, root / "runs", root / "features")
    browse = BrowseSources(BrowseCache(), root / "features", root / "uploads")
    app = build_app(ctx, jobs, browse)
    yield LiveApp(launch_locally(app), ctx, jobs, browse, app)
    job = jobs.current()
    if job is not None:
        job.stop_event.set()
        job.finished.wait(60)
    app.close()


@pytest.fixture(scope="session")
def preloaded_python() -> PreloadedPython:
    """``python -c`` runs forked from an interpreter with torch and open_clip imported
    (:mod:`tests.preloaded`), in :func:`tests.helpers.child_env`."""
    from tests.helpers import child_env
    from tests.preloaded import PreloadedPython

    python = PreloadedPython(child_env())
    yield python
    python.close()


@pytest.fixture(params=["cpu", "cuda"])
def device(request: pytest.FixtureRequest):
    """The device a solver or method test builds its tensors on, like POT's ``nx`` backend
    fixture: the CPU always, CUDA where a GPU is present (skipped otherwise). References
    (POT, closed forms) are computed on CPU copies."""
    import torch

    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    return torch.device(request.param)
