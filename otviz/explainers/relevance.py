"""Chefer et al.'s gradient-weighted attention relevance (Chefer, Gur & Wolf, ICCV 2021,
"Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder
Transformers", Eq. 5-6 for self-attention), as its authors apply it to CLIP's image tower.

With ``s`` the final image-phrase similarity and ``A^l`` layer ``l``'s attention map:

    Abar^l = mean_heads ReLU(ds/dA^l * A^l)            (Eq. 5, ``*`` elementwise)
    R      = prod_l (I + Abar^l),  R <- R + Abar^l R  in layer order   (Eq. 6, from R = I)

and the map is the row of ``R`` of the pooled token (the class token; for a mean-pooled tower
the mean of the patch rows) over the patch columns, min-max scaled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.explainers.base import PhraseExplainer, min_max, register_explainer
from otviz.explainers.towers import pooled_embedding, vit_blocks, vit_tower


@register_explainer
class CheferExplainer(PhraseExplainer):
    name = "chefer"
    label = "Chefer relevance"
    source = "Chefer, Gur & Wolf, ICCV 2021 (gradient-weighted attention rollout)"

    def check(self) -> None:
        vit_tower(self.model, self.label)

    def relevance(self, pixels: Tensor, text: Tensor) -> Tensor:
        """``[B, T, T]`` the relevance matrix ``R`` (module docstring)."""
        visual = vit_tower(self.model, self.label)
        with torch.enable_grad():
            tokens, maps = vit_blocks(visual, pixels.detach().requires_grad_(True))
            emb = F.normalize(pooled_embedding(visual, tokens[-1]), dim=-1)
            grads = torch.autograd.grad((emb * text.to(emb)).sum(), maps)
        b, _, t, _ = maps[0].shape
        r = torch.eye(t, dtype=maps[0].dtype, device=maps[0].device).expand(b, t, t)
        for a, g in zip(maps, grads, strict=True):
            r = r + (g * a.detach()).clamp_min(0).mean(1) @ r
        return r

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        visual = vit_tower(self.model, self.label)
        h, w = visual.grid_size
        r = self.relevance(pixels, text)[:, :, -h * w :]
        row = r[:, 0] if visual.pool_type == "tok" else r[:, -h * w :].mean(1)
        return min_max(row).reshape(-1, h, w)
