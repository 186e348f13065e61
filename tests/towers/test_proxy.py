"""The ``proxy`` feature source (otviz/towers/proxy.py, ProxyCLIP) against a reference written
here from the paper's equations and the authors' code: explicit value matmuls on a random
open_clip ViT-B/16's last block, a bilinear resize built by hand, the proxy's patch tokens
from timm's DINO interface (``get_intermediate_layers``) on random DINO / DINOv2 ViTs; and
the second backbone's loading and refusals."""

from __future__ import annotations

import copy
import math

import open_clip
import pytest
import timm
import torch
from open_clip.model import resize_pos_embed

from otviz.backbone import Backbone, _eval_transform
from otviz.errors import UserInputError
from otviz.towers import image_tower
from otviz.towers.proxy import ProxyTower, load_proxy, proxy_attention
from otviz.towers.sources import FeatureSource

BETA, GAMMA = 1.2, 3.0  # ProxyCLIP's defaults (proxyclip_segmentor.py L31)
DINO, DINOV2 = "vit_small_patch16_224.dino", "vit_small_patch14_dinov2"
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def random_proxy(name: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, num_classes=0,
                             dynamic_img_size=True).double().eval()


def bilinear(n_in: int, n_out: int) -> torch.Tensor:
    """``[n_out, n_in]`` 1-D bilinear resize, half-pixel centres (``align_corners=False``):
    output ``o`` reads input ``(o + 0.5) n_in / n_out - 0.5``, clamped at 0."""
    r = torch.zeros(n_out, n_in, dtype=torch.float64)
    for o in range(n_out):
        src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
        i = min(math.floor(src), n_in - 1)
        frac = src - i
        r[o, i] += 1 - frac
        r[o, min(i + 1, n_in - 1)] += frac
    return r


def reference(model, proxy, pixels: torch.Tensor) -> torch.Tensor:
    """``[B, H W, width]``: ProxyCLIP's last block (module docstring of otviz/towers/proxy.py)
    written out: the proxy's normed last-block patch tokens on ImageNet-normalised pixels,
    ``A = softmax(gamma (S - beta mean S))`` over entries >= 0, CLIP's per-head values of
    ``ln_1(x)`` resized to the proxy grid, ``out_proj(A v)``, ``ln_post``; no residual."""
    visual = model.visual
    x = visual._embeds(pixels)
    for block in visual.transformer.resblocks[:-1]:
        x = block(x)
    last = visual.transformer.resblocks[-1]
    clip_mean, clip_std = (torch.tensor(c, dtype=pixels.dtype)[:, None, None] for c in (
        visual.preprocess_cfg["mean"], visual.preprocess_cfg["std"]))
    mean, std = (torch.tensor(c, dtype=pixels.dtype)[:, None, None] for c in IMAGENET)
    feats = proxy.get_intermediate_layers((pixels * clip_std + clip_mean - mean) / std, n=1,
                                          reshape=True, norm=True)[0]  # [B, C, H, W]
    big_h, big_w = feats.shape[-2:]
    f = feats.flatten(2)
    f = f / f.norm(dim=1, keepdim=True)
    s = torch.einsum("bcm,bcn->bmn", f, f)
    logits = GAMMA * (s - BETA * s.mean())  # one image: the mean over all its entries
    logits[logits < 0] = float("-inf")
    a = torch.softmax(logits, dim=-1)
    d = x.shape[-1]
    heads = last.attn.num_heads
    v = last.ln_1(x) @ last.attn.in_proj_weight[2 * d:].T + last.attn.in_proj_bias[2 * d:]
    h = w = int(math.isqrt(x.shape[1] - 1))
    resize = torch.kron(bilinear(h, big_h), bilinear(w, big_w))  # [H W, h w], row-major
    v = resize.to(v) @ v[:, 1:]  # each channel (so each head's slice) resized alike
    out = torch.cat([a @ v[..., i * d // heads:(i + 1) * d // heads] for i in range(heads)], -1)
    out = out @ last.attn.out_proj.weight.T + last.attn.out_proj.bias
    return visual.ln_post(out)


@pytest.mark.parametrize(("name", "grid"), [(DINO, (14, 14)), (DINOV2, (16, 16))])
def test_proxy_source_is_proxyclips_equations(vit_b16_f64, name, grid):
    model, pixels = vit_b16_f64
    proxy = random_proxy(name, 2)
    tower = ProxyTower(image_tower(model), proxy, name)
    with torch.no_grad():
        patches, pooled = tower.encode(pixels, FeatureSource("proxy"))
        want = reference(model, proxy, pixels)
        pooled_want = model.encode_image(pixels)
    assert tower.grid == grid and patches.shape == (1, grid[0] * grid[1], 768)
    assert torch.isfinite(want).all()
    assert (patches - want).abs().max().item() < 1e-5
    assert (pooled - pooled_want).abs().max().item() < 1e-5


def test_the_attention_reads_only_entries_above_beta_times_the_mean():
    """Entries of ``gamma (S - beta mean S)`` below 0 get no weight, the rest their softmax;
    two images are each centred on their own mean."""
    feats = torch.randn(2, 8, 3, 4, generator=torch.Generator().manual_seed(5)).double()
    a = proxy_attention(feats)
    for i in range(2):
        f = feats[i].flatten(1)
        f = f / f.norm(dim=0)
        s = f.T @ f
        e = torch.where(s >= BETA * s.mean(), torch.exp(GAMMA * (s - BETA * s.mean())), 0.0)
        assert torch.allclose(a[i], e / e.sum(1, keepdim=True), atol=1e-12)
        assert (a[i][s < BETA * s.mean()] == 0).all()


def test_a_uniform_image_reads_each_tokens_own_value_not_nan():
    """Every patch alike: ``mean S = 1 > 1 / beta``, every entry below 0, the authors' rows all
    ``-inf`` (NaN); here each token keeps its own entry, ``A = I``."""
    feats = torch.ones(1, 8, 3, 4, dtype=torch.float64)
    assert torch.equal(proxy_attention(feats)[0], torch.eye(12, dtype=torch.float64))


def test_backbone_reads_a_proxy_from_a_local_weight_file_at_448_px(vit_b16_f64, tmp_path):
    """``with_features("proxy", 448, proxy="NAME:FILE")`` loads the file into a fresh model and
    equals the reference at 448 px (28 x 28 grids, the proxy's position embeddings resized),
    in float32 (1e-4; float64 to 1e-5 above)."""
    model = copy.deepcopy(vit_b16_f64[0]).float()  # float32 at 448 px: the suite's time
    proxy = random_proxy(DINO, 3).float()
    path = tmp_path / "dino.pth"
    torch.save(proxy.state_dict(), path)
    backbone = Backbone(model, open_clip.get_tokenizer("ViT-B-16"), _eval_transform(model))
    view = backbone.with_features("proxy", 448, proxy=f"{DINO}:{path}")
    assert view.grid == (28, 28) and view.image_size == 448
    big = open_clip.create_model("ViT-B-16", pretrained=None, force_image_size=448)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    resize_pos_embed(state, big)  # open_clip's own 448 px model of the same weights
    big.load_state_dict(state)
    pixels = torch.randn(1, 3, 448, 448, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        patches, _ = view.image_tower.encode(pixels, view.features)
        want = reference(big.eval(), proxy, pixels)
    assert (patches - want).abs().max().item() < 1e-4
    assert view.with_features("last").grid == (14, 14)  # the proxy goes with its source


def test_proxy_loading_failures_say_why_in_one_line(tmp_path):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a weight file")
    cases = {
        "nope_model": "not a timm model name",
        f"{DINO}:{tmp_path / 'missing.pth'}": "no weight file at",
        f"{DINO}:{bad}": "could not load vit_small_patch16_224.dino from the local weight file",
        DINO: "could not fetch",  # the hub is unreachable offline (HF_HUB_OFFLINE)
        "resnet18:random": "is not a ViT with patch tokens",
    }
    for spec, message in cases.items():
        with pytest.raises(UserInputError) as e:
            load_proxy(spec)
        text = str(e.value)
        assert message in text and "\n" not in text
        if ":" in spec and "random" not in spec:
            assert "hub" not in text.lower() and "connect" not in text.lower()


def test_the_proxy_source_and_its_backbone_go_together(vit_b16_f64):
    model, _ = vit_b16_f64
    backbone = Backbone(model, open_clip.get_tokenizer("ViT-B-16"), _eval_transform(model))
    with pytest.raises(UserInputError, match="needs its second backbone"):
        backbone.with_features("proxy")
    with pytest.raises(UserInputError, match="read by the proxy source only"):
        backbone.with_features("sclip", proxy=f"{DINO}:random")
    with pytest.raises(UserInputError, match="240 px is not a multiple of the proxy"):
        backbone.with_features("proxy", 240, proxy=f"{DINOV2}:random")  # CLIP 16 | 240, 14 not


def test_the_fingerprint_names_the_proxy_and_its_weights(vit_b16_f64):
    """A feature cache or head keyed on a proxy reading is not taken for another proxy's."""
    from otviz.checkpoints.identity import backbone_fingerprint

    model, _ = vit_b16_f64
    backbone = Backbone(model, open_clip.get_tokenizer("ViT-B-16"), _eval_transform(model))
    prints = [backbone_fingerprint(backbone.with_features("proxy", proxy=random_proxy(DINO, s)))
              for s in (5, 6, 5)]
    assert prints[0]["proxy"]["name"] == "VisionTransformer"
    assert prints[0]["proxy"] != prints[1]["proxy"] and prints[0] == prints[2]
    assert "proxy" not in backbone_fingerprint(backbone)


def test_explain_reads_the_proxy_named_on_the_command_line(tmp_path, capsys):
    """``otviz explain --features proxy --proxy NAME:random`` on the tiny CLIP draws its
    maps; ``--features proxy`` alone is a one-line usage error naming the missing backbone."""
    from otviz.cli.explain import main

    out = tmp_path / "maps.png"
    main(["--example", "0", "--features", "proxy", "--proxy",
          "vit_small_patch8_224.dino:random", "--out", str(out)], "otviz explain")
    assert out.stat().st_size > 0
    with pytest.raises(SystemExit) as e:
        main(["--example", "0", "--features", "proxy"], "otviz explain")
    assert e.value.code == 2
    assert "the proxy source needs its second backbone" in capsys.readouterr().err


def test_towers_proxyclip_does_not_rewrite_are_refused_by_name(tmp_path):
    from tests.towers.conftest import shrunk_backbone

    resnet = shrunk_backbone("RN50", tmp_path, seed=0)
    with pytest.raises(UserInputError, match="the ModifiedResNet tower cannot give proxy; "
                                             "ProxyCLIP rewrites the last block of an open_clip"):
        resnet.with_features("proxy", proxy=f"{DINO}:random")
