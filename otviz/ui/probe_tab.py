"""The "Probe" view: compositionality (ConceptOT Sec. 3, SugarCrepe-style). The caption is
scored next to its automatic edits (:mod:`otviz.text.edits`) and the user's own variants by
every method, with ``g + lambda_l * s_l`` (ConceptOT App. G.4); a batch mode runs the same
probe over the examples gallery with its world hard negatives, accuracy per category.

Callbacks are plain functions of plain values (testable without a browser); the tab only
wires them to components. All captions of one image are encoded in one backbone call and go
through each method in ONE batched call (:func:`score_captions`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from otviz.backbone import ImageInput, TokenFeatures
from otviz.boundary.text import check_caption
from otviz.eval.probe import probe_accuracy
from otviz.explain import Encoded, Explainer, InputError, region_masks
from otviz.methods import PairBatch
from otviz.suite import DEFAULT_LAMBDA, METHOD_LABELS, MethodSuite
from otviz.text.edits import EDIT_CATEGORIES, CaptionEdit, caption_edits
from otviz.text.parse import batch_node_masks, parse_caption
from otviz.text.tree import Tree
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.downloads import PendingDownloads
from otviz.ui.events import offer_downloads
from otviz.ui.examples import EXAMPLES_DIR
from otviz.ui.inputs import user_errors
from otviz.ui.plots import FigurePlot
from otviz.viz.probe import probe_accuracy_figure, probe_scores_figure, win_matrix_figure
from otviz.viz.tables import titled
from otviz.world.vocab import SEEN_PAIRS

MAX_CUSTOM = 12
TRUE = "true"
CUSTOM = "custom"

TAB_TITLE = "Probe"
#: The score tables' titles; once filled, each names the reading it was computed on
#: (:func:`~otviz.viz.tables.titled`).
SCORES_TITLE, BATCH_TITLE = "Scores", "Batch: accuracy"
HOW_TO_READ = """**How to read this view.** The first caption is yours (the *true* one);
below it are automatic edits that change its meaning but keep its words (SugarCrepe
categories: swap two adjectives, swap two nouns, replace a relation, add an absent
object; an edit that does not apply is listed as skipped, with the reason) and the
variants you typed. Every method scores every caption with **g + lambda_l * s_l**: the
global cosine g of the pooled embeddings plus lambda_l times the method's local
patch-token score s_l (Global-only has no local term). One panel per method, its axis
zoomed to its scores: the dark bar and dashed line are the true caption; an edit whose
bar passes the line fools the method. The matrix gives the margin *true minus edit*: a
win (red) when strictly positive, a loss (blue) otherwise, a tie counting as a loss;
colours are relative to each method's largest margin. The batch button runs the probe
over the example gallery with the world's own hard negatives (each checked false for its
scene) and gives accuracy per category; chance is 0.5. Edits of a typed caption are not
checked against the image: one can happen to be true (an added object that is really
there)."""

CAPTION_COLUMNS = ["label", "category", "caption", "note"]
SCORE_COLUMNS = ["method", "caption", "global g", "local s_l", "combined", "true caption"]


@dataclass(frozen=True)
class ProbeCaption:
    """One caption of the probe: ``label`` (legend), ``category`` ("true", an edit category
    or "custom") and the text."""

    label: str
    category: str
    text: str


@dataclass
class CaptionScores:
    """A method's scores of the captions of one image: ``[K]`` global and local."""

    global_score: np.ndarray
    local_score: np.ndarray

    def combined(self, lambda_local: float) -> np.ndarray:
        """``g + lambda_l * s_l`` (ConceptOT App. G.4)."""
        return self.global_score + lambda_local * self.local_score


@dataclass(frozen=True)
class GalleryItem:
    """An example of the gallery with its world hard negatives (category -> caption)."""

    image_path: Path
    caption: str
    negatives: dict[str, str]


def load_gallery(directory: Path = EXAMPLES_DIR) -> list[GalleryItem]:
    """The examples of ``directory/captions.json`` with their hard negatives."""
    index = directory / "captions.json"
    if not index.exists():
        return []
    return [
        GalleryItem(directory / item["file"], item["caption"], dict(item.get("negatives", {})))
        for item in json.loads(index.read_text())
    ]


def probe_captions(
    caption: str | None, custom: str | None = "", seed: int = 0
) -> tuple[list[ProbeCaption], list[CaptionEdit], list[str]]:
    """The true caption, its applied edits and the user's lines (one per line, repeats
    dropped), the edits (skipped ones included) and notes on dropped lines. The caption
    passes :func:`~otviz.boundary.text.check_caption` first, with the message every view
    gives (an emoji-only caption: "has no letter or digit")."""
    caption = check_caption(caption)  # the one caption rule, as every view applies it
    edits = caption_edits(caption, EDIT_CATEGORIES, seed, pairs=SEEN_PAIRS)
    items = [ProbeCaption(TRUE, TRUE, caption)]
    items += [ProbeCaption(e.category, e.category, e.caption) for e in edits if e.caption]
    lines = [line.strip() for line in (custom or "").splitlines() if line.strip()]
    if len(lines) > MAX_CUSTOM:
        raise InputError(f"at most {MAX_CUSTOM} variants of your own, one per line")
    notes = []
    for line in lines:
        if any(line == p.text for p in items):
            notes.append(f"'{line}' is already in the list; scored once")
            continue
        n = sum(p.category == CUSTOM for p in items) + 1
        items.append(ProbeCaption(f"{CUSTOM} {n}", CUSTOM, line))
    return items, edits, notes


def encode_captions(
    explainer: Explainer, image: ImageInput | None, captions: Sequence[str]
) -> tuple[Encoded, TokenFeatures]:
    """The (cached) encoding of the first pair, which checks the image, and the features
    of all ``(image, caption)`` pairs from ONE backbone call (the image repeated)."""
    if not captions:
        raise InputError("no captions to score")
    first = explainer.encode(image, captions[0])
    for caption in captions:
        check_caption(caption, "a caption")
    features = explainer.backbone.encode([first.image] * len(captions), list(captions))
    for k, caption in enumerate(captions):
        if not features.words[k] or not bool(features.token_mask[k].any()):
            raise InputError(f"the caption {caption!r} has no words the model can read")
    return first, features


def caption_batch(
    explainer: Explainer,
    first: Encoded,
    features: TokenFeatures,
    trees: Sequence[Tree],
    space: str,
    regions: str = "grid",
) -> PairBatch:
    """The method input of all pairs, as :meth:`Explainer.pair_batch` builds it for one:
    features in ``space``, the image's region masks, each caption's parse-tree nodes."""
    feats = features if space == "width" else explainer.backbone.to_space(features, "projected")
    batch = feats.pair_batch()
    masks = region_masks(first, regions)
    batch.regions = masks[None].expand(len(trees), *masks.shape)
    batch.nodes, batch.node_mask = batch_node_masks(list(trees), feats.token_word)
    return batch


def score_captions(
    explainer: Explainer,
    suite: MethodSuite,
    image: ImageInput | None,
    captions: Sequence[str],
    names: Sequence[str] | None = None,
    regions: str = "grid",
) -> dict[str, CaptionScores]:
    """Global and local scores of ``(image, caption)`` for every caption, by each method of
    ``suite`` (or ``names``): one backbone call, then one batched call per method."""
    first, features = encode_captions(explainer, image, captions)
    trees = [parse_caption(c).tree for c in captions]
    batches: dict[str, PairBatch] = {}
    out = {}
    for name in names or list(suite.methods):
        entry = suite.methods[name]
        if entry.space not in batches:
            batches[entry.space] = caption_batch(
                explainer, first, features, trees, entry.space, regions
            )
        with torch.no_grad():
            alignment = entry.method(batches[entry.space])
        out[name] = CaptionScores(
            alignment.global_score.double().cpu().numpy(),
            alignment.local_score.double().cpu().numpy(),
        )
    return out


@dataclass
class ProbeResult:
    """The scores of one image's captions by every method, at one ``lambda_l``."""

    captions: list[ProbeCaption]
    edits: list[CaptionEdit]
    notes: list[str]
    scores: dict[str, CaptionScores]
    lambda_local: float

    @property
    def methods(self) -> list[str]:
        return list(self.scores)

    def combined(self) -> np.ndarray:
        """``[n_methods, K]`` combined scores, the true caption in column 0."""
        return np.stack([s.combined(self.lambda_local) for s in self.scores.values()])

    def margins(self) -> np.ndarray:
        """``[n_methods, K - 1]`` score of the true caption minus each other caption's."""
        c = self.combined()
        return c[:, :1] - c[:, 1:]


def _check_lambda(lambda_local: float) -> float:
    value = float(lambda_local)
    if not np.isfinite(value) or value < 0:
        raise InputError(f"lambda_l must be a number >= 0, got {lambda_local}")
    return value


def run_probe(
    explainer: Explainer,
    suite: MethodSuite,
    image: ImageInput | None,
    caption: str | None,
    custom: str | None = "",
    lambda_local: float = DEFAULT_LAMBDA,
    seed: int = 0,
) -> ProbeResult:
    """Score the caption, its edits and the user's variants with every method."""
    if image is None:
        raise InputError("no image: upload one or pick an example")
    lam = _check_lambda(lambda_local)
    captions, edits, notes = probe_captions(caption, custom, seed)
    if len(captions) == 1:
        raise InputError(
            "nothing to compare: no automatic edit applies to this caption; type variants "
            "of your own, one per line"
        )
    scores = score_captions(explainer, suite, image, [c.text for c in captions])
    return ProbeResult(captions, edits, notes, scores, lam)


def _label(name: str) -> str:
    return METHOD_LABELS.get(name, name)


def caption_table(result: ProbeResult) -> pd.DataFrame:
    """The captions scored (true, edits, custom) and the skipped edits with their notes."""
    edit_notes = {e.category: e.note for e in result.edits}
    rows = [
        [c.label, c.category, c.text, edit_notes.get(c.category, "")] for c in result.captions
    ]
    rows += [[e.category, e.category, "-", e.note] for e in result.edits if not e.applied]
    return pd.DataFrame(rows, columns=CAPTION_COLUMNS)


def score_table(result: ProbeResult) -> pd.DataFrame:
    """One row per (method, caption): global, local, combined score and, for the edits,
    whether the true caption beats it."""
    rows = []
    for name, s in result.scores.items():
        combined = s.combined(result.lambda_local)
        for k, c in enumerate(result.captions):
            verdict = "-" if k == 0 else ("wins" if combined[0] > combined[k] else "loses")
            rows.append([_label(name), c.label, s.global_score[k], s.local_score[k],
                         combined[k], verdict])
    return pd.DataFrame(rows, columns=SCORE_COLUMNS).round(4)


def probe_summary(result: ProbeResult) -> str:
    """A line per method: how many edits the true caption beats."""
    wins = result.margins() > 0
    n = wins.shape[1]
    lines = [f"**lambda_l = {result.lambda_local:g}**; the true caption beats:"]
    lines += [
        f"- {_label(name)}: {int(w.sum())}/{n}" + (" (all)" if w.all() else "")
        for name, w in zip(result.methods, wins, strict=True)
    ]
    lines += [f"- note: {note}" for note in result.notes]
    return "\n".join(lines)


def probe_figures(result: ProbeResult) -> tuple[Figure, Figure]:
    """Grouped score bars and the win/lose matrix."""
    labels = [_label(n) for n in result.methods]
    caption_labels = [c.label for c in result.captions]
    bars = probe_scores_figure(
        labels, caption_labels, result.combined(),
        ylabel=f"g + {result.lambda_local:g} s_l",
    )
    matrix = win_matrix_figure(labels, caption_labels[1:], result.margins())
    return bars, matrix


def probe_downloads(result: ProbeResult, bars: Figure, matrix: Figure) -> PendingDownloads:
    """PNG figures, the combined scores as .npy/.csv (rows: captions in order) and every
    score as JSON."""
    out = PendingDownloads()
    out.save_figure(bars, "probe_scores")
    out.save_figure(matrix, "probe_win_matrix")
    out.save_array(result.combined().T, "probe_combined_scores", columns=result.methods)
    out.save_json(
        {
            "lambda_local": result.lambda_local,
            "captions": [c.__dict__ for c in result.captions],
            "skipped_edits": {e.category: e.note for e in result.edits if not e.applied},
            "scores": {
                name: {
                    "global": s.global_score,
                    "local": s.local_score,
                    "combined": s.combined(result.lambda_local),
                    "true_wins": (s.combined(result.lambda_local)[0]
                                  > s.combined(result.lambda_local)[1:]),
                }
                for name, s in result.scores.items()
            },
        },
        "probe_scores",
    )
    return out


def probe_view(
    explainer: Explainer,
    suite: MethodSuite,
    image: ImageInput | None,
    caption: str | None,
    custom: str | None,
    lambda_local: float,
) -> tuple[str, pd.DataFrame, pd.DataFrame, Figure, Figure, PendingDownloads]:
    """Everything the single-image probe shows: summary, caption table, score table, the
    two figures, and its downloads (written once these are shown)."""
    result = run_probe(explainer, suite, image, caption, custom, lambda_local)
    bars, matrix = probe_figures(result)
    return (probe_summary(result), caption_table(result), score_table(result), bars, matrix,
            probe_downloads(result, bars, matrix))


@dataclass
class BatchProbe:
    """Probe items of a gallery: per method the true and negative scores of every item."""

    categories: list[str]
    positives: dict[str, np.ndarray]
    negatives: dict[str, np.ndarray]
    n_images: int

    def accuracy(self) -> dict[str, dict[str, float]]:
        """Per method, :func:`otviz.eval.probe.probe_accuracy` of the items."""
        return {
            name: probe_accuracy(
                torch.from_numpy(self.positives[name]),
                torch.from_numpy(self.negatives[name]),
                self.categories,
            )
            for name in self.positives
        }


def run_batch_probe(
    explainer: Explainer,
    suite: MethodSuite,
    lambda_local: float = DEFAULT_LAMBDA,
    items: Sequence[GalleryItem] | None = None,
) -> BatchProbe:
    """Score each gallery image against its true caption and world hard negatives."""
    lam = _check_lambda(lambda_local)
    items = load_gallery() if items is None else list(items)
    items = [it for it in items if it.negatives]
    if not items:
        raise InputError("the examples gallery has no images with hard negatives")
    categories: list[str] = []
    pos: dict[str, list[float]] = {n: [] for n in suite.methods}
    neg: dict[str, list[float]] = {n: [] for n in suite.methods}
    for item in items:
        cats = list(item.negatives)
        scores = score_captions(
            explainer, suite, str(item.image_path),
            [item.caption, *(item.negatives[c] for c in cats)],
        )
        categories += cats
        for name, s in scores.items():
            combined = s.combined(lam)
            pos[name] += [combined[0]] * len(cats)
            neg[name] += combined[1:].tolist()
    return BatchProbe(
        categories,
        {n: np.asarray(v) for n, v in pos.items()},
        {n: np.asarray(v) for n, v in neg.items()},
        len(items),
    )


def batch_view(
    explainer: Explainer,
    suite: MethodSuite,
    lambda_local: float,
    items: Sequence[GalleryItem] | None = None,
) -> tuple[str, pd.DataFrame, Figure, PendingDownloads]:
    """Summary, the accuracy table (methods x categories + overall), its figure and its
    downloads."""
    batch = run_batch_probe(explainer, suite, lambda_local, items)
    acc = batch.accuracy()
    columns = [*dict.fromkeys(batch.categories), "overall"]
    labels = [_label(n) for n in acc]
    matrix = np.array([[a[c] for c in columns] for a in acc.values()])
    table = pd.DataFrame(matrix, columns=columns).round(3)
    table.insert(0, "method", labels)
    fig = probe_accuracy_figure(labels, columns, matrix, len(batch.categories))
    out = PendingDownloads()
    out.save_figure(fig, "probe_accuracy")
    out.save_array(matrix, "probe_accuracy", columns=columns)
    out.save_json(
        {
            "lambda_local": float(lambda_local),
            "categories": batch.categories,
            "accuracy": acc,
            "positive_scores": batch.positives,
            "negative_scores": batch.negatives,
        },
        "probe_batch",
    )
    best = max(acc, key=lambda n: acc[n]["overall"])
    summary = (
        f"{batch.n_images} gallery images, {len(batch.categories)} (image, negative) pairs; "
        f"best overall: **{_label(best)}** ({acc[best]['overall']:.2f}); chance is 0.5."
    )
    return summary, table, fig, out


def build_probe_tab(ctx: AppContext, shared: SharedInputs) -> None:
    """Add the Probe view to the enclosing ``gr.Blocks`` (inside its tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            custom = gr.Textbox(
                label="Your own variants of the caption (one per line)",
                lines=4,
                placeholder="a small blue circle to the left of a red star",
            )
            lam = gr.Slider(0.0, 5.0, value=DEFAULT_LAMBDA, step=0.05,
                            label="lambda_l (weight of the local score)")
            run = gr.Button("Score the caption and its edits", variant="primary")
            batch = gr.Button("Batch: probe accuracy over the examples gallery")
            summary = gr.Markdown()
        with gr.Column(scale=2):
            bars = FigurePlot(label="Scores per method", elem_id="probe-bars")
    # full width: every column of the long captions fits the page
    captions = gr.Dataframe(headers=CAPTION_COLUMNS, label="Captions", wrap=True,
                            interactive=False, column_widths=["12%", "12%", "46%", "30%"])
    with gr.Row():
        matrix = FigurePlot(label="Win / lose matrix")
        scores = gr.Dataframe(headers=SCORE_COLUMNS, label=SCORES_TITLE, interactive=False,
                           wrap=True)
    with gr.Row():
        batch_plot = FigurePlot(label="Batch: accuracy per category")
        with gr.Column():
            batch_summary = gr.Markdown()
            batch_table = gr.Dataframe(label=BATCH_TITLE, interactive=False)
    files = gr.File(label="Downloads (PNG, CSV, JSON)", file_count="multiple",
                    elem_id="probe-downloads")
    pending = gr.State()
    gr.Markdown(HOW_TO_READ)

    @user_errors
    def on_run(image, caption: str, checkpoint: str,
               features: str | None, image_size: float | None, variants: str,
               lambda_local: float):
        checkpoint = ctx.read_as(checkpoint, features, image_size)
        explainer = ctx.explainer(checkpoint)
        summary, table, score, *rest = probe_view(explainer, ctx.suite(checkpoint), image,
                                                  caption, variants, lambda_local)
        return (summary, table, gr.Dataframe(score, label=titled(
            SCORES_TITLE, explainer.backbone)), *rest)

    @user_errors
    def on_batch(checkpoint: str,
                 features: str | None, image_size: float | None, lambda_local: float):
        checkpoint = ctx.read_as(checkpoint, features, image_size)
        explainer = ctx.explainer(checkpoint)
        summary, table, *rest = batch_view(explainer, ctx.suite(checkpoint), lambda_local)
        return (summary, gr.Dataframe(table, label=titled(BATCH_TITLE, explainer.backbone)),
                *rest)

    offer_downloads(run.click(
        on_run,
        [shared.image, shared.caption, *shared.backbone, custom, lam],
        [summary, captions, scores, bars, matrix, pending],
        api_name="probe",
    ), pending, files)
    offer_downloads(batch.click(on_batch, [*shared.backbone, lam],
                                [batch_summary, batch_table, batch_plot, pending],
                                api_name="probe_batch"), pending, files)
