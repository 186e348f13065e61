"""The sliding window: mmsegmentation's window rule and keep-ratio resize against hand-worked
cases, windows' maps averaged where they overlap, one whole window equal to no window."""

from __future__ import annotations

import pytest
import torch

from otviz.errors import InputError
from otviz.eval.segmentation import token_maps
from otviz.eval.sliding_window import SlideWindow, Windows, image_windows, pasted_maps
from otviz.patch_grid.tokens import TokenGeometry


def test_windows_follow_mmseg_slide_inference() -> None:
    # 500 x 336, crop 224, stride 112: w_grids = (500-224+111)//112+1 = 4, h_grids = 2;
    # the last window flush with the edge
    slide = SlideWindow(336, 224, 112)
    assert slide.boxes(500, 336) == [
        (0, 0, 224, 224), (112, 0, 336, 224), (224, 0, 448, 224), (276, 0, 500, 224),
        (0, 112, 224, 336), (112, 112, 336, 336), (224, 112, 448, 336), (276, 112, 500, 336)]
    assert slide.boxes(100, 80) == [(0, 0, 100, 80)]  # smaller than a crop: one window
    assert slide.scaled_size(500, 375) == (448, 336)  # shorter side to 336
    assert slide.scaled_size(4000, 500) == (2048, 256)  # longer side at most 2048
    assert image_windows((50, 40), None) == Windows((50, 40), [(0, 0, 50, 40)])


@pytest.mark.parametrize("text", ["336:224", "a:b:c", "336:224:0", "336:100:200"])
def test_bad_slide_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(InputError, match="--slide"):
        SlideWindow.parse(text)
    assert SlideWindow.parse("") is None
    assert SlideWindow.parse("336:224:112") == SlideWindow(336, 224, 112)


def test_overlapping_windows_average_and_one_window_is_none() -> None:
    geometry = TokenGeometry.cell_centred((2, 2), (8, 8))
    maps = torch.tensor([[1.0] * 4, [3.0] * 4, [0.0, 1.0, 2.0, 3.0]], dtype=torch.float64)
    own = [Windows((12, 8), [(0, 0, 8, 8), (4, 0, 12, 8)])]
    pasted = pasted_maps(maps, geometry, own, [[[0], [1]]], [(8, 12)])(0, None)
    assert pasted.shape == (1, 8, 12)
    assert torch.allclose(pasted[0, :, :4], torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(pasted[0, :, 4:8], torch.tensor(2.0, dtype=torch.float64))  # (1 + 3) / 2
    assert torch.allclose(pasted[0, :, 8:], torch.tensor(3.0, dtype=torch.float64))
    # one window over the whole image at its own size: the plain drawing, exactly
    whole = pasted_maps(maps, geometry, [Windows((8, 8), [(0, 0, 8, 8)])], [[[2, -1]]],
                        [(8, 8)])(0, None)

    class Image:
        rows = [2, -1]
        gold = torch.zeros(8, 8)

    plain = token_maps(maps, geometry)(0, Image())
    assert torch.allclose(whole, plain) and torch.all(whole[1] == 0)
