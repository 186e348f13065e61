"""Zero-shot recognition of one object's attributes by the backbone's pooled embeddings
(CLIP's zero-shot rule: the candidate caption of highest cosine with the image).

Images: the world's held-out ``test`` split rendered with exactly one object (the world
config the backbone was trained on, with ``min_objects = max_objects = 1``). Captions: the
world's own phrasing ("a small red circle") or CLIP's prompt form ("a photo of a small red
circle"). Tasks, each with the candidates that differ only in what is asked:

* ``shape``: 8 captions, the true size and colour with every shape;
* ``colour``: 8 captions, the true size and shape with every colour;
* ``size``: 2 captions, the true colour and shape with either size;
* ``colour_shape``: the 64 captions "a <colour> <shape>" (no size); a hit needs both
  right, and the shape and colour of the chosen caption are also scored on their own.

:func:`compositional_zero_shot` scores the world's ``compositional`` classification view:
single objects of the held-out colour-shape pairs against those pairs' captions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from otviz.backbone import Backbone
from otviz.eval.classification_tables import pooled_image_embeddings, pooled_text_embeddings
from otviz.world import (
    COLOURS,
    SHAPES,
    SIZES,
    ClassificationView,
    Clause,
    Description,
    Meaning,
    SceneObject,
    World,
    WorldConfig,
    caption_of,
)

TASKS: tuple[str, ...] = ("shape", "colour", "size", "colour_shape")
#: Prompt forms: a template around the world's noun phrase ("a small red circle").
PROMPT_FORMS: dict[str, str] = {"world": "{}", "clip": "a photo of {}"}


def single_object_world(config: WorldConfig, seed: int = 0) -> World:
    """The held-out ``test`` split of ``config``'s world with one object per scene."""
    one = dataclasses.replace(config, min_objects=1, max_objects=1, negatives=False)
    return World(one, "test", seed)


def candidates(task: str, obj: SceneObject) -> tuple[list[Description], int]:
    """The candidate descriptions of ``task`` for ``obj`` and the index of the true one."""
    if task == "shape":
        return [Description(obj.colour, s, obj.size) for s in SHAPES], SHAPES.index(obj.shape)
    if task == "colour":
        return [Description(c, obj.shape, obj.size) for c in COLOURS], COLOURS.index(obj.colour)
    if task == "size":
        return [Description(obj.colour, obj.shape, z) for z in SIZES], SIZES.index(obj.size)
    if task == "colour_shape":
        pairs = [Description(c, s) for c in COLOURS for s in SHAPES]
        return pairs, pairs.index(Description(obj.colour, obj.shape))
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def describe(d: Description, form: str) -> str:
    """The caption of one description in the world's grammar, in prompt ``form``."""
    return PROMPT_FORMS[form].format(caption_of(Meaning((Clause(d),))))


def _all_descriptions() -> list[Description]:
    return [Description(c, s, z) for c in COLOURS for s in SHAPES for z in (*SIZES, None)]


@torch.no_grad()
def single_object_zero_shot(
    backbone: Backbone, config: WorldConfig, n: int, seed: int = 0
) -> dict[str, dict[str, float]]:
    """``{form: {task: accuracy}}`` over the first ``n`` one-object test images (see the
    module docstring); ``colour_shape`` adds ``colour_shape.shape`` and
    ``colour_shape.colour``, the accuracy of the chosen caption's shape and colour alone."""
    samples = single_object_world(config, seed).samples(0, n)
    objects = [s.objects[0] for s in samples]
    image = F.normalize(pooled_image_embeddings(backbone, [s.image for s in samples]), dim=-1)
    every = _all_descriptions()
    row_of = {d: k for k, d in enumerate(every)}
    out: dict[str, dict[str, float]] = {}
    for form in PROMPT_FORMS:
        text = F.normalize(pooled_text_embeddings(backbone, [describe(d, form) for d in every]),
                           dim=-1)
        sims = image @ text.T  # [n, all descriptions]
        scores: dict[str, float] = {}
        for task in TASKS:
            hits, shape_hits, colour_hits = [], [], []
            for i, obj in enumerate(objects):
                cands, truth = candidates(task, obj)
                pick = int(sims[i, [row_of[d] for d in cands]].argmax())
                hits.append(pick == truth)
                shape_hits.append(cands[pick].shape == obj.shape)
                colour_hits.append(cands[pick].colour == obj.colour)
            scores[task] = float(np.mean(hits))
            if task == "colour_shape":
                scores["colour_shape.shape"] = float(np.mean(shape_hits))
                scores["colour_shape.colour"] = float(np.mean(colour_hits))
        out[form] = scores
    return out


@torch.no_grad()
def compositional_zero_shot(
    backbone: Backbone, config: WorldConfig, n: int, seed: int = 0
) -> dict[str, float]:
    """``{form: accuracy}`` of the world's ``compositional`` colour-shape view (single
    objects of the held-out pairs, classified among those pairs' captions)."""
    out = {}
    images = None
    for form, template in PROMPT_FORMS.items():
        view = ClassificationView("colour_shape", "compositional", seed, config,
                                  template=template)
        if images is None:
            pixels, labels = view.batch(range(n))
            images = F.normalize(pooled_image_embeddings(backbone, list(pixels)), dim=-1)
        text = F.normalize(pooled_text_embeddings(backbone, view.prompts()), dim=-1)
        pred = (images @ text.T).argmax(dim=1)
        out[form] = float((pred == torch.from_numpy(labels)).double().mean())
    return out
