"""The "try again in about N s" of a refusal while a training run holds the slot (issue 50.7:
86, 134, 186 then 49 s within 30 s of one run; 134 and 186 s said when the slot freed after
46-63 s): N comes from the run's measured progress, never goes up within the run, and is
within a factor of 2 of the real wait. Driven on a fake clock: a run of two methods whose
encoding and steps take seeded random times around their means."""

from __future__ import annotations

import re

import numpy as np
import pytest

from otviz.ui.budget import MIN_RETRY_S, BudgetRefused, ComputeBudget
from otviz.ui.run_estimate import TRAINING, RunEstimate

PAIRS, REPORT_EVERY, PAIR_S = 256, 64, 0.01
STEPS, STEP_S = [60, 40], 0.3
#: The step guess a run starts with (the budget's seed bound: 0.5 s a step of 64 pairs).
GUESS_S = 0.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timeline(seed: int, slow_from: int | None = None) -> list[tuple[float, str, int, int]]:
    """``(time, phase, done, total)`` of each progress report of the run (``"start"`` for a
    method's start), each step taking 0.5-1.5 times its mean (twice that from step
    ``slow_from`` of the first method on: load arriving)."""
    rng = np.random.default_rng(seed)
    t, events = 0.0, []
    for index, steps in enumerate(STEPS):
        events.append((t, "start", index, 0))
        t += 1.0  # building the method
        for done in range(REPORT_EVERY, PAIRS + 1, REPORT_EVERY):
            t += REPORT_EVERY * PAIR_S * rng.uniform(0.5, 1.5)
            events.append((t, "encoding", done, PAIRS))
        for step in range(1, steps + 1):
            slow = 2.0 if slow_from is not None and index == 0 and step >= slow_from else 1.0
            t += STEP_S * slow * rng.uniform(0.5, 1.5)
            events.append((t, TRAINING, step, steps))
    events.append((t, "end", 0, 0))
    return events


def feed(estimate: RunEstimate, clock: FakeClock, event: tuple[float, str, int, int]
         ) -> float:
    """Tell ``estimate`` one event of a run's timeline at its time; returns the time."""
    clock.now, phase, done, total = event
    if phase == "start":
        estimate.start_method(done)
    elif phase == "end":
        estimate.end()
    else:
        estimate.report(phase, done, total)
    return clock.now


def told_along(events: list[tuple[float, str, int, int]]) -> list[tuple[float, float]]:
    """``(seconds told, real wait)`` asked every 0.25 s of the run."""
    clock = FakeClock()
    estimate = RunEstimate(list(STEPS), GUESS_S, clock)
    end, out, k = events[-1][0], [], 0
    for ask in np.arange(0.0, end, 0.25):
        while k < len(events) and events[k][0] <= ask:
            feed(estimate, clock, events[k])
            k += 1
        clock.now = float(ask)
        out.append((estimate.left_s(), end - ask))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_estimate_never_goes_up_and_is_within_2x_of_the_real_wait(seed):
    told = told_along(timeline(seed))
    said = [s for s, _ in told]
    assert all(b <= a for a, b in zip(said, said[1:], strict=False))
    # where a refusal names it (the budget's floor: MIN_RETRY_S)
    for s, real in told:
        shown = max(MIN_RETRY_S, s)
        if real >= MIN_RETRY_S:
            assert real / 2 <= shown <= 2 * real, (s, real)


def test_the_estimate_never_goes_up_when_the_steps_slow_down():
    said = [s for s, _ in told_along(timeline(0, slow_from=20))]
    assert all(b <= a for a, b in zip(said, said[1:], strict=False))


def test_a_mean_of_every_interval_not_of_the_last_few():
    """After steps of 0.1, 0.5, 0.1 and 0.5 s the step rate is their mean, 0.3 s."""
    clock = FakeClock()
    estimate = RunEstimate([10], GUESS_S, clock)
    estimate.report(TRAINING, 0, 10)
    for step, seconds in enumerate([0.1, 0.5, 0.1, 0.5], start=1):
        clock.now += seconds
        estimate.report(TRAINING, step, 10)
    assert estimate.fresh_s() == pytest.approx(0.3 * 6)


def test_the_budget_tells_the_estimate_of_the_run_holding_the_slot():
    """Refusals during the run name non-increasing waits, each within 2x of the real one."""
    clock = FakeClock()
    budget = ComputeBudget(slots=1, clock=clock)
    estimate = RunEstimate(list(STEPS), GUESS_S, clock)
    events = timeline(3)
    work = budget.acquire("trainer", "training", 0.0, capped=False)
    work.remaining = estimate.left_s
    said = []
    for event in events:
        t = feed(estimate, clock, event)
        with pytest.raises(BudgetRefused) as refused:
            budget.acquire("another visitor", "the trust metrics", 1.0)
        wait = int(re.search(r"try again in about (\d+) s", str(refused.value)).group(1))
        assert refused.value.retry_s == wait
        said.append(wait)
        real = events[-1][0] - t
        if real >= MIN_RETRY_S:
            assert real / 2 <= wait <= 2 * real + 1, (wait, real)
    assert all(b <= a for a, b in zip(said, said[1:], strict=False))
