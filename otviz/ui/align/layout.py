"""The Align view's page: its controls and outputs, built in page order, held by name
(:class:`AlignControls`), and the help under them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from otviz.explain import REGION_KINDS
from otviz.suite import DEFAULT_LAMBDA, method_choices
from otviz.ui.align.choices import shown_words
from otviz.ui.align.settings import (
    CAME_TEMPERATURES,
    DEFAULT_CAME_TEMPERATURE,
    DEFAULT_METHOD,
    DEFAULT_SHARED_SCALE,
    RASTER_FORMAT,
)
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.explainer_panels import DEFAULT_ON as EXPLAINERS_ON
from otviz.ui.explainer_panels import TOGGLE_LABEL
from otviz.ui.plots import FigurePlot
from otviz.ui.trust_panel import build_trust_panel

HOW_TO_READ = """**How to read this view.** *Heatmaps:* for the chosen word or parse-tree
phrase, each panel shows how much of the phrase's mass the method transports to each image
patch (the sum of the plan's columns over the phrase's tokens, ConceptOT Sec. 2.6; bright =
more mass); the cyan box encloses the patches above half the panel's peak (weak grounding; left out
when it covers nearly the whole image, e.g. for a flat map).
The image is greyed and dimmed; the colour grows opaque with the mass, so the
phrase's region glows. By default each panel has its own colour scale (the bar under it) to
show each method's own pattern; tick *one colour scale* to compare them in absolute mass.
*Transport plan:* rows are image patches (row-major on the patch grid;
hover for the row and column), columns are the caption's BPE tokens; pick a token to see its
column on the image. *Marginals:* how much mass each patch and token kept (plan row and
column sums) against the reference masses mu and nu the method aimed for; "unmatched" is
the part of mu a patch did not transport (unbalanced methods leave background unmatched).
*QC-Align* is read relative to its marginals: its panel shows sum over the phrase's tokens
of Pi_ij / (mu_i nu_j) (1 = no more coupling than the quotas imply), and its CAME quota map
mu is the "reference mu" panel when QC-Align is the selected method. *CAME temperature*
re-scores QC-Align with CAME's attention softmax at that temperature (1 = the paper's plain
softmax; lower = sharper, less uniform quotas); the note beside it gives the quotas' largest
entry over uniform. CAME has no parameters, so the control applies to a trained head too,
but its projections were trained at the temperature the note names. *ConceptOT*'s faithful
Nystrom plan (checkpoint "training-free, ConceptOT faithful") can hold negative entries:
they are never drawn as mass (clipped at 0, the titles and the score table's "negative
mass" column say how much); the default training-free entry uses the nonnegative variant.
*PowerCLIP*'s panel is its own readout (PowerCLIP Fig. 6): the text-to-patch similarity of
the phrase's tree node, weighted by the regions of the node's best subset (membership
sigmoid(q / tau)); the map its pointing game is scored on. Pick *boxes*, the proposals its
head trained on, *grid* or *segments* (superpixels). When no region is in the best subset
(all memberships ~0) the similarity is shown unweighted, titled "Fig. 6 sim.".
Global+Patch, FILIP, Text-Attn and PowerCLIP have no reference masses. *Scores:* global
cosine s_g, local score s_l, their combination s_g + λ·s_l (ConceptOT App. G.4), the
solver's final marginal error (blank without an OT solver) and the solve time.
*Explainers too* adds, after the methods' panels, the maps of Grad-CAM, LeGrad, MaskCLIP and
Chefer et al.'s relevance: read from the model's gradients or attention given the image and
the phrase's words alone, no transport plan (docs/explainers.md); each on its own scale."""



@dataclass
class AlignControls:
    """Every component the Align view's callbacks read or write, by the name its callbacks
    (and so the public API) give it: the shared image, caption, checkpoint and reading
    (``features``, ``image_size``: :func:`otviz.ui.reading.named_reading`), the view's
    settings, pickers and outputs, and the page's hidden helpers (``prefetched``: the
    pair's phrase grids in the page; ``shown_token``: the token of the pair on show;
    ``swapped``: the phrase a pick swapped in from ``prefetched``; ``phrase_default``:
    the phrase value the last Align click chose itself, no person's pick)."""

    image: gr.Image
    caption: gr.Textbox
    checkpoint: gr.Dropdown
    features: gr.Textbox
    image_size: gr.Number
    run: gr.Button
    regions: gr.Radio
    shared_scale: gr.Checkbox
    lambda_local: gr.Slider
    came_temperature: gr.Slider
    quotas: gr.Markdown
    explainers: gr.Checkbox
    phrase: gr.Dropdown
    grid: gr.Image
    prefetched: gr.HTML
    shown_token: gr.Textbox
    swapped: gr.Textbox
    method: gr.Dropdown
    plan: FigurePlot
    token: gr.Dropdown
    token_map: gr.Image
    patch_marginals: gr.Image
    token_marginals: FigurePlot
    scores: gr.Dataframe
    convergence: FigurePlot
    prepare: gr.Button
    files: gr.File
    phrase_default: gr.State

    def named(self, *names: str) -> dict[str, Any]:
        """The components called ``names``, by name (a listener's ``inputs_kwargs``)."""
        return {name: getattr(self, name) for name in names}


def build_controls(ctx: AppContext, shared: SharedInputs) -> AlignControls:
    """Add the view's components to the enclosing ``gr.Blocks`` in page order, the Trust
    panel and the help under them."""
    with gr.Row():
        run = gr.Button("Align", variant="primary", scale=1)
        regions = gr.Radio(list(REGION_KINDS), value="grid", label="PowerCLIP regions", scale=2)
        shared_scale = gr.Checkbox(DEFAULT_SHARED_SCALE, label="One colour scale for all methods",
                                   scale=1)
        lambda_local = gr.Slider(
            0.0, 2.0, DEFAULT_LAMBDA, step=0.05, scale=2, label="λ_l in combined = s_g + λ_l·s_l"
        )
    with gr.Row():
        came_temperature = gr.Slider(
            *CAME_TEMPERATURES, DEFAULT_CAME_TEMPERATURE, step=0.05, scale=1,
            label="QC-Align: CAME temperature (1 = the paper's softmax)")
        quotas = gr.Markdown(label="CAME quotas")  # the label names the API's output
        explainers = gr.Checkbox(EXPLAINERS_ON, label=TOGGLE_LABEL, scale=1,
                                 elem_id="align-explainers")
    # the heatmap grid spans the page (four panels across); the plan side comes under it
    phrase = gr.Dropdown(
        label="Phrase (a word or a parse-tree phrase; or type words)",
        choices=[],
        allow_custom_value=True,
        elem_id="align-phrase",
    )
    # its download button is left out: a phrase swapped in by the page (otviz.ui.phrase_grids)
    # is not the component's value; "Prepare downloads" saves the grid on show
    grid = gr.Image(
        label="Phrase heatmap per method", format=RASTER_FORMAT, interactive=False,
        elem_id="align-grid", buttons=["fullscreen"],
    )
    # the page's copy of the pair's phrase grids, the token of the pair on show, and the
    # phrase a pick swapped in from the copy
    prefetched = gr.HTML(visible="hidden", html_template="", elem_id="align-prefetched")
    shown_token = gr.Textbox(visible="hidden", label="Pair token", elem_id="align-token")
    swapped = gr.Textbox(visible="hidden", elem_id="align-swapped")
    phrase_default = gr.State(None)
    with gr.Row():
        with gr.Column(scale=3):
            method = gr.Dropdown(method_choices(), value=DEFAULT_METHOD, label="Method",
                                 elem_id="align-method")
            plan = FigurePlot(label="Transport plan", elem_id="align-plan")
        with gr.Column(scale=2):
            token = gr.Dropdown(label="Token (its plan column on the image)", choices=[])
            token_map = gr.Image(
                label="Token column on the image", format=RASTER_FORMAT, interactive=False,
                elem_id="align-token-map",
            )
    with gr.Row():
        patch_marginals = gr.Image(
            label="Patch marginals vs mu", format=RASTER_FORMAT, interactive=False,
            elem_id="align-patch-marginals",
        )
        token_marginals = FigurePlot(label="Token marginals vs nu", elem_id="align-token-marginals")
    scores = gr.Dataframe(label="Scores per method", interactive=False, elem_id="align-scores")
    with gr.Row():
        convergence = FigurePlot(label="Solver convergence", elem_id="align-convergence")
        with gr.Column():
            prepare = gr.Button("Prepare downloads")
            files = gr.File(label="Downloads", file_count="multiple")
    build_trust_panel(ctx, [shared.image, shared.caption, *shared.backbone, phrase, explainers],
                      shown_words)
    gr.Markdown(HOW_TO_READ)
    return AlignControls(
        shared.image, shared.caption, *shared.backbone,
        run, regions, shared_scale,
        lambda_local, came_temperature, quotas, explainers, phrase, grid, prefetched,
        shown_token, swapped, method, plan, token, token_map, patch_marginals,
        token_marginals, scores, convergence, prepare, files, phrase_default,
    )
