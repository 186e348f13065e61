"""The prompt templates the dense-CLIP papers fill with a class name, and the class embedding
they make of them.

:data:`IMAGENET_TEMPLATES`: the 80 templates of CLIP's ImageNet zero-shot ensemble (Radford
et al. 2021, the ``openai_imagenet_template`` list), as SCLIP reads them
(wangf3014/SCLIP, ``prompts/imagenet_template.py`` lines 169-250; reused by ClearCLIP and
NACLIP). :func:`ensembled` is how SCLIP's ``clip_segmentor.py`` lines 37-42 turn them into one
text embedding per class: each filled template encoded and normalised, their mean
normalised again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

#: CLIP's 80 ImageNet templates, in SCLIP's order.
IMAGENET_TEMPLATES = (
    "a bad photo of a {}.", "a photo of many {}.", "a sculpture of a {}.",
    "a photo of the hard to see {}.", "a low resolution photo of the {}.",
    "a rendering of a {}.", "graffiti of a {}.", "a bad photo of the {}.",
    "a cropped photo of the {}.", "a tattoo of a {}.", "the embroidered {}.",
    "a photo of a hard to see {}.", "a bright photo of a {}.", "a photo of a clean {}.",
    "a photo of a dirty {}.", "a dark photo of the {}.", "a drawing of a {}.",
    "a photo of my {}.", "the plastic {}.", "a photo of the cool {}.",
    "a close-up photo of a {}.", "a black and white photo of the {}.", "a painting of the {}.",
    "a painting of a {}.", "a pixelated photo of the {}.", "a sculpture of the {}.",
    "a bright photo of the {}.", "a cropped photo of a {}.", "a plastic {}.",
    "a photo of the dirty {}.", "a jpeg corrupted photo of a {}.", "a blurry photo of the {}.",
    "a photo of the {}.", "a good photo of the {}.", "a rendering of the {}.",
    "a {} in a video game.", "a photo of one {}.", "a doodle of a {}.",
    "a close-up photo of the {}.", "a photo of a {}.", "the origami {}.",
    "the {} in a video game.", "a sketch of a {}.", "a doodle of the {}.", "a origami {}.",
    "a low resolution photo of a {}.", "the toy {}.", "a rendition of the {}.",
    "a photo of the clean {}.", "a photo of a large {}.", "a rendition of a {}.",
    "a photo of a nice {}.", "a photo of a weird {}.", "a blurry photo of a {}.",
    "a cartoon {}.", "art of a {}.", "a sketch of the {}.", "a embroidered {}.",
    "a pixelated photo of a {}.", "itap of the {}.", "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.", "a plushie {}.", "a photo of the nice {}.",
    "a photo of the small {}.", "a photo of the weird {}.", "the cartoon {}.", "art of the {}.",
    "a drawing of the {}.", "a photo of the large {}.", "a black and white photo of a {}.",
    "the plushie {}.", "a dark photo of a {}.", "itap of a {}.", "graffiti of the {}.",
    "a toy {}.", "itap of my {}.", "a photo of a cool {}.", "a photo of a small {}.",
    "a tattoo of the {}.",
)
#: The one prompt otviz reads a class from without an ensemble (CLIP's "a photo of a {}.").
SINGLE_TEMPLATE = "a photo of a {}."
#: ``--templates`` -> the templates a class name fills.
TEMPLATE_SETS: dict[str, tuple[str, ...]] = {"single": (SINGLE_TEMPLATE,),
                                             "imagenet80": IMAGENET_TEMPLATES}


def ensembled(encode: Callable[[list[str]], Tensor], names: Sequence[str],
              templates: Sequence[str]) -> Tensor:
    """``[C, E]`` unit class embeddings of ``names`` (at least one): per name, ``encode``
    (texts -> ``[T, E]`` embeddings) of every template filled with it, each row normalised,
    their mean normalised (SCLIP's ``clip_segmentor.py`` lines 37-42). One ``encode`` call
    per name."""
    import torch  # here: the template lists are read by torch-free config code

    rows = []
    for name in names:
        unit = encode([t.format(name) for t in templates])
        unit = unit / unit.norm(dim=-1, keepdim=True)
        mean = unit.mean(dim=0)
        rows.append(mean / mean.norm())
    return torch.stack(rows)
