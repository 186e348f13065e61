"""Debiased Sinkhorn divergence ``S = W_xy - (W_xx + W_yy) / 2`` (QC-Align, QCT loss).

QC-Align's ``L_QCT = W_cross - (W_vv + W_tt) / 2`` with ``W = <Pi*, C>``, ``Pi*`` the entropic
plan under the cosine cost ``C = 1 - cos``: the cross term uses the CAME quotas, the two
self-transport terms uniform marginals. Subtracting the self terms removes the reward for
collapsing all features onto one point.

Two readings of ``W`` are offered:

* ``"sharp"`` (QC-Align's): ``W = <P*, C>``, the linear cost of the entropic plan;
* ``"entropic"``: ``W = <P*, C> + eps KL(P* || a b^T)``, the entropic OT value ``OT_eps`` of
  Feydy et al. (2019), for which ``S >= 0`` with equality iff the two measures coincide
  (the Gaussian-kernel case: ``1 - cos`` is half the squared distance on the sphere), when
  the self terms use the cross term's own marginals.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.ot._checks import check_eps, check_tensors, clean_clouds, clean_masses
from otviz.ot._knobs import check_choice, per_problem
from otviz.ot._result import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TOL,
    NotConvergedWarning,
    SolverResult,
    warn_unconverged,
)
from otviz.ot._settings import SinkhornSettings, settings_of
from otviz.ot.costs import COSINE_COST_SCALE, cosine_cost
from otviz.ot.sinkhorn import _transport_cost, sinkhorn_log

Objective = Literal["sharp", "entropic"]
OBJECTIVES: tuple[str, ...] = ("sharp", "entropic")


def _normalised_cosine_cost(x: Tensor, y: Tensor) -> Tensor:
    """``[B, N, M]`` cosine dissimilarity ``1 - cos(x_n, y_m)`` of raw features (QC-Align
    design 1)."""
    return cosine_cost(F.normalize(x, dim=-1), F.normalize(y, dim=-1))


def _entropy_term(plan: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``[B]`` generalized ``KL(P || a b^T) = sum P log(P / ab) - P + ab`` (0 log 0 = 0)."""
    ab = a[:, :, None] * b[:, None, :]
    ratio = torch.where(plan > 0, plan / ab.clamp_min(torch.finfo(plan.dtype).tiny), 1.0)
    return (plan * torch.log(ratio) - plan + ab).sum((1, 2))


def _ot_value(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    objective: Objective = "sharp",
    n_iters: int = DEFAULT_MAX_ITERS,
    tol: float | None = DEFAULT_TOL,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> tuple[Tensor, SolverResult]:
    """Entropic OT between ``a`` and ``b`` and its value ``W`` (``[B]``) under ``objective``
    (``n_iters`` / ``tol`` as :func:`otviz.ot.sinkhorn.sinkhorn_log`)."""
    res = sinkhorn_log(cost, a, b, eps, n_iters, tol, row_mask=row_mask, col_mask=col_mask)
    value = _transport_cost(res.plan, cost, row_mask, col_mask)
    if objective == "entropic":
        a0 = a if row_mask is None else a * row_mask.to(a.dtype)
        b0 = b if col_mask is None else b * col_mask.to(b.dtype)
        value = value + per_problem(eps, 1) * _entropy_term(res.plan, a0, b0)
    return value, res


@dataclass
class DivergenceResult:
    """Sinkhorn divergence of a batch of pairs.

    Attributes:
        value: ``[B]`` ``W_xy - (W_xx + W_yy) / 2``.
        cross, self_x, self_y: ``[B]`` the three OT values.
        plan: ``[B, N, M]`` cross plan.
        marginal_error: ``[B]`` the largest L1 marginal error of the three solves.
        relative_error: ``[B]`` the largest relative error of the three solves.
        converged: ``[B]`` bool, whether all three solves met their tolerance.
    """

    value: Tensor
    cross: Tensor
    self_x: Tensor
    self_y: Tensor
    plan: Tensor
    marginal_error: Tensor
    relative_error: Tensor
    converged: Tensor


def sinkhorn_divergence(
    x: Tensor,
    y: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    n_iters: int = DEFAULT_MAX_ITERS,
    x_mask: Tensor | None = None,
    y_mask: Tensor | None = None,
    a_self: Tensor | None = None,
    b_self: Tensor | None = None,
    objective: Objective = "sharp",
    tol: float | None = DEFAULT_TOL,
) -> DivergenceResult:
    """``S = W(x,a; y,b) - (W(x,a'; x,a') + W(y,b'; y,b')) / 2`` under the cosine cost.

    Args:
        x, y: ``[B, N, d]``, ``[B, M, d]`` point clouds (e.g. patches and tokens).
        a, b: ``[B, N]``, ``[B, M]`` marginals of the cross term (QC-Align: CAME quotas).
        eps: entropic regularisation (QC-Align default 0.5).
        n_iters: maximal Sinkhorn iterations per solve.
        tol: marginal-error tolerance of each solve (``None``: exactly ``n_iters``); one
            :class:`~otviz.ot._result.NotConvergedWarning` when a solve stops above it.
        x_mask, y_mask: optional validity masks.
        a_self, b_self: marginals of the self terms (default ``a``, ``b``: the standard
            divergence; QC-Align uses uniform ones).
        objective: ``"sharp"`` or ``"entropic"`` (module docstring).

    Raises:
        SolverInputError: unbatched or empty clouds, clouds of different widths, mixed
            dtypes or devices, bad masks, NaN on valid points, and every refusal of
            :func:`otviz.ot.sinkhorn.sinkhorn_log` on the three problems.
    """
    solver = "sinkhorn_divergence"
    check_choice("objective", objective, OBJECTIVES, solver)
    eps = settings_of(solver, SinkhornSettings, like=x, eps=eps, n_iters=n_iters, tol=tol).eps
    check_tensors(solver, x=x, y=y, a=a, b=b, a_self=a_self, b_self=b_self)
    x, y = clean_clouds(solver, ("x", "y"), x, y, x_mask, y_mask)
    (bsz, n, _), m = x.shape, y.shape[1]
    a = clean_masses("a", a, bsz, n, solver, x_mask)
    b = clean_masses("b", b, bsz, m, solver, y_mask)
    a_self = a if a_self is None else clean_masses("a_self", a_self, bsz, n, solver, x_mask)
    b_self = b if b_self is None else clean_masses("b_self", b_self, bsz, m, solver, y_mask)
    check_eps(eps, solver, bsz, x.dtype, COSINE_COST_SCALE)  # its costs are cosine ones

    def solve(
        p: Tensor, q: Tensor, mp: Tensor, mq: Tensor, pm: Tensor | None, qm: Tensor | None
    ) -> tuple[Tensor, SolverResult]:
        cost = _normalised_cosine_cost(p, q)
        with warnings.catch_warnings():  # one warning for the three solves, below
            warnings.simplefilter("ignore", NotConvergedWarning)
            return _ot_value(cost, mp, mq, eps, objective, n_iters, tol, pm, qm)

    cross, res = solve(x, y, a, b, x_mask, y_mask)
    wxx, rxx = solve(x, x, a_self, a_self, x_mask, x_mask)
    wyy, ryy = solve(y, y, b_self, b_self, y_mask, y_mask)
    solves = (res, rxx, ryy)
    err = torch.stack([r.marginal_error for r in solves]).amax(0)
    rel = torch.stack([r.relative_error for r in solves]).amax(0)
    converged = torch.stack([r.converged for r in solves]).all(0)
    if tol is not None and not bool(converged.all()):
        worst = max(solves, key=lambda r: float(r.relative_error.nan_to_num(math.inf).max()))
        warn_unconverged(
            rel, tol, max(r.n_iters for r in solves), solver, n_iters, (worst.log_u, worst.log_v)
        )
    value = cross - 0.5 * (wxx + wyy)
    return DivergenceResult(value, cross, wxx, wyy, res.plan, err, rel, converged)
