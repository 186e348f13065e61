"""Region masks on an ``(H, W)`` patch grid: bool ``[R, N]`` with ``N = H * W`` (row-major).

Three generators, all deterministic given their inputs (and seed):

* :func:`random_boxes` -- PowerCLIP Sec. 3.2: boxes with uniformly sampled centres, heights
  and widths (PowerCLIP-R);
* :func:`grid_cells` -- a regular partition of the grid into ``rows x cols`` cells (the
  documented default when a batch carries no regions);
* :func:`superpixels` -- scikit-image's SLIC superpixels of the picture, the offline
  segmentation step in place of PowerCLIP-S's SAM masks (:mod:`otviz.patch_grid.sam` loads
  SAM where a user has its weights); pixel segments become token masks only through the
  token geometry (:func:`segment_token_masks`).

:func:`stack_regions` pads per-image masks of different counts to ``[B, R_max, N]`` (all-False
rows are empty regions, which the methods treat as absent).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from skimage.segmentation import slic
from torch import Tensor

from otviz.errors import UserInputError
from otviz.patch_grid.tokens import TokenGeometry


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


#: PowerCLIP's numbers of random boxes per image, ``M`` (Sec. 4 and Table 7: 5, 10, 15).
PAPER_BOX_COUNTS = (5, 15)


def paper_boxes(grid: tuple[int, int], n_boxes: int, seed: int) -> Tensor:
    """:func:`random_boxes` with ``n_boxes`` in the paper's range :data:`PAPER_BOX_COUNTS`
    (PowerCLIP-R, Sec. 4, Table 7); another count is refused, naming ``n_regions``."""
    lo, hi = PAPER_BOX_COUNTS
    if not lo <= n_boxes <= hi:
        raise UserInputError(f"n_regions: PowerCLIP draws {lo} to {hi} random boxes per image "
                             f"(Table 7), got {n_boxes}")
    return random_boxes(grid, n_boxes, seed=seed)


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


def segment_token_masks(pixel_masks: Tensor, geometry: TokenGeometry) -> Tensor:
    """Pixel segments ``[S, height, width]`` (bool, on a raster of the geometry's frame) as
    token masks ``[R, N]`` through the token-geometry contract, from each segment's share of
    each token's cell (:meth:`TokenGeometry.pool` of its indicator): a token belongs to every
    segment covering more than half of its cell, and, where the segments together cover more
    than half of it, to the one covering most. A partition of the picture (superpixels) thus
    becomes a partition of the tokens; overlapping masks (SAM) stay overlapping, and a token
    they barely touch belongs to none. Segments that own no token are dropped."""
    share = geometry.pool(pixel_masks.to(torch.float64))  # [S, N]
    largest = share.argmax(0)
    covered = share.sum(0) > 0.5
    member = (share > 0.5) | (
        covered[None, :] & (largest[None, :] == torch.arange(share.shape[0])[:, None]))
    return member[member.any(1)]


def superpixels(
    image: np.ndarray, geometry: TokenGeometry, n_segments: int, compactness: float = 10.0
) -> Tensor:
    """SLIC superpixels of the picture (Achanta et al. 2012, ``skimage.segmentation.slic``)
    as token masks (:func:`segment_token_masks`): the offline segmentation step PowerCLIP
    Sec. 3.2 allows in place of random boxes (the paper uses SAM, Table 7).

    Args:
        image: ``[height, width, 3]`` picture (uint8 or float) the ``geometry`` is on.
        geometry: where each token looks on ``image``.
        n_segments: wanted number of superpixels (SLIC's approximate count).
        compactness: SLIC's colour-space / space trade-off (higher: squarer segments).

    Returns:
        bool ``[R, N]`` partition of the tokens into ``R`` non-empty regions.
    """
    labels = slic(image, n_segments=n_segments, compactness=compactness, start_label=0,
                  channel_axis=-1)
    labels = torch.from_numpy(labels.astype(np.int64))
    onehot = labels[None] == torch.arange(int(labels.max()) + 1)[:, None, None]
    return segment_token_masks(onehot, geometry)


def stack_regions(masks: list[Tensor]) -> Tensor:
    """Pad per-image masks ``[R_b, N]`` with all-False rows into ``[B, max R_b, N]``."""
    r_max = max(m.shape[0] for m in masks)
    out = torch.zeros(len(masks), r_max, masks[0].shape[1], dtype=torch.bool)
    for i, m in enumerate(masks):
        out[i, : m.shape[0]] = m
    return out
