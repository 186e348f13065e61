"""A new image-tower family in one file: a toy tower (``ToyVisual``) and its adapter
(``ToyTower``, the example of docs/layout.md "Adding a tower family"). Registered here and
nowhere else, it is read by every feature source it names, every explainer and every trust
metric, each checked against a recomputation from the toy's own modules."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from open_clip.model import CLIPTextCfg, CLIPVisionCfg
from open_clip.tokenizer import SimpleTokenizer
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import scale_cam_image
from torch import Tensor, nn

from otviz.backbone import Backbone, _eval_transform
from otviz.errors import UserInputError
from otviz.eval.trust import adapter as T
from otviz.eval.trust.metrics import TABLE_METRICS, TrustSettings, trust_scores
from otviz.explainers import EXPLAINERS, get_explainer, unavailable
from otviz.explainers.gradcam import ImageEmbedding, SimilarityTarget
from otviz.towers import ImageTower
from otviz.towers.base import register_image_tower
from otviz.towers.facts import AttentionReader, AttentionTrace, CamTarget, tokens_to_map
from otviz.towers.sources import FeatureSource, parse_feature_source
from tests.helpers import world_trust_inputs


# ----------------------------------------------------------------------- the family (the example)
class ToyBlock(nn.Module):
    """A pre-norm block of one attention head (its softmax written out) and a feed-forward."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1, self.qkv, self.out = nn.LayerNorm(width), nn.Linear(width, 3 * width), \
            nn.Linear(width, width)
        self.norm2, self.mlp = nn.LayerNorm(width), nn.Linear(width, width)

    def attend(self, x: Tensor, a: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(x_next, A [B, 1, T, T])``; a given ``a`` replaces the softmax (maskclip: I)."""
        q, k, v = (z[:, None] for z in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        if a is None:
            a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        x = x + self.out((a @ v)[:, 0])
        return x + self.mlp(self.norm2(x)), a

    def forward(self, x: Tensor) -> Tensor:
        return self.attend(x)[0]


class ToyVisual(nn.Module):
    """A patch convolution, a class token, two blocks, a final norm, the class token pooled."""

    def __init__(self, width: int = 16, embed: int = 16, patch: int = 8, side: int = 32) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, patch, patch)
        self.cls = nn.Parameter(0.1 * torch.randn(width))
        self.pos = nn.Parameter(0.1 * torch.randn((side // patch) ** 2 + 1, width))
        self.blocks = nn.ModuleList(ToyBlock(width) for _ in range(2))
        self.norm, self.proj = nn.LayerNorm(width), nn.Linear(width, embed, bias=False)
        self.preprocess_cfg = {"size": side, "mode": "RGB", "mean": (0.5,) * 3,
                               "std": (0.25,) * 3, "interpolation": "bicubic",
                               "resize_mode": "shortest", "fill_color": 0}

    def embeds(self, pixels: Tensor) -> Tensor:
        x = self.conv(pixels).flatten(2).transpose(1, 2)
        return torch.cat([self.cls.expand(x.shape[0], 1, -1), x], dim=1) + self.pos

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.embeds(pixels)
        for block in self.blocks:
            x = block(x)
        return self.proj(self.norm(x)[:, 0])


class ToyReader(AttentionReader):
    def __init__(self, visual: ToyVisual, grid: tuple[int, int]) -> None:
        self.visual, self._grid = visual, grid

    @property
    def grid(self) -> tuple[int, int]:
        return self._grid

    def trace(self, pixels: Tensor) -> AttentionTrace:
        x = self.visual.embeds(pixels)
        tokens, maps = [x], []
        for block in self.visual.blocks:
            x, a = block.attend(x)
            tokens.append(x)
            maps.append(a)
        return AttentionTrace(tokens, maps)

    def readout(self, tokens: Tensor) -> Tensor:
        return self.visual.proj(self.visual.norm(tokens)[:, 0])

    def pooled_row(self, tokens: Tensor, matrix: Tensor) -> Tensor:
        return matrix[:, 0]  # the class token's row


@register_image_tower(ToyVisual)
class ToyTower(ImageTower):
    """The toy family's adapter: its sources, encoding, projection and facts."""

    def sources(self) -> tuple[str, ...]:
        return ("last", "layer:K", "maskclip")

    @property
    def depth(self) -> int:
        return len(self.visual.blocks)

    def _grid_forward(self, pixels: Tensor) -> tuple[tuple[int, int], Tensor, Tensor]:
        return (self._side(),) * 2, *self._encode(pixels, FeatureSource("last"))

    def _side(self) -> int:
        return self.visual.preprocess_cfg["size"] // self.visual.conv.stride[0]

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        x = self.visual.embeds(pixels)
        *first, last = self.visual.blocks
        read = None
        for index, block in enumerate(first):
            x = block(x)
            read = x if source.layer == index else read
        if source.kind == "maskclip":  # the last block's attention replaced by I
            read = last.attend(x, torch.eye(x.shape[1], dtype=x.dtype, device=x.device))[0]
        x = last(x)
        read = x if read is None else read
        return self.visual.norm(read)[:, 1:], self.visual.proj(self.visual.norm(x)[:, 0])

    def project(self, patches: Tensor) -> Tensor:
        return self.visual.proj(patches)

    def cam_target(self) -> CamTarget:
        return CamTarget(self.visual.blocks[-1].norm1, tokens_to_map(self.grid))

    def randomisation_blocks(self) -> list[nn.Module]:
        return list(self.visual.blocks)

    def attention_reader(self) -> AttentionReader:
        return ToyReader(self.visual, self.grid)
# ----------------------------------------------------------------------- end of the example


@pytest.fixture(scope="module")
def backbone() -> Backbone:
    torch.manual_seed(0)
    text = CLIPTextCfg(context_length=16, vocab_size=49408, width=16, heads=2, layers=1)
    model = open_clip.CLIP(16, CLIPVisionCfg(layers=1, width=16, head_width=8, patch_size=8,
                                             image_size=32),
                           text)
    model.visual = ToyVisual()
    return Backbone(model.eval(), SimpleTokenizer(context_length=16), _eval_transform(model),
                    name="toy")


def _pixels(b: int = 2, seed: int = 0) -> Tensor:
    return torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _text(backbone: Backbone, b: int = 2, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(b, backbone.embed_dim, generator=g), dim=-1)


def test_the_backbone_finds_the_family_by_its_class(backbone):
    assert isinstance(backbone.image_tower, ToyTower)
    assert backbone.grid == (4, 4) and backbone.embed_dim == 16
    geometry = backbone.image_tower.geometry  # from the patch convolution's stride
    assert geometry.grid == (4, 4) and geometry.centres()[0].tolist() == [4.0, 4.0]


def test_every_source_the_family_names_reads_its_own_modules(backbone):
    visual, pixels = backbone.model.visual, _pixels()
    with torch.no_grad():
        x0 = visual.embeds(pixels)
        x1 = visual.blocks[0](x0)
        x2 = visual.blocks[1](x1)
        v = visual.blocks[1].qkv(visual.blocks[1].norm1(x1)).chunk(3, dim=-1)[2]
        z = x1 + visual.blocks[1].out(v)
        value_path = z + visual.blocks[1].mlp(visual.blocks[1].norm2(z))
        expected = {"last": x2, "layer:0": x1, "layer:-1": x2, "maskclip": value_path}
        for name, tokens in expected.items():
            view = backbone.with_features(name)
            patches, pooled = view.image_tower.encode(pixels, parse_feature_source(name))
            assert torch.allclose(patches, visual.norm(tokens)[:, 1:], atol=1e-6), name
            assert torch.allclose(pooled, visual(pixels), atol=1e-6)
    with pytest.raises(UserInputError, match="cannot give sclip; it gives last, layer:K, maskclip"):
        backbone.with_features("sclip")


def test_every_explainer_reads_the_family(backbone):
    pixels, text = _pixels(), _text(backbone)
    assert all(unavailable(backbone, name) is None for name in EXPLAINERS)
    maps = {name: get_explainer(name, backbone.model).explain(pixels, text)
            for name in EXPLAINERS}
    for name, heat in maps.items():
        assert heat.shape == (2, 4, 4) and torch.isfinite(heat).all(), name
        assert heat.amax() > heat.amin(), name
    # Grad-CAM: the library on the family's own target
    target = backbone.image_tower.cam_target()
    library = GradCAM(ImageEmbedding(backbone.model), [target.layer], target.reshape)
    theirs = library(pixels.clone().requires_grad_(True), [SimilarityTarget(t) for t in text])
    backbone.model.zero_grad(set_to_none=True)
    library.activations_and_grads.release()
    # the library: min-max, resize to the pixels, min-max again (its layer aggregation)
    ours = scale_cam_image(scale_cam_image(maps["gradcam"].numpy(), (32, 32)))
    assert np.allclose(ours, theirs, atol=1e-5)
    # MaskCLIP: the cosine of the value path's projected patches with the phrase
    with torch.no_grad():
        patches, _ = backbone.image_tower.encode(pixels, FeatureSource("maskclip"))
        f = F.normalize(backbone.image_tower.project(patches), dim=-1)
    assert torch.allclose(maps["maskclip"].reshape(2, -1),
                          torch.einsum("bne,be->bn", f, text), atol=1e-6)
    # Chefer relevance: (I + Abar^2)(I + Abar^1), the class token's row over the patches
    leaf = pixels.clone().requires_grad_(True)
    trace = backbone.image_tower.attention_reader().trace(leaf)
    emb = F.normalize(backbone.model.visual.proj(backbone.model.visual.norm(
        trace.tokens[-1])[:, 0]), dim=-1)
    grads = torch.autograd.grad((emb * text).sum(), trace.maps)
    bars = [(g * a).clamp_min(0).mean(1).detach() for a, g in zip(trace.maps, grads, strict=True)]
    eye = torch.eye(17)
    row = ((eye + bars[1]) @ (eye + bars[0]))[:, 0, 1:]
    low, high = row.amin(1, keepdim=True), row.amax(1, keepdim=True)
    assert torch.allclose(maps["chefer"].reshape(2, -1), (row - low) / (high - low), atol=1e-5)


def test_every_trust_metric_reads_the_family(backbone):
    inputs = world_trust_inputs(backbone, seed=1, n=2)
    settings = TrustSettings(regions=3, fc_runs=2, ms_samples=2, mprt_blocks=0)
    blocks = backbone.image_tower.randomisation_blocks()
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    assert [u._held[0] for u in inputs.scorer.units] == blocks  # MPRT resets the toy's blocks
    for name in EXPLAINERS:
        source = T.ExplainerSource(name, EXPLAINERS[name].label)
        scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets,
                              inputs.masks, settings, near=inputs.near)
        assert set(scores.values) == {m.key for m in TABLE_METRICS}, name
        for key, values in scores.values.items():
            assert np.isfinite(values).all() or key in scores.refused, (name, key)
    # MPRT randomised a copy: the shared model's weights are as they were
    assert all(torch.equal(v, backbone.model.state_dict()[k]) for k, v in before.items())
