"""Very small, thin and large images in the views: the panels draw every shape the boundary
lets through (1x1, 20:1 strips both ways), Zero-shot's gallery and Browse's rows show images
back within what an encoder takes (WebP: at most 16383 px a side), and Train refuses a thin
image of a folder with its size before any training starts."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from otviz.boundary.images import MAX_ASPECT_RATIO
from otviz.explain import InputError
from otviz.patch_grid.tokens import TokenGeometry
from otviz.ui.inputs import MAX_IMAGE_SIDE, fit_image
from otviz.ui.train_policy import FOLDER, resolve_data
from otviz.ui.zeroshot_tab import load_images
from otviz.viz.panels import compose_heatmaps
from tests.helpers import train_request_of

#: The longest side WebP (the gallery's format) encodes.
WEBP_MAX_SIDE = 16383


def _noise(width: int, height: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("width, height", [(1, 1), (1024, 1024 // MAX_ASPECT_RATIO),
                                           (1024 // MAX_ASPECT_RATIO, 1024), (20, 1), (1, 20),
                                           (2000, 1)])
@pytest.mark.parametrize("shared_scale", [True, False])
def test_panels_draw_small_and_thin_images(width, height, shared_scale):
    """Every panel layout of a thin or one-pixel image is a raster holding the panels and
    the colour bar (a wide strip's row of panels is lower than the bar: the figure grows),
    encodable as WebP."""
    rng = np.random.default_rng(1)
    heats = [rng.random((10, 10)) for _ in range(5)]
    boxes = [(0.0, 0.0, width, height), None, (0.0, 0.0, 0.4, 0.4), None, None]
    geometry = TokenGeometry.cell_centred((10, 10), (width, height))
    out = compose_heatmaps(_noise(width, height), heats, [f"m{k}" for k in range(5)],
                           geometry=geometry, boxes=boxes, shared_scale=shared_scale, columns=4,
                           notes=[None, None, None, "not available", None])
    assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
    panel_w = round(168 * width / max(width, height)) or 1
    assert out.shape[1] >= 4 * panel_w and out.shape[0] >= 2 * 20  # two rows of titles
    if shared_scale:
        assert out.shape[0] >= 20 - 5 + 80 + 10  # the shortest bar, below the title line
    Image.fromarray(out).save(io.BytesIO(), "WEBP")


def test_the_zero_shot_gallery_gets_images_it_can_encode(tmp_path):
    """Uploads are fitted to the app's longest side, so the gallery can encode each one;
    an image within it is passed as it is; a thin one is refused with its size."""
    wide, small = tmp_path / "wide.png", tmp_path / "small.png"
    Image.fromarray(_noise(16400, 1000)).save(wide)  # 16.4 MP: under the pixel limit
    Image.fromarray(_noise(30, 20)).save(small)
    images = load_images([str(wide), str(small)])
    assert images[0].shape == (62, MAX_IMAGE_SIDE, 3)  # 1000 * 1024 / 16400 = 62.4
    np.testing.assert_array_equal(images[1], _noise(30, 20))
    for image in images:
        assert max(image.shape[:2]) <= min(MAX_IMAGE_SIDE, WEBP_MAX_SIDE)
        Image.fromarray(image).save(io.BytesIO(), "WEBP")
    thin = tmp_path / "thin.png"
    Image.fromarray(_noise(16384, 2)).save(thin)
    with pytest.raises(InputError) as refused:
        load_images([str(thin)])
    assert str(refused.value) == (
        "thin.png is too thin (16384x2 pixels; the longer side may be at most 20 times the "
        "shorter): crop it and upload it again")


def test_a_shown_image_is_fitted():
    fitted, note = fit_image(_noise(16400, 1000))
    assert fitted.shape == (62, 1024, 3)
    assert note == "the image was scaled down from 16400x1000 to 1024x62 pixels"
    with pytest.raises(InputError, match=r"the image is too thin \(1x21 pixels"):
        fit_image(_noise(1, 21))


def test_train_refuses_a_thin_image_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("OTVIZ_DATA_ROOT", str(tmp_path))
    folder = tmp_path / "pairs"
    folder.mkdir()
    rows = ["path,caption"]
    for k in range(4):
        Image.fromarray(_noise(8, 8, k)).save(folder / f"{k}.png")
        rows.append(f"{k}.png,a red circle")
    Image.fromarray(_noise(1, 400)).save(folder / "strip.png")
    rows.append("strip.png,a blue star")
    (folder / "captions.csv").write_text("\n".join(rows) + "\n")
    request = train_request_of(["filip"], source=FOLDER, folder="pairs", batch_size=4,
                               hard_negatives=2)
    with pytest.raises(InputError) as refused:
        resolve_data(request, tmp_path / "run")
    assert str(refused.value) == (
        "cannot train on this data: strip.png is too thin (1x400 pixels; the longer side may "
        "be at most 20 times the shorter): crop it and upload it again")
