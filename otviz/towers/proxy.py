"""ProxyCLIP (Lan et al., "ProxyCLIP: Proxy Attention Improves CLIP for Open-Vocabulary
Segmentation", ECCV 2024): the ``proxy`` feature source, CLIP's last-block values mixed by
the attention a second vision backbone's patch correspondences give.

The terms as the authors' code computes them (mc-lan/ProxyCLIP at e7b767f; read, not
copied):

* the pixels: the image CLIP reads, un-normalised with CLIP's mean and std and normalised
  with the second backbone's (ImageNet's for DINO / DINOv2), at the same input size
  (``proxyclip_segmentor.py`` L79-80, L113);
* the proxy's features: its last block's patch tokens through its final norm, prefix
  (class and register) tokens dropped, on its own patch grid ``H x W``
  (``proxyclip_segmentor.py`` L132, L154 for DINO: ``get_intermediate_layers(...)[0][:, 1:]``,
  the hooked last-block q / k / v computed but unused; L159 for DINOv2:
  ``get_intermediate_layers(..., reshape=True)[0]``); here timm's
  ``forward_intermediates(indices=1, norm=True)``, the same tokens;
* the proxy attention (``open_clip/transformer.py`` L569-578): ``S`` the cosine similarities
  of those tokens (each normalised over its channels), ``S' = gamma (S - beta mean(S))``
  with ``beta = 1.2``, ``gamma = 3.0`` (``proxyclip_segmentor.py`` L31), entries of ``S'``
  below 0 set to ``-inf``, ``A = softmax(S')`` over each row, the same ``A`` for every head
  (a token's own entry kept where the whole row is below 0, which the authors' code turns
  into NaN: :func:`proxy_attention`).
  The authors run one image (one sliding crop) at a time; ``mean(S)`` here is per image;
* CLIP's values (``open_clip/transformer.py`` L524-528, L566-567, L580-586): the last
  block's per-head values ``v`` of ``ln_1(x)`` (``x`` the tokens entering the last block),
  the class token dropped, each head's ``h x w`` map resized to the proxy's ``H x W`` grid
  bilinearly (``align_corners=False``), then ``out_proj(A v)``: no residual, no
  feed-forward (the block's layer scale, identity on ViT-B/16, applied as on every otviz
  path);
* the output (L533-536): that map through the tower's final norm (``ln_post``; the
  projection is the projected space's), on the proxy's grid: the source's tokens are the
  proxy's patches (a DINO ViT-S/16 at 224 px: 14 x 14 as CLIP ViT-B/16; DINOv2's 14 px
  patches: 16 x 16).

The second backbone is any timm ViT (``patch_embed``, ``forward_intermediates``), built
with ``dynamic_img_size`` so it reads CLIP's input size, from a tag fetched from the
Hugging Face hub (``vit_small_patch16_224.dino``), from a local weight file
(``NAME:FILE``: timm's own or the authors' DINO / DINOv2 checkpoint, converted by timm's
loader) or random (``NAME:random``). CLIP's tower must be an open_clip ViT with a class
token (:func:`fits`); the input side must be a multiple of both patch sizes.

Cost (``benchmarks/feature_sources_cost.md``: one image, random ViT-B/16, CPU, one thread,
a loaded machine): one CLIP forward plus one of the proxy and the proxy's ``(H W)^2``
attention per image, shared by the heads. With DINO ViT-S/16, 1.02 x ``last`` at 224 px and
1.08 x at 448 px, + 44 / 114 MB while encoding; with the authors' DINO ViT-B/8 (56 x 56
tokens at 448 px), 3.4 x ``last`` at 224 px and 6.8 x at 448 px (33 s), + 85 / 288 MB, its
weights + 330 MB.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import timm
import torch
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer
from torch import Tensor, nn
from torch.nn import functional as F

from otviz.errors import UserInputError
from otviz.knobs import PROXY_SOURCE as PROXY
from otviz.towers.base import ImageTower
from otviz.towers.sources import FeatureSource
from otviz.towers.vit import VitTower, block_qkv

#: The authors' defaults (``proxyclip_segmentor.py`` L31).
BETA, GAMMA = 1.2, 3.0
#: The ``SOURCE`` of ``NAME:random``: random initialisation, nothing read.
RANDOM = "random"
NOT_A_VIT = ("is not a ViT with patch tokens read at any input size (patch_embed, "
             "forward_intermediates, dynamic_img_size); take a DINO or DINOv2 ViT")


def load_proxy(spec: str) -> nn.Module:
    """The second backbone written ``NAME`` (timm's weights of that tag, from the hub),
    ``NAME:FILE`` (a local weight file) or ``NAME:random`` (random weights), in eval mode;
    :class:`UserInputError` naming the proxy and saying why for an unknown name, a model that
    is not a ViT, weights the hub cannot give or a file that is missing or unreadable."""
    name, _, source = str(spec).strip().partition(":")
    if not name or not timm.is_model(name):
        raise UserInputError(
            f"proxy: {name!r} is not a timm model name; write NAME[:SOURCE] with NAME a timm "
            "ViT such as vit_small_patch16_224.dino or vit_small_patch14_dinov2.lvd142m")
    kwargs = {"num_classes": 0, "dynamic_img_size": True}
    if source == RANDOM:
        model = _create(name, kwargs, f"proxy: could not build {name}")
    elif source:
        if not os.path.isfile(source):
            raise UserInputError(f"proxy: no weight file at {source!r} for {name}")
        model = _create(name, {**kwargs, "pretrained": True,
                               "pretrained_cfg_overlay": {"file": source}},
                        f"proxy: could not load {name} from the local weight file {source!r}; "
                        f"check that it holds {name}'s weights (timm's or the authors' "
                        "checkpoint, complete and readable)")
    else:
        model = _create(name, {**kwargs, "pretrained": True},
                        f"proxy: could not fetch {name}'s weights from the Hugging Face hub; "
                        f"pass a local weight file as {name}:FILE")
    if not (hasattr(model, "patch_embed") and hasattr(model, "forward_intermediates")):
        raise UserInputError(f"proxy: {name} {NOT_A_VIT}")
    return model.eval()


def _create(name: str, kwargs: dict, failure: str) -> nn.Module:
    """``timm.create_model(name, **kwargs)``; any failure as one :class:`UserInputError`
    line ``failure`` with the error's kind (its text may advise what does not apply)."""
    try:
        return timm.create_model(name, **kwargs)
    except TypeError as e:
        if "dynamic_img_size" not in str(e):
            raise UserInputError(f"{failure} ({type(e).__name__})") from e
        raise UserInputError(f"proxy: {name} {NOT_A_VIT}") from e
    except Exception as e:  # timm / hub / torch.load / state-dict errors alike
        raise UserInputError(f"{failure} ({type(e).__name__})") from e


def proxy_attention(features: Tensor, beta: float = BETA, gamma: float = GAMMA) -> Tensor:
    """``[B, H W, H W]`` ProxyCLIP's ``A = softmax(gamma (S - beta mean S))``, entries below 0
    left out, from the proxy's patch features ``[B, C, H, W]`` (``S``: their cosine
    similarities; the mean per image; module docstring). A token's own entry is never left
    out: it is its row's largest (``S_pp = 1``), so this changes nothing where the authors'
    softmax is defined, and where ``mean S > 1 / beta`` (a uniform image: every patch alike)
    their row is all ``-inf`` (NaN) while here the token reads its own value."""
    unit = F.normalize(features.flatten(2), dim=1)
    similarity = unit.transpose(1, 2) @ unit
    logits = gamma * (similarity - beta * similarity.mean(dim=(1, 2), keepdim=True))
    own = torch.eye(logits.shape[-1], dtype=torch.bool, device=logits.device)
    return torch.softmax(logits.masked_fill((logits < 0) & ~own, float("-inf")), dim=-1)


def proxy_branch(block: ResidualAttentionBlock, x: Tensor, grid: tuple[int, int],
                 attention: Tensor, proxy_grid: tuple[int, int]) -> Tensor:
    """``[B, H W, D]`` ``ls_1(out_proj(A v'))``: the last block's values of the patch tokens
    of ``x`` ``[B, 1 + h w, D]`` (class token first) on ``grid`` ``(h, w)``, resized per head
    to ``proxy_grid`` bilinearly and mixed by ``attention`` ``[B, H W, H W]``."""
    _, _, v = block_qkv(block, x)
    b, heads, _, d = v.shape
    maps = v[:, :, 1:].reshape(b * heads, *grid, d).permute(0, 3, 1, 2)
    maps = F.interpolate(maps, size=proxy_grid, mode="bilinear", align_corners=False)
    v = maps.flatten(2).transpose(1, 2).reshape(b, heads, -1, d)
    out = (attention[:, None] @ v).transpose(1, 2).reshape(b, -1, heads * d)
    return block.ls_1(block.attn.out_proj(out))


def _channels(values: tuple[float, ...], like: Tensor) -> Tensor:
    """``[3, 1, 1]`` per-channel ``values`` in ``like``'s dtype and device."""
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None, None]


def fits(tower: ImageTower) -> bool:
    """Whether ``tower`` is an open_clip ViT whose last block is a plain self-attention block
    after a class token (the authors' setting)."""
    visual = tower.visual
    if not isinstance(tower, VitTower) or not isinstance(visual, VisionTransformer):
        return False
    last = visual.transformer.resblocks[-1]
    return (isinstance(last, ResidualAttentionBlock)
            and isinstance(last.attn, nn.MultiheadAttention) and not hasattr(last, "ln_1_kv")
            and visual.class_embedding is not None and visual.attn_pool is None)


class ProxyTower(ImageTower):
    """An open_clip ViT adapter (``clip``) read through ProxyCLIP's attention from
    ``proxy`` (module docstring): the tokens sit on the proxy's grid, their width and
    projection are CLIP's; ``name`` names the proxy in notes."""

    def __init__(self, clip: ImageTower, proxy: nn.Module, name: str = "") -> None:
        if not fits(clip):
            raise UserInputError(
                f"features: the {clip.family} tower cannot give {PROXY}; ProxyCLIP rewrites "
                "the last block of an open_clip ViT with a class token")
        super().__init__(clip.visual, clip.side)
        self.clip, self.proxy, self.name = clip, proxy, name or type(proxy).__name__
        side = self.clip.image_size
        patch = tuple(int(p) for p in proxy.patch_embed.patch_size)
        if side[0] % patch[0] or side[1] % patch[1]:
            raise UserInputError(
                f"image size: {side[0]} px is not a multiple of the proxy {self.name}'s "
                f"{patch[0]} px patches")
        self._proxy_grid = (side[0] // patch[0], side[1] // patch[1])

    @property
    def family(self) -> str:
        return f"{self.clip.family} with proxy {self.name}"

    def sources(self) -> tuple[str, ...]:
        return (PROXY,)

    @property
    def native_size(self) -> tuple[int, int]:
        return self.clip.native_size

    def on(self, visual: nn.Module) -> ProxyTower:
        return ProxyTower(self.clip.on(visual), self.proxy, self.name)

    def at_size(self, side: int | None) -> ProxyTower:
        return ProxyTower(self.clip.at_size(side), self.proxy, self.name)

    @property
    def grid(self) -> tuple[int, int]:
        return self._proxy_grid

    @property
    def width(self) -> int:
        return self.clip.width

    @property
    def embed_dim(self) -> int:
        return self.clip.embed_dim

    def project(self, patches: Tensor) -> Tensor:
        return self.clip.project(patches)

    def _spatial_path(self) -> tuple[nn.Module, Callable[[Tensor], tuple[int, int]]]:
        """The proxy's patch embedding places the tokens (timm's ``NHWC`` output)."""
        embed = self.proxy.patch_embed
        return embed, lambda pixels: tuple(embed(pixels).shape[1:3])

    def proxy_features(self, pixels: Tensor) -> Tensor:
        """``[B, C, H, W]`` the proxy's last-block patch tokens through its final norm, on
        CLIP's pixels renormalised to the proxy's mean and std."""
        cfg, proxy_cfg = self.clip.visual.preprocess_cfg, self.proxy.pretrained_cfg
        raw = pixels * _channels(cfg["std"], pixels) + _channels(cfg["mean"], pixels)
        x = (raw - _channels(proxy_cfg["mean"], raw)) / _channels(proxy_cfg["std"], raw)
        x = x.to(next(self.proxy.parameters()))
        out = self.proxy.forward_intermediates(x, indices=1, norm=True, output_fmt="NCHW",
                                               intermediates_only=True)
        return out[-1]

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        visual = self.visual
        *first, last = visual.transformer.resblocks
        x = self.clip.embeds(pixels)
        for block in first:
            x = block(x)
        attention = proxy_attention(self.proxy_features(pixels)).to(x)
        patches = proxy_branch(last, x, self.clip.grid, attention, self.grid)
        pooled, _ = visual._pool(last(x))
        pooled = pooled @ visual.proj if visual.proj is not None else pooled
        return self.clip.norm(patches), pooled
