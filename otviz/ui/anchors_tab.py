"""The "Anchors" view: ConceptOT's concept anchors (ConceptOT Sec. 2.3-2.4, Fig. 4-5).

The anchor-anchor cosine matrix in clustered order with the bank's mean off-diagonal
cosine; the anchor-word affinity for an editable word list and each anchor's top words;
anchors and words on one 2-D map; and where on the current image the anchors that carry the
most transported mass are active (columns of ``K_ZP``, Eq. 5).

Callbacks are plain functions of plain values (testable without a browser); the builder
only wires them to components.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import torch
from matplotlib.figure import Figure

from otviz.backbone import Backbone
from otviz.boundary.text import parse_word_list
from otviz.eval.grounding_metrics import mean_offdiag_cosine
from otviz.explain import InputError
from otviz.methods.conceptot import ConceptOT
from otviz.suite import SuiteMethod, word_concept_embeddings
from otviz.ui.context import COMMON_CONCEPTS, EMBEDDED, AppContext, SharedInputs
from otviz.ui.downloads import PendingDownloads
from otviz.ui.events import offer_downloads
from otviz.ui.inputs import user_errors
from otviz.ui.plots import FigurePlot
from otviz.viz.anchors import (
    PROJECTIONS,
    affinity_figure,
    anchor_kernel_maps,
    anchor_mass,
    anchor_matrix_figure,
    cluster_order,
    embed_2d,
    embedding_scatter,
    top_words,
)
from otviz.viz.heatmaps import heatmap_grid_figure
from otviz.viz.style import HEAT_CMAP
from otviz.world.vocab import COLOURS, SHAPES, SIZES

HOW_TO_READ = """**How to read this view.** ConceptOT routes all patch-word transport through
*r* learned concept anchors (ConceptOT Eq. 4-7). **Anchor matrix**: cosine between every two
anchors, rows and columns reordered by average-linkage clustering so that similar anchors sit
together (red blocks = anchors that duplicate each other; the mean off-diagonal cosine
summarises the bank's diversity, lower = more diverse; the paper reports 0.19). **Affinity**:
cosine of each anchor (rows, same order) with each word of your list in the method's concept
space; the table lists each anchor's best words. **2-D map**: anchors (numbered circles) and
words (diamonds) projected together; hover an anchor for its top words. **Anchor maps**: for
the anchors carrying the most transported mass on this image-caption pair, the kernel
`K_ZP = exp(-(1 - z_i . p_k) / eps)` over the patches: bright patches are where the anchor is
active, i.e. where mass can flow through it."""

WORLD_WORDS: list[str] = [*SIZES, *COLOURS, *SHAPES, "left", "right", "above", "below"]


def default_words(checkpoint: str) -> str:
    """The default word list of a checkpoint: the synthetic world's vocabulary for the
    embedded model, 30 common visual concepts for a real CLIP (ConceptOT Fig. 5)."""
    words = WORLD_WORDS if checkpoint.startswith(EMBEDDED) else COMMON_CONCEPTS
    return ", ".join(words)


def conceptot_entry(ctx: AppContext, checkpoint: str) -> SuiteMethod:
    """The checkpoint's ConceptOT method (InputError where the suite has none)."""
    entry = ctx.suite(checkpoint).methods.get("conceptot")
    if entry is None or not isinstance(entry.method, ConceptOT):
        raise InputError(f"the checkpoint {checkpoint!r} has no ConceptOT method")
    return entry


def untrained_words(backbone: Backbone, words: list[str]) -> list[str]:
    """Words with a BPE token whose embedding row is all zero: the embedded tiny CLIP
    trains only the rows its world uses and leaves the rest at zero, so such a word's
    affinity says nothing (a real CLIP has no zero rows)."""
    table = backbone.token_embeddings
    text = backbone.words(words)
    out = []
    for w, ids, mask in zip(words, text.ids, text.mask, strict=True):
        rows = table[ids[mask].to(table.device)]
        if bool((rows == 0).all(-1).any()):
            out.append(w)
    return out


@dataclass
class AnchorBankView:
    """The image-independent part of the view: numbers, figures, table and downloads."""

    cosine: np.ndarray  # [r, r] anchor-anchor cosine
    order: np.ndarray  # [r] clustered order of the anchors
    mean_offdiag: float
    words: list[str]
    affinity: np.ndarray  # [r, n_words]
    coords: np.ndarray  # [r + n_words, 2]: anchors first, then words
    top: list[list[tuple[str, float]]]
    matrix_figure: Figure
    affinity_figure: Figure
    scatter: go.Figure
    table: list[list]
    summary: str
    files: PendingDownloads


def anchor_bank_view(
    ctx: AppContext, checkpoint: str, words_text: str | None, projection: str = "PCA"
) -> AnchorBankView:
    """Anchor matrix, anchor-word affinity, top words and the 2-D map of anchors + words."""
    if projection not in PROJECTIONS:
        raise InputError(f"unknown projection {projection!r}; choose one of {PROJECTIONS}")
    words = parse_word_list(words_text)
    entry = conceptot_entry(ctx, checkpoint)
    backbone = ctx.explainer(checkpoint).backbone
    anchors = entry.method.unit_anchors().detach()
    try:
        word_emb = word_concept_embeddings(backbone, entry, words)
    except ValueError as exc:  # a word the tokenizer reads as nothing
        raise InputError(str(exc)) from None
    cosine = (anchors @ anchors.T).double().numpy()
    affinity = (anchors @ word_emb.T).double().numpy()
    order = cluster_order(cosine)
    offdiag = mean_offdiag_cosine(anchors)
    top = top_words(affinity, words, k=3)
    try:
        coords = embed_2d(torch.cat([anchors, word_emb]).double().numpy(), projection)
    except ValueError as e:
        raise InputError(str(e)) from None
    r = anchors.shape[0]
    hover = [f"anchor {k}: " + ", ".join(f"{w} {c:.2f}" for w, c in top[k]) for k in range(r)]
    unknown = untrained_words(backbone, words)
    matrix_fig = anchor_matrix_figure(cosine, order, offdiag)
    affinity_fig = affinity_figure(affinity, words, order)
    scatter = embedding_scatter(coords[:r], coords[r:], hover, words, projection)
    table = [
        [int(k), " · ".join(f"{w} ({c:.2f})" for w, c in top[k]), round(top[k][0][1], 4)]
        for k in order
    ]
    summary = (
        f"**{r} anchors** in a {anchors.shape[1]}-d concept space ({entry.source}); "
        f"mean off-diagonal cosine **{offdiag:.3f}** (lower = more diverse; ConceptOT "
        f"Fig. 4 reports 0.19 for its 32 trained anchors)."
    )
    if unknown:
        summary += f"\n\nThe model never trained on these words' tokens: {', '.join(unknown)}."
    out = PendingDownloads()
    out.save_figure(matrix_fig, "anchor_cosine")
    out.save_figure(affinity_fig, "anchor_word_affinity")
    out.save_figure(scatter, f"anchor_word_map_{projection}")
    out.save_array(cosine, "anchor_cosine")
    out.save_array(affinity, "anchor_word_affinity", columns=words)
    out.save_array(coords, f"anchor_word_coords_{projection}", columns=["x", "y"])
    out.save_json(
        {
            "checkpoint": checkpoint,
            "mean_offdiag_cosine": offdiag,
            "cluster_order": order,
            "words": words,
            "untrained_words": unknown,
            "top_words": {int(k): top[k] for k in range(r)},
            "coords_rows": "anchors 0..r-1, then the words in order",
        },
        "anchors",
    )
    return AnchorBankView(
        cosine, order, offdiag, words, affinity, coords, top, matrix_fig, affinity_fig,
        scatter, table, summary, out,
    )


@dataclass
class AnchorMapsView:
    """Where the anchors are active on one image-caption pair."""

    kernel: np.ndarray  # [r, N] K_ZP columns (Eq. 5), one row per anchor
    mass: np.ndarray  # [r] transported mass through each anchor
    shown: list[int]  # the anchors drawn
    figure: Figure
    files: PendingDownloads


def anchor_maps_view(
    ctx: AppContext,
    checkpoint: str,
    image,
    caption: str | None,
    n_top: int = 8,
    picked: list[int] | None = None,
    per_map_scale: bool = False,
) -> AnchorMapsView:
    """``K_ZP`` maps of the ``n_top`` anchors with the largest transported mass on the pair
    (:func:`otviz.viz.anchors.anchor_mass`), or of the ``picked`` anchors."""
    explainer = ctx.explainer(checkpoint)
    entry = conceptot_entry(ctx, checkpoint)
    encoded = explainer.encode(image, caption)
    run = explainer.align(encoded, ctx.suite(checkpoint), ["conceptot"])["conceptot"]
    alignment = run.alignment
    kernel = anchor_kernel_maps(alignment.extras["patch_anchor_cosine"][0], entry.method.config.eps)
    kernel = kernel.T.double().numpy()  # [r, N]
    mass = anchor_mass(alignment.plan)[0].double().numpy()
    r = kernel.shape[0]
    if picked:
        bad = [k for k in picked if not 0 <= int(k) < r]
        if bad:
            raise InputError(f"no anchor {bad}: anchors are numbered 0..{r - 1}")
        shown = [int(k) for k in picked]
    else:
        shown = [int(k) for k in np.argsort(-mass, kind="stable")[: max(1, min(int(n_top), r))]]
    h, w = encoded.grid
    figure = heatmap_grid_figure(
        encoded.image,
        [kernel[k].reshape(h, w) for k in shown],
        [f"anchor {k} · mass {mass[k]:.3g}" for k in shown],
        geometry=encoded.geometry,
        shared_scale=not per_map_scale,
        colorbar_label="anchor kernel K_ZP",
        cmap=HEAT_CMAP,
        suptitle=f"Where the anchors are active: \"{_short(encoded.caption)}\"",
    )
    out = PendingDownloads()
    out.save_figure(figure, "anchor_maps")
    out.save_array(kernel, "anchor_kernel_maps")
    out.save_json(
        {"caption": encoded.caption, "grid": encoded.grid, "eps": entry.method.config.eps,
         "anchor_mass": mass, "total_mass": float(mass.sum()), "shown": shown},
        "anchor_mass",
    )
    return AnchorMapsView(kernel, mass, shown, figure, out)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def build_anchors_tab(ctx: AppContext, shared: SharedInputs) -> None:
    """Add the Anchors view to the enclosing ``gr.Blocks`` (inside its tab)."""
    first = ctx.checkpoint_choices()[0]
    with gr.Row():
        with gr.Column(scale=1):
            words = gr.Textbox(
                label="Words (comma-separated)", value=default_words(first), lines=4
            )
            reset = gr.Button("Default words for this checkpoint", size="sm")
            projection = gr.Radio(list(PROJECTIONS), value="PCA", label="2-D map")
            n_top = gr.Slider(1, 16, value=8, step=1, label="Maps: top anchors by mass")
            picked = gr.Dropdown(
                choices=[], multiselect=True, label="... or pick anchors (overrides the top)"
            )
            per_map = gr.Checkbox(False, label="One colour scale per map")
            run = gr.Button("Show anchors", variant="primary")
            summary = gr.Markdown()
        with gr.Column(scale=2):
            matrix_plot = FigurePlot(label="Anchor-anchor cosine", elem_id="anchors-matrix")
            affinity_plot = FigurePlot(label="Anchor-word affinity")
    with gr.Row():
        maps_plot = FigurePlot(label="Anchor maps on the image", elem_id="anchors-maps")
        scatter_plot = FigurePlot(label="Anchors and words, 2-D map")
    table = gr.Dataframe(
        headers=["anchor", "top words (cosine)", "best cosine"], label="Top words per anchor"
    )
    with gr.Row():
        bank_files = gr.File(label="Downloads: anchor bank", file_count="multiple",
                             elem_id="anchors-bank-downloads")
        map_files = gr.File(label="Downloads: anchor maps", file_count="multiple",
                            elem_id="anchors-maps-downloads")
    bank_pending, maps_pending = gr.State(), gr.State()
    gr.Markdown(HOW_TO_READ)

    @user_errors
    def on_bank(checkpoint: str,
                features: str | None, image_size: float | None, words: str, projection: str):
        view = anchor_bank_view(ctx, ctx.read_as(checkpoint, features, image_size), words,
                                projection)
        choices = [(str(k), int(k)) for k in range(len(view.order))]
        return (
            view.matrix_figure, view.affinity_figure, view.scatter, view.table, view.summary,
            view.files, gr.Dropdown(choices=choices),
        )

    @user_errors
    def on_maps(image, caption: str, checkpoint: str,
                features: str | None, image_size: float | None, top_k: int,
                picked: list[int], per_map_scale: bool):
        view = anchor_maps_view(ctx, ctx.read_as(checkpoint, features, image_size), image,
                                caption, top_k, picked, per_map_scale)
        return view.figure, view.files

    bank_in = [*shared.backbone, words, projection]
    bank_out = [matrix_plot, affinity_plot, scatter_plot, table, summary, bank_pending, picked]
    maps_in = [shared.image, shared.caption, *shared.backbone, n_top, picked, per_map]
    maps_out = [maps_plot, maps_pending]
    offer_downloads(run.click(on_bank, bank_in, bank_out, api_name="anchors"), bank_pending,
                    bank_files)
    offer_downloads(run.click(on_maps, maps_in, maps_out, api_name="anchor_maps"),
                    maps_pending, map_files)
    # a control's edit runs an endpoint again: not an endpoint of its own
    offer_downloads(projection.input(on_bank, bank_in, bank_out, api_visibility="private"),
                    bank_pending, bank_files)
    for control in (n_top, picked, per_map):
        offer_downloads(control.input(on_maps, maps_in, maps_out, api_visibility="private"),
                        maps_pending, map_files)
    @user_errors
    def on_reset(checkpoint: str, features: str | None, image_size: float | None) -> str:
        # an unknown checkpoint or reading is a message
        ctx.explainer(ctx.read_as(checkpoint, features, image_size))
        return default_words(checkpoint)

    reset.click(on_reset, shared.backbone, [words], api_name="default_words")
