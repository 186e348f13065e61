"""Weak phrase grounding from a patch heatmap (ConceptOT Sec. 2.6): threshold the heatmap
and take the enclosing patch envelope as a box."""

from __future__ import annotations

import torch
from torch import Tensor


def heatmap_boxes(heat: Tensor, grid: tuple[int, int], threshold: float = 0.5) -> Tensor:
    """Enclosing box of the patches whose heat is at least ``threshold * max``.

    Args:
        heat: ``[B, N]`` heatmaps over an ``(H, W)`` patch grid, ``N = H * W``; negative
            values (a signed plan's) count as no heat.
        grid: the patch grid ``(H, W)``.
        threshold: fraction of each heatmap's maximum that a patch must reach.

    Returns:
        ``[B, 4]`` boxes ``(x0, y0, x1, y1)`` in patch units, half-open (``x1 - x0`` patches
        wide). An all-zero (or all-negative) heatmap gives the whole grid.
    """
    h, w = grid
    maps = heat.reshape(heat.shape[0], h, w).clamp_min(0.0)
    peak = maps.flatten(1).amax(dim=1)
    keep = maps >= threshold * peak[:, None, None]
    rows, cols = keep.any(dim=2), keep.any(dim=1)
    ys = torch.arange(h, device=heat.device)
    xs = torch.arange(w, device=heat.device)
    big = max(h, w) + 1
    y0 = torch.where(rows, ys, big).amin(dim=1)
    y1 = torch.where(rows, ys, -1).amax(dim=1) + 1
    x0 = torch.where(cols, xs, big).amin(dim=1)
    x1 = torch.where(cols, xs, -1).amax(dim=1) + 1
    return torch.stack([x0, y0, x1, y1], dim=1)


def patch_box_to_pixels(box: Tensor, grid: tuple[int, int], image_size: tuple[int, int]) -> Tensor:
    """Scale ``[..., 4]`` patch-unit boxes to pixel boxes of an image of ``(width, height)``."""
    h, w = grid
    width, height = image_size
    scale = torch.tensor([width / w, height / h, width / w, height / h], dtype=torch.float64)
    return box.to(torch.float64) * scale


def patch_cells(grid: tuple[int, int], image_size: tuple[int, int]) -> Tensor:
    """``[N, 4]`` float64 pixel boxes of the patch cells of an ``(H, W)`` grid on an image of
    ``(width, height)``, row-major."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    return patch_box_to_pixels(torch.stack([cols, rows, cols + 1, rows + 1], dim=1), grid,
                               image_size)
