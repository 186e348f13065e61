"""The semantic evaluator: is a caption's meaning true of a scene?

A :class:`Meaning` is read existentially over ALL objects of the scene, distractors
included: it is true when there is an injective assignment of scene objects to its noun
phrases such that every object fits its description (colour, shape, and size when stated)
and every stated relation holds between the assigned boxes (:func:`relation_holds`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from otviz.world.scene import relation_holds
from otviz.world.types import DescriptionKey, Meaning, Sample, SceneObject


def satisfying_assignment(meaning: Meaning, objects: Sequence[SceneObject]) -> list[int] | None:
    """Object indices, one per description of ``meaning``, that make it true; or None."""
    keys = [d.key for d in meaning.descriptions()]
    return assignment(keys, meaning.relations(), objects)


def assignment(
    descriptions: Sequence[DescriptionKey],
    relations: Sequence[tuple[int, str, int]],
    objects: Sequence[SceneObject],
) -> list[int] | None:
    """:func:`satisfying_assignment` of a meaning given as its descriptions' keys and its
    ``(subject, relation, landmark)`` index triples (:meth:`Meaning.relations`), without
    building a :class:`Meaning` (the hard negatives test many candidates this way)."""
    candidates = []
    for colour, shape, size in descriptions:
        fits = [
            j for j, o in enumerate(objects)
            if o.shape == shape and o.colour == colour and (size is None or o.size == size)
        ]
        if not fits:
            return None
        candidates.append(fits)
    # relations checked as soon as both ends are assigned (the landmark always comes later)
    checks: list[list[tuple[int, str]]] = [[] for _ in descriptions]
    for s, rel, l in relations:
        checks[l].append((s, rel))
    chosen: list[int] = []

    def search(k: int) -> bool:
        if k == len(candidates):
            return True
        for j in candidates[k]:
            if j in chosen:
                continue
            box = objects[j].box
            if all(relation_holds(rel, objects[chosen[s]].box, box) for s, rel in checks[k]):
                chosen.append(j)
                if search(k + 1):
                    return True
                chosen.pop()
        return False

    return chosen if search(0) else None


def is_true(meaning: Meaning, objects: Sequence[SceneObject]) -> bool:
    """Whether ``meaning`` is true of the scene made of ``objects``."""
    return satisfying_assignment(meaning, objects) is not None


def caption_match_counts(samples: Sequence[Sample]) -> np.ndarray:
    """For each sample's caption, the number of the samples' images it is true of (>= 1 for
    a world sample, since its own image makes it true). Captions are screened by the
    colour-shape pairs they need before the full evaluation."""
    pair_sets = [frozenset((o.colour, o.shape) for o in s.objects) for s in samples]
    counts = np.zeros(len(samples), dtype=np.int64)
    for i, s in enumerate(samples):
        needed = frozenset((d.colour, d.shape) for d in s.meaning.descriptions())
        counts[i] = sum(
            1
            for pairs, other in zip(pair_sets, samples, strict=True)
            if needed <= pairs and is_true(s.meaning, other.objects)
        )
    return counts


def ambiguous_caption_share(samples: Sequence[Sample]) -> float:
    """Share of captions true of more than one image of ``samples``: the fraction of text
    queries for which text-to-image retrieval cannot be exact even in principle."""
    if not samples:
        return 0.0
    return float(np.mean(caption_match_counts(samples) > 1))


def retrieval_ceiling(samples: Sequence[Sample]) -> float:
    """Best expected text-to-image R@1 on ``samples``: a perfect judge of truth that picks
    at random among the images a caption is true of scores ``mean(1 / count)``."""
    if not samples:
        return 0.0
    return float(np.mean(1.0 / caption_match_counts(samples)))
