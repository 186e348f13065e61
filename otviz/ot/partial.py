"""Entropic partial OT (OT-CLIP Eq. 16): transport exactly a total mass ``s`` with row sums
(and optionally column sums) bounded above,

    min <C, P> - eps H(P)   s.t.   P 1 <= a,   [P^T 1 <= b,]   1^T P 1 = s,

solved by Dykstra's iterative Bregman projections in the log domain (Benamou et al. 2015,
as OT-CLIP says; the same iteration as POT's ``ot.partial.entropic_partial_wasserstein``
with ``reg = eps``, which always has the column bound: ``H(P) = -sum P (log P - 1)`` and
POT's ``sum P log P`` differ by ``s``, a constant at fixed mass). OT-CLIP's selective
classification uses ``a = 1`` per image and no column bound: ``s`` images are (softly)
accepted.

Convergence means optimality: after each sweep the plan ``P = K e^{f + g + h}`` meets the
total mass exactly, and ``marginal_error`` is the fixed-point residual of the bounds
(:func:`otviz.ot._bregman.box_update_gap`): the row (column) sums against those the next
Dykstra projection gives them after undoing its dual ``f <= 0`` (``g <= 0``). It is 0 only
when every bound holds and every bound with an active dual binds, so a plan that is merely
feasible (the test this solver stopped on before) is not reported converged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otviz.ot._bregman import box_update_gap, col_box_shift, row_box_shift, total_mass_shift
from otviz.ot._checks import check_transported_mass, clean_problem
from otviz.ot._result import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TOL,
    SolverResult,
    judge_convergence,
    relative_error,
)
from otviz.ot._settings import SinkhornSettings, settings_of
from otviz.ot.sinkhorn import _masked_log, _masked_log_kernel, _transport_cost


def _masked(shift: Tensor, mask: Tensor | None) -> Tensor:
    return shift if mask is None else shift.masked_fill(~mask, 0.0)


def partial_ot_log(
    cost: Tensor,
    a: Tensor | None,
    b: Tensor | None,
    eps: float,
    mass: float | Tensor,
    n_iters: int = DEFAULT_MAX_ITERS,
    tol: float | None = DEFAULT_TOL,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Entropic partial OT with total mass ``mass`` by log-domain Dykstra.

    Args:
        cost: ``[B, N, M]`` cost.
        a: ``[B, N]`` row upper bounds (``None``: ones, OT-CLIP Eq. 16's ``P 1 <= 1``).
        b: ``[B, M]`` column upper bounds (``None``: none).
        eps: entropic regularisation (> 0; POT's ``reg``; a number, 0-D or ``[B]``).
        mass: total transported mass ``s`` (float, 0-D or ``[B]``), ``0 < s <= sum a``
            (and ``<= sum b``); more than is available is refused.
        n_iters: maximal Dykstra sweeps (rows, columns if bounded, total mass); the
            returned plan meets the total mass exactly.
        tol: stop once every problem's relative error (``marginal_error / s``) is
            ``<= tol``, warn when some is not after ``n_iters``; ``None``: exactly
            ``n_iters`` (:mod:`otviz.ot._result`).
        row_mask, col_mask: optional validity masks (masked entries may hold anything).

    Returns:
        :class:`SolverResult` with ``marginal_error`` = the bounds' fixed-point residual
        (module docstring) plus ``|1^T P 1 - s|`` (0 up to rounding), ``plan_mass = s``
        and ``cost = <C, P>``; ``log_u`` holds ``f + h`` (row and total-mass duals over
        eps), ``log_v`` holds ``g``.
    """
    solver = "partial_ot_log"
    eps = settings_of(
        solver, SinkhornSettings, like=cost, eps=eps, n_iters=n_iters, tol=tol
    ).eps
    cost, a, b = clean_problem(cost, a, b, eps, solver, row_mask, col_mask)
    log_k = _masked_log_kernel(cost, eps, row_mask, col_mask)
    a = torch.ones_like(cost[:, :, 0]) if a is None else a
    available = _total(a, row_mask)
    if b is not None:
        available = torch.minimum(available, _total(b, col_mask))
    mass_t = check_transported_mass(mass, available, solver)
    log_a = _masked_log(a, row_mask)
    log_b = None if b is None else _masked_log(b, col_mask)
    log_s = torch.log(mass_t)
    f = torch.zeros_like(log_k[:, :, 0])
    g = torch.zeros_like(log_k[:, 0])
    h = torch.zeros_like(log_s)  # total-mass scaling, folded into f at the end
    c_row, c_col, c_tot = torch.zeros_like(f), torch.zeros_like(g), torch.zeros_like(h)

    def log_plan() -> Tensor:
        return log_k + f[:, :, None] + g[:, None, :] + h[:, None, None]

    def residual(log_p: Tensor) -> Tensor:
        log_rows = torch.logsumexp(log_p, 2)
        err = box_update_gap(log_rows, f, None, log_a, row_mask)
        err = err + (torch.exp(torch.logsumexp(log_rows, 1)) - mass_t).abs()
        if log_b is None:
            return err
        return err + box_update_gap(torch.logsumexp(log_p, 1), g, None, log_b, col_mask)

    done = 0
    for _ in range(n_iters):
        f = f + c_row
        shift = _masked(row_box_shift(log_plan(), None, log_a), row_mask)
        f, c_row = f + shift, -shift
        if log_b is not None:
            g = g + c_col
            shift = _masked(col_box_shift(log_plan(), None, log_b), col_mask)
            g, c_col = g + shift, -shift
        h = h + c_tot
        shift = total_mass_shift(log_plan(), log_s)
        h, c_tot = h + shift, -shift
        done += 1
        if tol is not None:
            if bool((relative_error(residual(log_plan()).detach(), mass_t) <= tol).all()):
                break
    log_p = log_plan()
    plan = torch.exp(log_p)
    log_u = f + h[:, None]
    log_v = g
    if row_mask is not None:
        log_u = log_u.masked_fill(~row_mask, -math.inf)
    if col_mask is not None:
        log_v = log_v.masked_fill(~col_mask, -math.inf)
    res = SolverResult(
        plan,
        log_u,
        log_v,
        residual(log_p),
        done,
        _transport_cost(plan, cost, row_mask, col_mask),
        plan_mass=plan.sum((1, 2)),
    )
    return judge_convergence(res, tol, solver, n_iters)


def _total(x: Tensor, mask: Tensor | None) -> Tensor:
    return (x if mask is None else x * mask.to(x.dtype)).sum(1)
