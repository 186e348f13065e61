"""The preloaded interpreter (``tests/preloaded.py``) runs code as ``python -c`` and a script as
``python script.py`` do: the same exit status, output and streams for the same code, the same
signal dispositions and the same end on SIGINT and SIGTERM in a session of its own; each run
starts clean, and a server with a thread refuses to fork."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import ROOT, child_env
from tests.preloaded import PreloadedPython

CASES = {
    "output": "import sys; print('out'); print('err', file=sys.stderr)",
    "exit status": "import sys; sys.exit(3)",
    "exit message": "import sys; sys.exit('stopped')",
    "exception": "raise ValueError('bad')",
    "argv, main, stdin": "import sys; print(sys.argv, __name__, repr(sys.stdin.read()))",
    "folder and environment": "import os; print(os.getcwd(), os.environ['OTVIZ_PROBE'])",
    "threads and atexit": (
        "import atexit, threading, time\n"
        "atexit.register(print, 'atexit ran')\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()\n"),
}


@pytest.mark.parametrize("code", CASES.values(), ids=CASES.keys())
def test_a_run_is_what_python_c_gives(code: str, tmp_path: Path, preloaded_python) -> None:
    env = {**child_env(), "OTVIZ_PROBE": "probe value"}
    want = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    got = preloaded_python.run(code, tmp_path, env)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout,
                                                        want.stderr)


def test_each_run_starts_clean(tmp_path: Path, preloaded_python) -> None:
    first = preloaded_python.run("import otviz.methods; import sys; sys.shared = 1", tmp_path)
    assert first.returncode == 0, first.stderr
    second = preloaded_python.run(
        "import sys; print('otviz' in sys.modules, hasattr(sys, 'shared'), 'torch' in "
        "sys.modules)", tmp_path)
    assert second.stdout == "False False True\n"


def test_a_run_past_its_time_is_killed(tmp_path: Path, preloaded_python) -> None:
    done = preloaded_python.run("import time; time.sleep(60)", tmp_path, timeout=0.5)
    assert done.returncode == -9
    assert preloaded_python.run("print('next')", tmp_path).stdout == "next\n"


def test_runs_started_from_several_threads_at_once_each_get_their_own(
        tmp_path: Path, preloaded_python) -> None:
    """Each start writes a job and reads the next answer: without one lock around both, two
    threads could swap pids (and wait on each other's exit)."""
    codes = [f"import sys, time; time.sleep({k % 3} / 20); sys.exit({k})" for k in range(12)]
    with ThreadPoolExecutor(6) as pool:
        done = list(pool.map(lambda code: preloaded_python.run(code, tmp_path), codes))
    assert [d.returncode for d in done] == list(range(12))


SCRIPT = ("import os, sys\n"
          "print(sys.argv, __name__, __file__, sys.path[0], os.getcwd())\n"
          "raise SystemExit(len(sys.argv))\n")


def test_a_script_runs_as_python_script_gives(tmp_path: Path, preloaded_python) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    args = [str(script), "--port", "7"]
    want = subprocess.run([sys.executable, *args], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    out, err = tmp_path / "out", tmp_path / "err"
    got = preloaded_python.start(args, tmp_path, stdout=out, stderr=err)
    assert (got.wait(60), out.read_text(), err.read_text()) == (want.returncode, want.stdout,
                                                                  want.stderr)


#: Prints its signal dispositions and whether it leads a session, then waits for a signal.
SIGNALLED = ("import os, signal, time\n"
             "print({str(s): str(signal.getsignal(s)) for s in signal.valid_signals()},\n"
             "      os.getsid(0) == os.getpid(), flush=True)\n"
             "time.sleep(60)\n")


def signalled(process, out: Path, err: Path, signum: int) -> tuple[int, str, str]:
    """Once ``process`` has printed its line: send ``signum``; its exit status and output."""
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().endswith("\n")):
        assert time.monotonic() < deadline and process.poll() is None, err.read_text()
        time.sleep(0.05)
    process.send_signal(signum)
    return process.wait(60), out.read_text(), err.read_text()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_in_its_own_session_takes_signals_as_python_does(
        signum: int, tmp_path: Path, preloaded_python) -> None:
    out, err = tmp_path / "fresh.out", tmp_path / "fresh.err"
    with out.open("w") as out_file, err.open("w") as err_file:
        fresh = subprocess.Popen([sys.executable, "-c", SIGNALLED], cwd=tmp_path,
                                 env=child_env(), stdin=subprocess.DEVNULL, stdout=out_file,
                                 stderr=err_file, start_new_session=True)
    want = signalled(fresh, out, err, signum)
    out, err = tmp_path / "forked.out", tmp_path / "forked.err"
    forked = preloaded_python.start(["-c", SIGNALLED], tmp_path, stdout=out, stderr=err,
                                    new_session=True)
    got = signalled(forked, out, err, signum)
    assert got == want
    assert want[0] == -signum and "True" in want[1]


def test_a_server_with_a_thread_refuses_to_fork(tmp_path: Path) -> None:
    (tmp_path / "threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    env = {**child_env(), "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    python = PreloadedPython(env, imports=("threaded",))
    try:
        with pytest.raises(RuntimeError, match="2 Python and 2 native threads"):
            python.run("print('forked')", tmp_path)
    finally:
        python.close()


def test_a_run_with_other_startup_variables_is_refused(tmp_path: Path, preloaded_python) -> None:
    with pytest.raises(ValueError, match="PYTHON"):
        preloaded_python.run("print('run')", tmp_path, {**child_env(), "PYTHONHASHSEED": "7"})
