"""Cheap events never wait behind expensive ones (issue 50.8: the first Align click took
15.7 s, 14x idle, while 34 Trust requests arrived): a new session copies the page's initial
configs instead of rebuilding them on the event loop, the page's ordinary events count as
cheap from the moment they join the queue and while they run, and expensive work steps
aside for them between its parts and before each call of its model."""

from __future__ import annotations

import threading
import time

import gradio as gr
import pytest
import torch
from gradio.state_holder import SessionState
from gradio_client import Client

from otviz.ui import cheap_events
from otviz.ui.cheap_events import (
    CHEAP,
    QUEUED_TTL_S,
    CheapEvents,
    StepAside,
    cheap_event,
    watch_queue,
    yielding,
)
from otviz.ui.sessions import remember_initial_configs
from otviz.ui.trust_panel import trust_rows
from tests.conftest import free_port
from tests.ui.test_trust_panel import FAST

#: Long enough for a computation that does not wait to have gone on.
SETTLE_S = 0.5


@pytest.fixture()
def page() -> gr.Blocks:
    with gr.Blocks() as blocks:
        name = gr.Textbox("a red circle", label="Caption")
        pick = gr.Dropdown(["a", "b"], value="a", label="Phrase")
        gr.Button("Align").click(lambda text, p: text, [name, pick], name, api_name="align")
    return blocks


def test_a_session_copies_the_configs_gradio_would_build(page):
    built = SessionState(page).config_values
    remember_initial_configs(page)
    first, second = SessionState(page), SessionState(page)
    assert first.config_values == built
    pick = next(k for k, c in built.items() if c.get("props", {}).get("label") == "Phrase")
    first._update_value_in_config(pick, "b")  # a session's value stays its own
    assert second.config_values[pick]["props"]["value"] == "a"
    updated = gr.Dropdown(["a", "b", "c"], value="c", label="Phrase", render=False)
    fresh = first.blocks_config.config_for_block(pick, [], updated)  # not the remembered one
    assert fresh["props"]["choices"] == [("a", "a"), ("b", "b"), ("c", "c")]
    assert SessionState(page).config_values == built


def test_step_aside_waits_while_a_cheap_event_runs():
    events = CheapEvents()
    assert events.step_aside(0.0)  # none running
    with events.running():
        start = time.monotonic()
        assert not events.step_aside(0.2)  # a stream of them cannot starve the work
        assert time.monotonic() - start >= 0.2
        done = threading.Event()
        threading.Thread(target=lambda: done.set() if events.step_aside(10) else None).start()
        assert not done.wait(SETTLE_S)
    assert done.wait(5)


def test_cheap_callbacks_are_counted_while_they_run():
    seen = []

    @cheap_event
    def plain():
        seen.append(CHEAP.step_aside(0.0))

    @cheap_event
    def stream():
        seen.append(CHEAP.step_aside(0.0))
        yield 1

    plain()
    list(stream())
    assert seen == [False, False] and CHEAP.step_aside(0.0)
    assert cheap_event(plain) is plain


def test_the_app_counts_its_ordinary_events_as_cheap_and_not_the_expensive_ones(live_app):
    fns = {f.api_name: f for f in live_app.blocks.fns.values()}
    assert getattr(fns["align"].fn, "cheap", False)
    assert getattr(fns["words"].fn, "cheap", False)
    assert not getattr(fns["align_trust"].fn, "cheap", False)
    queue = live_app.blocks._queue  # and counts them from the moment they join
    assert (queue.push.__name__, queue.process_events.__name__) == (
        "counted_push", "counted_process")


def test_the_trust_panel_steps_aside_while_a_cheap_event_runs(tools, example):
    """Nothing of the panel is computed while an Align click runs; it goes on after."""
    explainer, suite = tools
    encoded = explainer.encode(example[0], example[1])
    from otviz.ui.trust_panel import TrustCache

    steps: list = []
    with CHEAP.running():
        worker = threading.Thread(target=lambda: steps.extend(trust_rows(
            explainer, suite, encoded, [0, 1], False, TrustCache(), FAST)))
        worker.start()
        worker.join(SETTLE_S)
        assert steps == [] and worker.is_alive()
    worker.join(120)
    assert not worker.is_alive() and steps and steps[-1][0]


def test_a_queued_event_counts_until_it_ends_and_is_forgotten_after_a_while():
    now = [0.0]
    events = CheapEvents(clock=lambda: now[0])
    events.joined("a")
    events.joined("b")
    assert not events.step_aside(0.0)
    events.done(["a"])
    assert not events.step_aside(0.0)
    events.done(["b"])
    assert events.step_aside(0.0)
    events.joined("left-the-queue")  # never reported done
    now[0] = QUEUED_TTL_S + 1
    assert events.step_aside(0.0)


class _Waits:
    """A stand-in for :class:`CheapEvents` whose cheap event never ends: each step aside
    waits its whole timeout."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def step_aside(self, timeout_s: float) -> bool:
        self.timeouts.append(timeout_s)
        time.sleep(timeout_s)
        return False


def test_expensive_work_steps_aside_for_a_bounded_time_in_all():
    events = _Waits()
    step = StepAside(total_s=0.2, events=events)  # type: ignore[arg-type]
    for _ in range(4):
        step()
    assert events.timeouts == [0.2]  # then it no longer waits


def test_expensive_work_waits_before_each_model_call_and_the_hook_goes_after():
    events = CheapEvents()
    model = torch.nn.Linear(2, 1)
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    done = threading.Event()

    def work() -> None:
        with yielding(model, StepAside(events=events)):
            for _ in range(3):
                model(torch.ones(1, 2))
        done.set()

    with events.running():
        worker = threading.Thread(target=work)
        worker.start()
        assert not done.wait(SETTLE_S) and calls == []  # its first model call waits
    assert done.wait(30) and calls == [1, 1, 1]
    assert not model._forward_pre_hooks


@pytest.fixture()
def queued_page(monkeypatch):
    """A page queued one event at a time with a cheap event (the default group) and an
    expensive one (``concurrency_limit=None``, as the Trust panel's) that run model calls
    through :func:`yielding`, its queue watched into its own :class:`CheapEvents`; served on
    loopback. Yields the page's client, its events, the gates that hold each callback, the
    expensive work's model calls and the events whose callbacks started. A step aside waits
    up to 60 s here (no expensive call slips through while a slow machine runs the test)."""
    monkeypatch.setattr(cheap_events, "STEP_ASIDE_S", 60.0)
    events, model = CheapEvents(), torch.nn.Linear(2, 1)
    gates = {"cheap": threading.Event(), "expensive": threading.Event()}
    started = {"cheap": threading.Semaphore(0), "expensive": threading.Semaphore(0)}
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))

    def cheap(text: str) -> str:
        started["cheap"].release()
        gates["cheap"].wait(60)
        return text

    def expensive(text: str) -> str:
        started["expensive"].release()
        with yielding(model, StepAside(events=events)):
            while not gates["expensive"].is_set():
                model(torch.ones(1, 2))
                time.sleep(0.01)
        return text

    with gr.Blocks() as page:
        box = gr.Textbox()
        gr.Button("cheap").click(cheap, box, box, api_name="cheap")
        gr.Button("expensive").click(expensive, box, box, api_name="expensive",
                                     concurrency_limit=None)
    page.queue(default_concurrency_limit=1)
    watch_queue(page, events)
    port = free_port()
    page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                quiet=True, ssr_mode=False)
    yield Client(f"http://127.0.0.1:{port}/", verbose=False), events, gates, calls, started
    for gate in gates.values():
        gate.set()
    page.close()


def test_a_cheap_event_starts_and_ends_while_expensive_ones_run(queued_page):
    """Three expensive events admitted and running do not hold up a cheap one; the
    expensive work makes no model call from the cheap event's arrival in the queue (a
    second cheap one waits there behind the first) until both are answered."""
    client, events, gates, calls, started = queued_page
    expensive = [client.submit("x", api_name="/expensive") for _ in range(3)]
    for _ in expensive:
        assert started["expensive"].acquire(timeout=60)
    assert events.step_aside(0.0)  # expensive events do not count
    first = client.submit("a", api_name="/cheap")
    assert started["cheap"].acquire(timeout=60)  # the cheap callback runs
    second = client.submit("b", api_name="/cheap")  # queued behind it (one at a time)
    time.sleep(SETTLE_S)
    before = len(calls)
    assert not events.step_aside(0.0)
    time.sleep(SETTLE_S)
    assert len(calls) == before  # each waits at its next call's hook
    gates["cheap"].set()
    assert first.result(timeout=60) == "a" and second.result(timeout=60) == "b"
    assert not any(job.done() for job in expensive)  # they were running all along
    assert events.step_aside(10)
    grown = len(calls)
    deadline = time.monotonic() + 30
    while len(calls) == grown and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(calls) > grown  # the expensive work goes on
    gates["expensive"].set()
    assert [job.result(timeout=60) for job in expensive] == ["x"] * 3
