import torch

from otviz.patch_grid.boxes import heatmap_boxes
from otviz.patch_grid.tokens import TokenGeometry


def test_box_is_envelope_of_patches_above_threshold():
    heat = torch.zeros(2, 5, 6)
    heat[0, 1, 2] = 1.0
    heat[0, 3, 4] = 0.6  # above half the peak: inside the envelope
    heat[0, 4, 0] = 0.4  # below: outside
    heat[1] = 0.0  # no mass at all: whole grid
    boxes = heatmap_boxes(heat.reshape(2, -1), TokenGeometry.cell_centred((5, 6), (6, 5)),
                          threshold=0.5)
    assert boxes[0].tolist() == [2, 1, 5, 4]
    assert boxes[1].tolist() == [0, 0, 6, 5]


def test_threshold_one_keeps_only_the_peak():
    torch.manual_seed(0)
    heat = torch.rand(3, 7 * 7)
    boxes = heatmap_boxes(heat, TokenGeometry.cell_centred((7, 7), (7, 7)), threshold=1.0)
    boxes = boxes.long()
    peak = heat.argmax(1)
    assert torch.equal(boxes[:, 0], peak % 7) and torch.equal(boxes[:, 1], peak // 7)
    assert torch.all(boxes[:, 2] - boxes[:, 0] == 1) and torch.all(boxes[:, 3] - boxes[:, 1] == 1)


def test_box_is_the_envelope_of_cells_in_pixels():
    """On a 10 x 10 grid over an 80 x 40 picture each cell is 8 x 4 px."""
    heat = torch.zeros(1, 100)
    heat[0, 2 * 10 + 1] = 1.0  # row 2, col 1
    heat[0, 4 * 10 + 2] = 1.0  # row 4, col 2
    box = heatmap_boxes(heat, TokenGeometry.cell_centred((10, 10), (80, 40)))
    assert box.tolist() == [[8.0, 8.0, 24.0, 20.0]]


def test_boxes_with_one_geometry_per_row_equal_each_rows_own():
    """Rows on pictures of two sizes, interleaved: each row's box is the one its own
    geometry gives."""
    small = TokenGeometry.cell_centred((5, 6), (60, 50))
    large = TokenGeometry((5, 6), (240, 200), (40.0, 40.0), (2.0, 2.0))
    heat = torch.rand(5, 30, generator=torch.Generator().manual_seed(1))
    rows = [small, large, small, large, large]
    boxes = heatmap_boxes(heat, rows)
    expected = torch.cat([heatmap_boxes(heat[k : k + 1], g) for k, g in enumerate(rows)])
    assert torch.equal(boxes, expected)
