"""Which event a view listens to for a person's edit of a control (otviz.ui.events); the
browser test ``test_a_pick_in_a_dropdown_is_one_server_call`` checks the count in Chromium."""

from __future__ import annotations

import gradio as gr

from otviz.ui.events import edit_event, on_edit


def test_single_select_dropdowns_listen_to_blur_others_to_input():
    with gr.Blocks():
        assert edit_event(gr.Dropdown(["a", "b"])) == "blur"
        assert edit_event(gr.Dropdown(["a", "b"], allow_custom_value=True)) == "blur"
        assert edit_event(gr.Dropdown(["a", "b"], multiselect=True)) == "input"
        assert edit_event(gr.Radio(["a", "b"])) == "input"
        assert edit_event(gr.CheckboxGroup(["a", "b"])) == "input"


def test_on_edit_registers_one_listener_on_that_event():
    with gr.Blocks() as blocks:
        pick, out = gr.Dropdown(["a", "b"]), gr.Textbox()
        on_edit(pick, lambda v: v, pick, out, api_name="pick")
    triggers = [(t[0], t[1]) for dep in blocks.fns.values() for t in dep.targets]
    assert triggers == [(pick._id, "blur")]
