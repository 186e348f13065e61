"""One compute budget per server for the app's expensive events: the Trust panel, Browse's
trust sort, app training and the explainer maps (docs/hosting.md, "Compute budget").

Work asks :class:`ComputeBudget` before it starts, with an estimate of its cost in seconds;
the budget refuses it at once, with :class:`BudgetRefused` (a readable message saying when
to try again), when

* the estimate is over the per-request cap (the message says what to make smaller),
* the visitor (Gradio's session of the page or API client) already has
  :attr:`ComputeBudget.per_visitor` pieces of expensive work running, or
* the server already runs :attr:`ComputeBudget.slots` of them, from any event, or
* the server process's resident memory is over :attr:`ComputeBudget.max_rss_mb` (after a
  garbage collection): the work running, or caches, hold it.

Nothing waits: expensive events run outside Gradio's per-event limits
(``concurrency_limit=None``) and are answered at once when refused, so they never hold a
place in the queue that cheap events (Align, a phrase change) wait in. Admitted work shares
the CPU with the cheap events, so it steps aside for them between its parts
(:mod:`otviz.ui.cheap_events`: the queue's default group, every event of the page but the
expensive ones): a cheap event waits for at most the part in progress. Estimates come from
:class:`CostModel`: seconds per map of each trust metric and of each explainer, seeded with
the figures measured on the 2-core machine (docs/trust.md) and updated with every
measurement the work reports.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from otviz.explain import InputError
from otviz.ui.context import on_space
from otviz.ui.shutdown import refuse_if_stopping

#: Expensive pieces of work at once per server, on a Space / elsewhere
#: (``OTVIZ_EXPENSIVE_SLOTS`` overrides).
SPACE_SLOTS, LOCAL_SLOTS = 1, 2
#: Expensive pieces of work at once per visitor.
PER_VISITOR = 1
#: Estimated seconds one request may cost at most, on a Space / elsewhere
#: (``OTVIZ_MAX_REQUEST_S`` overrides).
SPACE_MAX_REQUEST_S, LOCAL_MAX_REQUEST_S = 120.0, 600.0
#: The soonest "try again in" a refusal names, in seconds.
MIN_RETRY_S = 5
#: Resident memory (MB) of the server process above which expensive work is not started, on
#: a Space (``OTVIZ_MAX_RSS_MB`` overrides): a free CPU Space has 16 GB, and the served app
#: grew by 0.1-0.3 GB in the load test and Browse's chunked trust sort by 0.26-0.37 GB
#: (docs/hosting.md), so the 4 GB left cover the work admitted just under the cap.
SPACE_MAX_RSS_MB = 12 * 1024
#: Elsewhere: this share of the machine's physical memory.
LOCAL_MAX_RSS_SHARE = 0.75
#: "Try again in" of a memory refusal when no expensive work is running (caches hold the
#: memory; nothing is expected to free it soon).
IDLE_MEMORY_RETRY_S = 300
#: Seconds per map, seeded from docs/trust.md's "background torch process" column (2 CPU
#: cores, load 2.5-3.7): drawing the map, and each trust metric on it. MPRT's randomised
#: model is drawn once per request and shared (0.39-0.65 s, then 3-42 ms a map at load 5-6,
#: benchmarks/trust_panel_latency.md): 0.1 s a map over a panel of 10.
SEED_MAP_S = 0.095
SEED_METRIC_S = {
    "pointing": 0.005, "mass": 0.005, "rank": 0.005, "auc": 0.005,
    "sparseness": 0.005, "random_logit": 0.09, "deletion": 0.414, "insertion": 0.414,
    "faith_corr": 0.414, "max_sensitivity": 0.273, "mprt": 0.1,
}
#: Seconds per map of an explainer: the dearest of the embedded model's, one map at a time,
#: was 84 ms (Chefer; Grad-CAM 80, LeGrad 45, MaskCLIP 30) on the 2-core machine at load
#: ~9.7; and per training pair of an optimiser step of app training (a bound: 0.5 s a step
#: of the form's batch of 64). A step's cost grows with its batch, so the estimate is per
#: pair: a rate learned at batch 8 applied per step to a batch of 64 said "about 5 s" while
#: the slot stayed busy 40-80 s more.
SEED_EXPLAINER_S, SEED_PAIR_STEP_S = 0.1, 0.5 / 64
#: Weight of a new measurement in the running estimate.
SMOOTHING = 0.3


class BudgetRefused(InputError):
    """Expensive work refused by the server's compute budget (the message says when to try
    again: ``retry_s`` seconds, ``None`` for work too large to admit at all)."""

    def __init__(self, message: str, retry_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_s = retry_s


@dataclass
class CostModel:
    """Seconds per unit of each kind of work (a metric's map, an explainer's map, a training
    pair of an optimiser step), seeded and then a running average of what was measured."""

    seconds: dict[str, float] = field(default_factory=lambda: {
        "map": SEED_MAP_S, "explainer": SEED_EXPLAINER_S, "train_pair": SEED_PAIR_STEP_S,
        **{f"metric:{k}": v for k, v in SEED_METRIC_S.items()}})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def unit(self, kind: str, seed: float | None = None) -> float:
        """Seconds per unit of ``kind``: measured, else ``seed``, else the dearest unit
        known."""
        with self._lock:
            return self.seconds.get(kind, max(self.seconds.values()) if seed is None else seed)

    def record(self, kind: str, seconds_per_unit: float) -> None:
        """Fold one measurement (seconds per unit of ``kind``) into the estimate."""
        if not math.isfinite(seconds_per_unit) or seconds_per_unit < 0:
            return
        with self._lock:
            old = self.seconds.get(kind, seconds_per_unit)
            self.seconds[kind] = (1 - SMOOTHING) * old + SMOOTHING * seconds_per_unit

    def trust(self, n_maps: int, metrics: Iterable[str]) -> float:
        """Seconds to draw ``n_maps`` maps and score each with ``metrics`` (keys)."""
        per_map = self.unit("map") + sum(self.unit(f"metric:{k}") for k in metrics)
        return n_maps * per_map

    def record_trust(self, ms: dict[str, float], n_maps: int) -> None:
        """Fold a trust computation's measured ms (:attr:`TrustScores.ms`: per metric key,
        ``"maps"`` for the maps) over ``n_maps`` maps into the estimates."""
        for key, total in ms.items():
            self.record("map" if key == "maps" else f"metric:{key}",
                        total / 1000 / max(1, n_maps))


@dataclass(eq=False)
class Work:
    """One admitted piece of expensive work: estimated ``cost_s`` seconds at its start;
    ``remaining`` (set by work that measures its own progress, e.g. a training run) tells
    the seconds it still needs from what it has done and its measured rate."""

    visitor: str
    what: str
    cost_s: float
    started: float
    remaining: Callable[[], float] | None = None

    def left_s(self, now: float) -> float:
        """Seconds until this work is expected to end: its own live estimate, else its
        estimate at the start less the time since."""
        if self.remaining is not None:
            return self.remaining()
        return self.started + self.cost_s - now


def resident_mb() -> float | None:
    """This process's resident memory in MB (``/proc/self/statm``; ``None`` where there is
    no such file, e.g. macOS: no memory cap is enforced there)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def physical_mb() -> float | None:
    """The machine's physical memory in MB, where the OS tells."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, AttributeError):
        return None


def _megabytes(mb: float) -> str:
    return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "").strip() or default)
    except ValueError:
        return default


class ComputeBudget:
    """At most ``slots`` pieces of expensive work at once on the server, ``per_visitor`` per
    visitor, each estimated at most ``max_request_s`` seconds, none started while the
    process's resident memory (``memory()``, MB) is over ``max_rss_mb`` (``None``: no memory
    cap) (module docstring)."""

    def __init__(self, slots: int, per_visitor: int = PER_VISITOR,
                 max_request_s: float = LOCAL_MAX_REQUEST_S, clock=time.monotonic,
                 max_rss_mb: float | None = None,
                 memory: Callable[[], float | None] = resident_mb) -> None:
        self.slots, self.per_visitor, self.max_request_s = slots, per_visitor, max_request_s
        self.max_rss_mb, self._memory = max_rss_mb, memory
        self.costs = CostModel()
        self._clock = clock
        self._running: list[Work] = []
        self._lock = threading.Lock()

    @classmethod
    def for_server(cls) -> ComputeBudget:
        """The budget of this server: :data:`SPACE_SLOTS` or :data:`LOCAL_SLOTS`, the
        per-request cap and the memory cap (:data:`SPACE_MAX_RSS_MB`, or
        :data:`LOCAL_MAX_RSS_SHARE` of the machine's memory), unless the environment
        overrides them."""
        slots = SPACE_SLOTS if on_space() else LOCAL_SLOTS
        cap = SPACE_MAX_REQUEST_S if on_space() else LOCAL_MAX_REQUEST_S
        physical = physical_mb()
        rss = SPACE_MAX_RSS_MB if on_space() or physical is None else (
            LOCAL_MAX_RSS_SHARE * physical)
        return cls(max(1, int(_env_number("OTVIZ_EXPENSIVE_SLOTS", slots))),
                   max_request_s=_env_number("OTVIZ_MAX_REQUEST_S", cap),
                   max_rss_mb=_env_number("OTVIZ_MAX_RSS_MB", rss))

    def running(self) -> list[Work]:
        with self._lock:
            return list(self._running)

    def retry_after_s(self, visitor: str | None = None) -> int:
        """Seconds until the soonest running work (of ``visitor``, if given) is expected to
        end, from the work still to do (:meth:`Work.left_s`); at least :data:`MIN_RETRY_S`."""
        now = self._clock()
        with self._lock:
            running = [w for w in self._running if visitor in (None, w.visitor)]
        left = [w.left_s(now) for w in running]
        return max(MIN_RETRY_S, math.ceil(min(left, default=0.0)))

    def acquire(self, visitor: str, what: str, cost_s: float,
                capped: bool = True) -> Work:
        """Admit ``what`` (estimated ``cost_s`` seconds) for ``visitor`` or raise
        :class:`BudgetRefused` (an :class:`InputError` while the server stops);
        ``capped=False`` skips the per-request cap (work bounded otherwise: training by its
        step cap). Release it with :meth:`release`."""
        refuse_if_stopping(what)
        if capped and cost_s > self.max_request_s:
            raise BudgetRefused(
                f"{what} would take about {cost_s:.0f} s of computing, more than the "
                f"{self.max_request_s:.0f} s this server allows for one request: ask for "
                "less (fewer images or maps)")
        self._check_memory(what)
        with self._lock:
            mine = sum(w.visitor == visitor for w in self._running)
            busy = len(self._running) >= self.slots
            if mine < self.per_visitor and not busy:
                work = Work(visitor, what, cost_s, self._clock())
                self._running.append(work)
                return work
        if mine >= self.per_visitor:
            wait = self.retry_after_s(visitor)
            raise BudgetRefused(
                f"{what} not started: your previous expensive computation is still running "
                f"(at most {self.per_visitor} at a time per visitor); try again in about "
                f"{wait} s", wait)
        wait = self.retry_after_s()
        raise BudgetRefused(
            f"{what} not started: the server is busy with {self.slots} expensive "
            f"computation(s) (trust metrics, training, explainers); try again in about "
            f"{wait} s", wait)

    def _check_memory(self, what: str) -> None:
        """Raise :class:`BudgetRefused` when the process's resident memory is over the cap
        after a garbage collection."""
        if self.max_rss_mb is None or (self._memory() or 0.0) <= self.max_rss_mb:
            return
        gc.collect()
        used = self._memory() or 0.0
        if used <= self.max_rss_mb:
            return
        busy = bool(self.running())
        wait = self.retry_after_s() if busy else IDLE_MEMORY_RETRY_S
        why = ("the expensive work running now holds memory" if busy else
               "caches hold it and nothing expensive is running to free it sooner")
        raise BudgetRefused(
            f"{what} not started: the server is using {_megabytes(used)} of memory, over "
            f"the {_megabytes(self.max_rss_mb)} at which it starts no more expensive work "
            f"({why}); try again in about {wait} s", wait)

    def release(self, work: Work) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._running.remove(work)

    @contextlib.contextmanager
    def admit(self, visitor: str, what: str, cost_s: float) -> Iterator[Work]:
        """:meth:`acquire` for the ``with`` block, released when it ends."""
        work = self.acquire(visitor, what, cost_s)
        try:
            yield work
        finally:
            self.release(work)


_SERVER: ComputeBudget | None = None
_SERVER_LOCK = threading.Lock()


def server_budget() -> ComputeBudget:
    """The one budget of this server process (built on first use)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = ComputeBudget.for_server()
        return _SERVER


def visitor() -> str:
    """Who sent the event being run: its Gradio session (one per page load or API client);
    ``"local"`` outside an event (a direct call)."""
    from gradio.context import LocalContext

    request = LocalContext.request.get(None)
    session = getattr(request, "session_hash", None)
    return f"session:{session}" if session else "local"


@contextlib.contextmanager
def expensive(what: str, cost_s: float) -> Iterator[Work]:
    """The server budget's admission of ``what`` for the visitor of the running event."""
    with server_budget().admit(visitor(), what, cost_s) as work:
        yield work
