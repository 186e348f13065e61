"""Classification metrics for zero-shot, long-tailed and selective classification (OT-CLIP
Sec. 4.1-4.3). The predictions come from :mod:`otviz.ot.zeroshot` (softmax, FGW, Sinkhorn
with a label prior, unbalanced / partial OT); these functions only score them.

* top-1 accuracy (OT-CLIP Tables 4-5);
* per-class accuracy and its many / medium / few-shot split, the long-tailed convention of
  Liu et al. (OLTR, CVPR 2019) that Kang et al. (2019), cited by OT-CLIP Sec. 4.4, follow:
  a class is many-shot with more than 100 training images, few-shot with fewer than 20,
  medium otherwise, and a group's accuracy is the mean of its classes' accuracies;
* selective accuracy: accuracy on the accepted samples and the coverage (the share
  accepted; OT-CLIP Sec. 4.3 fixes the selective rate at 50 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def _check(pred: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    pred, labels = pred.detach().flatten().long().cpu(), labels.detach().flatten().long().cpu()
    if pred.shape != labels.shape:
        raise ValueError(f"{pred.numel()} predictions but {labels.numel()} labels")
    return pred, labels


def accuracy(pred: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy ``mean(pred == labels)``; NaN for no samples."""
    pred, labels = _check(pred, labels)
    return float((pred == labels).double().mean()) if labels.numel() else math.nan


def per_class_accuracy(pred: Tensor, labels: Tensor, n_classes: int) -> Tensor:
    """``[n_classes]`` float64: accuracy on the samples of each true class (NaN for a class
    with no sample)."""
    pred, labels = _check(pred, labels)
    if labels.numel() and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels outside [0, {n_classes})")
    total = torch.bincount(labels, minlength=n_classes).double()
    right = torch.bincount(labels[pred == labels], minlength=n_classes).double()
    return torch.where(total > 0, right / total.clamp(min=1), torch.full_like(total, math.nan))


def shot_split_accuracy(
    pred: Tensor,
    labels: Tensor,
    class_counts: Sequence[int] | Tensor,
    many_above: int = 100,
    few_below: int = 20,
) -> dict[str, float]:
    """Many / medium / few-shot accuracy for long-tailed classification (OLTR convention).

    Args:
        pred, labels: ``[n]`` predicted and true classes.
        class_counts: ``[C]`` images per class in the training set (for zero-shot use, the
            label prior's counts, e.g. :func:`otviz.world.long_tailed_counts`).
        many_above: a class with more than this many images is many-shot.
        few_below: a class with fewer than this many is few-shot; the rest is medium.

    Returns:
        ``{"many", "medium", "few"}`` (mean per-class accuracy over the test classes of the
        group, NaN for an empty group), ``"mean_per_class"`` (over all classes present) and
        ``"overall"`` (top-1 over samples).
    """
    counts = torch.as_tensor(class_counts).flatten()
    if few_below > many_above + 1:
        raise ValueError("few_below must not exceed many_above + 1")
    per_class = per_class_accuracy(pred, labels, counts.numel())
    groups = {
        "many": counts > many_above,
        "medium": (counts <= many_above) & (counts >= few_below),
        "few": counts < few_below,
    }
    out = {name: _nanmean(per_class[mask]) for name, mask in groups.items()}
    out["mean_per_class"] = _nanmean(per_class)
    out["overall"] = accuracy(pred, labels)
    return out


def selective_accuracy(pred: Tensor, labels: Tensor, accept_mask: Tensor) -> dict[str, float]:
    """Accuracy on the accepted samples and coverage (OT-CLIP Sec. 4.3).

    Returns:
        ``{"accuracy": mean(pred == labels | accepted) (NaN if none accepted),
        "coverage": share accepted, "n_accepted": count}``.
    """
    pred, labels = _check(pred, labels)
    accept = accept_mask.detach().flatten().bool().cpu()
    if accept.shape != labels.shape:
        raise ValueError(f"{accept.numel()} accept flags but {labels.numel()} labels")
    n_acc = int(accept.sum())
    return {
        "accuracy": accuracy(pred[accept], labels[accept]),
        "coverage": n_acc / labels.numel() if labels.numel() else math.nan,
        "n_accepted": float(n_acc),
    }


def _nanmean(x: Tensor) -> float:
    x = x[~torch.isnan(x)]
    return float(x.mean()) if x.numel() else math.nan
