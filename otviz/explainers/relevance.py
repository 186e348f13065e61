"""Chefer et al.'s gradient-weighted attention relevance (Chefer, Gur & Wolf, ICCV 2021,
"Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder
Transformers", Eq. 5-6 for self-attention), as its authors apply it to CLIP's image tower.

With ``s`` the final image-phrase similarity and ``A^l`` layer ``l``'s attention map:

    Abar^l = mean_heads ReLU(ds/dA^l * A^l)            (Eq. 5, ``*`` elementwise)
    R      = prod_l (I + Abar^l),  R <- R + Abar^l R  in layer order   (Eq. 6, from R = I)

and the map is the row of ``R`` of the pooled output over the patch columns, min-max scaled
(:meth:`~otviz.towers.facts.AttentionReader.pooled_row`, the tower adapter's
:meth:`~otviz.towers.base.ImageTower.attention_reader`): the class token's row; for
a mean-pooled tower the mean of the patch rows; for an attention pooler (CoCa, SigLIP) the
rows mixed by the pooler's head-mean attention weights over the tokens, the one attention
step the pooled output takes beyond the blocks (read as in attention rollout, without a
gradient weight).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.explainers.base import PhraseExplainer, min_max, register_explainer


@register_explainer
class CheferExplainer(PhraseExplainer):
    name = "chefer"
    label = "Chefer relevance"
    source = "Chefer, Gur & Wolf, ICCV 2021 (gradient-weighted attention rollout)"

    def check(self) -> None:
        self.asked(self.tower.attention_reader)

    def relevance(self, pixels: Tensor, text: Tensor) -> tuple[Tensor, Tensor]:
        """``(R [B, T, T], tokens [B, T, D])``: the relevance matrix (module docstring) and
        the last layer's tokens (what the pooling reads)."""
        reader = self.asked(self.tower.attention_reader)
        with torch.enable_grad():
            trace = reader.trace(pixels.detach().requires_grad_(True))
            emb = F.normalize(reader.readout(trace.tokens[-1]), dim=-1)
            grads = torch.autograd.grad((emb * text.to(emb)).sum(), trace.maps)
        maps = trace.maps
        b, _, t, _ = maps[0].shape
        r = torch.eye(t, dtype=maps[0].dtype, device=maps[0].device).expand(b, t, t)
        for a, g in zip(maps, grads, strict=True):
            r = r + (g * a.detach()).clamp_min(0).mean(1) @ r
        return r, trace.tokens[-1].detach()

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        reader = self.asked(self.tower.attention_reader)
        h, w = reader.grid
        r, tokens = self.relevance(pixels, text)
        return min_max(reader.pooled_row(tokens, r)[:, -h * w :]).reshape(-1, h, w)
