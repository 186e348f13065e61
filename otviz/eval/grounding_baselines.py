"""Phrase heatmaps that know nothing of the model: the baselines any grounding method must
beat on the world's pointing game (ConceptOT Sec. 2.6 protocol).

* :func:`colour_oracle_heatmaps`: the share of each patch's pixels whose colour is the
  phrase's colour word in the world's palette (``COLOUR_RGB``), within a tolerance: a
  detector of colour alone, which cannot tell two objects of one colour apart;
* :func:`centre_prior_heatmaps`: a Gaussian bump on the image centre.

A uniform map needs no function here: it is flat, and the pointing game's tie rule
(:func:`~otviz.eval.grounding_metrics.expected_hits`) scores it the chance that a token drawn
uniformly looks inside the gold box.

Heatmaps are ``[n, N]`` over the ``(H, W)`` patch grid, row-major, like a method's
``Alignment.heatmap``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from otviz.patch_grid.boxes import Geometries, per_row
from otviz.world import COLOUR_RGB, Sample

#: L-infinity distance (0-255) within which a pixel counts as a palette colour: the world's
#: colour jitter (12) and grain (5) leave room for part of the antialiased edge.
COLOUR_TOLERANCE = 32


def colour_mask(image: np.ndarray, colour: str, tolerance: int = COLOUR_TOLERANCE) -> np.ndarray:
    """``[H, W]`` bool: pixels of ``image`` (uint8 ``[H, W, 3]``) within ``tolerance`` of the
    palette colour ``colour`` in every channel."""
    rgb = np.asarray(COLOUR_RGB[colour], dtype=np.int16)
    return (np.abs(image.astype(np.int16) - rgb).max(axis=2) <= tolerance)


def colour_oracle_heatmaps(
    images: Sequence[np.ndarray], colours: Sequence[str], geometry: Geometries,
    tolerance: int = COLOUR_TOLERANCE,
) -> Tensor:
    """``[n, N]``: per token, the share of the pixels of its cell (the token geometry's,
    :meth:`~otviz.patch_grid.tokens.TokenGeometry.pool`) matching ``colours[i]`` in
    ``images[i]``."""
    rows = per_row(geometry, len(images))
    return torch.stack([
        g.pool(torch.from_numpy(colour_mask(im, c, tolerance)).double())
        for im, c, g in zip(images, colours, rows, strict=True)
    ]) if rows else torch.zeros(0, 0, dtype=torch.float64)


def centre_prior_heatmaps(n: int, geometry: Geometries) -> Tensor:
    """``[n, N]``: ``exp(-d^2 / (2 s^2))`` of the distance ``d`` from where each token looks
    to the picture's centre, ``s`` a quarter of its shorter side."""
    rows = per_row(geometry, n)
    maps = []
    for g in rows:
        width, height = g.size
        centres = g.centres()
        d2 = (centres[:, 0] - width / 2) ** 2 + (centres[:, 1] - height / 2) ** 2
        s = min(width, height) / 4
        maps.append(torch.exp(-d2 / (2 * s * s)))
    return torch.stack(maps) if maps else torch.zeros(0, 0, dtype=torch.float64)


def colour_shared(sample: Sample, object_index: int) -> bool:
    """Whether another object of the scene (distractors included) has the colour of object
    ``object_index``: colour alone cannot point to it."""
    colour = sample.objects[object_index].colour
    return any(o.colour == colour for k, o in enumerate(sample.objects) if k != object_index)
