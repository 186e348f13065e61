"""Balanced entropic OT between patches and tokens (ConceptOT Sec. 3.2)."""

from __future__ import annotations

from otviz.methods.base import Alignment, PairBatch, register
from otviz.methods.masses import uniform_masses
from otviz.methods.projected import ProjectedMethod, cosine_ot_alignment, fixed_count
from otviz.ot.costs import cosine_cost
from otviz.ot.unbalanced import solve_dense


@register
class BalancedOT(ProjectedMethod):
    """Entropic OT with hard uniform marginals over the valid patches and tokens, cost
    ``1 - z_i . y_j``, ``config.n_iters`` Sinkhorn iterations at ``config.eps``; score
    ``sum P_ij z_i.y_j / sum P_ij`` (Eq. 8, dense form)."""

    name = "balanced_ot"
    label = "Balanced OT"
    order = 40
    paper_epochs = 3
    paper = "ConceptOT Sec. 3.2"

    def align(self, batch: PairBatch) -> Alignment:
        z, z_scale, y = self.project_scaled(batch)
        a = uniform_masses(batch.patch_mask, z.dtype)
        b = uniform_masses(batch.token_mask, z.dtype)
        res = solve_dense(
            cosine_cost(z, y, z_scale), a, b, fixed_count(self.config), batch.patch_mask,
            batch.token_mask,
        )
        return cosine_ot_alignment(batch, res, a, b)
