"""Region masks on an ``(H, W)`` patch grid: bool ``[R, N]`` with ``N = H * W`` (row-major).

Three generators, all deterministic given their inputs (and seed):

* :func:`random_boxes` -- PowerCLIP Sec. 3.2: boxes with uniformly sampled centres, heights
  and widths (PowerCLIP-R);
* :func:`grid_cells` -- a regular partition of the grid into ``rows x cols`` cells (the
  documented default when a batch carries no regions);
* :func:`segments` -- a SLIC-like superpixel segmentation: k-means on per-patch descriptors
  (mean colours or patch features) concatenated with scaled patch coordinates, started from
  a regular lattice of centres; a stand-in for PowerCLIP-S's SAM masks, which need weights
  we cannot ship. Unlike SLIC, segments are not forced to be connected.

:func:`stack_regions` pads per-image masks of different counts to ``[B, R_max, N]`` (all-False
rows are empty regions, which the methods treat as absent).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _grid_coords(grid: tuple[int, int], device: torch.device | None = None) -> Tensor:
    """``[N, 2]`` integer ``(y, x)`` coordinates of the patches, row-major."""
    h, w = grid
    ys, xs = torch.meshgrid(
        torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
    )
    return torch.stack([ys.reshape(-1), xs.reshape(-1)], dim=1)


def boxes_to_masks(boxes: Tensor, grid: tuple[int, int]) -> Tensor:
    """Half-open patch boxes ``[..., 4]`` as ``(y0, x0, y1, x1)`` to masks ``[..., N]``."""
    yx = _grid_coords(grid, boxes.device)
    y, x = yx[:, 0], yx[:, 1]
    b = boxes.unsqueeze(-2)  # [..., 1, 4]
    return (y >= b[..., 0]) & (y < b[..., 2]) & (x >= b[..., 1]) & (x < b[..., 3])


def random_boxes(
    grid: tuple[int, int],
    n_boxes: int,
    seed: int,
    batch_size: int | None = None,
    min_size: int = 1,
) -> Tensor:
    """Random box masks (PowerCLIP Sec. 3.2): centre patch uniform over the grid, height
    uniform in ``[min_size, H]`` and width uniform in ``[min_size, W]`` (integers), the box
    centred on the centre patch and clipped to the grid, so it is never empty.

    Args:
        grid: patch grid ``(H, W)``.
        n_boxes: boxes per image.
        seed: seed of a private generator (same seed, same boxes).
        batch_size: if given, ``batch_size`` independent sets are drawn.
        min_size: smallest side length in patches.

    Returns:
        bool ``[n_boxes, N]``, or ``[batch_size, n_boxes, N]`` with ``batch_size``.
    """
    h, w = grid
    if not 1 <= min_size <= min(h, w):
        raise ValueError(f"min_size must be in [1, {min(h, w)}], got {min_size}")
    gen = torch.Generator().manual_seed(seed)
    shape = (batch_size or 1, n_boxes)
    cy = torch.randint(0, h, shape, generator=gen)
    cx = torch.randint(0, w, shape, generator=gen)
    bh = torch.randint(min_size, h + 1, shape, generator=gen)
    bw = torch.randint(min_size, w + 1, shape, generator=gen)
    y0 = (cy - bh // 2).clamp_min(0)
    x0 = (cx - bw // 2).clamp_min(0)
    y1 = (cy - bh // 2 + bh).clamp(max=h)
    x1 = (cx - bw // 2 + bw).clamp(max=w)
    masks = boxes_to_masks(torch.stack([y0, x0, y1, x1], dim=-1), grid)
    return masks if batch_size is not None else masks[0]


def grid_cells(grid: tuple[int, int], rows: int, cols: int) -> Tensor:
    """Partition of the grid into ``rows x cols`` near-equal cells, bool ``[rows*cols, N]``.

    Patch ``(y, x)`` belongs to cell ``(floor(y*rows/H), floor(x*cols/W))``; every cell is
    non-empty when ``rows <= H`` and ``cols <= W``.
    """
    h, w = grid
    if not (1 <= rows <= h and 1 <= cols <= w):
        raise ValueError(f"need 1 <= rows <= {h} and 1 <= cols <= {w}, got {rows}x{cols}")
    yx = _grid_coords(grid)
    cell = (yx[:, 0] * rows // h) * cols + yx[:, 1] * cols // w
    return cell[None, :] == torch.arange(rows * cols)[:, None]


def cell_layout(grid: tuple[int, int], max_cells: int) -> tuple[int, int]:
    """``(rows, cols)`` with ``rows * cols <= max_cells``, following the grid's aspect ratio."""
    h, w = grid
    rows = max(1, min(h, round(math.sqrt(max_cells * h / w))))
    cols = max(1, min(w, max_cells // rows))
    return rows, cols


def segments(
    descriptors: Tensor,
    grid: tuple[int, int],
    n_segments: int,
    spatial_weight: float = 1.0,
    n_iters: int = 10,
) -> Tensor:
    """SLIC-like segments of one image: k-means over ``[descriptor, spatial_weight * (y, x)]``.

    Descriptors are standardised per channel; coordinates are divided by the lattice step
    ``sqrt(N / n_segments)`` so ``spatial_weight`` trades compactness against colour
    fidelity as SLIC's ``m`` does. Centres start on a regular lattice (no randomness), so
    the result is deterministic.

    Args:
        descriptors: ``[N, C]`` per-patch descriptors (e.g. mean RGB, patch features).
        grid: patch grid ``(H, W)``.
        n_segments: wanted number of segments (an upper bound: empty clusters are dropped).
        spatial_weight: weight of the spatial coordinates.
        n_iters: Lloyd iterations.

    Returns:
        bool ``[R, N]`` partition of the grid with ``R <= n_segments`` non-empty segments.
    """
    h, w = grid
    n = h * w
    if descriptors.shape[0] != n:
        raise ValueError(f"descriptors have {descriptors.shape[0]} rows, grid has {n} patches")
    x = descriptors.to(torch.float64)
    x = (x - x.mean(0)) / x.std(0, unbiased=False).clamp_min(1e-12)
    step = math.sqrt(n / n_segments)
    pos = _grid_coords(grid).to(torch.float64) * (spatial_weight / step)
    feats = torch.cat([x, pos], dim=1)
    rows, cols = cell_layout(grid, n_segments)
    start = grid_cells(grid, rows, cols).to(torch.float64)
    centres = start @ feats / start.sum(1, keepdim=True)
    for _ in range(n_iters):
        label = torch.cdist(feats, centres).argmin(1)
        onehot = torch.nn.functional.one_hot(label, centres.shape[0]).to(torch.float64).T
        count = onehot.sum(1, keepdim=True)
        centres = torch.where(count > 0, onehot @ feats / count.clamp_min(1), centres)
    label = torch.cdist(feats, centres).argmin(1)
    masks = label[None, :] == torch.arange(centres.shape[0])[:, None]
    return masks[masks.any(1)]


def stack_regions(masks: list[Tensor]) -> Tensor:
    """Pad per-image masks ``[R_b, N]`` with all-False rows into ``[B, max R_b, N]``."""
    r_max = max(m.shape[0] for m in masks)
    out = torch.zeros(len(masks), r_max, masks[0].shape[1], dtype=torch.bool)
    for i, m in enumerate(masks):
        out[i, : m.shape[0]] = m
    return out
