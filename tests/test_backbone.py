"""Backbone features: shapes and spaces for the shipped tiny CLIP and a random ViT-B-16,
equality with open_clip's own token outputs, any upload accepted, typed load errors."""

from __future__ import annotations

import io
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from otviz.backbone import (
    Backbone,
    BackboneLoadError,
    CaptionTooLongError,
    ImageInputError,
    to_rgb,
)
from otviz.checkpoints.store import CheckpointError
from otviz.data.rendered import normalise
from otviz.methods.base import PairBatch
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT
from otviz.world import World, WorldConfig

CAPTIONS = ["a small red circle to the left of a blue square", "there is a cyan star"]


@pytest.fixture(scope="module")
def world_samples():
    world = World(WorldConfig(negatives=False), split="test", seed=0)
    return [world.sample(i) for i in range(2)]


@pytest.fixture(scope="module")
def tiny() -> Backbone:
    return Backbone.from_checkpoint(DEFAULT_CHECKPOINT)


def test_tiny_width_features(tiny, world_samples):
    images = [s.image for s in world_samples]
    f = tiny.encode(images, CAPTIONS)
    B, cfg = 2, tiny.info["model_cfg"]
    Dv, Dt, E = cfg["vision_cfg"]["width"], cfg["text_cfg"]["width"], cfg["embed_dim"]
    assert f.grid == (10, 10) == tiny.grid
    assert f.patches.shape == (B, 100, Dv) and tiny.patch_dim == Dv
    assert f.tokens.shape == (B, 32, Dt) and tiny.token_dim == Dt
    assert f.image_global.shape == f.text_global.shape == (B, E)
    assert f.token_mask.sum(1).tolist() == [len(f.text.captions[b].token_ids) for b in range(B)]
    # "cyan" is two BPE tokens of word 3
    assert f.token_word[1, 1:7].tolist() == [0, 1, 2, 3, 3, 4]


def test_features_equal_open_clip_output_tokens(tiny, world_samples):
    """forward_intermediates (what the backbone uses) == output_tokens on both towers."""
    images = [s.image for s in world_samples]
    f = tiny.encode(images, CAPTIONS)
    model = tiny.model
    model.visual.output_tokens = model.text.output_tokens = True
    try:
        with torch.no_grad():
            pooled_i, patches = model.visual(tiny.image_tensor(images))
            pooled_t, tokens = model.text(f.token_ids)
    finally:
        model.visual.output_tokens = model.text.output_tokens = False
    torch.testing.assert_close(f.patches, patches, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f.tokens, tokens)
    torch.testing.assert_close(f.image_global, pooled_i, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f.text_global, pooled_t)


def test_projected_space(world_samples):
    bb = Backbone.from_checkpoint(DEFAULT_CHECKPOINT, space="projected")
    f = bb.encode([s.image for s in world_samples], CAPTIONS)
    E = bb.embed_dim
    assert f.patches.shape == (2, 100, E) and f.tokens.shape == (2, 32, E)
    assert bb.patch_dim == bb.token_dim == E
    # the projected EOT token is the pooled text embedding (argmax pooling of CLIP)
    eot = f.token_ids.argmax(-1)
    torch.testing.assert_close(f.tokens[torch.arange(2), eot], f.text_global)
    # width features mapped by to_space, and text-only encoding, give the same tensors
    width = Backbone.from_checkpoint(DEFAULT_CHECKPOINT, space="width")
    w = width.encode([s.image for s in world_samples], CAPTIONS)
    p = width.to_space(w, "projected")
    assert p.space == "projected" and width.to_space(w, "width") is w
    torch.testing.assert_close(p.patches, f.patches)
    torch.testing.assert_close(p.tokens, f.tokens)
    with pytest.raises(ValueError):
        width.to_space(f, "width")
    tokens, mask = width.encode_text(CAPTIONS)
    torch.testing.assert_close(tokens, w.tokens)
    assert torch.equal(mask, w.token_mask)
    tokens, _ = width.encode_text(CAPTIONS, space="projected")
    torch.testing.assert_close(tokens, f.tokens)


def test_pair_batch(tiny, world_samples):
    f = tiny.encode([s.image for s in world_samples], CAPTIONS)
    pb = f.pair_batch()
    assert isinstance(pb, PairBatch) and pb.size == 2 and pb.grid == (10, 10)
    assert pb.patch_mask.all() and pb.patch_mask.shape == (2, 100)
    assert torch.equal(pb.token_mask, f.token_mask) and pb.tokens is f.tokens
    assert pb.regions is None and pb.nodes is None
    assert tiny.pair_batch(f).patches is f.patches


def test_shipped_model_retrieves_held_out_pairs(tiny):
    """The embedded model is trained: on 100 held-out pairs, far above chance (1%)."""
    world = World(WorldConfig(negatives=False), split="test", seed=123)
    samples = [world.sample(i) for i in range(100)]
    f = tiny.encode([s.image for s in samples], [s.caption for s in samples])
    sim = torch.nn.functional.normalize(f.image_global, dim=-1) @ torch.nn.functional.normalize(
        f.text_global, dim=-1).T
    i2t = (sim.argmax(1) == torch.arange(100)).float().mean()
    t2i = (sim.argmax(0) == torch.arange(100)).float().mean()
    assert i2t > 0.2 and t2i > 0.2


def test_tensor_path_equals_pil_preprocessing(tiny, world_samples):
    """Training normalises uint8 tensors directly; that equals the model's own transform."""
    images = np.stack([s.image for s in world_samples])
    pp = tiny.model.visual.preprocess_cfg
    direct = normalise(torch.from_numpy(images), tuple(pp["mean"]), tuple(pp["std"]))
    torch.testing.assert_close(tiny.image_tensor(list(images)), direct)


def test_truncation(tiny):
    long = " ".join(["a small red circle to the left of a large blue square and"] * 4)
    f = tiny.encode([np.zeros((80, 80, 3), np.uint8)], [long])
    assert f.token_mask.sum() == 30 and f.truncated[0]
    with pytest.raises(CaptionTooLongError, match="words cut"):
        tiny.encode([np.zeros((80, 80, 3), np.uint8)], [long], allow_truncation=False)
    with pytest.raises(ValueError):
        tiny.encode([np.zeros((80, 80, 3), np.uint8)], ["a", "b"])


@pytest.mark.slow
def test_random_vit_b16_shapes():
    bb = Backbone.from_pretrained("ViT-B-16", None, space="width")
    images = [Image.new("RGB", (300, 200), (200, 30, 30)), np.zeros((64, 64), np.uint8)]
    f = bb.encode(images, CAPTIONS)
    assert f.grid == (14, 14)
    assert f.patches.shape == (2, 196, 768) and f.tokens.shape == (2, 77, 512)
    assert f.image_global.shape == f.text_global.shape == (2, 512)
    assert isinstance(bb.model, open_clip.CLIP)  # standard (non custom-text) CLIP class
    # text tokens equal a manual pass through the standard CLIP text tower
    m = bb.model
    with torch.no_grad():
        x = m.token_embedding(f.token_ids) + m.positional_embedding
        x = m.ln_final(m.transformer(x, attn_mask=m.attn_mask))
    torch.testing.assert_close(f.tokens, x, atol=1e-5, rtol=1e-5)
    # projected space: the class-token-free patches through visual.proj
    bb.space = "projected"
    g = bb.encode(images[:1], CAPTIONS[:1])
    torch.testing.assert_close(g.patches, f.patches[:1] @ m.visual.proj, atol=1e-4, rtol=1e-4)
    assert g.tokens.shape == (1, 77, 512)


# ------------------------------------------------------------------ uploads
def _png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_rgba_composited_on_white():
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    rgba.putpixel((1, 0), (0, 0, 0, 128))
    out = np.asarray(to_rgb(rgba))
    assert out.shape == (4, 4, 3) and out.dtype == np.uint8
    assert out[1, 1].tolist() == [255, 255, 255]  # transparent -> white
    assert out[0, 0].tolist() == [0, 0, 255]  # opaque kept
    assert abs(int(out[0, 1, 0]) - 127) <= 1  # half-transparent black over white


def test_palette_with_transparency_and_la():
    p = Image.new("P", (3, 3), 0)
    p.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    p.putpixel((1, 1), 1)
    p.info["transparency"] = 0
    out = np.asarray(to_rgb(p))
    assert out[0, 0].tolist() == [255, 255, 255] and out[1, 1].tolist() == [200, 100, 50]
    la = Image.new("LA", (2, 2), (0, 0))
    assert np.asarray(to_rgb(la)).min() == 255


def test_sixteen_bit_and_float_scaled():
    a16 = np.full((5, 5), 65535, np.uint16)
    a16[0, 0] = 257 * 100
    img16 = Image.fromarray(a16)
    assert img16.mode.startswith("I;16")
    out = np.asarray(to_rgb(img16))
    assert out[1, 1].tolist() == [255] * 3 and out[0, 0].tolist() == [100] * 3
    out = np.asarray(to_rgb(Image.fromarray(a16.astype(np.int32))))  # mode "I"
    assert out[0, 0].tolist() == [100] * 3
    fl = np.zeros((3, 3), np.float32)
    fl[0, 0] = 1.0
    out = np.asarray(to_rgb(Image.fromarray(fl)))  # mode "F" in [0, 1]
    assert out[0, 0].tolist() == [255] * 3 and out[1, 1].tolist() == [0] * 3


def test_exif_orientation_applied():
    img = Image.new("RGB", (40, 20), (0, 0, 0))
    img.paste((255, 0, 0), (0, 0, 10, 10))  # red block top-left as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    buf = io.BytesIO()
    img.save(buf, format="PNG", exif=exif.tobytes())
    out = np.asarray(to_rgb(buf.getvalue()))
    assert out.shape == (40, 20, 3)
    assert out[:10, 10:].tolist() == [[[255, 0, 0]] * 10] * 10  # now top-right
    assert out[:10, :10].max() == 0


@pytest.mark.parametrize(
    "image",
    [
        Image.new("L", (7, 300), 90),
        Image.new("1", (50, 50), 1),
        Image.new("CMYK", (40, 30), (0, 255, 255, 0)),
        Image.new("RGB", (1, 1), (1, 2, 3)),
        Image.new("RGB", (1000, 13), (1, 2, 3)),
        np.random.default_rng(0).integers(0, 255, (30, 20, 4), dtype=np.uint8),
        np.ones((10, 10, 1), np.float64),
        np.zeros((10, 10), bool),
        _png_bytes(Image.new("RGBA", (9, 9), (0, 255, 0, 255))),
    ],
    ids=["L", "1", "CMYK", "1x1", "wide", "rgba-array", "float-array", "bool-array", "bytes"],
)
def test_any_upload_is_encoded(tiny, image):
    assert to_rgb(image).mode == "RGB"
    f = tiny.encode([image], ["a green square"])
    assert f.patches.shape[:2] == (1, 100) and torch.isfinite(f.patches).all()


def test_file_path_upload(tmp_path):
    path = tmp_path / "x.png"
    Image.new("RGB", (5, 5), (9, 9, 9)).save(path)
    assert np.asarray(to_rgb(path))[0, 0].tolist() == [9, 9, 9]


@pytest.mark.parametrize("bad", [b"not an image", "no/such/file.png", np.zeros((3, 3, 7)),
                                 np.zeros((0, 4, 3)), 42])
def test_non_images_rejected(bad):
    with pytest.raises(ImageInputError):
        to_rgb(bad)


# ------------------------------------------------------------------ loading errors
def test_from_pretrained_network_failure_is_typed_and_fast(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(open_clip.factory, "download_pretrained", no_network)
    start = time.perf_counter()
    with pytest.raises(BackboneLoadError) as info:
        Backbone.from_pretrained("ViT-B-32", "openai")
    assert time.perf_counter() - start < 20
    message = str(info.value)
    assert "name resolution" in message and "from_checkpoint" in message
    assert "local path" in message


def test_from_pretrained_unknown_name_or_tag():
    with pytest.raises(BackboneLoadError, match="unknown open_clip model"):
        Backbone.from_pretrained("ViT-Nope-99")
    with pytest.raises(BackboneLoadError, match="known tags"):
        Backbone.from_pretrained("ViT-B-32", "no-such-tag")


@pytest.mark.parametrize("content", [b"not a checkpoint", None])
def test_a_local_weight_files_failure_never_advises_the_hub(tmp_path, content):
    """A corrupt file, and a readable state dict of another architecture: the message names
    the file and the architecture, never the hub or connecting the machine."""
    path = tmp_path / "weights.pt"
    if content is None:
        torch.save({"visual.nothing": torch.zeros(2)}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(BackboneLoadError) as info:
        Backbone.from_pretrained("RN50", str(path))
    message = str(info.value)
    assert f"local weight file {str(path)!r}" in message and "RN50 architecture" in message
    assert not any(word in message.lower() for word in ("hub", "internet", "connect"))


def test_from_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError):
        Backbone.from_checkpoint(tmp_path)
    from otviz.checkpoints.store import save_checkpoint

    save_checkpoint(tmp_path, {"x": torch.ones(1)}, {"kind": "conceptot-head"})
    with pytest.raises(CheckpointError, match="otviz-tiny-clip"):
        Backbone.from_checkpoint(tmp_path)


def test_bad_space_rejected(tiny):
    with pytest.raises(ValueError, match="space"):
        Backbone(tiny.model, tiny.words.tokenizer, tiny.preprocess, space="concept")
