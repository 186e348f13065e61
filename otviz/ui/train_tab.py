"""The "Train small model" view: train method heads on the picked backbone's frozen features
(the synthetic world, or an image-caption folder: COCO captions JSON, Karpathy split JSON or
a CSV) with the papers' hyperparameters, watch the progress and the loss curves live, stop
when you like, and compare each finished head with its training-free configuration; the new
heads appear at once in the checkpoint picker.

Callbacks are plain functions of plain values (testable without a browser); the builder
only wires them to components. The recipe's components are generated from TrainConfig
(:mod:`otviz.ui.train_form`), the server's caps are :mod:`otviz.ui.train_policy`, the run
itself is :mod:`otviz.ui.train_jobs`.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd
import plotly.graph_objects as go

from otviz.explain import InputError
from otviz.suite import METHOD_LABELS, method_choices
from otviz.train.loop import ENCODING
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.downloads import DownloadDir
from otviz.ui.inputs import CheckedFile, user_errors
from otviz.ui.plots import FigurePlot
from otviz.ui.train_form import build_form, config_from_form
from otviz.ui.train_jobs import JobStatus, TrainingJob, TrainingJobs, status_record
from otviz.ui.train_policy import (
    FOLDER,
    WORLD,
    TrainRequest,
    data_sources,
    pair_cap,
    step_cap,
)
from otviz.viz.training import before_after_figure, loss_curves_figure

TAB_TITLE = "Train small model"
POLL_S = 0.5
HISTORY_COLUMNS = ["step", "epoch", "loss", "global", "local", "regulariser", "lr",
                   "grad_norm", "seconds"]
METRIC_COLUMNS = ["method", "status", "steps", "first loss", "final loss", "final local",
                  "s / step", "probe acc. training-free", "probe acc. trained"]

HOW_TO_READ = """**How to read this view.** Training fits only the method's own parameters
(projections, mass heads, anchors; ConceptOT Sec. 2.4) on the frozen backbone of the picked
checkpoint, whose features are computed once and cached (the bar says *encoding* while that
happens). The **bar** shows the optimiser steps of the method in training. The **loss
curves** show, per step, the training objective (the global contrastive term plus λ_l times
the local term, ConceptOT Eq. 10; QC-Align and PowerCLIP use their own local losses) and
the local term alone; with a frozen backbone and no global head the global term has no
gradient, but it differs from batch to batch, so the total is noisier than the local term.
**End-of-run metrics**: the first and final loss, the time per step, and the compositional
probe accuracy on the examples gallery (does the true caption outscore each hard
negative?) of the trained head next to the same method training-free. Each finished run
appears in the checkpoint picker as *trained here: ...*; every view can use it. One run at
a time per server; runs are capped at {cap} steps per method and {pairs} training pairs
here."""


def train_request(source: str, folder: str | None, uploads: list | None,
                  methods: list[str] | None, recipe: dict[str, Any]) -> TrainRequest:
    """The form's values as a :class:`TrainRequest`: the recipe's by TrainConfig field name
    (range checks come when it starts)."""
    return TrainRequest(
        methods=list(methods or []),
        config=config_from_form(recipe),
        source=source,
        folder=folder or "",
        uploads=[f if isinstance(f, str) else str(getattr(f, "name", f))  # keeps orig_name
                 for f in uploads or []],
    )


# ----------------------------------------------------------------------- rendering
def progress_html(status: JobStatus) -> str:
    """A progress bar of the current phase (encoding the data, or the steps of the method
    in training) with a line of text."""
    label = METHOD_LABELS.get(status.method, status.method)
    frac = status.step / status.total if status.total else 0.0
    if status.phase == ENCODING:
        text = f"encoding the training pairs with the backbone: {status.step}/{status.total}"
    elif status.phase == "evaluating":
        frac, text = 1.0, "scoring the trained heads on the examples gallery ..."
    elif status.done:
        frac = 1.0 if status.state == "finished" else frac
        text = f"{status.state}: {', '.join(METHOD_LABELS[m] for m in status.methods)}"
    else:
        k = status.methods.index(status.method) + 1 if status.method in status.methods else 1
        history = status.histories.get(status.method) or []
        loss = f", loss {history[-1]['loss']:.4f}" if history else ""
        text = (f"{label} ({k}/{len(status.methods)}): step {status.step}/{status.total}"
                f"{loss} · {status.seconds:.0f} s")
    pct = max(0.0, min(1.0, frac)) * 100
    return (
        f'<div class="otviz-progress" data-state="{status.state}" data-step="{status.step}">'
        '<div style="background:#e6e6e6;border-radius:4px;height:14px;width:100%">'
        f'<div style="background:#b5367a;border-radius:4px;height:14px;width:{pct:.1f}%">'
        f'</div></div><div style="font-size:0.9em;margin-top:4px">{html.escape(text)}</div>'
        "</div>"
    )


def status_markdown(status: JobStatus) -> str:
    """The run's state, its notes (caps, constant terms, ...) and any error."""
    lines = []
    if status.error:
        lines.append(f"**Training failed.** {html.escape(status.error)}")
    elif status.state == "stopped":
        lines.append("**Stopped.** Methods stopped before their end save no head.")
        if status.picker_entry:
            finished = [METHOD_LABELS.get(m, m) for m, r in status.results.items()
                        if r.status == "finished"]
            lines.append(f"The ones that had finished ({', '.join(finished)}) saved theirs: "
                         f"the checkpoint picker now offers **{status.picker_entry}**.")
    elif status.state == "finished":
        lines.append(f"**Finished** in {status.seconds:.0f} s.")
        if status.picker_entry:
            lines.append(f"The checkpoint picker now offers **{status.picker_entry}**.")
    else:
        lines.append("**Training ...** (Stop ends the run after the current step.)")
    lines += [f"- {html.escape(n)}" for n in status.notes]
    return "\n".join(lines)


def loss_figure(status: JobStatus) -> go.Figure:
    return loss_curves_figure(status.histories, METHOD_LABELS)


def metrics_table(status: JobStatus) -> pd.DataFrame:
    """One row per method: outcome, first and final loss, time per step and the probe
    accuracies (NaN where a number does not exist yet)."""
    rows = []
    for method in status.methods:
        result = status.results.get(method)
        history = status.histories.get(method) or []
        probe = status.probe.get(method, {})
        rows.append([
            METHOD_LABELS[method],
            result.status if result else ("running" if not status.done else "not run"),
            len(history),
            history[0]["loss"] if history else np.nan,
            history[-1]["loss"] if history else np.nan,
            history[-1]["local"] if history else np.nan,
            result.seconds_per_step if result and result.seconds_per_step else np.nan,
            probe.get("training-free", np.nan),
            probe.get("trained", np.nan),
        ])
    return pd.DataFrame(rows, columns=METRIC_COLUMNS).round(4)


def metrics_figure(status: JobStatus) -> go.Figure | None:
    """The probe accuracy of each trained head next to its training-free configuration."""
    if not status.probe:
        return None
    methods = list(status.probe)
    return before_after_figure(
        [METHOD_LABELS[m] for m in methods],
        [status.probe[m]["training-free"] for m in methods],
        [status.probe[m]["trained"] for m in methods],
        "Probe accuracy on the examples gallery",
        "accuracy (true caption wins)",
    )


def run_files(status: JobStatus) -> list[str]:
    """The loss curves (HTML), each method's per-step history (.npy + .csv) and the run's
    record (JSON)."""
    out = DownloadDir()
    out.save_figure(loss_figure(status), "loss_curves")
    for method, history in status.histories.items():
        if history:
            values = np.array([[r.get(c, np.nan) for c in HISTORY_COLUMNS] for r in history])
            out.save_array(values, f"history_{method}", columns=HISTORY_COLUMNS)
    out.save_json(status_record(status), "training_run")
    return [str(p) for p in out.files]


# ----------------------------------------------------------------------- callbacks
def follow_job(
    ctx: AppContext, job: TrainingJob, poll_s: float = POLL_S
) -> Iterator[tuple]:
    """The live view of ``job`` until it ends: ``(progress, status, curves, table,
    metrics figure, files, picker update)``, the last with the files and the picker's new
    choices."""
    while not job.finished.wait(poll_s):
        status = job.status()
        yield (progress_html(status), status_markdown(status), loss_figure(status),
               metrics_table(status), gr.skip(), gr.skip(), gr.skip())
    status = job.status()
    picker = gr.Dropdown(choices=ctx.checkpoint_choices()) if status.picker_entry else gr.skip()
    yield (progress_html(status), status_markdown(status), loss_figure(status),
           metrics_table(status), metrics_figure(status), run_files(status), picker)


def build_train_tab(ctx: AppContext, shared: SharedInputs, jobs: TrainingJobs | None = None
                    ) -> TrainingJobs:
    """Add the Train view to the enclosing ``gr.Blocks`` (inside its tab); returns the
    server's training slot."""
    jobs = jobs or TrainingJobs(ctx)
    with gr.Row():
        with gr.Column(scale=1):
            source = gr.Radio(data_sources(), value=WORLD, label="Training data")
            folder = gr.Textbox(label="Folder under the server's data root (OTVIZ_DATA_ROOT), "
                                "or its COCO / Karpathy JSON or CSV",
                                placeholder="coco (annotations/captions_train.json)",
                                visible=FOLDER in data_sources())
            uploads = CheckedFile(file_count="multiple", label="Upload: a .zip of the folder, "
                                  "or the images and their captions file (CSV path,caption)")
            methods = gr.CheckboxGroup(method_choices(), value=["conceptot"],
                                       label="Methods (trained one after the other)")
            with gr.Row():
                start = gr.Button("Start training", variant="primary")
                stop = gr.Button("Stop", variant="stop")
        with gr.Column(scale=1):
            recipe = build_form()
        with gr.Column(scale=2):
            bar = gr.HTML(elem_id="train-progress")
            status = gr.Markdown()
            curves = FigurePlot(label="Loss curves (live)", elem_id="train-curves")
    metrics_plot = FigurePlot(label="End-of-run metrics", elem_id="train-metrics")
    # full width: all its columns fit the page
    metrics = gr.Dataframe(headers=METRIC_COLUMNS, label="End-of-run metrics", wrap=True,
                           interactive=False)
    files = gr.File(label="Downloads (loss curves, histories, run record)", file_count="multiple")
    gr.Markdown(HOW_TO_READ.format(cap=step_cap(), pairs=pair_cap()))
    job_id = gr.State(None)

    @user_errors
    def on_start(checkpoint, features, image_size, source, folder, uploads, methods,
                 **recipe_v):
        checkpoint = ctx.read_as(checkpoint, features, image_size)  # heads train on it
        job = jobs.start(train_request(source, folder, uploads, methods, recipe_v), checkpoint)
        for update in follow_job(ctx, job):
            yield (job.id, *update)

    @user_errors
    def on_stop(current: str | None) -> str:
        if not jobs.stop(current):
            raise InputError("no run of yours is in progress")
        return "**Stopping** after the current step ..."

    inputs = [*shared.backbone, source, folder, uploads, methods]
    outputs = [job_id, bar, status, curves, metrics, metrics_plot, files, shared.checkpoint]
    # its own concurrency group: a second requester is answered at once (busy), not queued
    start.click(on_start, inputs, outputs, inputs_kwargs=recipe, api_name="train",
                concurrency_id="train", concurrency_limit=4)
    stop.click(on_stop, job_id, status, api_name="train_stop", concurrency_limit=None)
    return jobs

