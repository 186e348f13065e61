"""The "Zero-shot" view: how OT changes CLIP's zero-shot classification (OT-CLIP Sec. 4).

A set of images (uploads, or a seeded batch of the world's classification view) is
classified into a list of class names, prompted with a template, by the softmax of CLIP
and by the set-level OT rules: FGW-ISoftmax and FGW-PGD (Eq. 11-13; the paper's Eq. 12
scaling next to the previous unit-mass one), OT with a label prior for long-tailed data
(Eq. 14: fused Gromov OT, and plain Sinkhorn) and selective classification by softmax
confidence, unbalanced OT (Eq. 15) or partial OT (Eq. 16). The predictions come from
:func:`otviz.eval.zero_shot_run.run_zero_shot`; this module parses inputs and draws.

Callbacks are plain functions of plain values (testable without a browser); the tab only
wires them to components.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import gradio as gr
import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import Tensor

from otviz.backbone import Backbone, to_rgb
from otviz.boundary.images import decode_image
from otviz.eval.classification_tables import ZERO_SHOT_RULES
from otviz.eval.zero_shot_run import ZeroShotRun, check_rate, run_zero_shot
from otviz.explain import InputError
from otviz.text.words import article
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.downloads import PendingDownloads
from otviz.ui.events import offer_downloads
from otviz.ui.inputs import CheckedFile, fit_image, user_errors
from otviz.ui.plots import FigurePlot
from otviz.ui.upload_cache import discarded_if_refused
from otviz.viz.zeroshot import accuracy_bars_figure, message_figure, selective_curve_figure
from otviz.world import ClassificationView, long_tailed_counts
from otviz.world.classification import TASKS

TAB_TITLE = "Zero-shot"
TEMPLATE = "a photo of a {}"
#: The label-prior rules (:data:`otviz.ot.zeroshot.LONG_TAILED_RULES`) as the view names them.
PRIOR_RULES: dict[str, str] = {
    "lt_fgw": "OT + label prior, FGW (Eq. 14)",
    "lt_sinkhorn": "OT + label prior, plain Sinkhorn",
}
RULE_LABELS: dict[str, str] = {**ZERO_SHOT_RULES, **PRIOR_RULES}
SELECTIVE_RULES: dict[str, str] = {
    "confidence": "softmax confidence",
    "uot": "unbalanced OT",
    "partial": "partial OT",
}
UNIFORM, LONG_TAILED, CUSTOM = "uniform", "long-tailed imbalance 10", "custom"
PRIOR_PRESETS: tuple[str, ...] = (UNIFORM, LONG_TAILED, CUSTOM)
IMBALANCE = 10.0
WORLD, UPLOAD = "world batch", "uploaded images"
SOURCES: tuple[str, ...] = (WORLD, UPLOAD)
LAYOUTS: tuple[str, ...] = ("balanced", "long-tailed (imbalance 10)")
MAX_IMAGES = 128
#: The largest world seed the seed field takes (seeds are whole numbers from 0: the world's
#: random streams refuse a negative one).
MAX_SEED = 2**32 - 1
MAX_CLASSES = 100

HOW_TO_READ = """**How to read this view.** Each image is classified into one of the
class names, each turned into a prompt ("a photo of a {}"). *Softmax* is CLIP's rule:
every image on its own, the class of highest cosine. The OT rules classify the whole set
at once (OT-CLIP Sec. 4), so one image's label depends on the others: *FGW-ISoftmax* and
*FGW-PGD* match the image set to the class set while keeping their internal structure
(fused Gromov-Wasserstein, Eq. 11-13), each twice: with the paper's Eq. 12 scaling of the
structure term (alpha0 = 0.01 on the plan of mass n, OT-CLIP Table 7) and with the
unit-mass plan this app used before (alpha0 / n, n times weaker); *OT + label prior* makes
the classes receive the share of images the prior says (Eq. 14), by fused Gromov OT
(alpha0 = 0.01, "FGW") or by plain Sinkhorn (alpha0 = 0): give it the test set's label
distribution, e.g. the long-tailed preset for a long-tailed batch (the uniform prior forces
equal shares, which costs accuracy on a batch whose classes are not exactly balanced). The
selective rules accept only the share *rate* of images they trust most and reject the
rest: by softmax confidence, by the mass an unbalanced OT plan keeps on each image (Eq.
15), or by the mass partial OT moves (Eq. 16). The curve shows accuracy on the accepted images
as coverage grows; a good rule is accurate at low coverage. Accuracies need known labels
(the world batch); uploads get predictions only. The temperature is the model's own (1 /
logit scale)."""


# ----------------------------------------------------------------------- inputs
def world_view(task: str, seed: int = 0) -> ClassificationView:
    if task not in TASKS:
        raise InputError(f"task must be one of {TASKS}, got {task!r}")
    return ClassificationView(task, split="test", seed=int(seed))


def world_classes(task: str) -> list[str]:
    """The world's class names of ``task`` as its prompts say them ("circle", "red object",
    "red circle")."""
    view = world_view(task)
    return [view.class_text(k) for k in range(len(view.classes))]


def world_batch(
    task: str, seed: int, n_images: int, layout: str = LAYOUTS[0]
) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """Images, labels and class names of a world batch: ``n_images`` drawn uniformly over
    the classes, or (long-tailed layout) the smallest long-tailed set of imbalance 10 with
    at least ``n_images`` images, head classes first (OT-CLIP Sec. 4.2)."""
    n = int(n_images)
    if not 1 <= n <= MAX_IMAGES:
        raise InputError(f"the number of images must be between 1 and {MAX_IMAGES}")
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}")
    view = world_view(task, seed)
    if layout == LAYOUTS[0]:
        images, labels = view.batch(range(n))
    else:
        n_max = 1
        while sum(long_tailed_counts(len(view.classes), n_max, IMBALANCE)) < n:
            n_max += 1
        images, labels = view.long_tailed(n_max, IMBALANCE)
    return list(images), labels, world_classes(task)


def load_images(files: Sequence | None) -> list[np.ndarray]:
    """Uploaded files (paths, or objects with a ``.name`` path) as RGB arrays, each decoded
    through the input boundary (:func:`~otviz.boundary.images.decode_image`: pixel limit
    and aspect ratio from the header, a message naming the file) and scaled down to the
    app's longest side (:func:`~otviz.ui.inputs.fit_image`), so the gallery shows each one
    back within what its encoder takes."""
    paths = [getattr(f, "name", f) for f in (files or [])]
    if not paths:
        raise InputError("no images: upload some, or use a world batch")
    if len(paths) > MAX_IMAGES:
        raise InputError(f"at most {MAX_IMAGES} images at once, got {len(paths)}")
    images = []
    for path in paths:
        with discarded_if_refused([path]):  # a refused image leaves the server at once
            images.append(np.asarray(fit_image(np.asarray(decode_image(path)))[0]))
    return images


def parse_classes(text: str | None) -> list[str]:
    """Class names from a textbox: one per line or comma-separated."""
    names = [n.strip() for n in re.split(r"[,\n]", text or "") if n.strip()]
    if not names:
        raise InputError("the class list is empty: give at least two class names")
    if len(names) < 2:
        raise InputError("give at least two class names to choose between")
    if len(names) > MAX_CLASSES:
        raise InputError(f"at most {MAX_CLASSES} classes, got {len(names)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(f"repeated class names: {repeated}")
    return names


def class_prompts(classes: Sequence[str], template: str | None = TEMPLATE) -> list[str]:
    """``template`` filled with each class name; "a {}" takes "an" before a vowel, as the
    world writes its prompts ("a photo of an orange object")."""
    template = (template or "").strip()
    if template.count("{}") != 1:
        raise InputError('the prompt template needs exactly one "{}" for the class name')
    head, tail = template.split("{}")
    fix = re.search(r"\b(a|an) $", head)
    prompts = []
    for name in classes:
        start = head if fix is None else f"{head[: fix.start()]}{article(name.lower())} "
        prompts.append(f"{start}{name}{tail}")
    return prompts


def parse_prior(text: str | None, classes: Sequence[str]) -> Tensor:
    """A label prior from ``"class:weight, ..."`` naming every class once, or from one
    plain weight per class in order; weights >= 0, not all 0. Returns the ``[K]`` weights."""
    parts = [p.strip() for p in re.split(r"[,\n]", text or "") if p.strip()]
    if not parts:
        raise InputError("the label prior is empty: give class:weight for every class")
    named = [p.rsplit(":", 1) for p in parts]
    if all(len(p) == 2 for p in named):
        weights = dict((name.strip(), value.strip()) for name, value in named)
        unknown = sorted(set(weights) - set(classes))
        missing = [c for c in classes if c not in weights]
        if unknown or missing or len(weights) != len(parts):
            raise InputError(
                f"the label prior must name each of the {len(classes)} classes once"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else "")
            )
        values = [weights[c] for c in classes]
    elif any(len(p) == 2 for p in named):
        raise InputError("write the prior either as class:weight pairs or as plain weights")
    else:
        values = parts
        if len(values) != len(classes):
            raise InputError(
                f"the label prior has {len(values)} weights for {len(classes)} classes"
            )
    try:
        prior = torch.tensor([float(v) for v in values], dtype=torch.float64)
    except ValueError:
        raise InputError(f"the label prior's weights must be numbers: {values}") from None
    if not torch.isfinite(prior).all() or (prior < 0).any() or prior.sum() <= 0:
        raise InputError("the label prior's weights must be finite, >= 0 and not all 0")
    return prior


def label_prior(preset: str, text: str | None, classes: Sequence[str]) -> Tensor:
    """The ``[K]`` label prior of a preset: uniform, long-tailed of imbalance 10 over the
    classes in order (:func:`otviz.world.long_tailed_counts`), or the user's text."""
    if preset == UNIFORM:
        return torch.ones(len(classes), dtype=torch.float64)
    if preset == LONG_TAILED:
        counts = long_tailed_counts(len(classes), 1000, IMBALANCE)
        return torch.tensor(counts, dtype=torch.float64)
    if preset == CUSTOM:
        return parse_prior(text, classes)
    raise InputError(f"the prior preset must be one of {PRIOR_PRESETS}")


# ----------------------------------------------------------------------- outputs
def prediction_table(run: ZeroShotRun) -> pd.DataFrame:
    """One row per image: true class (if known), the class each rule predicts, softmax
    confidence, and which selective rules accept it."""
    n = len(next(iter(run.predictions.values())).labels)
    table = pd.DataFrame({"image": range(n)})
    if run.labels is not None:
        table["true"] = [run.classes[k] for k in run.labels]
    for rule, pred in run.predictions.items():
        table[RULE_LABELS[rule]] = [run.classes[k] for k in pred.labels.tolist()]
    table["softmax confidence"] = run.predictions["softmax"].confidence.double().numpy().round(3)
    for rule, pred in run.selective.items():
        table[f"accepted by {SELECTIVE_RULES[rule]}"] = [
            "yes" if a else "no" for a in pred.accepted.tolist()
        ]
    return table


def zero_shot_summary(run: ZeroShotRun) -> str:
    """Accuracies (where labels are known), the temperature and the notes."""
    n = len(run.predictions["softmax"].labels)
    lines = [f"{n} images, {len(run.classes)} classes, temperature eps = {run.eps:.4f}."]
    acc = run.accuracy()
    if acc:
        lines.append("Accuracy: " + ", ".join(f"{RULE_LABELS[r]} **{a:.3f}**"
                                              for r, a in acc.items()))
        sel = run.selective_accuracy()
        lines.append(f"Selective at rate {run.rate:.2f}: " + ", ".join(
            f"{SELECTIVE_RULES[r]} {_fmt(s['accuracy'])} ({int(s['n_accepted'])} accepted)"
            for r, s in sel.items()
        ))
    else:
        lines.append("Labels unknown: predictions only.")
    lines += [f"Note: {note}" for note in run.notes]
    return "\n\n".join(lines)


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def zero_shot_figures(run: ZeroShotRun) -> tuple[Figure, Figure]:
    """The accuracy bars and the selective accuracy-coverage curves."""
    acc = run.accuracy()
    if not acc:
        text = "Accuracy needs known labels (use a world batch)."
        return message_figure(text), message_figure(text)
    n = len(run.labels) if run.labels is not None else 0
    bars = accuracy_bars_figure([RULE_LABELS[r] for r in acc], list(acc.values()),
                                1.0 / len(run.classes), n)
    curves = {SELECTIVE_RULES[r]: c for r, c in run.curves.items()}
    return bars, selective_curve_figure(curves, run.rate)


def zero_shot_downloads(run: ZeroShotRun, table: pd.DataFrame, figures: Sequence[Figure]
                        ) -> PendingDownloads:
    """PNG figures, the predictions as CSV and everything as JSON."""
    out = PendingDownloads()
    for fig, name in zip(figures, ("zero_shot_accuracy", "selective_curve"), strict=True):
        out.save_figure(fig, name)
    out.save_table(table, "zero_shot_predictions")
    out.save_json(
        {
            "classes": run.classes,
            "prompts": run.prompts,
            "temperature": run.eps,
            "label_prior": run.prior,
            "labels": run.labels,
            "predictions": {r: p.labels for r, p in run.predictions.items()},
            "scores": {r: p.scores for r, p in run.predictions.items()},
            "accuracy": run.accuracy(),
            "selective_rate": run.rate,
            "selective_accepted": {r: p.accepted for r, p in run.selective.items()},
            "selective_accuracy": run.selective_accuracy(),
            "selective_curves": run.curves,
        },
        "zero_shot",
    )
    return out


def zero_shot_view(
    backbone: Backbone,
    source: str,
    files: Sequence | None,
    task: str,
    seed: int,
    n_images: int,
    layout: str,
    classes_text: str | None,
    template: str | None,
    prior_preset: str,
    prior_text: str | None,
    rate: float,
) -> tuple[str, pd.DataFrame, Figure, Figure, list[tuple[np.ndarray, str]], PendingDownloads]:
    """Everything the view shows: summary, per-image table, accuracy bars, selective
    curves, the images with their predictions, and its downloads (written once these are
    shown)."""
    check_rate(rate)
    classes = parse_classes(classes_text)
    prior = label_prior(prior_preset, prior_text, classes)
    if source == WORLD:
        images, labels, names = world_batch(task, seed, n_images, layout)
    elif source == UPLOAD:
        images, labels, names = load_images(files), None, None
    else:
        raise InputError(f"the image source must be one of {SOURCES}")
    run = run_zero_shot(backbone, images, classes, class_prompts(classes, template),
                        prior=prior, rate=rate, labels=labels, label_names=names)
    table = prediction_table(run)
    figures = zero_shot_figures(run)
    gallery = [(np.asarray(to_rgb(im)), _gallery_caption(row)) for im, (_, row) in
               zip(images, table.iterrows(), strict=True)]
    return (zero_shot_summary(run), table, *figures, gallery,
            zero_shot_downloads(run, table, figures))


def _gallery_caption(row: pd.Series) -> str:
    parts = [f"#{row['image']}"]
    if "true" in row:
        parts.append(f"true: {row['true']}")
    parts += [f"{RULE_LABELS[r]}: {row[RULE_LABELS[r]]}" for r in ("softmax", "fgw_pgd")]
    return " | ".join(parts)


def build_zeroshot_tab(ctx: AppContext, shared: SharedInputs) -> None:
    """Add the Zero-shot view to the enclosing ``gr.Blocks`` (inside its tab). It has its
    own image set; of the shared inputs it reads the checkpoint only."""
    with gr.Row():
        with gr.Column(scale=1):
            source = gr.Radio(list(SOURCES), value=WORLD, label="Images")
            with gr.Group():
                task = gr.Dropdown(list(TASKS), value="shape", label="World task")
                seed = gr.Number(0, precision=0, minimum=0, maximum=MAX_SEED,
                                 label="World seed")
                n_images = gr.Slider(2, MAX_IMAGES, value=32, step=1,
                                     label="Number of world images")
                layout = gr.Radio(list(LAYOUTS), value=LAYOUTS[0], label="World batch layout")
            files = CheckedFile(file_count="multiple", file_types=["image"],
                                label="Uploaded images")
        with gr.Column(scale=1):
            classes = gr.Textbox("\n".join(world_classes("shape")), lines=6,
                                 label="Class names (one per line or comma-separated)")
            template = gr.Textbox(TEMPLATE, label='Prompt template ("{}" = class name)')
            preset = gr.Radio(list(PRIOR_PRESETS), value=UNIFORM,
                              label="Label prior (for OT + label prior, FGW and Sinkhorn)")
            prior_text = gr.Textbox(label="Custom prior: class:weight, ... (or one weight "
                                    "per class)", placeholder="circle:10, square:5, ...")
            rate = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Selective rate")
            run = gr.Button("Classify", variant="primary")
    summary = gr.Markdown()
    with gr.Row():
        acc_plot = FigurePlot(label="Accuracy per rule", elem_id="zeroshot-accuracy")
        sel_plot = FigurePlot(label="Selective accuracy vs coverage")
    table = gr.Dataframe(label="Predictions per image", interactive=False, wrap=True)
    gallery = gr.Gallery(label="Images and predictions", columns=8, height=320)
    downloads = gr.File(label="Downloads (PNG, CSV, JSON)", file_count="multiple",
                        elem_id="zeroshot-downloads")
    pending = gr.State()
    gr.Markdown(HOW_TO_READ)

    def on_task(task: str):
        return "\n".join(world_classes(task))

    @user_errors
    def on_run(checkpoint, features, image_size, source, files, task, seed, n_images, layout,
               classes, template, prior_preset, prior_text, rate):
        backbone = ctx.explainer(ctx.read_as(checkpoint, features, image_size)).backbone
        return zero_shot_view(backbone, source, files, task, seed, n_images, layout, classes,
                              template, prior_preset, prior_text, rate)

    task.change(on_task, task, classes, api_name="zero_shot_classes")
    offer_downloads(run.click(
        on_run,
        [*shared.backbone, source, files, task, seed, n_images, layout, classes, template,
         preset, prior_text, rate],
        [summary, table, acc_plot, sel_plot, gallery, pending],
        api_name="zero_shot",
    ), pending, downloads)
