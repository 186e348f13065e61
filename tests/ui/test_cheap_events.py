"""Cheap events never wait behind expensive ones (issue 50.8: the first Align click took
15.7 s, 14x idle, while 34 Trust requests arrived): a new session copies the page's initial
configs instead of rebuilding them on the event loop, the page's ordinary events count as
cheap while they run, and the Trust panel steps aside for them between its parts."""

from __future__ import annotations

import threading
import time

import gradio as gr
import pytest
from gradio.state_holder import SessionState

from otviz.ui.cheap_events import CHEAP, CheapEvents, cheap_event
from otviz.ui.sessions import remember_initial_configs
from otviz.ui.trust_panel import trust_rows
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
