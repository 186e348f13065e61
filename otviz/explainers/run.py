"""Explainers on a :class:`~otviz.backbone.Backbone`: the phrases' text embeddings and the
heatmaps of (image, phrase) pairs in chunks, on the backbone's patch grid."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.backbone import Backbone, ImageInput
from otviz.explainers.base import EXPLAINERS, ExplainerUnsupportedError, get_explainer

CHUNK = 32


@torch.no_grad()
def phrase_embeddings(backbone: Backbone, phrases: Sequence[str]) -> Tensor:
    """``[P, E]`` unit text embeddings of the phrases, each encoded alone by the model's text
    tower (the pooled embedding its contrastive loss was trained on)."""
    ids = backbone.words(list(phrases)).ids.to(backbone.device)
    return F.normalize(backbone.model.encode_text(ids), dim=-1)


@dataclass
class ExplainerMaps:
    """One explainer's maps of P pairs and the wall time they took."""

    name: str
    maps: Tensor  # [P, N] float64 on the CPU
    ms: float


def explain_pairs(
    backbone: Backbone, name: str, images: Sequence[ImageInput], phrases: Sequence[str],
    chunk: int = CHUNK, text: Tensor | None = None,
) -> ExplainerMaps:
    """The explainer ``name``'s ``[P, N]`` maps of the pairs ``(images[p], phrases[p])`` on
    the backbone's patch grid, ``chunk`` pairs per call (images are preprocessed per chunk);
    ``text``: the phrases' ``[P, E]`` unit embeddings when given (e.g. a prompt-template
    ensemble, :func:`otviz.text.templates.ensembled`), else :func:`phrase_embeddings`."""
    if len(images) != len(phrases):
        raise ValueError(f"{len(images)} images but {len(phrases)} phrases")
    explainer = get_explainer(name, backbone.model, backbone.image_tower)
    text = phrase_embeddings(backbone, phrases) if text is None else text.to(backbone.device)
    parts, start = [], time.perf_counter()
    for s in range(0, len(phrases), chunk):
        pixels = backbone.image_tensor(list(images[s : s + chunk]))
        parts.append(explainer.maps(pixels, text[s : s + chunk],
                                    backbone.image_tower.geometry).double().cpu())
    ms = 1000 * (time.perf_counter() - start)
    n = backbone.grid[0] * backbone.grid[1]
    return ExplainerMaps(name, torch.cat(parts) if parts else torch.zeros(0, n), ms)


def explainer_choices() -> list[tuple[str, str]]:
    """``(label, name)`` of every explainer, for the views' pickers (after the methods')."""
    return [(cls.label, name) for name, cls in EXPLAINERS.items()]


def explainers_needed(chosen: Iterable[str]) -> tuple[str, ...]:
    """Every registered explainer when any name of ``chosen`` is one, else none: a view
    computes the explainers' maps only once a person picks one (they cost a forward and
    backward pass per phrase), and then all of them at once."""
    return tuple(EXPLAINERS) if any(n in EXPLAINERS for n in chosen) else ()


def explainer_names(spec: str) -> tuple[str, ...]:
    """A comma list of explainer names (``"all"``: every registered one, ``""``: none),
    checked against the registry."""
    if spec.strip() == "all":
        return tuple(EXPLAINERS)
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = sorted(set(names) - set(EXPLAINERS))
    if unknown:
        raise ValueError(f"unknown explainers {unknown}; known: {', '.join(EXPLAINERS)}")
    return names


def unavailable(backbone: Backbone, name: str) -> str | None:
    """``"<label>: not available for <family> towers"`` (or the explainer's reason at a
    non-native input size) when the explainer ``name`` cannot read the backbone's image
    tower (:meth:`~otviz.explainers.base.PhraseExplainer.check`), else ``None``."""
    try:
        get_explainer(name, backbone.model, backbone.image_tower).check()
    except ExplainerUnsupportedError as e:
        if backbone.image_tower.side is not None:
            return str(e)
        return (f"{EXPLAINERS[name].label}: not available for "
                f"{backbone.image_tower.family} towers")
    return None
