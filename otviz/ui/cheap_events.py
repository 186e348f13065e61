"""The page's cheap events in progress, which expensive work steps aside for.

Expensive work admitted by the compute budget (:mod:`otviz.ui.budget`: the Trust panel)
shares the server's CPU cores with the page's ordinary events (the queue's default group:
an Align click, a phrase change, a view's button). It calls :meth:`CheapEvents.step_aside`
between its parts, which waits while any of those runs (:func:`cheap_event` counts them;
:func:`otviz.ui.inputs.guard_callbacks` wraps every ordinary event's callback), so a cheap
event waits for the CPU behind at most the part in progress. Issue 50.8: the first Align
click took 4-6 s, 12-18x idle, while a Trust panel computed under a flood of Trust requests.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator

#: The longest expensive work waits at one of its steps for the cheap events in progress
#: (a stream of them must not starve it).
STEP_ASIDE_S = 5.0


class CheapEvents:
    """The cheap events in progress (module docstring)."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A cheap event runs for the ``with`` block."""
        with self._idle:
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def step_aside(self, timeout_s: float = STEP_ASIDE_S) -> bool:
        """Wait (at most ``timeout_s``) until no cheap event runs; whether none does."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout_s)


#: The server's cheap events (:func:`cheap_event`).
CHEAP = CheapEvents()


def cheap_event(fn: Callable) -> Callable:
    """``fn`` (an event's callback, a generator's too) counted in :data:`CHEAP` while it
    runs."""
    if getattr(fn, "cheap", False):
        return fn
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def wrapped_gen(*args, **kwargs):
            with CHEAP.running():
                yield from fn(*args, **kwargs)

        wrapped_gen.cheap = True  # type: ignore[attr-defined]
        return wrapped_gen

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with CHEAP.running():
            return fn(*args, **kwargs)

    wrapped.cheap = True  # type: ignore[attr-defined]
    return wrapped
