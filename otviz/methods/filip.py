"""FILIP late interaction (ConceptOT Sec. 3.2): per-token maximum over patches."""

from __future__ import annotations

from otviz.methods.base import Alignment, PairBatch, register
from otviz.methods.masses import uniform_masses
from otviz.methods.projected import (
    AssignmentPlan,
    ProjectedMethod,
    build_alignment,
    masked_similarity,
)


@register
class Filip(ProjectedMethod):
    """``s_l = mean_{j valid} max_{i valid} z_i . y_j``.

    The plan puts token ``j``'s uniform weight ``1 / M_valid`` on its best patch (one-hot
    argmax), so Eq. 8 on the plan gives the score back and a phrase heatmap marks the
    patches its tokens picked."""

    name = "filip"
    label = "FILIP"
    order = 20
    paper = "ConceptOT Sec. 3.2 (FILIP)"

    def align(self, batch: PairBatch) -> Alignment:
        z, z_scale, y = self.project_scaled(batch)
        sim = masked_similarity(z, y, batch, fill=-float("inf"), z_scale=z_scale)
        best, index = sim.max(1)  # [B, M]
        weight = uniform_masses(batch.token_mask, z.dtype)
        score = (weight * best.masked_fill(~batch.token_mask, 0.0)).sum(1)
        plan = AssignmentPlan(index, weight, z.shape[1])
        return build_alignment(batch, plan, score, col_marginal=weight)
