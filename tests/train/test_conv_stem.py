"""The tiny CLIP's convolutional stem (Xiao et al. 2021): the same token grid as the linear
patch embedding, overlapping receptive fields, a config open_clip never sees, an exact
save/load round trip; and the v3 training plumbing (vectorised shift, parallel rendering,
device checks)."""

from __future__ import annotations

import pytest
import torch
from open_clip import factory as open_clip_factory

from otviz.data.rendered import random_shift, render_split, render_split_cached
from otviz.tiny_clip.conv_stem import ConvStem, stem_channels
from otviz.tiny_clip.model import (
    STEM_KEY,
    create_tiny_clip,
    load_tiny_clip,
    register_tiny_clip,
    save_tiny_clip,
    tiny_clip_config,
)
from otviz.train.pretrain import pretrain
from otviz.train.pretrain_config import PretrainConfig
from otviz.world import WorldConfig

SMALL = dict(embed_dim=16, vision_width=32, vision_layers=1, vision_heads=2, text_width=32,
             text_layers=1, text_heads=2)


def test_stem_channels_double_up_to_the_width() -> None:
    assert stem_channels(96, 8) == (24, 48, 96)
    assert stem_channels(96, 4) == (48, 96)
    with pytest.raises(ValueError, match="power-of-two patch size"):
        stem_channels(96, 6)


def test_the_stem_keeps_the_patch_grid_and_overlaps_patches() -> None:
    torch.manual_seed(0)
    stem = ConvStem(32, 8).eval()
    x = torch.randn(1, 3, 80, 80)
    out = stem(x)
    assert out.shape == (1, 32, 10, 10) and stem.out_channels == 32
    # a pixel in the last column of patch (4, 4) moves the token of patch (4, 5) too (each
    # token reads input columns 8j - 7 .. 8j + 7); the linear patch embedding moves one token
    y = x.clone()
    y[0, :, 36, 39] += 5.0
    changed = (stem(y) - out).abs().sum(1)[0] > 1e-6
    assert changed[4, 4] and changed[4, 5]
    linear = torch.nn.Conv2d(3, 32, 8, stride=8)
    moved = (linear(y) - linear(x)).abs().sum(1)[0] > 1e-6
    assert moved.sum() == 1


def test_a_conv_stem_model_round_trips_and_open_clip_never_sees_the_key(tmp_path) -> None:
    cfg = tiny_clip_config(**SMALL, vision_stem="conv", vision_pool="avg")
    assert cfg[STEM_KEY] == "conv" and STEM_KEY not in tiny_clip_config(**SMALL)
    name = register_tiny_clip(cfg)
    assert STEM_KEY not in open_clip_factory._MODEL_CONFIGS[name]
    assert name != register_tiny_clip(tiny_clip_config(**SMALL, vision_pool="avg"))
    model = create_tiny_clip(cfg, seed=0)
    assert isinstance(model.visual.conv1, ConvStem) and tuple(model.visual.grid_size) == (10, 10)
    model.eval()
    save_tiny_clip(tmp_path / "ck", model, cfg, {"recipe": {}})
    loaded, meta = load_tiny_clip(tmp_path / "ck")
    assert meta["model_cfg"] == cfg and isinstance(loaded.visual.conv1, ConvStem)
    pixels = torch.randn(2, 3, 80, 80)
    torch.testing.assert_close(loaded.encode_image(pixels), model.encode_image(pixels),
                               rtol=0, atol=0)


def test_an_unknown_stem_is_refused() -> None:
    with pytest.raises(ValueError, match="vision_stem must be one of"):
        tiny_clip_config(vision_stem="resnet")


def test_the_vectorised_shift_equals_a_per_image_crop() -> None:
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (5, 12, 10, 3), dtype=torch.uint8, generator=g)
    shifted = random_shift(images, 2, torch.Generator().manual_seed(7))
    offsets = torch.randint(0, 5, (5, 2), generator=torch.Generator().manual_seed(7))
    padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2).float(), (2,) * 4,
                                     mode="replicate")
    for b, (dy, dx) in enumerate(offsets.tolist()):
        want = padded[b, :, dy : dy + 12, dx : dx + 10].permute(1, 2, 0).to(torch.uint8)
        assert torch.equal(shifted[b], want)


def test_parallel_rendering_and_its_cache_give_the_single_process_split(tmp_path) -> None:
    config = WorldConfig(negatives=True)
    one = render_split("train", 9, 4, 32, config)
    first = render_split_cached(tmp_path, "train", 9, 4, 32, config, workers=2)
    again = render_split_cached(tmp_path, "train", 9, 4, 32, config, workers=2)
    assert len(list(tmp_path.iterdir())) == 1  # rendered once, then read back
    for split in (first, again):
        assert torch.equal(split.images, one.images) and torch.equal(split.ids, one.ids)
        assert split.captions == one.captions
        assert torch.equal(split.negative_ids, one.negative_ids)
        assert torch.equal(split.negative_valid, one.negative_valid)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_a_cuda_device_is_refused_without_a_gpu_and_with_processes() -> None:
    with pytest.raises(ValueError, match="no CUDA device is available"):
        pretrain(PretrainConfig(device="cuda", processes=1, out=""))
    with pytest.raises(ValueError, match="pass --processes 1"):
        pretrain(PretrainConfig(device="cuda", processes=2, out=""))
