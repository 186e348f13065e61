"""Python code run as ``python -c code`` or ``python script.py args`` runs it, in a process
forked from an interpreter that has already imported some heavy modules (by default torch
and open_clip, and nothing of otviz): each run starts with nothing another run did, as a
fresh interpreter does, without paying the CPU those imports take on the 2-core machine
(4-5 s for torch and open_clip; 9 s with Gradio and the app, :mod:`tests.ui.test_stop`). The
docs pages' runs, the command-line runs that load a model and the served app use it.

The server is a plain ``python -c`` process that imports its modules and starts nothing: no
thread, Python's or native (checked before every fork: a server with a second thread
refuses to fork, and the run fails with the reason), so forking it is safe. A run gets what
a fresh interpreter starts with: its own ``__main__`` module, ``sys.argv`` and
``sys.path[0]`` (``""`` for ``-c``, the script's folder for a script), working folder,
environment, standard streams (stdin empty), a fresh seed of NumPy's global generator, and
the signal dispositions and mask a ``python`` started by the caller at that moment would
have (the caller's ignored signals and mask, then Python's start-up rules; whatever an import
or the server's own start changed is undone, so a run's own handlers are what signals
reach). The variables Python reads as it starts (``PYTHON*``) cannot differ from
the server's: a run asking for others is refused. At its end a run waits for its non-daemon
threads and runs its ``atexit`` functions, as an interpreter's exit does (ended by an
uncaught ``KeyboardInterrupt``, it then kills itself with SIGINT, as python does). A run may
have a session of its own (``os.setsid``, as ``start_new_session=True``), so that it can be
signalled and its group killed; runs may overlap.

(The servers run with ``OMP_NUM_THREADS=1``, :func:`tests.helpers.child_env`: without it
torch's import leaves a native thread, OpenMP's, and the server would refuse to fork.)
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: The forking server's source (runs as ``python -c SERVER module...``).
SERVER = r"""
import atexit, importlib, json, os, select, signal, sys, threading, traceback, types

for name in sys.argv[1:]:
    importlib.import_module(name)


def answer(**fields):
    print(json.dumps(fields), flush=True)


def single_threaded():
    threads, native = threading.active_count(), len(os.listdir("/proc/self/task"))
    if (threads, native) != (1, 1):
        answer(error=f"the preloaded interpreter has {threads} Python and {native} native "
                     f"threads after importing {sys.argv[1:]}: forking it is not safe")
        sys.exit(1)


def fresh_dispositions(ignored):
    # what python started by the caller now begins with: the signals the caller ignores stay
    # ignored across exec, every other one is back at its default; then Python's own start-up
    # ignores SIGPIPE and SIGXFSZ and, unless SIGINT is ignored, gives SIGINT
    # default_int_handler (Python/pylifecycle.c, Modules/signalmodule.c)
    out = {s: signal.SIG_IGN if s in ignored else signal.SIG_DFL
           for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}
    out[signal.SIGPIPE] = out[signal.SIGXFSZ] = signal.SIG_IGN
    if signal.SIGINT not in ignored:
        out[signal.SIGINT] = signal.default_int_handler
    return out


def run(job):
    if job["session"]:
        os.setsid()
    for signum, handler in fresh_dispositions(set(job["ignored"])).items():
        if signal.getsignal(signum) != handler:
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, job["mask"])
    if "numpy.random" in sys.modules:  # a fresh interpreter seeds it from the OS
        sys.modules["numpy.random"].seed()
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
        if path is None:  # 2>&1
            os.dup2(1, fd)
            continue
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    argv = job["argv"]
    main = types.ModuleType("__main__")
    if argv[0] == "-c":
        source, filename, sys.argv, sys.path[0] = argv[1], "<string>", ["-c", *argv[2:]], ""
    else:
        with open(argv[0], "rb") as script:
            source = script.read()
        filename, sys.argv, main.__file__ = argv[0], argv, argv[0]
        sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    sys.modules["__main__"] = main
    try:
        exec(compile(source, filename, "exec"), main.__dict__)
        code = 0
    except SystemExit as stop:  # as the interpreter ends: a number, None (0) or a message (1)
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # the traceback from the run's code, as python prints it
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


children = {}  # pid: whether it leads a session of its own
while True:  # jobs from stdin; each child's exit reported once it ends (polled while any runs)
    if select.select([sys.stdin], [], [], 0.05 if children else None)[0]:
        line = sys.stdin.readline()
        if not line:
            break
        job = json.loads(line)
        single_threaded()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run(job)
                if code == -signal.SIGINT:  # as python ends on Ctrl-C: killed by SIGINT
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGINT)
            finally:
                os._exit(code)
        children[pid] = job["session"]
        answer(pid=pid)
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        del children[pid]
        answer(pid=pid, returncode=os.waitstatus_to_exitcode(status))
for pid, session in children.items():  # stdin closed: what still runs goes with the server
    (os.killpg if session else os.kill)(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
os._exit(0)  # nothing to finalise: the answers are flushed (a finalisation took seconds)
"""


class _Server:
    """One forking server process and the reader of its answers (a thread): the pid of each
    fork, in order, and each run's exit status once it ends."""

    def __init__(self, env: dict[str, str], imports: tuple[str, ...]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, *imports], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.forks: queue.Queue[dict] = queue.Queue()
        self.exits: dict[int, int] = {}
        self.ended = False
        self.changed = threading.Condition()
        #: One job written and its answer read at a time: the answers come in the jobs'
        #: order, so two threads starting runs at once would otherwise take each other's pid.
        self.forking = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                answer = json.loads(line)
                if "returncode" in answer:
                    with self.changed:
                        self.exits[answer["pid"]] = answer["returncode"]
                        self.changed.notify_all()
                else:
                    self.forks.put(answer)
        finally:  # its end, or a line not of its answers (the waiting calls fail, not hang)
            with self.changed:
                self.ended = True
                self.changed.notify_all()
            self.forks.put({"error": self.gone()})

    def gone(self) -> str:
        return f"the preloaded interpreter stopped answering (exit status {self.proc.poll()})"

    def fork(self, job: dict) -> int:
        with self.forking:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            answer = self.forks.get()
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["pid"]

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status, waiting at most ``timeout`` seconds (None: until it ends)
        for it; None if it still runs then."""
        with self.changed:
            self.changed.wait_for(lambda: pid in self.exits or self.ended, timeout)
            if pid not in self.exits and self.ended:
                raise RuntimeError(self.gone())
            return self.exits.get(pid)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join()
        self.proc.stdout.close()


class Run:
    """A started run, as :class:`subprocess.Popen` shows a process: its ``pid``, ``poll``,
    ``wait``, ``send_signal`` and ``returncode``."""

    def __init__(self, server: _Server, pid: int, session: bool, args: list[str]) -> None:
        self._server, self.pid, self._session, self.args = server, pid, session, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._ended(0)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; :class:`subprocess.TimeoutExpired` if it still runs after
        ``timeout`` seconds."""
        if self.poll() is None and self._ended(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _ended(self, timeout: float | None) -> int | None:
        self.returncode = self._server.exit_status(self.pid, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the run (nothing once it has ended)."""
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the run, and to its process group when it leads a session; wait."""
        if self.poll() is None:
            (os.killpg if self._session else os.kill)(self.pid, signal.SIGKILL)
            self.wait()


def _startup_variables(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith("PYTHON")}


class PreloadedPython:
    """The forking server with ``imports`` done (started by the first run) and its runs."""

    def __init__(self, env: dict[str, str],
                 imports: tuple[str, ...] = ("open_clip", "torch")) -> None:
        self.env, self.imports = env, imports
        self._server: _Server | None = None

    def _started(self) -> _Server:
        if self._server is None or self._server.proc.poll() is not None:
            self._server = _Server(self.env, self.imports)
        return self._server

    def start(self, args: list[str], cwd: Path, env: dict[str, str] | None = None, *,
              stdout: Path, stderr: Path | None, new_session: bool = False) -> Run:
        """``python *args`` (``["-c", code]`` or ``[script, *argv]``) in ``cwd`` with ``env``
        (default: the server's), its streams written to the files ``stdout`` and ``stderr``
        (None: to ``stdout``, as ``2>&1``), in a session of its own if ``new_session``;
        returns at once."""
        env = env or self.env
        if _startup_variables(env) != _startup_variables(self.env):
            raise ValueError("a run's PYTHON* variables are the preloaded interpreter's: "
                             f"{_startup_variables(self.env)}")
        server = self._started()
        job = {"argv": args, "cwd": str(cwd), "env": env, "stdout": str(stdout),
               "stderr": None if stderr is None else str(stderr), "session": new_session,
               # what a python started from this thread now inherits (ignored signals, mask)
               "ignored": [int(s) for s in signal.valid_signals()
                           if signal.getsignal(s) == signal.SIG_IGN],
               "mask": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ())]}
        return Run(server, server.fork(job), new_session, ["python", *args])

    def run(self, code: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``python -c code`` in ``cwd`` with ``env`` (default: the server's); its exit status
        and output as :func:`subprocess.run` gives them with ``capture_output=True``; a run
        still going after ``timeout`` seconds is killed (exit status -9)."""
        with tempfile.TemporaryDirectory() as streams:
            out, err = Path(streams, "stdout"), Path(streams, "stderr")
            started = self.start(["-c", code], cwd, env, stdout=out, stderr=err)
            try:
                returncode = started.wait(timeout)
            except subprocess.TimeoutExpired:
                started.kill()
                returncode = started.returncode
            return subprocess.CompletedProcess(["python", "-c", code], returncode,
                                               out.read_text(), err.read_text())

    def close(self) -> None:
        """End the server (its stdin closed, then killed if it does not end); runs still
        going are killed with it."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
