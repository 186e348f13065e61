"""The Gradio app: shared inputs on top, one tab per view; it composes, computes nothing."""

from __future__ import annotations

import gradio as gr

from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.examples import load_examples
from otviz.ui.words_tab import build_words_tab

INTRO = """# otviz: optimal transport between image patches and caption words
Upload an image and type a caption (or pick an example), choose a checkpoint, then open a
view. The embedded model is otviz's tiny CLIP, trained on its synthetic world of shapes;
real open_clip models appear in the picker where their weights can be downloaded."""


def build_shared_inputs(ctx: AppContext) -> SharedInputs:
    """The image, caption and checkpoint picker every view reads, with the examples."""
    choices = ctx.checkpoint_choices()
    with gr.Row():
        image = gr.Image(label="Image", type="numpy", image_mode="RGB", height=260, scale=1)
        with gr.Column(scale=2):
            caption = gr.Textbox(
                label="Caption", placeholder="a small red circle to the left of a blue star"
            )
            checkpoint = gr.Dropdown(choices, value=choices[0], label="Checkpoint")
            examples = load_examples()
            if examples:
                gr.Examples(
                    [[str(e.image_path), e.caption] for e in examples],
                    inputs=[image, caption],
                    label="Examples from the synthetic world",
                )
    return SharedInputs(image, caption, checkpoint)


def build_app(ctx: AppContext | None = None) -> gr.Blocks:
    """The app's Blocks, on the embedded tiny CLIP unless another context is given."""
    ctx = ctx or AppContext.default()
    with gr.Blocks(title="otviz") as app:
        gr.Markdown(INTRO)
        shared = build_shared_inputs(ctx)
        with gr.Tab("Words"):
            build_words_tab(ctx, shared)
    return app


def launch(**kwargs) -> None:
    """Build and serve the app with a bounded queue (one model, shared CPU)."""
    app = build_app()
    app.queue(default_concurrency_limit=2, max_size=32)
    app.launch(**kwargs)
