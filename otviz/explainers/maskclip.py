"""MaskCLIP (Zhou, Loy and Dai, ECCV 2022, "Extract Free Dense Labels from CLIP"): a
training-free dense similarity map read from the last attention block's value path.

The query-key attention of the last block is dropped: each patch token ``x_i`` entering the
last block goes through that block's value and output projections alone, then the tower's
final LayerNorm and projection,

    f_i = proj( ln_post( W_o (W_v ln_1(x_i) + b_v) + b_o ) ),

and the map is the cosine ``<f_i / |f_i|, t>`` with the phrase's unit text embedding ``t``
(signed; a grounding box keeps the positive part). No gradient is taken.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.explainers.base import PhraseExplainer, register_explainer
from otviz.explainers.towers import block_forward, vit_tower


@register_explainer
class MaskClipExplainer(PhraseExplainer):
    name = "maskclip"
    label = "MaskCLIP"
    source = "Zhou, Loy & Dai, ECCV 2022 (value projection of the last block)"

    @torch.no_grad()
    def patch_embeddings(self, pixels: Tensor) -> Tensor:
        """``[B, N, E]`` the value-path embeddings ``f_i`` of the patches (module docstring)."""
        visual = vit_tower(self.model, self.label)
        *first, last = visual.transformer.resblocks
        x = visual._embeds(pixels)
        for block in first:
            x, _ = block_forward(block, x)
        mha = last.attn
        d = x.shape[-1]
        v = F.linear(last.ln_1(x), mha.in_proj_weight[2 * d :], mha.in_proj_bias[2 * d :])
        f = visual.ln_post(last.ls_1(mha.out_proj(v))) @ visual.proj
        return f[:, -visual.grid_size[0] * visual.grid_size[1] :]

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        visual = vit_tower(self.model, self.label)
        f = F.normalize(self.patch_embeddings(pixels), dim=-1)
        heat = (f * text.to(f)[:, None]).sum(-1)
        return heat.reshape(heat.shape[0], *visual.grid_size)
