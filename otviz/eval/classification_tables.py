"""OT-CLIP's inference tables on the world's classification view (OT-CLIP Sec. 4.1-4.3,
Tables 4-6): zero-shot classification by softmax vs FGW-ISoftmax vs FGW-PGD (each FGW rule
with the paper's Eq. 12 scaling of the Gromov term next to the unit-mass variant this
package used before, :mod:`otviz.ot.fgw`), long-tailed test sets (imbalance 10;
long-tailed, uniform, reverse) by softmax vs the fused Gromov OT of Eq. 14 (alpha0 = 0.01)
vs long-tailed Sinkhorn (alpha0 = 0), both given the test label distribution, and selective
classification at a 50 % rate by softmax confidence vs unbalanced OT vs partial OT.

They need the backbone's pooled embeddings only (the method heads do not enter), so each
function takes a :class:`~otviz.backbone.Backbone`; the temperature ``eps`` is the model's
own ``1 / logit_scale``. The OT rules couple all images of a set (OT-CLIP App. D.2): one
batched solve per set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from otviz.backbone import Backbone
from otviz.eval.classification_metrics import accuracy, selective_accuracy, shot_split_accuracy
from otviz.eval.table import Column, Table
from otviz.ot.zeroshot import (
    LONG_TAILED_RULES,
    long_tailed_predict,
    selective_predict,
    zero_shot_predict,
)
from otviz.world.classification import ORDERS, TASKS, ClassificationView, long_tailed_counts

StageProgress = Callable[[str, int, int], None]
#: Zero-shot rule -> its label; each FGW rule next to its unit-mass variant.
ZERO_SHOT_RULES: dict[str, str] = {
    "softmax": "Softmax",
    "fgw_isoftmax": "FGW-ISoftmax (paper Eq. 12 scaling)",
    "fgw_isoftmax_unit": "FGW-ISoftmax (unit-mass, previous)",
    "fgw_pgd": "FGW-PGD (paper Eq. 12 scaling)",
    "fgw_pgd_unit": "FGW-PGD (unit-mass, previous)",
}
#: Long-tailed rule (:data:`otviz.ot.zeroshot.LONG_TAILED_RULES`) -> its label.
LONG_TAILED_LABELS: dict[str, str] = {
    rule: (f"LT fused Gromov OT (Eq. 14, alpha0 = {alpha0:g})" if alpha0 > 0
           else "LT Sinkhorn (alpha0 = 0)")
    for rule, alpha0 in LONG_TAILED_RULES.items()
}
SELECTIVE_RULES = ("confidence", "uot", "partial")
ORDER_LABELS = {"lt": "LT", "uniform": "U", "reverse": "RLT"}


@torch.no_grad()
def pooled_image_embeddings(backbone: Backbone, images: Sequence, batch_size: int = 128) -> Tensor:
    """``[n, E]`` the model's pooled image embeddings (``encode_image``)."""
    parts = [
        backbone.model.encode_image(backbone.image_tensor(list(images[s : s + batch_size])))
        for s in range(0, len(images), batch_size)
    ]
    return torch.cat(parts).float().cpu()


@torch.no_grad()
def pooled_text_embeddings(backbone: Backbone, texts: Sequence[str]) -> Tensor:
    """``[K, E]`` the model's pooled text embeddings (``encode_text``)."""
    ids = backbone.words(list(texts)).ids.to(backbone.device)
    return backbone.model.encode_text(ids).float().cpu()


def temperature(backbone: Backbone) -> float:
    """``eps = 1 / logit_scale`` of the model (0.01 when it has no logit scale)."""
    scale = getattr(backbone.model, "logit_scale", None)
    return 0.01 if scale is None else float(1.0 / scale.detach().exp())


@dataclass
class ClassificationSet:
    """One balanced test set of the classification view, embedded: its row label, view,
    ``[n, E]`` image and ``[K, E]`` class-prompt embeddings and ``[n]`` labels."""

    label: str
    view: ClassificationView
    image_emb: Tensor
    class_emb: Tensor
    labels: Tensor


def classification_sets(
    backbone: Backbone, n_images: int = 400, tasks: Sequence[str] = TASKS, seed: int = 0
) -> list[ClassificationSet]:
    """Images ``0..n_images-1`` (uniform over classes) of each task on the test split, and
    of ``colour_shape`` on the compositional split (held-out colour-shape pairs only),
    embedded by ``backbone`` (shared by :func:`zero_shot_table` and
    :func:`selective_table`)."""
    views = [(task, ClassificationView(task, split="test", seed=seed)) for task in tasks]
    if "colour_shape" in tasks:
        views.append(("colour_shape (held-out)",
                      ClassificationView("colour_shape", split="compositional", seed=seed)))
    out = []
    for label, view in views:
        images, labels = view.batch(range(n_images))
        image_emb, class_emb = _embed(backbone, view, images)
        out.append(ClassificationSet(label, view, image_emb, class_emb, torch.from_numpy(labels)))
    return out


def _embed(backbone: Backbone, view: ClassificationView, images: np.ndarray) -> tuple[
        Tensor, Tensor]:
    return pooled_image_embeddings(backbone, list(images)), pooled_text_embeddings(
        backbone, view.prompts())


def zero_shot_table(
    backbone: Backbone,
    n_images: int = 400,
    tasks: Sequence[str] = TASKS,
    seed: int = 0,
    sets: list[ClassificationSet] | None = None,
) -> Table:
    """Zero-shot top-1 accuracy (OT-CLIP Table 4) of ``n_images`` balanced test images per
    task by softmax, FGW-ISoftmax and FGW-PGD, each FGW rule with the paper's scaling and
    the unit-mass one (:data:`ZERO_SHOT_RULES`; ``sets``: already embedded test sets)."""
    eps = temperature(backbone)
    sets = sets if sets is not None else classification_sets(backbone, n_images, tasks, seed)
    columns = [Column("task", "Task", "text"), Column("classes", "Classes", "int")]
    columns += [Column(rule, label) for rule, label in ZERO_SHOT_RULES.items()]
    n = sets[0].labels.numel() if sets else n_images
    table = Table("zero_shot", f"Zero-shot classification, {n} images per task", columns)
    for cs in sets:
        row = {"task": cs.label, "classes": len(cs.view.classes)}
        for rule in ZERO_SHOT_RULES:
            pred = zero_shot_predict(cs.image_emb, cs.class_emb, rule, eps=eps)
            row[rule] = accuracy(pred.labels, cs.labels)
        table.rows.append(row)
    table.notes.append(f"eps = 1/logit_scale = {eps:.4f}; FGW: alpha0 = 0.01, 3 steps "
                       "(OT-CLIP Table 7) on the raw plan of mass n (paper Eq. 12) or on the "
                       "unit-mass plan (alpha0 / n in effect); prompts 'a photo of a <class>'")
    return table


def long_tailed_table(
    backbone: Backbone,
    n_max: int = 100,
    imbalance: float = 10.0,
    tasks: Sequence[str] = ("shape", "colour"),
    seed: int = 0,
    progress: StageProgress | None = None,
) -> Table:
    """Long-tailed zero-shot classification (OT-CLIP Table 5): for each task and test
    order (LT, uniform, reverse LT; imbalance ``imbalance``, ``n_max`` images in the largest
    class), softmax vs each rule of :data:`LONG_TAILED_RULES` (the fused Gromov OT of Eq.
    14, and long-tailed Sinkhorn with alpha0 = 0) with the test set's label distribution as
    the prior; top-1 and mean per-class accuracy."""
    eps = temperature(backbone)
    rules = {"softmax": "Softmax", **LONG_TAILED_LABELS}
    columns = [Column("task", "Task", "text"), Column("order", "Test", "text"),
               Column("images", "Images", "int")]
    columns += [Column(rule, label) for rule, label in rules.items()]
    columns += [Column(f"{rule}_class", f"{label} (per class)") for rule, label in rules.items()]
    table = Table("long_tailed", f"Long-tailed classification, imbalance {imbalance:g}", columns)
    total, done = len(tasks) * len(ORDERS), 0
    for task in tasks:
        view = ClassificationView(task, split="test", seed=seed)
        for order in ORDERS:
            images, labels = view.long_tailed(n_max, imbalance, order)
            image_emb, class_emb = _embed(backbone, view, images)
            counts = long_tailed_counts(len(view.classes), n_max, imbalance, order)
            prior = torch.tensor(counts, dtype=torch.float32)
            truth = torch.from_numpy(labels)
            predicted = {"softmax": zero_shot_predict(image_emb, class_emb, "softmax", eps=eps)}
            predicted.update({
                rule: long_tailed_predict(image_emb, class_emb, prior, eps=eps, alpha0=alpha0)
                for rule, alpha0 in LONG_TAILED_RULES.items()
            })
            row = {"task": task, "order": ORDER_LABELS[order], "images": len(labels)}
            for rule, pred in predicted.items():
                row[rule] = accuracy(pred.labels, truth)
                row[f"{rule}_class"] = shot_split_accuracy(pred.labels, truth,
                                                           counts)["mean_per_class"]
            table.rows.append(row)
            done += 1
            if progress is not None:
                progress("long-tailed", done, total)
    table.notes.append("label prior: the class distribution of each test set (OT-CLIP Sec. "
                       "4.2 assumes it known); hard class marginal (Eq. 14); fused Gromov OT: "
                       "3 linearisation steps on the raw plan (paper Eq. 12 scaling)")
    return table


def selective_table(
    backbone: Backbone,
    n_images: int = 400,
    rate: float = 0.5,
    tasks: Sequence[str] = TASKS,
    seed: int = 0,
    sets: list[ClassificationSet] | None = None,
) -> Table:
    """Selective zero-shot classification (OT-CLIP Table 6): accuracy on the ``rate``
    share of images each rule accepts (softmax confidence, unbalanced OT row mass, partial
    OT row mass), next to the accuracy on all images (``sets``: already embedded)."""
    eps = temperature(backbone)
    sets = sets if sets is not None else classification_sets(backbone, n_images, tasks, seed)
    columns = [Column("task", "Task", "text"), Column("all", "All images (softmax)")]
    columns += [Column(r, {"confidence": "Softmax conf.", "uot": "Unbalanced OT",
                           "partial": "Partial OT"}[r]) for r in SELECTIVE_RULES]
    n = sets[0].labels.numel() if sets else n_images
    table = Table("selective", f"Selective classification at a {100 * rate:.0f}% rate, "
                  f"{n} images per task", columns)
    for cs in sets:
        soft = zero_shot_predict(cs.image_emb, cs.class_emb, "softmax", eps=eps).labels
        row = {"task": cs.label, "all": accuracy(soft, cs.labels)}
        for rule in SELECTIVE_RULES:
            pred = selective_predict(cs.image_emb, cs.class_emb, rate, rule, eps=eps)
            row[rule] = selective_accuracy(pred.labels, cs.labels, pred.accepted)["accuracy"]
        table.rows.append(row)
    table.notes.append("unbalanced OT: KL weight tau = 0.01 on the image marginal (Eq. 15); "
                       "partial OT moves rate x n mass (Eq. 16)")
    return table
