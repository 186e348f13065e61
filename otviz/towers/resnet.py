"""open_clip's ModifiedResNet (OpenAI's RN50, RN101, RN50x4, ...).

Patch tokens are the positions of the last stage's feature map (``layer4``, stride 32:
a 7 x 7 grid at 224 px), channels as width; the network has no final norm, so the width
space is that map as is. The tower pools it with a QKV attention pool (``attnpool``), whose
query is the mean of the map. Projected space, as MaskCLIP does for ResNet CLIPs (Zhou et
al. 2022, Sec. 3.2): each position through the attention pool's value and output
projections, ``c_proj(v_proj(x))``, i.e. the pool's output for a query that attends to that
position alone (positional embedding not added, as in MaskCLIP). So the ``maskclip`` source
of this family is its ``last`` source read as ever; ``layer:K`` is refused (the stages'
maps have other widths and no final norm or projection reads them).
"""

from __future__ import annotations

from open_clip.modified_resnet import ModifiedResNet
from torch import Tensor, nn
from torch.nn import functional as F

from otviz.towers.base import ImageTower, register_image_tower
from otviz.towers.facts import CamTarget
from otviz.towers.sources import FeatureSource


@register_image_tower(ModifiedResNet)
class ResNetTower(ImageTower):
    @property
    def grid(self) -> tuple[int, int]:
        side = int(self.visual.attnpool.positional_embedding.shape[0] - 1) ** 0.5
        return (int(side), int(side))

    @property
    def width(self) -> int:
        return int(self.visual.attnpool.v_proj.in_features)

    @property
    def embed_dim(self) -> int:
        return int(self.visual.output_dim)

    def sources(self) -> tuple[str, ...]:
        return ("last", "maskclip")

    def cam_target(self) -> CamTarget:
        return CamTarget(self.visual.layer4, None)  # the last conv stage, before the pool

    def randomisation_blocks(self) -> list[nn.Module]:
        v = self.visual
        return [v.layer1, v.layer2, v.layer3, v.layer4]

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        _, patches, pooled = self._grid_forward(pixels)
        return patches, pooled

    def _grid_forward(self, pixels: Tensor) -> tuple[tuple[int, int], Tensor, Tensor]:
        out = self.visual.forward_intermediates(pixels, indices=1)
        spatial = out["image_intermediates"][-1]  # [B, C, h, w]
        grid = (int(spatial.shape[2]), int(spatial.shape[3]))
        return grid, spatial.flatten(2).transpose(1, 2), out["image_features"]

    def project(self, patches: Tensor) -> Tensor:
        pool = self.visual.attnpool
        return pool.c_proj(F.linear(patches, pool.v_proj.weight, pool.v_proj.bias))
