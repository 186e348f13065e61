"""Double-Bounded OT (DBOT; OT-CLIP Eq. 8): entropic OT with exact row marginals and column
sums confined to a box,

    min <C, P> - eps H(P)   s.t.   P 1 = a,   low <= P^T 1 <= high,

between the row-only set ``C(a)`` (``low = 0``, ``high = inf``: a row softmax) and ``U(a, b)``
(``low = high = b``: Sinkhorn). Solved as the KL projection of ``K = exp(-C / eps)`` onto the
intersection by Dykstra's algorithm in the log domain (Benamou et al. 2015): alternating the
row projection (a row normalisation) and the column-box projection (each column sum clipped
into its box), carrying the Dykstra correction for the box, which plain alternation (OT-CLIP
App. A.2) lacks and without which the limit is feasible but not the optimum.

Convergence means optimality: ``marginal_error`` is the fixed-point residual of the column
box (:func:`otviz.ot._bregman.box_update_gap`: the column sums against those the next
projection gives them after undoing its dual ``g``), 0 only when the box holds and every
column whose dual is active sits on its bound; the rows are exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

from otviz.ot._bregman import box_update_gap, col_box_shift, row_box_shift
from otviz.ot._checks import SolverInputError, check_tensors, clean_problem
from otviz.ot._result import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TOL,
    SolverResult,
    judge_convergence,
    relative_error,
)
from otviz.ot._settings import SinkhornSettings, settings_of
from otviz.ot.sinkhorn import _masked_log, _masked_log_kernel, _transport_cost


def _log_bound(x: Tensor | None, mask: Tensor | None, fill: float) -> Tensor | None:
    """``log x`` with ``fill`` (an inactive bound) on masked entries."""
    if x is None:
        return None
    out = torch.log(x)
    return out if mask is None else out.masked_fill(~mask, fill)


def dbot_log(
    cost: Tensor,
    a: Tensor,
    low: Tensor | None,
    high: Tensor | None,
    eps: float,
    n_iters: int = DEFAULT_MAX_ITERS,
    tol: float | None = DEFAULT_TOL,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Entropic double-bounded OT by log-domain Dykstra.

    Args:
        cost: ``[B, N, M]`` cost.
        a: ``[B, N]`` exact row masses.
        low, high: ``[B, M]`` column-sum bounds, the box standing for ``b`` in the shared
            ``(cost, a, b, eps)`` order (``None``: 0 / no upper bound); OT-CLIP Eq. 8 uses
            ``b - delta`` and ``b + delta``. Needs ``low <= high`` and
            ``sum low <= sum a <= sum high`` (refused otherwise: the set is empty).
        eps: entropic regularisation (> 0; a number, 0-D or ``[B]``).
        n_iters: maximal Dykstra sweeps (rows then columns), followed by a last row
            projection so the returned plan meets the rows exactly.
        tol: stop once every problem's relative error (``marginal_error / sum a``) is
            ``<= tol``, warn when some is not after ``n_iters``; ``None``: exactly
            ``n_iters`` (:mod:`otviz.ot._result`).
        row_mask, col_mask: optional validity masks (masked entries may hold anything).

    Returns:
        :class:`SolverResult` with ``P = diag(exp log_u) K diag(exp log_v)``,
        ``marginal_error`` = the column box's fixed-point residual (module docstring; rows
        are exact) and ``cost = <C, P>``.
    """
    solver = "dbot_log"
    eps = settings_of(
        solver, SinkhornSettings, like=cost, eps=eps, n_iters=n_iters, tol=tol
    ).eps
    check_tensors(solver, cost=cost, a=a, low=low, high=high)
    cost, a, _ = clean_problem(cost, a, None, eps, solver, row_mask, col_mask)
    bsz, _, m = cost.shape
    low = _clean_bound("low", low, bsz, m, col_mask)
    high = _clean_bound("high", high, bsz, m, col_mask)
    _check_box(a, low, high, m, row_mask, col_mask)
    log_k = _masked_log_kernel(cost, eps, row_mask, col_mask)
    log_a = _masked_log(a, row_mask)
    log_low = _log_bound(low, col_mask, -float("inf"))
    log_high = _log_bound(high, col_mask, float("inf"))
    f = torch.zeros_like(log_k[:, :, 0])
    g = torch.zeros_like(log_k[:, 0])
    corr = torch.zeros_like(g)  # Dykstra correction of the column box

    def rows(f: Tensor, g: Tensor) -> Tensor:
        shift = row_box_shift(log_k + f[:, :, None] + g[:, None, :], log_a, log_a)
        return f + (shift if row_mask is None else shift.masked_fill(~row_mask, 0.0))

    def residual(f: Tensor, g: Tensor) -> Tensor:
        log_cols = torch.logsumexp(log_k + f[:, :, None] + g[:, None, :], 1)
        return box_update_gap(log_cols, g, log_low, log_high, col_mask)

    row_mass = a if row_mask is None else a * row_mask.to(a.dtype)
    row_mass = row_mass.sum(1).detach()

    done = 0
    for _ in range(n_iters):
        f = rows(f, g)
        g = g + corr
        shift = col_box_shift(log_k + f[:, :, None] + g[:, None, :], log_low, log_high)
        if col_mask is not None:
            shift = shift.masked_fill(~col_mask, 0.0)
        g = g + shift
        corr = -shift
        done += 1
        if tol is not None:
            rel = relative_error(residual(rows(f, g), g).detach(), row_mass)
            if bool((rel <= tol).all()):
                break
    f = rows(f, g)
    plan = torch.exp(log_k + f[:, :, None] + g[:, None, :])
    log_u = f if row_mask is None else f.masked_fill(~row_mask, -float("inf"))
    log_v = g if col_mask is None else g.masked_fill(~col_mask, -float("inf"))
    res = SolverResult(
        plan,
        log_u,
        log_v,
        residual(f, g),
        done,
        _transport_cost(plan, cost, row_mask, col_mask),
        plan_mass=plan.sum((1, 2)),
    )
    return judge_convergence(res, tol, solver, n_iters)


def _clean_bound(
    name: str, bound: Tensor | None, bsz: int, m: int, col_mask: Tensor | None
) -> Tensor | None:
    """A column bound ``[B, M]`` (``high`` may be ``inf``; ``None``: none), with NaN on
    masked columns set to 0."""
    if bound is None:
        return None
    if tuple(bound.shape) != (bsz, m):
        raise SolverInputError(
            f"dbot_log: {name} has shape {tuple(bound.shape)}, expected {(bsz, m)}"
        )
    if col_mask is None:
        return bound
    return bound.masked_fill(~col_mask & torch.isnan(bound), 0.0)


def _check_box(
    a: Tensor,
    low: Tensor | None,
    high: Tensor | None,
    m: int,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> None:
    """The column box must be non-negative, non-empty and able to hold the row mass
    ``sum a``."""
    valid = torch.ones(a.shape[0], m, dtype=torch.bool, device=a.device)
    valid = valid if col_mask is None else col_mask
    total = (a if row_mask is None else a * row_mask.to(a.dtype)).sum(1)
    for name, bound in (("low", low), ("high", high)):
        if bound is None:
            continue
        if bool((valid & ~(bound >= 0)).any()) or bool((valid & torch.isnan(bound)).any()):
            raise SolverInputError(f"dbot_log: {name} must be >= 0 on valid columns")
    if low is not None and high is not None and bool((valid & (low > high)).any()):
        raise SolverInputError("dbot_log: some column has low > high (an empty box)")
    w = valid.to(a.dtype)
    if low is not None and bool(((low * w).sum(1) > total * (1 + 1e-6)).any()):
        raise SolverInputError("dbot_log: sum low exceeds the row mass sum a (no feasible plan)")
    if high is not None and bool(((high.nan_to_num(0.0) * w).sum(1) < total * (1 - 1e-6)).any()):
        raise SolverInputError("dbot_log: sum high is below the row mass sum a (no feasible plan)")
