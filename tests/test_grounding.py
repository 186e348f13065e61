import torch

from otviz.grounding import heatmap_boxes, patch_box_to_pixels


def test_box_is_envelope_of_patches_above_threshold():
    heat = torch.zeros(2, 5, 6)
    heat[0, 1, 2] = 1.0
    heat[0, 3, 4] = 0.6  # above half the peak: inside the envelope
    heat[0, 4, 0] = 0.4  # below: outside
    heat[1] = 0.0  # no mass at all: whole grid
    boxes = heatmap_boxes(heat.reshape(2, -1), (5, 6), threshold=0.5)
    assert boxes[0].tolist() == [2, 1, 5, 4]
    assert boxes[1].tolist() == [0, 0, 6, 5]


def test_threshold_one_keeps_only_the_peak():
    torch.manual_seed(0)
    heat = torch.rand(3, 7 * 7)
    boxes = heatmap_boxes(heat, (7, 7), threshold=1.0)
    peak = heat.argmax(1)
    assert torch.equal(boxes[:, 0], peak % 7) and torch.equal(boxes[:, 1], peak // 7)
    assert torch.all(boxes[:, 2] - boxes[:, 0] == 1) and torch.all(boxes[:, 3] - boxes[:, 1] == 1)


def test_patch_box_scales_to_pixels():
    box = torch.tensor([1, 2, 3, 5])
    assert patch_box_to_pixels(box, (10, 10), (80, 40)).tolist() == [8.0, 8.0, 24.0, 20.0]
