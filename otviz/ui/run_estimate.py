"""Seconds a training run still needs, for the compute budget's "try again in about N s"
(:mod:`otviz.ui.budget`): from the run's measured progress, told as a countdown that never
goes up within the run.

A run encodes its data (pairs), then trains each method for its planned steps. Each phase's
rate is the mean over every interval between two of its progress reports so far (seconds
per pair while encoding, per step while training): a mean of all intervals, not a running
average of the last few, which swung the estimate by 2x with the machine's load (issue 50.7:
86, 134, 186 then 49 s within 30 s of one run). Until a phase has a measurement its units are
priced at the guess the run started with (a step's guess from the budget's learned cost,
never below its seed bound; an encoded pair's at nothing). The seconds since the last report
count as done. What is told is the least estimate told so far (:meth:`RunEstimate.left_s`):
a refusal never names a longer wait than an earlier one of the same run.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: The phase a run reports while it trains a method (steps); any other phase it reports
#: (``otviz.train.loop.ENCODING``: encoding its data, pairs) comes before it.
TRAINING = "training"


@dataclass
class _Rate:
    """Seconds over units of the intervals measured in one phase."""

    seconds: float = 0.0
    units: int = 0

    def per_unit(self, guess: float) -> float:
        return self.seconds / self.units if self.units else guess


@dataclass
class RunEstimate:
    """Seconds left of a run of methods with ``planned`` steps each, a step guessed at
    ``step_s`` seconds until measured (module docstring); ``clock`` in seconds."""

    planned: list[int]
    step_s: float
    clock: Callable[[], float] = time.monotonic
    _rates: dict[str, _Rate] = field(default_factory=dict)
    _method: int = 0
    _phase: str = ""
    _done: int = 0
    _total: int = 0
    _reported: float | None = None
    _told: float = math.inf
    _ended: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start_method(self, index: int) -> None:
        """Method ``index`` (of :attr:`planned`) begins: nothing of it measured yet."""
        with self._lock:
            self._method, self._phase, self._done, self._total = index, "", 0, 0
            self._reported = None

    def report(self, phase: str, done: int, total: int) -> None:
        """A progress report of the method running: ``done`` of ``total`` units of
        ``phase`` (:data:`TRAINING`'s steps, or the pairs of the phase before it)."""
        now = self.clock()
        with self._lock:
            if self._reported is not None and phase == self._phase and done > self._done:
                rate = self._rates.setdefault(phase, _Rate())
                rate.seconds += now - self._reported
                rate.units += done - self._done
            self._reported, self._phase, self._done, self._total = now, phase, done, total

    def end(self) -> None:
        """Training is over (what follows, e.g. the heads' probe, is not counted)."""
        with self._lock:
            self._ended = True

    def fresh_s(self) -> float:
        """The estimate from the progress measured so far, not held to earlier ones."""
        now = self.clock()
        with self._lock:
            if self._ended:
                return 0.0
            step_s = self._rates.get(TRAINING, _Rate()).per_unit(self.step_s)
            later = sum(self.planned[self._method + 1:])
            if self._phase == TRAINING:
                current = step_s * (self._total - self._done)
            elif self._phase:  # encoding the data, before the method's steps
                pair_s = self._rates.get(self._phase, _Rate()).per_unit(0.0)
                current = pair_s * (self._total - self._done) + step_s * self.planned[
                    self._method]
            else:  # a method about to start
                current = step_s * self.planned[self._method]
            since = 0.0 if self._reported is None else now - self._reported
            return max(0.0, current - since) + step_s * later

    def left_s(self) -> float:
        """The seconds told: the least of :meth:`fresh_s` over every call so far."""
        fresh = self.fresh_s()
        with self._lock:
            self._told = min(self._told, fresh)
            return self._told
