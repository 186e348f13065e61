"""Compositional probe (SugarCrepe-style, ConceptOT Sec. 3): for each image, does the model
score the true caption above a hard negative (replaced / swapped object, attribute or
relation, an added absent object)?

A pair counts as correct only when ``pos > neg`` strictly: a tie is a failure, so a method
that cannot tell the captions apart (equal scores) gets 0, not 50 %.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from otviz.world.types import Sample


@dataclass(frozen=True)
class ProbeItem:
    """One probe question: sample ``index`` (into the list given to :func:`probe_items`),
    its true caption, a negative caption and the negative's category."""

    index: int
    positive: str
    negative: str
    category: str


def probe_items(samples: Sequence[Sample]) -> list[ProbeItem]:
    """Every (sample, negative) pair of world samples, in sample order and, within a sample,
    in the order of ``Sample.negatives``."""
    return [
        ProbeItem(i, s.caption, neg, cat)
        for i, s in enumerate(samples)
        for cat, neg in s.negatives.items()
    ]


def probe_accuracy(
    pos_scores: Tensor, neg_scores: Tensor, categories: Sequence[str]
) -> dict[str, float]:
    """Accuracy ``mean(pos > neg)`` per category and over all items.

    Args:
        pos_scores: ``[n]`` score of each item's true caption with its image.
        neg_scores: ``[n]`` score of the item's negative caption with the same image.
        categories: ``n`` category names.

    Returns:
        ``{category: accuracy, ..., "overall": accuracy}``; ``"overall"`` is the mean over
        items (micro average), so categories weigh by their number of items. Ties count as
        failures.
    """
    pos, neg = pos_scores.detach().flatten(), neg_scores.detach().flatten()
    if not (pos.numel() == neg.numel() == len(categories)):
        raise ValueError(
            f"{pos.numel()} positive, {neg.numel()} negative scores, {len(categories)} categories"
        )
    if pos.numel() == 0:
        raise ValueError("no probe items")
    if "overall" in categories:
        raise ValueError("'overall' is reserved for the total; rename that category")
    correct = (pos > neg).tolist()
    out: dict[str, float] = {}
    for cat in dict.fromkeys(categories):
        hits = [c for c, k in zip(correct, categories, strict=True) if k == cat]
        out[cat] = sum(hits) / len(hits)
    out["overall"] = sum(correct) / len(correct)
    return out
