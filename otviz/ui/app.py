"""The Gradio app: composes the views in ``otviz/ui``; computes nothing itself."""

from __future__ import annotations

import gradio as gr

from otviz.backbone import Backbone
from otviz.pipeline import Explainer
from otviz.ui.examples import load_examples
from otviz.ui.words_tab import build_words_tab

INTRO = """# otviz: optimal transport between image patches and caption words
Upload an image and a caption (or pick an example) to see which patches each word aligns
with. The model is otviz's embedded tiny CLIP, trained on its synthetic world of shapes."""


def build_app(explainer: Explainer | None = None) -> gr.Blocks:
    """The app's Blocks, on the embedded tiny CLIP unless another explainer is given."""
    explainer = explainer or Explainer(Backbone.from_checkpoint())
    with gr.Blocks(title="otviz") as app:
        gr.Markdown(INTRO)
        with gr.Tab("Words"):
            build_words_tab(explainer, load_examples())
    return app


def launch(**kwargs) -> None:
    """Build and serve the app with a bounded queue (one model, shared CPU)."""
    app = build_app()
    app.queue(default_concurrency_limit=2, max_size=32)
    app.launch(**kwargs)
