"""The token-geometry contract against closed forms and against open_clip's own
preprocessing (a marker pixel found where the mapping says it lands)."""

import numpy as np
import pytest
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from otviz.patch_grid.tokens import TokenGeometry, input_frame

#: otviz's convolutional stem at 8-px stride on an 80-px input: token (i, j) looks at
#: (8 j + 0.5, 8 i + 0.5), 3.5 px up-left of its cell's centre.
STEM = TokenGeometry((10, 10), (80, 80), (8.0, 8.0), (0.5, 0.5))


def test_cell_centred_centres_and_cells() -> None:
    g = TokenGeometry.cell_centred((2, 4), (32, 16))
    assert g.centres().tolist() == [[4, 4], [12, 4], [20, 4], [28, 4],
                                    [4, 12], [12, 12], [20, 12], [28, 12]]
    assert g.cells()[5].tolist() == [8, 8, 16, 16]


def test_cells_are_the_voronoi_cells_of_the_centres_and_tile_the_window() -> None:
    cells = STEM.cells()
    assert cells[0].tolist() == [0.0, 0.0, 4.5, 4.5]  # reaches the frame's edge
    assert cells[11].tolist() == [4.5, 4.5, 12.5, 12.5]  # midway between centres
    assert cells[99].tolist() == [68.5, 68.5, 80.0, 80.0]
    area = ((cells[:, 2] - cells[:, 0]) * (cells[:, 3] - cells[:, 1])).sum()
    assert float(area) == 80 * 80
    # every pixel is owned by the token nearest to it (cells are half-open: on a tie, the
    # later token)
    own = STEM.owner()
    px = torch.arange(80, dtype=torch.float64) + 0.5
    later = 1e-9 * torch.arange(10, dtype=torch.float64)
    nearest = ((px[:, None] - STEM.axis_centres(0)[None]).abs() - later).argmin(1)
    assert torch.equal(own[0], nearest) and torch.equal(own[:, 0], nearest * 10)


def test_upsample_peaks_where_the_token_looks_and_is_exact_on_linear_maps() -> None:
    heat = torch.zeros(100, dtype=torch.float64)
    heat[4 * 10 + 6] = 1.0
    field = STEM.upsample(heat)
    y, x = divmod(int(field.argmax()), 80)
    assert (x, y) == (48, 32)  # pixel 48 holds the point 48.5: 8 * 6 + 0.5
    # bilinear between centres reproduces a linear function of the token position
    cols = torch.arange(10, dtype=torch.float64).repeat(10)
    ramp = STEM.upsample(cols)
    inside = torch.arange(1, 72)  # pixels between the first and the last centre
    assert torch.allclose(ramp[5, inside], inside.double() / 8)  # (p + 0.5 - 0.5) / 8


def test_envelope_pool_and_paint() -> None:
    keep = torch.zeros(2, 100, dtype=torch.bool)
    keep[0, [11, 23]] = True
    assert STEM.envelope(keep).tolist() == [[4.5, 4.5, 28.5, 20.5], [0, 0, 80, 80]]
    pixels = torch.arange(80, dtype=torch.float64).expand(80, 80)  # value = column
    pooled = STEM.pool(pixels)
    assert pooled[0] == pytest.approx(1.5)  # pixel centres 0.5 .. 3.5 in [0, 4.5)
    assert pooled[1] == pytest.approx(7.5)  # pixel centres 4.5 .. 11.5 in [4.5, 12.5)
    painted = STEM.paint(torch.arange(100, dtype=torch.float64))
    assert torch.equal(painted, STEM.owner().double())


@pytest.mark.parametrize("mode", ["shortest", "longest", "squash"])
@pytest.mark.parametrize("size", [(120, 80), (80, 131), (64, 64)])
def test_input_frame_matches_open_clips_transform(mode: str, size: tuple[int, int]) -> None:
    """A white pixel at a known model-input position is found on the picture where
    input_frame puts it (the transform is run on the picture, the marker read back)."""
    width, height = size
    cfg = PreprocessCfg(size=(32, 32), resize_mode=mode, interpolation="bilinear",
                        mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    transform = image_transform_v2(cfg, is_train=False)
    (sx, sy), (ox, oy) = input_frame(size, (32, 32), {"resize_mode": mode})
    rng = np.random.default_rng(0)
    for _ in range(4):
        x_in, y_in = rng.uniform(8, 24, 2)
        x, y = x_in * sx + ox, y_in * sy + oy
        picture = np.zeros((height, width, 3), dtype=np.uint8)
        picture[int(y), int(x)] = 255
        blob = transform(Image.fromarray(picture))[0].numpy()
        ys, xs = np.nonzero(blob > 1e-3)
        weight = blob[ys, xs]
        found = (((xs + 0.5) * weight).sum() / weight.sum(),
                 ((ys + 0.5) * weight).sum() / weight.sum())
        cell = ((int(x) + 0.5 - ox) / sx, (int(y) + 0.5 - oy) / sy)
        assert found == pytest.approx(cell, abs=0.6)


def test_on_image_carries_the_geometry_through_a_centre_crop() -> None:
    # 240 x 160 -> shorter side to 80 (scale 1/2) -> 120 x 80, centre crop from x = 20
    g = STEM.on_image(240, 160, {"resize_mode": "shortest"})
    assert g.stride == pytest.approx((16.0, 16.0))
    assert g.origin == pytest.approx((2 * (20 + 0.5), 2 * 0.5))
    assert g.window == pytest.approx((40.0, 0.0, 200.0, 160.0))
    assert int(g.owner()[80, 20]) == -1  # left of the crop: no token sees it
    assert float(g.upsample(torch.ones(100))[80, 20]) == 0.0
