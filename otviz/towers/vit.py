"""open_clip's own VisionTransformer, pooled by class token, by mean, or by attention pool.

Patch tokens are the last block's tokens with the class token dropped. Width space: after
the tower's final norm (``ln_post``) for class-token and mean pooling; for attention-pooled
towers (CoCa: ``attn_pool`` then ``ln_post`` then ``proj``) after the pooler's key norm
``ln_k``, the norm the pooler applies to the tokens it reads. Projected space: ``@ proj``;
for an attention-pooled tower each token goes through the pooler's value and output
projections first (:func:`value_path`), which is what the pooler returns for a query that
attends to that one token alone (MaskCLIP, Zhou et al. 2022, Sec. 3.2), then ``ln_post``.
"""

from __future__ import annotations

from collections.abc import Callable

from open_clip.transformer import AttentionalPooler, VisionTransformer
from torch import Tensor, nn
from torch.nn import functional as F

from otviz.tiny_clip.conv_stem import ConvStem
from otviz.towers.base import ImageTower, register_image_tower


def value_path(attention: nn.MultiheadAttention, x: Tensor) -> Tensor:
    """``out_proj(v_proj(x))``: multi-head attention's output for one token that attends
    only to itself (softmax over a single key is 1), per position (MaskCLIP Sec. 3.2)."""
    e = attention.embed_dim
    weight = (attention.in_proj_weight[2 * e :] if attention._qkv_same_embed_dim
              else attention.v_proj_weight)
    bias = attention.in_proj_bias[2 * e :] if attention.in_proj_bias is not None else None
    return attention.out_proj(F.linear(x, weight, bias))


def _through_pooler(pooler: AttentionalPooler, x: Tensor) -> Tensor:
    return value_path(pooler.attn, pooler.ln_k(x))


@register_image_tower(VisionTransformer)
class VitTower(ImageTower):
    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.visual.grid_size)  # type: ignore[return-value]

    @property
    def width(self) -> int:
        return int(self.visual.conv1.out_channels)

    @property
    def embed_dim(self) -> int:
        return int(self.visual.output_dim)

    @property
    def family(self) -> str:
        if self.visual.attn_pool is None:
            return "open_clip ViT"
        return "attention-pooled open_clip ViT (CoCa)"

    def stem(self, pixels: Tensor) -> Tensor:
        """The patch embedding's output per patch; for otviz's convolutional stem its
        low-level features (:meth:`otviz.tiny_clip.conv_stem.ConvStem.low_level`)."""
        if isinstance(self.visual.conv1, ConvStem):
            return self.visual.conv1.low_level(pixels).flatten(2).transpose(1, 2)
        return super().stem(pixels)

    def _spatial_path(self) -> tuple[nn.Module, Callable[[Tensor], tuple[int, int]]]:
        """The patch embedding (or otviz's convolutional stem) places the tokens; the
        transformer after it mixes them without moving them."""
        conv1 = self.visual.conv1
        return conv1, lambda pixels: tuple(conv1(pixels).shape[-2:])

    def encode(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        out = self.visual.forward_intermediates(pixels, indices=1, output_fmt="NLC")
        return self.norm(out["image_intermediates"][-1]), out["image_features"]

    def norm(self, x: Tensor) -> Tensor:
        """Block-output tokens ``[B, T, D]`` -> the width space of :meth:`encode`'s patches."""
        v = self.visual
        if v.attn_pool is not None and v.attn_pool_contrastive is None:
            return v.attn_pool.ln_k(x)  # CoCa: ln_post acts after the pool, at its width
        return v.ln_post(x)

    def project(self, patches: Tensor) -> Tensor:
        v = self.visual
        if v.attn_pool is None:
            x = patches
        elif v.attn_pool_contrastive is None:  # CoCa: attn_pool -> ln_post -> proj
            x = v.ln_post(value_path(v.attn_pool.attn, patches))
        elif v.attn_pool_type == "parallel":
            x = _through_pooler(v.attn_pool_contrastive, patches)
        else:  # cascade: the contrastive pooler reads the first pooler's output
            x = _through_pooler(v.attn_pool_contrastive, _through_pooler(v.attn_pool, patches))
        return x @ v.proj if v.proj is not None else x
