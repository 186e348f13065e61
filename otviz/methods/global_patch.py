"""Global+Patch baseline (ConceptOT Sec. 3.2): mean patch-token cosine as the local score."""

from __future__ import annotations

from otviz.methods.base import Alignment, PairBatch, register
from otviz.methods.projected import ProjectedMethod, build_alignment, uniform_plan


@register
class GlobalPatch(ProjectedMethod):
    """``s_l = mean_{i, j valid} z_i . y_j``: the cosine averaged over all valid pairs, i.e.
    Eq. 8 with the uniform product plan. Computed as ``mean(z) . mean(y)`` in
    ``O((N + M) d)``; the plan is that uniform product plan."""

    name = "global_patch"
    label = "Global+Patch"
    order = 10
    paper = "ConceptOT Sec. 3.2"
    flat_map = ("flat by construction: its plan is the uniform product plan (the mean "
                "patch-token cosine), every patch carries the same mass, so its map cannot "
                "point")

    def align(self, batch: PairBatch) -> Alignment:
        z, y = self.project(batch)
        plan = uniform_plan(batch)
        z_mean = (plan.row[:, :, None] * z).sum(1)
        y_mean = (plan.col[:, :, None] * y).sum(1)
        score = (z_mean * y_mean).sum(-1)
        return build_alignment(batch, plan, score, row_marginal=plan.row, col_marginal=plan.col)
