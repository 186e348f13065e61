"""Does a word's heatmap bind to the object it names? A test of attribute binding at the
patch level on held-out world scenes.

For each scene with two objects A and B of different colours and different shapes, two
captions name one object: the true caption of A ("a small red circle") and a conflicting
caption that gives A's size and shape with B's colour ("a small blue circle"; false of
the scene: no object is a small blue circle). For each word (size, colour, shape) we find
where its heatmap peaks (the centre of its hottest patch, as in the pointing game, a tie
split evenly among the tied patches): inside A's box, inside B's box, or elsewhere. A
model that binds shape to place puts the shape word on A in both captions, and the
conflicting colour word on B; a colour detector puts every word of the conflicting caption
on B.

Heatmaps come from a :data:`HeatmapSource`: a method's ``Alignment.heatmap`` of the word's
tokens (:func:`method_source`) or the app's Words view, the cosine of the word with each
patch (:func:`words_view_source`, through :meth:`otviz.explain.Explainer.word_similarity`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from otviz.backbone import Backbone
from otviz.eval.grounding_metrics import peak_locations
from otviz.eval.world_set import backbone_in_space
from otviz.explain import Explainer
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import SuiteMethod
from otviz.world import Clause, Description, Meaning, SceneObject, World, realise

ROLES: tuple[str, ...] = ("size", "colour", "shape")
CAPTION_KINDS: tuple[str, ...] = ("true", "conflicting")
PLACES: tuple[str, ...] = ("on_a", "on_b", "elsewhere", "no_peak")

#: ``(images, captions, {role: word index per caption}) -> {role: [n, N] heatmaps}``.
HeatmapSource = Callable[[Sequence[np.ndarray], list[str], dict[str, list[int]]],
                         dict[str, Tensor]]


@dataclass(frozen=True)
class BindingItem:
    """One scene of the test: its image and the two objects A (named) and B (lending its
    colour to the conflicting caption)."""

    sample_index: int
    image: np.ndarray
    a: SceneObject
    b: SceneObject

    def description(self, kind: str) -> Description:
        """A's description, with B's colour in the ``"conflicting"`` caption."""
        colour = self.a.colour if kind == "true" else self.b.colour
        return Description(colour, self.a.shape, self.a.size)

    def caption(self, kind: str) -> tuple[str, dict[str, int]]:
        """The caption of ``kind`` in the world's grammar, and the word index of each role."""
        d = self.description(kind)
        real = realise(Meaning((Clause(d),)))
        words = real.words
        return real.caption, {"size": words.index(d.size), "colour": words.index(d.colour),
                              "shape": words.index(d.shape)}

    def boxes(self) -> list[tuple[int, int, int, int]]:
        return [self.a.box, self.b.box]


def conflict_pair(objects: Sequence[SceneObject]) -> tuple[int, int] | None:
    """The first ordered pair ``(a, b)`` of objects with different colours and shapes such
    that no object of the scene fits A's size and shape in B's colour (so the conflicting
    caption is false of the scene); ``None`` when there is none."""
    for i, a in enumerate(objects):
        for j, b in enumerate(objects):
            if i == j or a.colour == b.colour or a.shape == b.shape:
                continue
            swapped = Description(b.colour, a.shape, a.size)
            if not any(swapped.matches(o) for o in objects):
                return i, j
    return None


def binding_items(world: World, n: int, max_samples: int | None = None) -> list[BindingItem]:
    """The first ``n`` samples of ``world`` (in index order) with a :func:`conflict_pair`,
    looking at most at ``max_samples`` samples (default ``20 n``)."""
    items: list[BindingItem] = []
    for i in range(max_samples or 20 * n):
        if len(items) == n:
            break
        sample = world.sample(i)
        pair = conflict_pair(sample.objects)
        if pair is not None:
            a, b = (sample.objects[k] for k in pair)
            items.append(BindingItem(i, sample.image, a, b))
    return items


def method_source(backbone: Backbone, entry: SuiteMethod, chunk: int = 128) -> HeatmapSource:
    """Heatmaps of one word's tokens from ``entry``'s alignment plan (``Alignment.heatmap``,
    ConceptOT Sec. 2.6), encoding in the feature space the method consumes."""
    encoder = backbone_in_space(backbone, entry.space)

    @torch.no_grad()
    def source(images: Sequence[np.ndarray], captions: list[str],
               roles: dict[str, list[int]]) -> dict[str, Tensor]:
        parts: dict[str, list[Tensor]] = {role: [] for role in roles}
        for s in range(0, len(captions), chunk):
            rows = range(s, min(s + chunk, len(captions)))
            feats = encoder.encode(list(images[s : rows.stop]), captions[s : rows.stop])
            alignment = entry.method(feats.pair_batch())
            for role, words in roles.items():
                select = torch.stack([feats.text.word_mask(b, [words[p]])
                                      for b, p in enumerate(rows)])
                parts[role].append(alignment.heatmap(select).double().cpu())
        return {role: torch.cat(p) for role, p in parts.items()}

    return source


def words_view_source(explainer: Explainer) -> HeatmapSource:
    """Heatmaps as the app's Words view draws them: each word's cosine with every patch in
    the model's joint space (:meth:`Explainer.word_similarity`)."""

    def source(images: Sequence[np.ndarray], captions: list[str],
               roles: dict[str, list[int]]) -> dict[str, Tensor]:
        out: dict[str, list[Tensor]] = {role: [] for role in roles}
        for p, (image, caption) in enumerate(zip(images, captions, strict=True)):
            maps = explainer.word_similarity(explainer.encode(image, caption))
            for role, words in roles.items():
                out[role].append(maps[words[p]].flatten().double())
        return {role: torch.stack(m) for role, m in out.items()}

    return source


def peak_shares(locations: Tensor) -> dict[str, float]:
    """Mean shares of :func:`~otviz.eval.grounding_metrics.peak_locations` over boxes
    ``(A, B)`` (``[n, 4]``: a tie for the peak split among the tied tokens' places):
    ``on_a``, ``on_b``, ``elsewhere`` and ``no_peak`` (flat map)."""
    means = locations.double().mean(dim=0)
    return {place: float(means[c]) for c, place in enumerate(PLACES)}


def binding_results(
    items: Sequence[BindingItem], source: HeatmapSource, geometry: TokenGeometry
) -> dict[str, dict[str, dict[str, float]]]:
    """``{caption kind: {role: peak shares}}`` of ``source``'s heatmaps over ``items``."""
    if not items:
        raise ValueError("no binding items")
    images = [it.image for it in items]
    boxes = torch.tensor([it.boxes() for it in items], dtype=torch.float64)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in CAPTION_KINDS:
        captions, positions = zip(*(it.caption(kind) for it in items), strict=True)
        roles = {role: [pos[role] for pos in positions] for role in ROLES}
        heat = source(images, list(captions), roles)
        out[kind] = {role: peak_shares(peak_locations(heat[role], geometry, boxes))
                     for role in ROLES}
    return out
