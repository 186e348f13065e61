"""Region masks cover what they claim: cells partition the grid, boxes are seeded filled
rectangles in the paper's count range, superpixels become token masks through the token
geometry (where each token looks, not an even split of the picture) and follow colour edges."""

import numpy as np
import pytest
import torch

from otviz.errors import UserInputError
from otviz.patch_grid.masks import (
    PAPER_BOX_COUNTS,
    boxes_to_masks,
    cell_layout,
    grid_cells,
    paper_boxes,
    random_boxes,
    segment_token_masks,
    stack_regions,
    superpixels,
)
from otviz.patch_grid.tokens import TokenGeometry

#: A stem-like geometry: 6x6 tokens on a 48 px frame, centred 3.5 px up-left of the cells.
STEM = TokenGeometry((6, 6), (48, 48), (8.0, 8.0), (0.5, 0.5))


def _bounding_box(mask: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Filled bounding box of a mask, as a mask (reference built with plain loops)."""
    h, w = grid
    m = mask.reshape(h, w)
    ys = [y for y in range(h) if m[y].any()]
    xs = [x for x in range(w) if m[:, x].any()]
    out = torch.zeros(h, w, dtype=torch.bool)
    out[min(ys) : max(ys) + 1, min(xs) : max(xs) + 1] = True
    return out.reshape(-1)


@pytest.mark.parametrize("grid,rows,cols", [((7, 7), 3, 3), ((4, 6), 2, 5), ((5, 3), 5, 1)])
def test_grid_cells_partition_the_grid(grid, rows, cols):
    cells = grid_cells(grid, rows, cols)
    assert cells.shape == (rows * cols, grid[0] * grid[1])
    assert torch.equal(cells.sum(0), torch.ones(grid[0] * grid[1], dtype=torch.long))
    assert bool(cells.any(1).all())  # no empty cell
    for c in cells:  # every cell is a filled rectangle
        assert torch.equal(c, _bounding_box(c, grid))
    # cell sizes differ by at most one row / column of patches
    h_sizes = {int(c.reshape(grid).any(1).sum()) for c in cells}
    assert max(h_sizes) - min(h_sizes) <= 1


def test_grid_cells_rejects_too_many_cells():
    with pytest.raises(ValueError):
        grid_cells((3, 3), 4, 1)


def test_cell_layout_respects_budget():
    for grid in [(7, 7), (4, 10), (14, 14), (2, 2)]:
        for budget in [1, 4, 9, 12]:
            r, c = cell_layout(grid, budget)
            assert 1 <= r * c <= max(budget, 1) and r <= grid[0] and c <= grid[1]
    assert cell_layout((7, 7), 9) == (3, 3)


def test_random_boxes_deterministic_and_rectangular():
    grid = (6, 8)
    a = random_boxes(grid, 10, seed=3)
    b = random_boxes(grid, 10, seed=3)
    c = random_boxes(grid, 10, seed=4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.shape == (10, 48)
    for m in a:
        assert bool(m.any())
        assert torch.equal(m, _bounding_box(m, grid))


def test_random_boxes_batch_and_size_range():
    grid = (5, 5)
    masks = random_boxes(grid, 50, seed=0, batch_size=4, min_size=2)
    assert masks.shape == (4, 50, 25)
    assert not torch.equal(masks[0], masks[1])
    sides = masks.reshape(4, 50, 5, 5)
    heights = sides.any(3).sum(2)
    widths = sides.any(2).sum(2)
    # a clipped box keeps at least ceil(size / 2) >= 1 rows; unclipped sizes reach H
    assert int(heights.min()) >= 1 and int(heights.max()) == 5
    assert int(widths.max()) == 5
    with pytest.raises(ValueError):
        random_boxes(grid, 3, seed=0, min_size=6)


def test_boxes_to_masks_matches_loop():
    grid = (4, 5)
    boxes = torch.tensor([[0, 0, 4, 5], [1, 2, 3, 4], [3, 4, 4, 5]])
    masks = boxes_to_masks(boxes, grid)
    for box, m in zip(boxes.tolist(), masks, strict=True):
        y0, x0, y1, x1 = box
        ref = [y0 <= y < y1 and x0 <= x < x1 for y in range(4) for x in range(5)]
        assert m.tolist() == ref


def _token_of_pixels(geometry: TokenGeometry, width: int, height: int) -> np.ndarray:
    """``[height, width]`` token whose centre is nearest each pixel centre (plain loops
    over the geometry's centres: the reference for which pixels a token owns)."""
    centres = geometry.centres().numpy()
    out = np.zeros((height, width), dtype=np.int64)
    for y in range(height):
        for x in range(width):
            d = np.abs(centres - [x + 0.5, y + 0.5])
            # nearest along each axis separately: the cells are a product of intervals
            col = int(np.argmin(d[: geometry.grid[1], 0]))
            row = int(np.argmin(d[:: geometry.grid[1], 1]))
            out[y, x] = row * geometry.grid[1] + col
    return out


def test_segment_token_masks_follow_the_token_geometry():
    """A pixel segment's token mask: tokens whose cell (on the stem's off-centre lattice) it
    covers more than half of, or most of (the two cover every cell); checked against counts
    by plain loops."""
    height = width = 48
    seg = np.zeros((2, height, width), dtype=bool)
    seg[0, :, :22] = True  # left 22 px: the stem's cells end at 4.5, 12.5, 20.5, 28.5, ...
    seg[1] = ~seg[0]
    got = segment_token_masks(torch.from_numpy(seg), STEM)
    owner = _token_of_pixels(STEM, width, height)
    for s in range(2):
        for n in range(STEM.n):
            cell = owner == n
            share = seg[s][cell].mean()
            other = seg[1 - s][cell].mean()
            assert bool(got[s, n]) == (share > 0.5 or share > other)
    assert torch.equal(got.sum(0), torch.ones(STEM.n, dtype=torch.long))  # still a partition
    # the stem's third column spans x in [12.5, 20.5): wholly left; an even split (cells
    # [16, 24)) would cut it at 22 and put the third column's boundary elsewhere
    assert bool(got[0].reshape(6, 6)[:, 2].all()) and not bool(got[0].reshape(6, 6)[:, 3].any())


def test_superpixels_partition_tokens_and_follow_colour_edges():
    rng = np.random.default_rng(0)
    image = np.zeros((48, 48, 3), dtype=np.uint8)
    image[:, :20] = (220, 30, 30)  # red left, blue right; the edge at x = 20.5 is a cell edge
    image[:, 20:] = (30, 30, 220)
    image = np.clip(image + rng.integers(-5, 6, image.shape), 0, 255).astype(np.uint8)
    regions = superpixels(image, STEM, n_segments=4)
    assert regions.shape[1] == STEM.n and regions.shape[0] >= 2
    assert torch.equal(regions.sum(0), torch.ones(STEM.n, dtype=torch.long))
    red = torch.zeros(6, 6, dtype=torch.bool)
    red[:, :3] = True  # the tokens whose cells lie left of x = 20.5
    red = red.reshape(-1)
    for r in regions:  # no region straddles the colour edge
        assert not bool((r & red).any()) or not bool((r & ~red).any())
    assert torch.equal(superpixels(image, STEM, n_segments=4), regions)  # deterministic


@pytest.mark.parametrize("m", [PAPER_BOX_COUNTS[0], 10, PAPER_BOX_COUNTS[1]])
def test_paper_boxes_draw_m_seeded_boxes_in_the_papers_range(m):
    assert PAPER_BOX_COUNTS == (5, 15)  # PowerCLIP Table 7: M = 5, 10, 15
    got = paper_boxes((6, 7), m, seed=4)
    assert torch.equal(got, random_boxes((6, 7), m, seed=4))
    assert got.shape == (m, 42) and bool(got.any(1).all())


@pytest.mark.parametrize("m", [1, 4, 16, 64])
def test_paper_boxes_refuse_counts_outside_the_papers_range(m):
    with pytest.raises(UserInputError, match="n_regions"):
        paper_boxes((6, 7), m, seed=0)


def test_stack_regions_pads_with_empty_rows():
    a = grid_cells((4, 4), 2, 2)
    b = grid_cells((4, 4), 1, 3)
    out = stack_regions([a, b])
    assert out.shape == (2, 4, 16)
    assert torch.equal(out[0], a) and torch.equal(out[1, :3], b)
    assert not bool(out[1, 3].any())
