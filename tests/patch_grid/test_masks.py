"""Region masks cover what they claim: cells partition the grid, boxes are seeded filled
rectangles, segments partition the grid and follow colour edges."""

import pytest
import torch

from otviz.patch_grid.masks import (
    boxes_to_masks,
    cell_layout,
    grid_cells,
    random_boxes,
    segments,
    stack_regions,
)
from otviz.patch_grid.tokens import TokenGeometry


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


def test_segments_partition_and_follow_colour_edge():
    grid = (6, 6)
    image = torch.zeros(3, 24, 24)
    image[0, :, :12] = 1.0  # left half red, right half blue
    image[2, :, 12:] = 1.0
    image += 0.01 * torch.randn(3, 24, 24, generator=torch.Generator().manual_seed(0))
    desc = TokenGeometry.cell_centred(grid, (24, 24)).pool(image.double()).T
    assert desc.shape == (36, 3)
    segs = segments(desc, grid, n_segments=4, spatial_weight=0.1)
    assert torch.equal(segs.sum(0), torch.ones(36, dtype=torch.long))
    left = torch.zeros(6, 6, dtype=torch.bool)
    left[:, :3] = True
    left = left.reshape(-1)
    for s in segs:  # no segment straddles the colour edge
        assert bool((s & left).sum() == 0) or bool((s & ~left).sum() == 0)
    assert torch.equal(segments(desc, grid, 4, spatial_weight=0.1), segs)


def test_segments_compact_with_large_spatial_weight():
    grid = (8, 8)
    desc = torch.randn(64, 3, generator=torch.Generator().manual_seed(1))
    segs = segments(desc, grid, n_segments=4, spatial_weight=100.0)
    assert segs.shape[0] == 4  # colour noise is swamped: the 2x2 lattice cells come back
    assert torch.equal(segs.sum(0), torch.ones(64, dtype=torch.long))
    assert {int(s.sum()) for s in segs} == {16}


def test_stack_regions_pads_with_empty_rows():
    a = grid_cells((4, 4), 2, 2)
    b = grid_cells((4, 4), 1, 3)
    out = stack_regions([a, b])
    assert out.shape == (2, 4, 16)
    assert torch.equal(out[0], a) and torch.equal(out[1, :3], b)
    assert not bool(out[1, 3].any())
