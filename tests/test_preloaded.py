"""The preloaded interpreter (``tests/preloaded.py``) runs code as ``python -c`` does: the
same exit status, output and streams for the same code, and each run starts clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import child_env

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
