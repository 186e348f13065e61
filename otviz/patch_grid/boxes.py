"""Weak phrase grounding from a patch heatmap (ConceptOT Sec. 2.6): threshold the heatmap
and take the envelope of the kept tokens' cells as a pixel box. Where the cells lie is the
tower's token geometry (:class:`otviz.patch_grid.tokens.TokenGeometry`), one per heatmap row
or one for all."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from otviz.patch_grid.tokens import TokenGeometry

#: One geometry for every heatmap row, or one per row (pictures of different sizes).
Geometries = TokenGeometry | Sequence[TokenGeometry]


def per_row(geometry: Geometries, n: int) -> list[TokenGeometry]:
    """``n`` geometries: ``geometry`` repeated, or the sequence checked to hold ``n``."""
    if isinstance(geometry, TokenGeometry):
        return [geometry] * n
    rows = list(geometry)
    if len(rows) != n:
        raise ValueError(f"{n} heatmaps but {len(rows)} token geometries")
    return rows


def token_centres(geometry: Geometries, n: int) -> Tensor:
    """``[n, N, 2]`` float64 ``(x, y)`` centres of each row's tokens."""
    if isinstance(geometry, TokenGeometry):
        return geometry.centres()[None].expand(n, -1, -1)
    return torch.stack([g.centres() for g in per_row(geometry, n)])


def kept_tokens(heat: Tensor, threshold: float = 0.5) -> Tensor:
    """``[B, N]`` bool: the tokens whose heat is at least ``threshold * max`` of their row;
    negative values (a signed plan's) count as no heat, so an all-zero (or all-negative)
    row keeps every token."""
    maps = heat.detach().clamp_min(0.0)
    peak = maps.amax(dim=1, keepdim=True)
    return maps >= threshold * peak


def heatmap_boxes(heat: Tensor, geometry: Geometries, threshold: float = 0.5) -> Tensor:
    """``[B, 4]`` float64 pixel boxes ``(x0, y0, x1, y1)``, half-open: the envelope of the
    cells of the tokens :func:`kept_tokens` keeps (an all-zero heatmap: the whole window).

    Args:
        heat: ``[B, N]`` heatmaps over the token grid, row-major.
        geometry: the token geometry on the picture the boxes are drawn on (one, or one
            per row).
        threshold: fraction of each heatmap's maximum that a token must reach.
    """
    keep = kept_tokens(heat.reshape(heat.shape[0], -1), threshold).cpu()
    if isinstance(geometry, TokenGeometry):
        return geometry.envelope(keep)
    rows = per_row(geometry, keep.shape[0])
    boxes = torch.zeros(len(rows), 4, dtype=torch.float64)
    for g in dict.fromkeys(rows):  # one envelope call per distinct geometry (picture size)
        same = torch.tensor([r == g for r in rows])
        boxes[same] = g.envelope(keep[same])
    return boxes
