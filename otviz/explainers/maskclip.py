"""MaskCLIP (Zhou, Loy and Dai, ECCV 2022, "Extract Free Dense Labels from CLIP"): a
training-free dense similarity map read from the last attention block's value path.

The query-key attention of the last block is dropped: each patch token ``x_i`` entering the
last block goes through that block's value and output projections alone, then the tower's
final LayerNorm and projection,

    f_i = proj( ln_post( W_o (W_v ln_1(x_i) + b_v) + b_o ) ),

and the map is the cosine ``<f_i / |f_i|, t>`` with the phrase's unit text embedding ``t``
(signed; a grounding box keeps the positive part). No gradient is taken.

On a ModifiedResNet tower (MaskCLIP's ResNet recipe, Sec. 3.2) ``f_i`` is the attention
pool's value and output projections of each position of the last stage's map,
``c_proj(v_proj(x_i))``: the training-free projection of the ResNet tower adapter
(:class:`otviz.towers.resnet.ResNetTower`), used as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.explainers.base import PhraseExplainer, register_explainer
from otviz.explainers.towers import block_forward, vit_tower
from otviz.towers import image_tower
from otviz.towers.resnet import ResNetTower
from otviz.towers.vit import value_path


@register_explainer
class MaskClipExplainer(PhraseExplainer):
    name = "maskclip"
    label = "MaskCLIP"
    source = ("Zhou, Loy & Dai, ECCV 2022 (value projection of the last block; of the "
              "attention pool on ResNets)")

    def _resnet(self) -> ResNetTower | None:
        tower = image_tower(self.model)
        return tower if isinstance(tower, ResNetTower) else None

    def check(self) -> None:
        if self._resnet() is None:
            vit_tower(self.model, self.label)

    @torch.no_grad()
    def patch_embeddings(self, pixels: Tensor) -> Tensor:
        """``[B, N, E]`` the value-path embeddings ``f_i`` of the patches (module docstring)."""
        resnet = self._resnet()
        if resnet is not None:
            return resnet.project(resnet.encode(pixels)[0])
        visual = vit_tower(self.model, self.label)
        *first, last = visual.transformer.resblocks
        x = visual._embeds(pixels)
        for block in first:
            x, _ = block_forward(block, x)
        f = visual.ln_post(last.ls_1(value_path(last.attn, last.ln_1(x)))) @ visual.proj
        return f[:, -visual.grid_size[0] * visual.grid_size[1] :]

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        resnet = self._resnet()
        grid = resnet.grid if resnet is not None else vit_tower(self.model, self.label).grid_size
        f = F.normalize(self.patch_embeddings(pixels), dim=-1)
        heat = (f * text.to(f)[:, None]).sum(-1)
        return heat.reshape(heat.shape[0], *grid)
