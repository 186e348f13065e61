"""Dense unbalanced OT with learned masses (ConceptOT Eq. 1-3, Eq. 8 in dense form)."""

from __future__ import annotations

from otviz.methods.base import Alignment, MethodConfig, PairBatch, register
from otviz.methods.masses import ReferenceMasses
from otviz.methods.projected import ProjectedMethod, cosine_ot_alignment
from otviz.ot import UnbalancedSettings
from otviz.ot.costs import cosine_cost
from otviz.ot.unbalanced import solve_dense


@register
class DenseUOT(ProjectedMethod):
    """Generalized Sinkhorn (Eq. 3) on the full ``N x M`` Gibbs kernel, reference masses
    from softplus heads (Eq. 1-2; uniform when training-free), ``config.n_iters``
    iterations; score ``sum P_ij z_i.y_j / sum P_ij`` (Eq. 8)."""

    name = "dense_uot"
    label = "Dense UOT"
    order = 50
    paper_epochs = 3
    paper = "ConceptOT Eq. 1-3, 8"

    def __init__(self, patch_dim: int, token_dim: int, config: MethodConfig | None = None):
        super().__init__(patch_dim, token_dim, config)
        self.masses = ReferenceMasses(patch_dim, token_dim, self.config.trainable)

    def align(self, batch: PairBatch) -> Alignment:
        z, z_scale, y = self.project_scaled(batch)
        mu, nu = self.masses(batch)
        cfg = self.config
        settings = UnbalancedSettings(
            eps=cfg.eps, tau_a=cfg.tau_v, tau_b=cfg.tau_t, n_iters=cfg.n_iters,
            tol=None,  # the model's fixed L iterations
        )
        res = solve_dense(
            cosine_cost(z, y, z_scale), mu, nu, settings, batch.patch_mask, batch.token_mask
        )
        return cosine_ot_alignment(batch, res, mu, nu)
