"""Python code run as ``python -c`` runs it, in a process forked from an interpreter that
has already imported torch and open_clip, and nothing of otviz: each run starts with otviz
not imported and with nothing another run did, as a fresh interpreter does, without paying
the 4-5 s of CPU those two imports take on the 2-core machine (the docs pages' runs and the
command-line runs that load a model use it).

The server is a plain ``python`` process with only those imports done and no thread
started, so forking it is safe. A run gets its own ``__main__`` module, working folder,
environment, standard streams (stdin empty) and ``sys.argv == ["-c"]``; at its end it waits
for its non-daemon threads and runs its ``atexit`` functions, as an interpreter's exit
does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: The forking server's source (runs as ``python -c``).
SERVER = r"""
import atexit, json, os, sys, threading, traceback, types
import open_clip, torch  # noqa: F401  (what every run shares)


def run(job):
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(job["code"], "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as stop:  # as the interpreter ends: a number, None (0) or a message (1)
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # the traceback from the run's code, as python -c prints it
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = run(job)
        finally:
            os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class PreloadedPython:
    """The forking server (started by the first :meth:`run`) and its runs, one at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self._server: subprocess.Popen[str] | None = None

    def _started(self) -> subprocess.Popen[str]:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, "-c", SERVER], env=self.env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True)
        return self._server

    def _answer(self, server: subprocess.Popen[str]) -> dict:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"the preloaded interpreter ended ({server.wait()})")
        return json.loads(line)

    def run(self, code: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``python -c code`` in ``cwd`` with ``env`` (default: the server's); its exit status
        and output as :func:`subprocess.run` gives them with ``capture_output=True``; a run
        still going after ``timeout`` seconds is killed (exit status -9)."""
        server = self._started()
        with tempfile.TemporaryDirectory() as streams:
            out, err = Path(streams, "stdout"), Path(streams, "stderr")
            job = {"code": code, "cwd": str(cwd), "env": env or self.env,
                   "stdout": str(out), "stderr": str(err)}
            server.stdin.write(json.dumps(job) + "\n")
            server.stdin.flush()
            pid = self._answer(server)["pid"]
            watchdog = threading.Timer(timeout, os.kill, (pid, signal.SIGKILL))
            watchdog.start()
            try:
                returncode = self._answer(server)["returncode"]
            finally:
                watchdog.cancel()
            return subprocess.CompletedProcess(["python", "-c", code], returncode,
                                               out.read_text(), err.read_text())

    def close(self) -> None:
        """End the server (its stdin closed; killed if it does not end)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stdin.close()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()
