"""Which event a view listens to for a person's edit of a control (otviz.ui.events); the
browser test ``test_a_pick_in_a_dropdown_is_one_server_call`` checks the count in Chromium.
A view's downloads, recorded while it computes, are written by a step after its pictures
(``offer_downloads``); the browser tests see them reach each Downloads box."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from otviz.ui.downloads import DownloadDir, PendingDownloads, write_downloads
from otviz.ui.events import edit_event, offer_downloads, on_edit


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


def _record(out: DownloadDir | PendingDownloads) -> None:
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    out.save_figure(fig, "curve")
    out.save_array(np.arange(6.0).reshape(3, 2), "values", columns=["a", "b"])
    out.save_json({"x": float("nan")}, "meta")
    out.save_table(pd.DataFrame({"image": [0, 1], "label": ["red", "blue"]}), "table")


def test_pending_downloads_write_what_the_same_calls_write_at_once(tmp_path):
    now = DownloadDir(root=tmp_path / "now")
    _record(now)
    pending = PendingDownloads()
    _record(pending)
    assert not (tmp_path / "later").exists()  # nothing is written before write()
    later = [Path(p) for p in pending.write(root=tmp_path / "later")]
    assert [p.name for p in later] == [p.name for p in now.files] == [
        "curve.png", "values.npy", "values.csv", "meta.json", "table.csv"]
    for a, b in zip(now.files, later, strict=True):
        if a.suffix != ".png":  # PNG metadata may carry a timestamp
            assert a.read_bytes() == b.read_bytes(), a.name
    assert later[0].read_bytes()[:4] == b"\x89PNG"
    assert json.loads(later[3].read_text()) == {"x": None}
    assert write_downloads(None) == (None, None)


def test_offer_downloads_adds_a_private_step_after_the_event_that_reads_its_state_only():
    with gr.Blocks() as blocks:
        text, pending, files = gr.Textbox(), gr.State(), gr.File(file_count="multiple")
        button = gr.Button()
        offer_downloads(button.click(lambda t: PendingDownloads(), text, pending,
                                     api_name="view"), pending, files)
    first, step = blocks.fns.values()
    assert step.fn is write_downloads and step.trigger_after == first._id
    assert [c._id for c in step.inputs] == [pending._id]
    assert [c._id for c in step.outputs] == [files._id, pending._id]
