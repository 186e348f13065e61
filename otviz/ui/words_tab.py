"""The "Words" view: per-word patch-similarity heatmaps on the image, with a word picker.

Callbacks are plain functions of plain values (testable without a browser); the tab only
wires them to components.
"""

from __future__ import annotations

import gradio as gr
import numpy as np
from matplotlib.figure import Figure

from otviz.explain import Explainer
from otviz.patch_grid.boxes import heatmap_boxes
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.inputs import user_errors
from otviz.ui.plots import FigurePlot
from otviz.viz.heatmaps import heatmap_grid_figure, word_similarity_figure
from otviz.viz.style import SIMILARITY_CMAP

HOW_TO_READ = """**How to read this view.** Each panel shows how similar one caption word is to
every image patch (cosine in the model's joint space; bright = similar), all on one colour
scale. The large panel averages the words you pick; its cyan box is the weak-grounding box
(patches above half the peak, ConceptOT Sec. 2.6)."""


def word_choices(explainer: Explainer, image, caption: str) -> list[tuple[str, int]]:
    """``(label, word index)`` for each caption word the model reads."""
    encoded = explainer.encode(image, caption)
    return [(f"{encoded.words[k].text} ({k})", k) for k in encoded.kept_words]


def words_figures(
    explainer: Explainer, image, caption: str, picked: list[int] | None
) -> tuple[Figure, Figure]:
    """The grid of per-word maps and the picked phrase's map with its grounding box."""
    encoded = explainer.encode(image, caption)
    maps = explainer.word_similarity(encoded)
    choices = word_choices(explainer, image, caption)
    shown = [k for _, k in choices]
    picked = [k for k in (picked or shown[:1]) if k in shown] or shown[:1]
    grid_fig = word_similarity_figure(encoded, maps, shown)
    phrase = maps[picked].mean(0)
    heat = (phrase - phrase.min()).reshape(1, -1)
    pixel_box = heatmap_boxes(heat, encoded.geometry)[0].tolist()
    phrase_text = " ".join(encoded.words[k].text for k in sorted(picked))
    phrase_fig = heatmap_grid_figure(
        encoded.image,
        [phrase.numpy()],
        [f'"{phrase_text}"'],
        geometry=encoded.geometry,
        boxes=[pixel_box],
        cmap=SIMILARITY_CMAP,
        colorbar_label="cosine similarity",
        zero_floor=False,
        panel_size=4.0,
    )
    return grid_fig, phrase_fig


def build_words_tab(ctx: AppContext, shared: SharedInputs) -> None:
    """Add the Words view to the enclosing ``gr.Blocks`` (inside its tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            run = gr.Button("Show word heatmaps", variant="primary")
            picker = gr.CheckboxGroup(label="Words of the phrase", choices=[])
            phrase_plot = FigurePlot(label="Phrase heatmap")
        with gr.Column(scale=2):
            grid_plot = FigurePlot(label="Per-word heatmaps", elem_id="words-grid")
    gr.Markdown(HOW_TO_READ)

    @user_errors
    def on_run(image: np.ndarray | None, caption: str, checkpoint: str,
               features: str | None, image_size: float | None):
        explainer = ctx.explainer(ctx.read_as(checkpoint, features, image_size))
        choices = word_choices(explainer, image, caption)
        grid_fig, phrase_fig = words_figures(explainer, image, caption, None)
        return gr.CheckboxGroup(choices=choices, value=[choices[0][1]]), phrase_fig, grid_fig

    @user_errors
    def on_pick(image: np.ndarray | None, caption: str, checkpoint: str,
                features: str | None, image_size: float | None, picked: list[int]):
        # an unknown checkpoint or reading: a message
        explainer = ctx.explainer(ctx.read_as(checkpoint, features, image_size))
        if not picked:
            return gr.skip(), gr.skip()
        grid_fig, phrase_fig = words_figures(explainer, image, caption, picked)
        return phrase_fig, grid_fig

    inputs = [shared.image, shared.caption, *shared.backbone]
    run.click(on_run, inputs, [picker, phrase_plot, grid_plot], api_name="words")
    picker.input(on_pick, [*inputs, picker], [phrase_plot, grid_plot], api_name="words_pick")
