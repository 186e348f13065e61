"""MaskCLIP (Zhou, Loy and Dai, ECCV 2022, "Extract Free Dense Labels from CLIP"): a
training-free dense similarity map read from the last attention block's value path.

The query-key attention of the last block is dropped: each patch token ``x_i`` entering the
last block goes through that block's value and output projections alone, then the tower's
final LayerNorm and projection,

    f_i = proj( ln_post( W_o (W_v ln_1(x_i) + b_v) + b_o ) ),

and the map is the cosine ``<f_i / |f_i|, t>`` with the phrase's unit text embedding ``t``
(signed; a grounding box keeps the positive part). No gradient is taken. On other transformer
towers the same: the last block's attention branch with the attention map replaced by the
identity (each token reads its own value), then the tower's per-position readout: the
attention pooler's value path on CoCa, the trunk's final norm and head per position on timm
ViTs such as SigLIP and EVA
(:meth:`~otviz.explainers.attention.AttentionReader.value_patches`).

On a ModifiedResNet tower (MaskCLIP's ResNet recipe, Sec. 3.2) ``f_i`` is the attention
pool's value and output projections of each position of the last stage's map,
``c_proj(v_proj(x_i))``: the training-free projection of the ResNet tower adapter
(:class:`otviz.towers.resnet.ResNetTower`), used as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.explainers.attention import attention_reader
from otviz.explainers.base import PhraseExplainer, register_explainer
from otviz.towers import image_tower
from otviz.towers.resnet import ResNetTower


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
            attention_reader(self.model, self.label)

    @torch.no_grad()
    def patch_embeddings(self, pixels: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """``([B, N, E], grid)`` the value-path embeddings ``f_i`` of the patches (module
        docstring) and the grid they lie on."""
        resnet = self._resnet()
        if resnet is not None:
            return resnet.project(resnet.encode(pixels)[0]), resnet.grid
        reader = attention_reader(self.model, self.label)
        return reader.value_patches(pixels), reader.grid

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        f, grid = self.patch_embeddings(pixels)
        f = F.normalize(f, dim=-1)
        heat = (f * text.to(f)[:, None]).sum(-1)
        return heat.reshape(heat.shape[0], *grid)
