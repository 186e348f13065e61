"""The Gradio app: shared inputs on top, one tab per view; it composes, computes nothing."""

from __future__ import annotations

import functools
import gc
import logging
import os
import sys
from typing import NoReturn

import gradio as gr

from otviz.text.parse import try_download_benepar
from otviz.ui.align import build_align_tab
from otviz.ui.anchors_tab import build_anchors_tab
from otviz.ui.browse_tab import TAB_TITLE as BROWSE_TITLE
from otviz.ui.browse_tab import AlignTarget, BrowseSources, build_browse_tab
from otviz.ui.cheap_events import watch_queue
from otviz.ui.context import AppContext, SharedInputs, on_space, remote_models
from otviz.ui.examples import inline_samples, load_examples
from otviz.ui.inputs import CheckedImage, guard_callbacks, on_upload
from otviz.ui.model_sources import ModelSource
from otviz.ui.phrase_grids import DRAWER
from otviz.ui.phrases_tab import build_phrases_tab
from otviz.ui.probe_tab import build_probe_tab
from otviz.ui.reading_controls import build_reading_controls
from otviz.ui.sessions import remember_initial_configs
from otviz.ui.shutdown import finish, stop_on_signals, wait_for_stop
from otviz.ui.startup_imports import import_lazy_modules
from otviz.ui.train_jobs import TrainingJobs
from otviz.ui.train_tab import build_train_tab
from otviz.ui.upload_cache import DELETE_CACHE, own_upload_cache
from otviz.ui.words_tab import build_words_tab
from otviz.ui.zeroshot_tab import build_zeroshot_tab

log = logging.getLogger("otviz.ui")

INTRO = """# otviz: optimal transport between image patches and caption words
Upload an image and type a caption (or pick an example), choose a checkpoint, then open a
view: **Align** compares how each method transports the caption's words onto the image's
patches. The embedded model is otviz's tiny CLIP, trained on its synthetic world of shapes;
real open_clip models appear in the picker where their weights can be downloaded, and heads
you train in the last tab appear there as soon as they finish."""

#: The views in page order (the first is the main one): tab title and builder.
VIEWS = (
    ("Align", build_align_tab),
    ("Anchors", build_anchors_tab),
    ("Phrases & regions", build_phrases_tab),
    ("Probe", build_probe_tab),
    ("Zero-shot", build_zeroshot_tab),
    ("Words", build_words_tab),
)
TRAIN_TITLE = "Train small model"
#: Concurrent events per server (one model, a few CPU cores) and waiting requests.
CONCURRENCY, SPACE_CONCURRENCY, QUEUE_SIZE = 2, 1, 32
#: Largest accepted upload (Gradio size syntax), everywhere; ``OTVIZ_MAX_FILE_SIZE`` or
#: ``app.py --max-file-size`` overrides.
MAX_UPLOAD = "50mb"
MAX_UPLOAD_ENV = "OTVIZ_MAX_FILE_SIZE"
#: Gradio floats a component's label badge over its top-left corner, on the figure's own
#: title: the badge gets a line of its own above the figure instead. After a refused event
#: Gradio also marks every output with a bare "Error" (its status tracker's ``span.error``)
#: beside the toast that says what is wrong: those marks are hidden, the toast stays.
APP_CSS = ('label[data-testid="block-label"].float { position: static !important; }\n'
           '.wrap:has(> span.error) { display: none !important; }\n'
           # the image input's label, made static above, takes its row of the box's fixed
           # height: the rest is a column the upload area shrinks to fit, its upload / webcam
           # / paste icons kept inside the box instead of cut off at its bottom edge
           '#shared-image { display: flex; flex-direction: column; }\n'
           '#shared-image > .image-container { flex: 1 1 0; min-height: 0; }\n'
           # a narrow page (760 px) stacks the image above the caption and pickers, so that
           # the checkpoint picker's entry fits on its line, and the block slider's label
           # never wraps beside its number box
           '@media (max-width: 900px) {\n'
           '  #shared-inputs { flex-wrap: wrap; }\n'
           '  #shared-inputs > * { min-width: 100% !important; }\n'
           '}\n'
           '#shared-layer label > span { white-space: nowrap; }\n'
           # a page too narrow for the heatmap grid at its own size (4 panels of 288 px)
           # shows it so, scrolled sideways, instead of shrunk until its titles are unreadable
           '@media (max-width: 1100px) {\n'
           '  #align-grid .image-container { overflow-x: auto; }\n'
           # block layout: a centred row would overflow on the left too, out of the scroll
           '  #align-grid .image-container > button, #align-grid .image-frame'
           ' { display: block; width: max-content; min-width: 100%; }\n'
           '  #align-grid .image-container img { width: auto; height: auto;'
           ' max-width: none; max-height: none; }\n'
           '}')


def tab_id(title: str) -> str:
    """The element id of a view's tab panel: ``"tab-"`` and the title's first word."""
    return "tab-" + title.split()[0].lower()


def build_shared_inputs(ctx: AppContext) -> SharedInputs:
    """The image, caption, checkpoint picker and reading controls every view reads, with
    the examples."""
    choices = ctx.checkpoint_choices()
    with gr.Row(elem_id="shared-inputs"):
        image = CheckedImage(label="Image", type="numpy", image_mode="RGB", height=260,
                             scale=1, elem_id="shared-image")
        with gr.Column(scale=2):
            caption = gr.Textbox(
                label="Caption", placeholder="a small red circle to the left of a blue star",
                elem_id="shared-caption",
            )
            # custom values: entries added since this page (or API client) got its list of
            # choices still pass; the context names unknown ones
            checkpoint = gr.Dropdown(choices, value=ctx.default_checkpoint(), label="Checkpoint",
                                     allow_custom_value=True, elem_id="shared-checkpoint")
            reading = build_reading_controls(ctx, checkpoint)
            examples = load_examples()
            picker = None
            if examples:
                picker = gr.Examples(
                    [[str(e.image_path), e.caption] for e in examples],
                    inputs=[image, caption],
                    label="Examples from the synthetic world",
                    examples_per_page=4,
                    elem_id="examples",
                )
                # the config names no file of the server's (Gradio's cache by absolute path)
                picker.dataset.samples = inline_samples(picker.dataset.samples)
    image.upload(on_upload, image, image, api_visibility="private", preprocess=False)
    return SharedInputs(image, caption, checkpoint, reading.features_value, reading.size_value,
                        picker)


def build_app(
    ctx: AppContext | None = None, jobs: TrainingJobs | None = None,
    browse: BrowseSources | None = None,
) -> gr.Blocks:
    """The app's Blocks: every view on one shared image, caption and checkpoint, then
    Browse (whose rows open in Align) and Train; on the embedded tiny CLIP (plus the real
    CLIPs :func:`remote_models` allows) unless another context is given. Gradio deletes the
    files it cached for the app on :data:`~otviz.ui.upload_cache.DELETE_CACHE`'s schedule
    and when the server stops."""
    ctx = ctx or AppContext.default(remote_models())
    with gr.Blocks(title="otviz", delete_cache=DELETE_CACHE) as app:
        gr.Markdown(INTRO)
        shared = build_shared_inputs(ctx)
        links = {}
        with gr.Tabs() as tabs:
            for title, build in VIEWS:
                with gr.Tab(title, id=tab_id(title), elem_id=tab_id(title)):
                    links[title] = build(ctx, shared)
            with gr.Tab(BROWSE_TITLE, id=tab_id(BROWSE_TITLE), elem_id=tab_id(BROWSE_TITLE)):
                align = VIEWS[0][0]
                build_browse_tab(ctx, shared, AlignTarget(tabs, tab_id(align), links[align]),
                                 browse)
            with gr.Tab(TRAIN_TITLE, id=tab_id(TRAIN_TITLE), elem_id=tab_id(TRAIN_TITLE)):
                build_train_tab(ctx, shared, jobs)
        if shared.examples is not None:  # a picked example is aligned at once
            links[VIEWS[0][0]].after(shared.examples.load_input_event,
                                     api_visibility="private")
        # heads trained in another session since this page was built
        app.load(lambda: gr.Dropdown(choices=ctx.checkpoint_choices()), None,
                 shared.checkpoint, api_visibility="private")
    guard_callbacks(app)
    return app


def upload_limit() -> str:
    """The largest accepted upload: ``$OTVIZ_MAX_FILE_SIZE`` or :data:`MAX_UPLOAD`."""
    return os.environ.get(MAX_UPLOAD_ENV, "").strip() or MAX_UPLOAD


def serve_options(app: gr.Blocks, max_file_size: str | int | None = None) -> dict:
    """Queue ``app`` as this server runs it (one event at a time on a Space's small shared
    CPU, a bounded queue, no monitoring summary: :func:`without_monitoring`, sessions that
    copy the page's initial configs: :func:`~otviz.ui.sessions.remember_initial_configs`,
    cheap events counted from the moment they join: :func:`~otviz.ui.cheap_events.watch_queue`)
    and return the ``launch`` options every server uses: the upload limit
    (:func:`upload_limit` unless given), :data:`APP_CSS` and Gradio's monitoring pages
    turned off."""
    app.queue(default_concurrency_limit=SPACE_CONCURRENCY if on_space() else CONCURRENCY,
              max_size=QUEUE_SIZE)
    without_monitoring(app)
    remember_initial_configs(app)  # a visitor's first request holds no other one up
    watch_queue(app)  # expensive work steps aside while a cheap event is queued or runs
    return {"max_file_size": max_file_size or upload_limit(), "css": APP_CSS,
            "enable_monitoring": False}


def without_monitoring(app: gr.Blocks) -> None:
    """Stop the queue of ``app`` rebuilding the summary that only Gradio's monitoring pages
    read (turned off by :func:`serve_options`: on a public page its ``/monitoring/summary``
    lists every event's name, count and timings to anyone). Gradio rebuilds it after every
    event as a pandas table of the last 10,000 events: 11 ms of CPU per event with 500
    events recorded, 31 ms with 10,000 (measured on the 2-core machine), on every click of
    a long-running Space."""
    queue = app._queue
    if hasattr(queue, "ANAYLTICS_CACHE_FREQUENCY"):  # Gradio's name, misspelt
        queue.ANAYLTICS_CACHE_FREQUENCY = sys.maxsize


#: The served app's log lines: time, level, logger, message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def server_logging() -> None:
    """The served app's log on stderr: otviz's own lines from INFO up (a user error's one
    line with its id, a training run's progress), other libraries' from WARNING up. A
    logging set-up the host already made (a handler on the root logger) is kept."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    logging.getLogger("otviz").setLevel(logging.INFO)


def freeze_startup_heap() -> None:
    """Take everything built so far out of the garbage collector's scans (``gc.freeze``):
    the libraries, the models and the Blocks, some 650,000 objects that live as long as the
    server. Each full collection walked them all, about 0.33 s on the 2-core machine during
    which no request moves (23 such pauses in 2 minutes of the hostile catalogue). What is
    already garbage is collected first; a frozen object is still freed when its last
    reference goes."""
    gc.collect()
    gc.freeze()


def launch(
    max_file_size: str | int | None = None, models: list[ModelSource] | None = None,
    heads: list[tuple[int, str]] | None = None, **kwargs
) -> NoReturn:
    """Build and serve the app with a bounded queue and bounded uploads and its log
    (:func:`server_logging`), Gradio's upload cache under the app's data folder
    (:func:`~otviz.ui.upload_cache.own_upload_cache`); on a Space the benepar parser is
    fetched at start-up, and the libraries events would import lazily are imported
    (:mod:`otviz.ui.startup_imports`). The real CLIPs offered are ``models`` (``otviz app
    --model NAME --pretrained SOURCE``) when given, else :func:`remote_models`'; ``heads``
    (``(k, DIR)``, ``otviz app --heads``) add the trained heads of DIR to the k-th backbone
    (0: the embedded one), beside those of ``$OTVIZ_HEADS``. What start-up built is frozen
    (:func:`freeze_startup_heap`).
    Serves until ``SIGTERM`` or ``SIGINT``, then ends the process with status 0
    (:mod:`otviz.ui.shutdown`: the work running stopped at its next step)."""
    stop_on_signals()
    app = None
    try:
        server_logging()
        own_upload_cache()  # before any component is built: they read it when built
        if on_space() and not try_download_benepar():
            log.info("benepar unavailable: trees come from the built-in parser")
        import_lazy_modules()  # no event imports them in a thread of its own (a deadlock)
        app = build_app(AppContext.default(remote_models() if models is None else models,
                                           heads=heads or ()))
        freeze_startup_heap()
        DRAWER.start()  # the phrase grids' drawing worker, ready before the first visitor
        app.launch(**{**serve_options(app, max_file_size), **kwargs,
                      "prevent_thread_lock": True})
        wait_for_stop()
    except KeyboardInterrupt:  # the signal's handler leaves start-up, or the wait, at once
        pass
    finish(functools.partial(_close, app))


def _close(app: gr.Blocks | None) -> None:
    """Close the server (if it was built) and shut the drawing worker down (a worker cut
    short still exits with the server: :func:`~otviz.ui.phrase_grids._worker_start`)."""
    if app is not None:
        app.close()
    DRAWER.stop()
