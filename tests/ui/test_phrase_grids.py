"""The phrase grids the Align view prefetches into the page (otviz.ui.phrase_grids): the
server's cache, the pair token, the JPEG round trip and the drawing worker. The browser
test ``test_a_phrase_pick_swaps_in_the_prefetched_grid`` checks the page's swap."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from otviz.methods import METHODS
from otviz.methods.base import MethodConfig, PairBatch
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import ALIGN_METHODS, flat_map_reasons
from otviz.ui.phrase_grids import (
    GRID_QUALITY,
    GridCache,
    IdleDrawer,
    data_url,
    decode_jpeg,
    draw_grids,
    encode_jpeg,
    pair_token,
    prefetch_payload,
)
from otviz.viz.panels import compose_heatmaps
from otviz.viz.phrase_grid import grid_layout


@pytest.fixture(scope="module")
def layouts() -> tuple[np.ndarray, list[dict], list[np.ndarray]]:
    """An image, two phrases' grid layouts and the rasters the view draws of them."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    out, rasters = [], []
    for k, scale in enumerate((False, True)):
        heats = {n: rng.random((6, 8)) ** (k + 2) for n in ALIGN_METHODS}
        geometry = TokenGeometry.cell_centred((6, 8), (128, 96))
        out.append(grid_layout(geometry, heats, f"phrase {k}", scale))
        rasters.append(compose_heatmaps(image, **out[-1]))
    return image, out, rasters


def test_cache_keeps_the_latest_and_keys_by_token_phrase_and_scale():
    cache = GridCache(size=2)
    cache.put("t", "span:0:1", False, b"a")
    cache.put("t", "span:0:1", True, b"b")
    assert cache.get("t", "span:0:1", False) == b"a"  # now the most recent
    assert cache.get("u", "span:0:1", False) is None  # another pair
    cache.put("t", "span:1:2", False, b"c")  # evicts the least recent: scale True
    assert cache.get("t", "span:0:1", True) is None
    assert cache.get("t", "span:0:1", False) == b"a"
    assert cache.get("t", "span:1:2", False) == b"c"


def test_pair_token_names_the_settings():
    key = (("sha", "a red circle"), "otviz-tiny · trained heads", "grid", 1.0)
    assert pair_token(*key) == pair_token(*key)
    assert len(pair_token(*key)) == 16
    assert pair_token(*key[:3], 0.5) != pair_token(*key)  # another CAME temperature
    assert pair_token(key[0], key[1], "boxes", 1.0) != pair_token(*key)


def test_jpeg_round_trip_and_data_url(layouts):
    _, _, rasters = layouts
    jpeg = encode_jpeg(rasters[0])
    back = decode_jpeg(jpeg)
    assert back.shape == rasters[0].shape
    # JPEG at this quality: close to the raster, not equal
    assert GRID_QUALITY >= 80
    assert np.abs(back.astype(float) - rasters[0]).mean() < 4.0
    url = data_url(jpeg)
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == jpeg
    payload = prefetch_payload("tok", True, {"span:0:1": jpeg})
    assert payload == {"token": "tok", "shared_scale": True, "grids": {"span:0:1": url}}


def test_drawn_grids_are_the_view_s_grids(layouts):
    image, grid_layouts, rasters = layouts
    drawn = draw_grids(image, grid_layouts)
    assert [decode_jpeg(j).shape for j in drawn] == [r.shape for r in rasters]
    assert drawn == [encode_jpeg(r) for r in rasters]  # same raster, same encoder


def test_idle_worker_draws_what_the_server_draws(layouts):
    """In a worker process at the lowest priority, the same JPEG bytes."""
    image, grid_layouts, _ = layouts
    drawer = IdleDrawer()
    try:
        assert drawer.draw(image, grid_layouts) == draw_grids(image, grid_layouts)
    finally:
        drawer.start().shutdown()


def test_a_map_flat_by_construction_says_why_instead_of_drawing(layouts):
    """Global+Patch's panel holds its reason in words and no grounding box; the reason is
    true: its plan is the uniform product plan, the same mass on every patch."""
    _, out, _ = layouts
    reasons = flat_map_reasons()
    assert set(reasons) == {"global_patch"}
    k = list(ALIGN_METHODS).index("global_patch")
    for layout in out:
        assert layout["notes"][k] == reasons["global_patch"] and layout["boxes"][k] is None
        others = [n for j, n in enumerate(layout["notes"][: len(ALIGN_METHODS)]) if j != k]
        assert others == [None] * (len(ALIGN_METHODS) - 1)
    method = METHODS["global_patch"](6, 6, MethodConfig(trainable=False))
    g = torch.Generator().manual_seed(0)
    batch = PairBatch(patches=torch.randn(1, 5, 6, generator=g),
                      tokens=torch.randn(1, 3, 6, generator=g),
                      patch_mask=torch.ones(1, 5, dtype=torch.bool),
                      token_mask=torch.ones(1, 3, dtype=torch.bool),
                      image_global=torch.randn(1, 6, generator=g),
                      text_global=torch.randn(1, 6, generator=g), grid=(1, 5))
    heat = method(batch).heatmap(torch.tensor([[True, False, True]]))
    assert torch.allclose(heat, heat[:, :1].expand_as(heat))
