"""The procedural world: seeded scenes, captions with gold trees and boxes, hard negatives.

``World(config, split, seed).sample(i)`` is a pure function of ``(config, split, seed, i)``:
it draws from ``np.random.default_rng([seed, split_id, i])`` and renders on the fly.

Splits: ``train`` and ``test`` share one distribution (objects, distractors included, use
only colour-shape pairs outside ``HELD_OUT_PAIRS``; negatives name none either) and differ
only in their random streams. ``compositional`` draws objects from all pairs and always
mentions at least one held-out pair.

A scene has 1-4 objects of distinct (colour, shape, size), placed without overlap. Each
object after the first is a distractor (rendered, not mentioned) with ``distractor_prob``.
The caption mentions the others in random order, joining consecutive ones by the salient
spatial relation (:func:`salient_relation`) with ``relation_prob`` and by conjunction
otherwise (at most three conjuncts). Because the order is random, a relation comes out in
either direction ("a left of b" or "b right of a"). A size word is dropped with
``omit_size_prob`` only where colour and shape alone pick out the object in the scene, so
every noun phrase names exactly one object.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import partial

import numpy as np

from otviz.world.draws import integers, shuffled
from otviz.world.grammar import caption_of, realise
from otviz.world.negatives import hard_negatives
from otviz.world.render import render_scene
from otviz.world.scene import place_boxes, salient_relation
from otviz.world.semantics import is_true
from otviz.world.types import (
    Clause,
    Description,
    Meaning,
    Phrase,
    Sample,
    SceneObject,
    WorldConfig,
)
from otviz.world.vocab import ALL_PAIRS, HELD_OUT_PAIRS, SEEN_PAIRS, SIZES, SPLITS

_MAX_CONJUNCTS = 3


class World:
    """Seeded generator of samples for one split."""

    def __init__(self, config: WorldConfig | None = None, split: str = "train", seed: int = 0):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.config = config or WorldConfig()
        self.split = split
        self.split_id = SPLITS.index(split)
        self.seed = seed
        counts = np.arange(self.config.min_objects, self.config.max_objects + 1)
        weights = counts.astype(float) ** self.config.count_bias
        self._counts = counts.tolist()
        self._count_cdf = (np.cumsum(weights[:-1]) / weights.sum()).tolist()
        compositional = split == "compositional"
        self.pairs = ALL_PAIRS if compositional else SEEN_PAIRS
        self.forbidden_pairs = frozenset() if compositional else frozenset(HELD_OUT_PAIRS)

    def sample(self, i: int) -> Sample:
        """Sample ``i`` of this split (deterministic; its hard negatives are made on their
        first read, see :meth:`Sample.defer_negatives`)."""
        rng = np.random.default_rng([self.seed, self.split_id, i])
        objects = self._scene(rng)
        meaning, order = self._describe(objects, rng)
        real = realise(meaning)
        image = render_scene(objects, rng, self.config)
        phrases = [
            Phrase(s, e, " ".join(real.words[s:e]), j, objects[j].box)
            for (s, e), j in zip(real.spans, order, strict=True)
        ]
        sample = Sample(
            image=image,
            caption=real.caption,
            words=real.words,
            tree=real.tree,
            phrases=phrases,
            objects=objects,
            negatives={},
            meaning=meaning,
            split=self.split,
            index=i,
        )
        if self.config.negatives:
            # the negatives draw last from ``rng``, which nothing else holds: defer them
            sample.defer_negatives(partial(self._negatives, meaning, objects, rng))
        return sample

    def _negatives(
        self, meaning: Meaning, objects: list[SceneObject], rng: np.random.Generator
    ) -> tuple[dict[str, Meaning], dict[str, str]]:
        meanings = hard_negatives(meaning, objects, rng, self.forbidden_pairs)
        return meanings, {k: caption_of(m) for k, m in meanings.items()}

    def samples(self, start: int, count: int) -> list[Sample]:
        """Samples ``start, ..., start + count - 1``."""
        return [self.sample(i) for i in range(start, start + count)]

    @staticmethod
    def is_true(meaning: Meaning, objects: list[SceneObject]) -> bool:
        """Whether ``meaning`` is true of the scene (see :mod:`otviz.world.semantics`)."""
        return is_true(meaning, objects)

    def _scene(self, rng: np.random.Generator) -> list[SceneObject]:
        cfg = self.config
        n = self._counts[bisect_right(self._count_cdf, rng.random())]
        size_ids = integers(rng, 0, len(SIZES), n)
        sides = [
            int(rng.integers(lo, hi + 1))
            for lo, hi in (cfg.large_px if s else cfg.small_px for s in size_ids)
        ]
        boxes = place_boxes(sides, rng, cfg.image_size, cfg.margin)
        mentioned = [True] * n
        if n > 1:
            draws = rng.random(n - 1).tolist()
            mentioned[1:] = [u >= cfg.distractor_prob for u in draws]
            mentioned = shuffled(mentioned, rng)
        pairs = self._pairs(rng, [SIZES[s] for s in size_ids], mentioned)
        return [
            SceneObject(shape, colour, SIZES[s], box, m)
            for (colour, shape), s, box, m in zip(pairs, size_ids, boxes, mentioned, strict=True)
        ]

    def _pairs(
        self, rng: np.random.Generator, sizes: list[str], mentioned: list[bool]
    ) -> list[tuple[str, str]]:
        """A colour-shape pair per object, no (colour, shape, size) repeated; in the
        compositional split one mentioned object gets a held-out pair."""
        pairs: list[tuple[str, str]] = []
        forced = -1
        if self.split == "compositional":
            candidates = [k for k, m in enumerate(mentioned) if m]
            forced = candidates[int(rng.integers(len(candidates)))]
        taken: set[tuple[str, str, str]] = set()
        for k, size in enumerate(sizes):
            pool = HELD_OUT_PAIRS if k == forced else self.pairs
            while True:
                pair = pool[int(rng.integers(len(pool)))]
                if (*pair, size) not in taken:
                    break
            taken.add((*pair, size))
            pairs.append(pair)
        return pairs

    def _describe(
        self, objects: list[SceneObject], rng: np.random.Generator
    ) -> tuple[Meaning, list[int]]:
        """The caption meaning for the mentioned objects, and the object index of each of
        its descriptions."""
        cfg = self.config
        pairs = [(o.colour, o.shape) for o in objects]
        ids = [j for j in shuffled(range(len(objects)), rng) if objects[j].mentioned]
        omit = rng.random(len(ids)).tolist()
        desc = {}
        for j, u in zip(ids, omit, strict=True):
            o = objects[j]
            drop = u < cfg.omit_size_prob
            unique = pairs.count(pairs[j]) == 1
            desc[j] = Description(o.colour, o.shape, None if drop and unique else o.size)
        clauses: list[Clause] = []
        order: list[int] = []
        k = 0
        while k < len(ids):
            remaining, slots = len(ids) - k, _MAX_CONJUNCTS - len(clauses)
            if remaining >= 2 and (remaining > slots or rng.random() < cfg.relation_prob):
                a, b = ids[k], ids[k + 1]
                rel = salient_relation(objects[a].box, objects[b].box)
                clauses.append(Clause(desc[a], rel, desc[b]))
                order += [a, b]
                k += 2
            else:
                clauses.append(Clause(desc[ids[k]]))
                order.append(ids[k])
                k += 1
        there_is = bool(rng.random() < cfg.there_is_prob)
        return Meaning(tuple(clauses), there_is), order
