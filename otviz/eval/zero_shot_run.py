"""OT-CLIP inference on one image set (OT-CLIP Sec. 4): every rule's predictions, accuracies
and selective curves for a set of images and class prompts. The Zero-shot view of the app
shows a :class:`ZeroShotRun`; it computes nothing itself.

The rules are those of the evaluation tables (:mod:`otviz.eval.classification_tables`):
softmax, the FGW zero-shot rules with the paper's Eq. 12 scaling and the unit-mass one
(:data:`~otviz.eval.classification_tables.ZERO_SHOT_RULES`), the label-prior rules of Eq. 14
(fused Gromov OT and plain Sinkhorn, :data:`otviz.ot.zeroshot.LONG_TAILED_RULES`) and the
selective rules of Eq. 15-16.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from otviz.backbone import Backbone
from otviz.eval.classification_metrics import accuracy, selective_accuracy
from otviz.eval.classification_tables import (
    SELECTIVE_RULES,
    ZERO_SHOT_RULES,
    pooled_image_embeddings,
    pooled_text_embeddings,
    temperature,
)
from otviz.explain import InputError
from otviz.ot.zeroshot import (
    LONG_TAILED_RULES,
    Prediction,
    long_tailed_predict,
    selective_predict,
    zero_shot_predict,
)

#: Selective rates of the accuracy-coverage curve.
CURVE_RATES: tuple[float, ...] = tuple(np.linspace(0.1, 1.0, 10).round(2))


def check_rate(rate: float) -> float:
    """The selective rate as a float in [0, 1] (raises :class:`InputError` otherwise)."""
    value = float(rate)
    if not 0.0 <= value <= 1.0:
        raise InputError(f"the selective rate must be between 0 and 1, got {rate}")
    return value


@dataclass
class ZeroShotRun:
    """Predictions of every rule on one image set.

    Attributes:
        classes, prompts: the class names and their prompts.
        labels: ``[n]`` true classes (indices into ``classes``), or None if unknown.
        predictions: rule -> :class:`Prediction` (softmax, the FGW rules in both scalings,
            the label-prior rules of :data:`LONG_TAILED_RULES`).
        selective: selective rule -> :class:`Prediction` at ``rate``.
        curves: selective rule -> (coverages, accuracies) over :data:`CURVE_RATES`.
        prior: the ``[K]`` label prior used (normalised).
        eps: the temperature; rate: the selective rate.
        notes: remarks for the summary.
    """

    classes: list[str]
    prompts: list[str]
    labels: np.ndarray | None
    predictions: dict[str, Prediction]
    selective: dict[str, Prediction]
    curves: dict[str, tuple[list[float], list[float]]]
    prior: Tensor
    eps: float
    rate: float
    notes: list[str] = field(default_factory=list)

    def accuracy(self) -> dict[str, float]:
        """Top-1 accuracy per rule (empty without labels)."""
        if self.labels is None:
            return {}
        truth = torch.from_numpy(self.labels)
        return {rule: accuracy(p.labels, truth) for rule, p in self.predictions.items()}

    def selective_accuracy(self) -> dict[str, dict[str, float]]:
        """Per selective rule at ``rate``: accuracy on the accepted images and coverage."""
        if self.labels is None:
            return {}
        truth = torch.from_numpy(self.labels)
        return {
            rule: selective_accuracy(p.labels, truth, p.accepted)
            for rule, p in self.selective.items()
        }


def selective_curves(
    image_emb: Tensor, class_emb: Tensor, labels: np.ndarray, eps: float
) -> dict[str, tuple[list[float], list[float]]]:
    """Per selective rule, the (coverage, accuracy on the accepted images) points over
    :data:`CURVE_RATES` (rates accepting no image are left out)."""
    truth = torch.from_numpy(labels)
    curves = {}
    for rule in SELECTIVE_RULES:
        coverage, acc = [], []
        for rate in CURVE_RATES:
            pred = selective_predict(image_emb, class_emb, rate, rule, eps=eps)
            result = selective_accuracy(pred.labels, truth, pred.accepted)
            if not math.isnan(result["accuracy"]):
                coverage.append(result["coverage"])
                acc.append(result["accuracy"])
        curves[rule] = (coverage, acc)
    return curves


def map_labels(
    labels: np.ndarray | None, label_names: Sequence[str] | None, classes: Sequence[str]
) -> tuple[np.ndarray | None, list[str]]:
    """Labels given as indices into ``label_names`` as indices into ``classes`` (matched by
    name), with a note instead when ``classes`` lacks one of them."""
    if labels is None or label_names is None:
        return None, []
    needed = sorted({label_names[int(k)] for k in labels})
    missing = [n for n in needed if n not in classes]
    if missing:
        return None, [f"accuracy not shown: the class list lacks the world classes {missing}"]
    return np.array([classes.index(label_names[int(k)]) for k in labels], dtype=np.int64), []


def run_zero_shot(
    backbone: Backbone,
    images: Sequence,
    classes: Sequence[str],
    prompts: Sequence[str],
    *,
    prior: Tensor | None = None,
    rate: float = 0.5,
    labels: np.ndarray | None = None,
    label_names: Sequence[str] | None = None,
) -> ZeroShotRun:
    """Classify ``images`` into ``classes`` by every rule, at the model's temperature.

    Args:
        backbone: the CLIP model giving the pooled embeddings.
        images: RGB images (anything :func:`otviz.backbone.to_rgb` reads).
        classes: class names; prompts: one prompt per class.
        prior: ``[K]`` label prior of the label-prior rules (default uniform).
        rate: the selective rate in [0, 1].
        labels, label_names: true labels as indices into ``label_names`` (matched to
            ``classes`` by name), if known.
    """
    if not len(images):
        raise InputError("no images: upload some, or use a world batch")
    rate = check_rate(rate)
    classes = list(classes)
    if len(prompts) != len(classes):
        raise InputError(f"{len(prompts)} prompts for {len(classes)} classes")
    prior = torch.ones(len(classes), dtype=torch.float64) if prior is None else prior
    if prior.numel() != len(classes):
        raise InputError(f"the label prior has {prior.numel()} weights for {len(classes)} classes")
    truth, notes = map_labels(labels, label_names, classes)
    image_emb = pooled_image_embeddings(backbone, images)
    class_emb = pooled_text_embeddings(backbone, prompts)
    eps = temperature(backbone)
    predictions = {
        rule: zero_shot_predict(image_emb, class_emb, rule, eps=eps) for rule in ZERO_SHOT_RULES
    }
    predictions.update({
        rule: long_tailed_predict(image_emb, class_emb, prior.float(), eps=eps, alpha0=alpha0)
        for rule, alpha0 in LONG_TAILED_RULES.items()
    })
    selective = {
        rule: selective_predict(image_emb, class_emb, rate, rule, eps=eps)
        for rule in SELECTIVE_RULES
    }
    curves = {} if truth is None else selective_curves(image_emb, class_emb, truth, eps)
    return ZeroShotRun(classes, list(prompts), truth, predictions, selective, curves,
                       prior / prior.sum(), eps, rate, notes)
