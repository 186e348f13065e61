"""Text-conditioned attention pooling (ConceptOT Sec. 3.2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from otviz.methods.base import Alignment, DensePlan, MethodConfig, PairBatch, register
from otviz.methods.masses import uniform_masses
from otviz.methods.projected import ProjectedMethod, build_alignment
from otviz.ot.costs import cosine_similarity
from otviz.ot.sinkhorn import NEG


@register
class TextAttn(ProjectedMethod):
    """Each token attends over the valid patches, ``A_ij = softmax_i(z_i . y_j / T)``, pools
    ``o_j = sum_i A_ij z_i`` and is scored by ``cos(y_j, o_j)``; ``s_l`` averages that over
    the valid tokens. The plan is ``A_ij / M_valid`` (each token's attention, uniformly
    weighted). The temperature ``T`` (``config.extra['attn_temperature']``, default 0.07)
    is learned in log space when the method is trainable."""

    name = "text_attn"
    label = "Text-Attn"
    order = 30
    paper = "ConceptOT Sec. 3.2"

    def __init__(self, patch_dim: int, token_dim: int, config: MethodConfig | None = None):
        super().__init__(patch_dim, token_dim, config)
        log_t = torch.tensor(math.log(self.config.extra.get("attn_temperature", 0.07)))
        self.log_temperature = nn.Parameter(log_t, requires_grad=self.config.trainable)

    def align(self, batch: PairBatch) -> Alignment:
        z, y = self.project(batch)
        logits = cosine_similarity(z, y) / self.log_temperature.exp()
        logits = logits.masked_fill(~batch.patch_mask[:, :, None], NEG)
        attn = torch.softmax(logits, dim=1)  # [B, N, M], columns sum to 1
        pooled = attn.transpose(1, 2) @ z  # [B, M, d]
        cos = F.cosine_similarity(pooled, y, dim=-1)
        weight = uniform_masses(batch.token_mask, z.dtype)
        score = (weight * cos).sum(1)
        plan = attn * weight[:, None, :]
        return build_alignment(batch, DensePlan(plan), score, col_marginal=weight)
