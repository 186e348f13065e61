"""timm image towers (open_clip's ``TimmModel``): EVA, SigLIP / SigLIP 2, PE, ConvNeXt,
ViTamin, MobileCLIP, ...

Patch tokens come from timm's ``forward_intermediates`` (last stage, the trunk's final norm
applied, prefix tokens dropped), as an ``NCHW`` map read row-major; where the trunk's
features end in a layer the intermediates skip (FastViT's / MobileCLIP's ``final_conv``),
that layer is applied to the map. Projected space: the
tower's head applied to each position as if that position were the whole image: the
trunk's ``forward_head`` on a one-position input (a ``1 x 1`` map for convolutional
trunks; for token trunks one copy of the token in every prefix and patch slot), then
open_clip's adapter head (``linear`` / ``mlp`` projection or attention pool). Every pooling
(class token, mean, global average) returns that position's features unchanged; an attention
pool over one key returns its value and output projections of that token (MaskCLIP, Zhou et
al. 2022, Sec. 3.2), and a head norm or MLP then acts per position.
"""

from __future__ import annotations

from open_clip.timm_model import TimmModel
from torch import Tensor

from otviz.towers.base import ImageTower, register_image_tower


@register_image_tower(TimmModel)
class TimmTower(ImageTower):
    @property
    def image_size(self) -> tuple[int, int]:
        return tuple(self.visual.image_size)  # type: ignore[return-value]

    @property
    def family(self) -> str:
        return f"timm {type(self.visual.trunk).__name__}"

    def encode(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        _, patches, pooled = self._grid_forward(pixels)
        return patches, pooled

    def _grid_forward(self, pixels: Tensor) -> tuple[tuple[int, int], Tensor, Tensor]:
        out = self.visual.forward_intermediates(pixels, indices=1, normalize_intermediates=True)
        spatial = out["image_intermediates"][-1]  # [B, C, h, w]
        final_conv = getattr(self.visual.trunk, "final_conv", None)
        if final_conv is not None:  # FastViT: its final conv follows the last stage's output
            spatial = final_conv(spatial)
        grid = (int(spatial.shape[2]), int(spatial.shape[3]))
        return grid, spatial.flatten(2).transpose(1, 2), out["image_features"]

    def project(self, patches: Tensor) -> Tensor:
        trunk = self.visual.trunk
        B, N, C = patches.shape
        flat = patches.reshape(B * N, C)
        prefix = getattr(trunk, "num_prefix_tokens", None)
        if prefix is None:  # convolutional trunk: a 1 x 1 map
            one = flat[:, :, None, None]
        else:  # token trunk: the token in every slot, so any pooling returns it
            one = flat[:, None, :].expand(-1, prefix + 1, -1)
        out = self.visual.head(trunk.forward_head(one))
        return out.reshape(B, N, -1)
