"""Heat is drawn where its tokens look: the panels, matplotlib figures and region drawings
read the token geometry (:class:`otviz.patch_grid.tokens.TokenGeometry`), not an even split of
the picture."""

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.heatmaps import draw_heatmap
from otviz.viz.panels import TITLE_PX, compose_heatmaps, heat_fields
from otviz.viz.regions import mask_centre, mask_outline, region_layer

#: otviz's convolutional stem at 8-px stride on an 80-px input: token (i, j) looks at
#: (8 j + 0.5, 8 i + 0.5), 3.5 px up-left of its cell's centre.
STEM = TokenGeometry((10, 10), (80, 80), (8.0, 8.0), (0.5, 0.5))


def _heat_pixels(raster: np.ndarray) -> np.ndarray:
    """How much colour a panel shows per pixel over a black backdrop (its heat level)."""
    return raster.astype(float).sum(-1)


@pytest.mark.parametrize(("i", "j"), [(3, 4), (6, 2)])
def test_one_hot_token_peaks_at_the_pixel_the_geometry_says(i, j):
    """A one-hot token map on the stem's geometry, drawn by compose_heatmaps on a black
    80-px image at 80-px panels, is brightest at the token's centre (8 j + 0.5, 8 i + 0.5):
    pixel (8 j, 8 i), not the cell centre (8 j + 4, 8 i + 4) an even stretch peaks at."""
    heat = np.zeros((10, 10))
    heat[i, j] = 1.0
    black = np.zeros((80, 80, 3), np.uint8)
    out = compose_heatmaps(black, [heat], ["t"], geometry=STEM, panel_px=80)
    level = _heat_pixels(out[TITLE_PX : TITLE_PX + 80, :80])
    y, x = np.unravel_index(np.argmax(level), level.shape)
    assert (x, y) == (8 * j, 8 * i)
    # the naive cell-centred drawing of the same map peaks 3.5-4 px down-right
    naive = compose_heatmaps(black, [heat], ["t"],
                             geometry=TokenGeometry.cell_centred((10, 10), (80, 80)),
                             panel_px=80)
    level = _heat_pixels(naive[TITLE_PX : TITLE_PX + 80, :80])
    ny, nx = np.unravel_index(np.argmax(level), level.shape)
    assert nx - x >= 3 and ny - y >= 3


def test_cell_centred_geometry_reproduces_the_even_bilinear_stretch():
    """Where the old drawing was right (tokens centred on an even split, a ViT), the field
    is PIL's bilinear resize of the grid: both interpolate linearly between the cell centres
    and hold the outermost value beyond them (float32 rounding apart)."""
    rng = np.random.default_rng(0)
    heat = rng.random((3, 4))
    field = heat_fields(TokenGeometry.cell_centred((3, 4), (80, 60)), [heat], 80, 60)[0]
    stretched = np.asarray(Image.fromarray(heat.astype(np.float32), mode="F").resize(
        (80, 60), Image.Resampling.BILINEAR))
    np.testing.assert_allclose(field, stretched, atol=1e-5)


def test_field_is_zero_where_no_token_looks():
    """On a picture the preprocessing cropped (a 160 x 80 upload, shortest side to 80, centre
    crop), the left and right 40 px are seen by no token and carry no heat."""
    geometry = STEM.on_image(160, 80, {"resize_mode": "shortest"})
    field = heat_fields(geometry, [np.ones((10, 10))], 160, 80)[0]
    assert np.all(field[:, :40] == 0) and np.all(field[:, 120:] == 0)
    assert np.all(field[:, 40:120] == 1)


def test_matplotlib_heat_raster_is_the_geometry_field():
    heat = np.zeros((10, 10))
    heat[2, 5] = 1.0
    ax = Figure().subplots()
    mappable = draw_heatmap(ax, np.zeros((80, 80, 3), np.uint8), heat, STEM)
    raster = np.asarray(mappable.get_array())
    np.testing.assert_array_equal(raster, heat_fields(STEM, [heat], 80, 80)[0])
    assert np.unravel_index(np.argmax(raster), raster.shape) == (16, 40)


def test_regions_are_the_tokens_cells():
    """A region of tokens (i, j) in rows 1-2, column 3 fills exactly their cells: x in
    [20.5, 28.5), y in [4.5, 20.5) on the stem; its id sits at the mean of the centres."""
    mask = np.zeros(100, bool)
    mask[[13, 23]] = True
    layer = region_layer(mask, STEM, (1, 0, 0), 0.5)
    ys, xs = np.nonzero(layer[..., 3])
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (20, 27, 4, 19)  # pixel centres inside
    segments = mask_outline(mask, STEM)
    xs = sorted({p[0] for s in segments for p in s})
    ys = sorted({p[1] for s in segments for p in s})
    assert xs == [20.5, 28.5] and ys == [4.5, 12.5, 20.5]
    assert mask_centre(mask, STEM) == pytest.approx((24.5, 12.5))
    assert torch.equal(torch.from_numpy(layer[..., 3] > 0), STEM.pixel_masks(
        torch.from_numpy(mask)))
