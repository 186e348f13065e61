"""A clean stop of the served app: ``SIGTERM`` (a Space's restart, a service manager's stop)
or ``SIGINT`` (Ctrl-C) at any moment ends the server within :data:`STOP_DEADLINE_S` with
exit status 0 (docs/hosting.md, "Stopping").

On the first signal :func:`begin_stop` marks the server stopping (:func:`stopping`: the
compute budget admits no new work, the loops of expensive work poll it) and asks every
tracked party (:func:`track`: the training slot) to stop its work at its next step; the main
thread, which waits in :func:`wait_for_stop`, wakes. :func:`finish` closes the server in a
thread of its own while it waits for the tracked work to end (a stopped run saves its resume
state and its record) and for the close until :data:`STOP_GRACE_S` after the signal,
flushes the log, and ends the process with ``os._exit(0)``. (Gradio's
own close, on the main thread, took 7 s under load: uvicorn waits for open event streams.)

Why not a plain interpreter exit: Gradio's worker threads and the training thread are
daemon threads, and a daemon thread still inside a torch operator when the interpreter
finalises is ended by ``pthread_exit`` through a C++ ``noexcept`` frame, which aborts the
process ("terminate called without an active exception", SIGABRT, exit 134: 3 of 4 runs
stopped mid-training before this module). The work that must finish is waited for
explicitly; what is left is cut without running the interpreter's finalisation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

from otviz.errors import InputError

#: The longest a stop may take from the signal to the process's end, in seconds.
STOP_DEADLINE_S = 10.0
#: How long the work running and the server's close are given, from the signal; the rest of
#: :data:`STOP_DEADLINE_S` is a margin for flushing the log and a loaded machine.
STOP_GRACE_S = 6.0

log = logging.getLogger("otviz.ui.shutdown")


class Stoppable(Protocol):
    """Something holding work that a server stop must end: the training slot."""

    def stop_all(self) -> None:
        """Ask the work to stop at its next step (returns at once)."""

    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the work to end; whether it did."""


_STOPPING = threading.Event()
_SIGNALLED_AT: list[float] = []
_TRACKED: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()


def stopping() -> bool:
    """Whether the server is stopping (a signal came): expensive work polls it."""
    return _STOPPING.is_set()


def refuse_if_stopping(what: str) -> None:
    """Raise :class:`~otviz.errors.InputError` (shown as the event's message) when the server
    is stopping: expensive work calls it before each of its parts."""
    if stopping():
        raise InputError(f"{what} not finished: the server is stopping; try again in a "
                         "minute, once it has restarted")


def track(party: Stoppable) -> None:
    """Have :func:`begin_stop` stop ``party``'s work and :func:`finish` wait for it (kept by
    a weak reference: a party dropped is no longer waited for)."""
    with _LOCK:
        _TRACKED.add(party)


def _tracked() -> list[Stoppable]:
    with _LOCK:
        return list(_TRACKED)


def begin_stop() -> bool:
    """Mark the server stopping and ask every tracked party to stop its work; False when the
    stop had already begun."""
    with _LOCK:
        if _STOPPING.is_set():
            return False
        _STOPPING.set()
        _SIGNALLED_AT.append(time.monotonic())
    for party in _tracked():
        try:
            party.stop_all()
        except Exception:  # one party's failure must not keep the others running
            log.exception("stopping %r failed", party)
    return True


def _on_signal(signum: int, frame: object) -> None:
    """The first ``SIGTERM`` / ``SIGINT``: begin the stop and leave the serving loop (as
    Ctrl-C does); a later one is ignored (the stop is under way and bounded)."""
    if begin_stop():
        log.info("signal %d: stopping the server", signum)
        raise KeyboardInterrupt


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals() -> dict[int, Any]:
    """Route ``SIGTERM`` and ``SIGINT`` to :func:`_on_signal` (from the main thread only, as
    Python requires); returns the handlers they had. Python's default for ``SIGTERM`` ends
    the process at once, skipping every ``finally``; its ``SIGINT`` raises again on a second
    Ctrl-C mid-stop."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _on_signal) for signum in STOP_SIGNALS}


def drain(grace_s: float = STOP_GRACE_S) -> bool:
    """Stop the tracked work (:func:`begin_stop`, if no signal did) and wait for it until
    ``grace_s`` after the stop began; whether all of it ended in time."""
    begin_stop()
    deadline = _SIGNALLED_AT[0] + grace_s
    ended = True
    for party in _tracked():
        ended &= party.wait_stopped(max(0.0, deadline - time.monotonic()))
    if not ended:
        log.warning("work still running %.0f s after the stop: cut", grace_s)
    return ended


def wait_for_stop() -> None:
    """Block until the server is stopping (waking every second, so that the signal's handler
    runs promptly on the main thread)."""
    while not _STOPPING.wait(1.0):
        pass


def finish(close: Callable[[], None] | None = None, status: int = 0) -> NoReturn:
    """End the process with ``status``: ``close`` (the server's) runs in a thread of its own
    while :func:`drain` waits for the work; both are given until :data:`STOP_GRACE_S` after
    the stop began, then the log and the standard streams are flushed and the process ends
    at once (module docstring: no interpreter finalisation)."""
    began = time.monotonic()
    closer = threading.Thread(target=close or (lambda: None), name="otviz-close", daemon=True)
    closer.start()
    drain()
    closer.join(max(0.0, _SIGNALLED_AT[0] + STOP_GRACE_S - time.monotonic()))
    log.info("stopped %.1f s after the stop began (%.1f s closing and waiting for work)%s",
             time.monotonic() - _SIGNALLED_AT[0], time.monotonic() - began,
             "" if not closer.is_alive() else "; the server's close was cut")
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
