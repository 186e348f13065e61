"""The page's cheap events in progress, which expensive work steps aside for.

Expensive work admitted by the compute budget (:mod:`otviz.ui.budget`: the Trust panel)
shares the server's CPU cores, and the interpreter, with the page's ordinary events (the
queue's default group: an Align click, a phrase change, a view's button). A cheap event
counts from the moment it joins the queue until its last message is sent
(:func:`watch_queue`), and while its callback runs (:func:`cheap_event`:
:func:`otviz.ui.inputs.guard_callbacks` wraps every ordinary event's callback, also
outside a queue). Expensive work calls a :class:`StepAside` between its parts and before
each call of its model (:func:`yielding`), which waits while any cheap event is in
progress, so a cheap event shares the CPU with at most one model call of it, not with a
whole part (a map's slow metrics: up to 1.5 s on the 2-core machine).

Issue 50.8: the first Align click took 15.7 s, 14x idle, while 34 Trust requests arrived;
3.2-6.1x after the page's configs were remembered and the panel stepped aside between its
parts; with the benchmark's clients apart from the server (as on a Space) and cheap events
counted from the queue, 1.6x [1.4, 2.2] on the idle machine (benchmarks/trust_flood_align.md).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gradio as gr
from torch import nn

#: The longest expensive work waits at one of its steps for the cheap events in progress
#: (a stream of them must not starve it).
STEP_ASIDE_S = 5.0
#: The longest one piece of expensive work waits in all (:class:`StepAside`): the budget's
#: slot it holds is freed at most this much later than its own computing needs.
STEP_ASIDE_TOTAL_S = 30.0
#: A queued cheap event no longer counts after this many seconds (one that left the queue
#: without being processed, e.g. its page was closed, is never reported done).
QUEUED_TTL_S = 60.0


class CheapEvents:
    """The cheap events in progress (module docstring): callbacks running, and events in
    the queue (by id, with when they joined), until reported done."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._running = 0
        self._queued: dict[str, float] = {}
        self._clock = clock
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A cheap event's callback runs for the ``with`` block."""
        with self._idle:
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def joined(self, event_id: str) -> None:
        """A cheap event joined the queue."""
        with self._idle:
            self._queued[event_id] = self._clock()

    def done(self, event_ids: Iterable[str]) -> None:
        """These events' last messages were sent."""
        with self._idle:
            for event_id in event_ids:
                self._queued.pop(event_id, None)
            self._idle.notify_all()

    def _quiet(self) -> bool:
        """No callback runs and no queued event younger than :data:`QUEUED_TTL_S`
        (older ones forgotten)."""
        oldest = self._clock() - QUEUED_TTL_S
        for event_id in [k for k, joined in self._queued.items() if joined < oldest]:
            del self._queued[event_id]
        return self._running == 0 and not self._queued

    def step_aside(self, timeout_s: float = STEP_ASIDE_S) -> bool:
        """Wait (at most ``timeout_s``) until no cheap event is in progress; whether none
        is."""
        with self._idle:
            return self._idle.wait_for(self._quiet, timeout_s)


#: The server's cheap events (:func:`cheap_event`, :func:`watch_queue`).
CHEAP = CheapEvents()


class StepAside:
    """One piece of expensive work's stepping aside for :data:`CHEAP`'s events: each call
    waits at most :data:`STEP_ASIDE_S`, all calls together at most ``total_s`` (the work
    stays bounded however many cheap events come)."""

    def __init__(self, total_s: float = STEP_ASIDE_TOTAL_S, events: CheapEvents = CHEAP
                 ) -> None:
        self.left_s, self.events = total_s, events

    def __call__(self) -> None:
        if self.left_s <= 0:
            return
        start = time.monotonic()
        self.events.step_aside(min(STEP_ASIDE_S, self.left_s))
        self.left_s -= time.monotonic() - start


@contextlib.contextmanager
def yielding(model: nn.Module, step: StepAside) -> Iterator[None]:
    """``step`` called before every call of ``model`` in the ``with`` block (a forward
    pre-hook, removed at the end; a copy made meanwhile, e.g. MPRT's randomised model,
    keeps it)."""
    handle = model.register_forward_pre_hook(lambda *_: step())
    try:
        yield
    finally:
        handle.remove()


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


def watch_queue(blocks: gr.Blocks, events: CheapEvents = CHEAP) -> None:
    """Count in ``events`` each of ``blocks``' ordinary events (the queue's default group,
    as :func:`~otviz.ui.inputs.guard_callbacks` tells them) from the moment it joins the
    queue until the queue has processed it: expensive work then steps aside while a cheap
    event waits for a worker, has its inputs read and its outputs sent, not only while its
    callback runs. Wraps the queue's own ``push`` and ``process_events`` (Gradio's
    ``gradio.queueing.Queue``); call it once the queue is set up (``blocks.queue``)."""
    queue = blocks._queue
    push, process = queue.push, queue.process_events

    async def counted_push(*args: Any, **kwargs: Any) -> tuple:
        body = kwargs["body"] if "body" in kwargs else args[0]
        joined = await push(*args, **kwargs)
        block_fn = blocks.fns.get(body.fn_index)
        if joined[0] and block_fn is not None and block_fn.concurrency_limit == "default":
            events.joined(joined[1])
        return joined

    async def counted_process(batch: list, *args: Any, **kwargs: Any) -> None:
        try:
            await process(batch, *args, **kwargs)
        finally:
            events.done(event._id for event in batch)

    queue.push = counted_push  # type: ignore[method-assign]
    queue.process_events = counted_process  # type: ignore[method-assign]
