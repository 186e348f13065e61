"""QC-Align: CAME quotas + quota-calibrated OT (QCT), with the Sinkhorn-divergence QCT loss.

Per pair: CAME (:mod:`otviz.ot.came`) estimates the patch quotas ``mu`` and token quotas
``nu`` from the projected features, parameter-free; QCT solves entropic OT with the hard
marginals ``Pi 1 = mu``, ``Pi^T 1 = nu`` under the cost ``1 - cos``. The paper uses QC-Align
only as a training regulariser (``L = L_global + lambda L_QCT``, :meth:`QCAlign.qct_loss`);
for the shared contract its plan is also the alignment, scored like the other OT methods by
the plan-weighted cosine ``sum Pi_ij cos_ij`` (= ``1 - W_cross``, the plan has unit mass).

Heatmap readout: at QC-Align's ``eps = 0.5`` the plan stays close to the independent
coupling ``mu nu^T`` (the entropic solution of QC-Align Eq. (QCT) tends to it as eps grows),
so summing plan columns would only redraw the quota map ``mu``. The phrase heatmap
(:meth:`Alignment.heatmap`) is therefore read from the plan relative to its marginals,

    h_i(J) = sum_{j in J} Pi_ij / (mu_i nu_j),

the density of ``Pi`` against ``mu nu^T`` (1 where the plan is independent, above 1 where
patch ``i`` and token ``j`` are coupled more than their quotas alone imply), summed over the
phrase's tokens ``J`` (:func:`relative_plan`). ``mu`` itself is shown separately as the
quota map (``Alignment.row_reference``).

Settings: ``config.eps`` and ``config.n_iters`` drive every Sinkhorn solve (the paper uses
``eps = 0.5``, ``lambda = 0.5``); ``config.extra`` may hold ``came_temperature`` (default 1,
the paper's plain softmax; lower values make the quotas less uniform) and
``came_negative_slope`` (default 0.01), see :func:`otviz.ot.came.came_marginals`.

CAME has no parameters, so its temperature can change at inference for a trained head as
well (:meth:`QCAlign.with_came_temperature`); the head's projections were trained under its
own temperature (``came_temperature`` of its training config, ``--came-temperature``), so
another one scores the pair with quotas the head never saw in training.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import Tensor

from otviz.methods.base import QCT, Alignment, DensePlan, PairBatch, register
from otviz.methods.masses import max_over_uniform, uniform_masses
from otviz.methods.projected import (
    ProjectedMethod,
    dense_plan_alignment,
    fixed_count,
    masked_similarity,
)
from otviz.ot._knobs import check_number
from otviz.ot.came import CameResult, solve_came
from otviz.ot.divergence import sinkhorn_divergence
from otviz.ot.unbalanced import solve_dense


def relative_plan(plan: Tensor, mu: Tensor, nu: Tensor) -> Tensor:
    """``[B, N, M]`` ``Pi_ij / (mu_i nu_j)``: the plan's density against the independent
    coupling of its marginals (QC-Align Sec. 3: ``Pi 1 = mu``, ``Pi^T 1 = nu``), 0 where a
    quota is 0 (masked patches / tokens)."""
    outer = mu[:, :, None] * nu[:, None, :]
    positive = outer > 0
    return torch.where(positive, plan / torch.where(positive, outer, 1.0), 0.0)


@register
class QCAlign(ProjectedMethod):
    """Quota-calibrated OT with CAME marginals (QC-Align)."""

    name = "qc_align"
    label = "QC-Align"
    order = 70
    paper_epochs = 3
    local_objective = QCT
    uses_came = True
    reference_label = "CAME quota map mu"
    paper = "QC-Align"

    @classmethod
    def train_settings(cls, config: Any) -> dict[str, Any]:
        """QC-Align's own Sinkhorn entropy (``qc_eps``, the paper's 0.5) and the CAME
        temperature it trains with."""
        return {"eps": config.qc_eps, "extra": {"came_temperature": config.came_temperature}}

    @property
    def came_temperature(self) -> float:
        """CAME's softmax temperature (``config.extra["came_temperature"]``, default 1)."""
        temperature = self.config.extra.get("came_temperature", 1.0)
        check_number("came_temperature", temperature, self.name, above=0.0)
        return float(temperature)

    @property
    def came_negative_slope(self) -> float:
        """The slope of CAME's leaky-ReLU (``config.extra["came_negative_slope"]``, default
        0.01; finite, >= 0)."""
        slope = self.config.extra.get("came_negative_slope", 0.01)
        check_number("came_negative_slope", slope, self.name, at_least=0.0)
        return float(slope)

    def with_came_temperature(self, temperature: float) -> QCAlign:
        """This method with CAME's softmax at ``temperature`` (> 0), sharing its projections
        (trained or identity; CAME itself has no parameters)."""
        check_number("came_temperature", temperature, self.name, above=0.0)
        clone = copy.copy(self)
        extra = {**self.config.extra, "came_temperature": float(temperature)}
        clone.config = dataclasses.replace(self.config, extra=extra)
        return clone

    def _quotas(self, z: Tensor, y: Tensor, batch: PairBatch) -> CameResult:
        return solve_came(
            z,
            y,
            batch.patch_mask,
            batch.token_mask,
            negative_slope=self.came_negative_slope,
            temperature=self.came_temperature,
        )

    def align(self, batch: PairBatch) -> Alignment:
        z, y = self.project(batch)
        came = self._quotas(z, y, batch)
        sim = masked_similarity(z, y, batch, 0.0)
        res = solve_dense(
            1.0 - sim, came.mu, came.nu, fixed_count(self.config), batch.patch_mask,
            batch.token_mask,
        )
        out = dense_plan_alignment(batch, res.plan, sim, came.mu, came.nu, res.marginal_error)
        out.readout = DensePlan(relative_plan(res.plan, came.mu, came.nu))
        out.extras.update(
            quota_max_over_uniform=max_over_uniform(came.mu, batch.patch_mask),
            came_attention_t2v=came.attn_t2v,
            came_attention_v2t=came.attn_v2t,
            came_weight_token=came.weight_t,
            came_weight_patch=came.weight_v,
        )
        return out

    def qct_loss(self, batch: PairBatch) -> Tensor:
        """Batch mean of ``L_QCT = W_cross - (W_vv + W_tt) / 2`` (QC-Align, design 3): the
        cross term under the CAME quotas, the self terms under uniform marginals, every
        ``W = <Pi*, C>`` with ``C = 1 - cos``. Differentiable through CAME and Sinkhorn."""
        z, y = self.project(batch)
        came = self._quotas(z, y, batch)
        div = sinkhorn_divergence(
            z,
            y,
            came.mu,
            came.nu,
            self.config.eps,
            n_iters=self.config.n_iters,
            tol=None,  # the model's fixed iteration count
            x_mask=batch.patch_mask,
            y_mask=batch.token_mask,
            a_self=uniform_masses(batch.patch_mask, z.dtype),
            b_self=uniform_masses(batch.token_mask, y.dtype),
        )
        return div.value.mean()
