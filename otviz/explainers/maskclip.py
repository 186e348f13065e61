"""MaskCLIP (Zhou, Loy and Dai, ECCV 2022, "Extract Free Dense Labels from CLIP"): a
training-free dense similarity map read from the last attention block's value path.

The map is the cosine ``<f_i / |f_i|, t>`` between each patch's ``maskclip`` feature ``f_i``
in the joint space and the phrase's unit text embedding ``t`` (signed; a grounding box keeps
the positive part). No gradient is taken. ``f_i`` is the image tower's ``maskclip`` feature
source (:mod:`otviz.towers.dense`), re-run from the model's current weights at every call:
on a ViT the last block's attention replaced by the identity, so each patch token ``x_i``
entering it goes through that block's value and output projections, keeps the block's
residual and feed-forward, then the tower's final norm and projection,

    z_i = x_i + W_o (W_v ln_1(x_i) + b_v) + b_o,
    f_i = proj( ln_post( z_i + mlp(ln_2(z_i)) ) ),

as the authors' code computes it (chongzhou96/MaskCLIP, ``mmseg/models/backbones/vit.py``
L96-104 and L434-437, ``mmseg/models/decode_heads/maskclip_head.py`` L80); the attention
pooler's value path after that on CoCa, the trunk's final norm and head per position on
timm ViTs such as SigLIP and EVA. On a ModifiedResNet tower (MaskCLIP's ResNet recipe,
Sec. 3.2; ``maskclip_head.py`` L111-116) the attention pool's value and output projections
of each position of the last stage's map, ``c_proj(v_proj(x_i))``. The explainer reads that
source whatever source the backbone's methods read, at the backbone's input size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.errors import UserInputError
from otviz.explainers.base import ExplainerUnsupportedError, PhraseExplainer, register_explainer
from otviz.towers.sources import FeatureSource

MASKCLIP = FeatureSource("maskclip")


@register_explainer
class MaskClipExplainer(PhraseExplainer):
    name = "maskclip"
    label = "MaskCLIP"
    source = ("Zhou, Loy & Dai, ECCV 2022 (value path of the last block, its residual and "
              "feed-forward kept; of the attention pool on ResNets)")

    def check(self) -> None:
        try:
            self.tower.check_source(MASKCLIP)
        except UserInputError as e:
            raise ExplainerUnsupportedError(
                f"{self.label} reads the maskclip source of a ViT or ResNet tower: {e}") from None

    @torch.no_grad()
    def patch_embeddings(self, pixels: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """``([B, N, E], grid)`` the value-path embeddings ``f_i`` of the patches (module
        docstring) and the grid they lie on."""
        self.check()
        patches, _ = self.tower.encode(pixels, MASKCLIP)
        return self.tower.project(patches), self.tower.grid

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        f, grid = self.patch_embeddings(pixels)
        f = F.normalize(f, dim=-1)
        heat = (f * text.to(f)[:, None]).sum(-1)
        return heat.reshape(heat.shape[0], *grid)
