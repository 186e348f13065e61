"""Batched entropic unbalanced OT by generalized Sinkhorn (ConceptOT Eq. 3).

Problem (per pair)::

    min_{P >= 0} <C, P> + eps * sum P (log P - 1)
                 + tau_a * KL(P 1 || a) + tau_b * KL(P^T 1 || b)

with the generalized KL ``KL(x || y) = sum x log(x / y) - x + y``. Its solution is
``P = diag(u) K diag(v)``, ``K = exp(-C / eps)``, with the damped scaling updates
``u <- (a / K v)^alpha_a``, ``v <- (b / K^T u)^alpha_b``, ``alpha = tau / (tau + eps)``.
``tau = inf`` gives ``alpha = 1``, the balanced update (Prop. 1 (i)).

In POT terms this is ``ot.unbalanced.sinkhorn_unbalanced(a, b, C, reg=eps,
reg_m=(tau_a, tau_b), reg_type='entropy')``: POT's ``'entropy'`` regulariser
``KL(P || 1) = sum P log P - P + 1`` equals Eq. 3's ``H(P)`` up to a constant, while POT's
default ``'kl'`` regulariser ``KL(P || a b^T)`` adds ``-eps * log(a_i b_j)`` to the cost.
"""

from __future__ import annotations

import torch
from torch import Tensor

from otviz.ot._checks import check_tau, clean_problem
from otviz.ot._knobs import per_problem
from otviz.ot._result import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TOL,
    SolverResult,
    judge_convergence,
    safe_log,
)
from otviz.ot._settings import SinkhornSettings, UnbalancedSettings, settings_of
from otviz.ot.sinkhorn import (
    _effective_mask,
    _finalise_scalings,
    _in_cache_chunks,
    _log_scaling_iterations,
    _masked_log,
    _row_update_gap,
    _ShiftedKernel,
    _sinkhorn_log,
    _transport_cost,
)


def _damping_exponent(tau: float | Tensor, eps: float | Tensor) -> float | Tensor:
    """``alpha = tau / (tau + eps)`` of the generalized Sinkhorn update (1 for
    ``tau = inf``), per problem: a number, a 0-D tensor, or ``[B, 1]`` when ``tau`` or
    ``eps`` is ``[B]`` (to scale ``[B, n]`` log-scalings)."""
    if not isinstance(tau, Tensor):
        if tau == float("inf"):
            return 1.0
        return tau / (tau + per_problem(eps, 2))
    hard = torch.isinf(tau)
    finite = torch.where(hard, torch.ones_like(tau), tau)  # no inf / inf, even in autograd
    alpha = torch.where(hard, torch.ones_like(tau), finite / (finite + eps))
    return per_problem(alpha, 2)


def sinkhorn_unbalanced_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    tau_a: float,
    tau_b: float,
    n_iters: int = DEFAULT_MAX_ITERS,
    tol: float | None = DEFAULT_TOL,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Entropic unbalanced OT (ConceptOT Eq. 3) by batched log-domain generalized Sinkhorn.

    Args:
        cost: ``[B, N, M]`` cost matrices (ConceptOT: ``1 - z_i . y_j``).
        a, b: ``[B, N]``, ``[B, M]`` positive reference masses mu, nu.
        eps, tau_a, tau_b, n_iters, tol: the :class:`otviz.ot.UnbalancedSettings`:
            entropic regularisation (> 0); KL weights (>= 0) on the row / column marginals
            (``float('inf')``: hard constraint, the balanced update on that side; 0: that
            side free); maximal iterations (ConceptOT's model runs a fixed L = 5 with
            ``tol=None``); stop once every problem's relative marginal error
            (``marginal_error`` below over the plan's mass) is ``<= tol``, warn when some
            is not after ``n_iters`` (``None``: exactly ``n_iters``, :mod:`otviz.ot._result`).
        row_mask, col_mask: optional ``[B, N]``/``[B, M]`` bool validity masks (masked
            entries may hold anything, NaN included).

    Returns:
        :class:`SolverResult` with the dense plan, log-scalings (``-inf`` where masked),
        ``cost = <C, P>`` and ``marginal_error`` = ``|P 1 - P' 1|_1``, the L1 distance
        between the plan's row marginal and the one the next row update
        ``u <- (a / K v)^alpha_a`` gives it (the column update holds exactly after the
        last half-step): 0 exactly at the fixed point, ``|P 1 - a|_1`` for a hard row
        constraint. Unbalanced plans need not meet ``a, b``: ``row_marginal`` ``[B, N]``
        and ``col_marginal`` ``[B, M]`` say what they keep. Large batches run in
        cache-sized sub-batches (:func:`otviz.ot.sinkhorn._in_cache_chunks`; ``tol`` then
        applies per sub-batch).
    """
    solver = "sinkhorn_unbalanced_log"
    settings = settings_of(
        solver, UnbalancedSettings, like=cost, eps=eps, tau_a=tau_a, tau_b=tau_b,
        n_iters=n_iters, tol=tol,
    )
    cost, a, b = clean_problem(cost, a, b, settings.eps, solver, row_mask, col_mask)
    check_tau("tau_a", settings.tau_a, solver, cost.shape[0])
    check_tau("tau_b", settings.tau_b, solver, cost.shape[0])
    return solve_dense(cost, a, b, settings, row_mask, col_mask)


def solve_dense(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    settings: SinkhornSettings,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """The dense Sinkhorn family on a problem its caller has already checked (a method
    checks its inputs once at its boundary): :func:`sinkhorn_unbalanced_log` for
    :class:`UnbalancedSettings`, :func:`otviz.ot.sinkhorn.sinkhorn_log` for plain
    :class:`SinkhornSettings`; no validation, so no host sync on an accelerator with
    ``tol=None``."""
    if isinstance(settings, UnbalancedSettings):
        name, core = "sinkhorn_unbalanced_log", _sinkhorn_unbalanced_log
    else:
        name, core = "sinkhorn_log", _sinkhorn_log
    res = _in_cache_chunks(core, cost, a, b, settings, row_mask, col_mask)
    return judge_convergence(res, settings.tol, name, settings.n_iters)


def _hold_rows(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x.masked_fill(~mask, -float("inf"))


def _sinkhorn_unbalanced_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    settings: UnbalancedSettings,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> SolverResult:
    row_mask, col_mask = _effective_mask(row_mask), _effective_mask(col_mask)
    eps = settings.eps
    alpha_a = _damping_exponent(settings.tau_a, eps)
    alpha_b = _damping_exponent(settings.tau_b, eps)
    kernel = _ShiftedKernel.from_cost(cost, eps, row_mask, col_mask)
    log_a = _masked_log(a, row_mask)
    state = _log_scaling_iterations(
        kernel,
        log_a,
        _masked_log(b, col_mask),
        alpha_a,
        alpha_b,
        settings.n_iters,
        settings.tol,
        row_mask,
        col_mask,
    )
    plan = kernel.into_plan(state.log_u, state.log_v)
    rows = plan.sum(2)
    # log (K v)_i = log (P 1)_i - log u_i
    log_kv = safe_log(rows) - state.log_u
    log_next = _hold_rows(alpha_a * (log_a - log_kv) + log_kv, row_mask)
    residual = _row_update_gap(safe_log(rows), log_next, row_mask)
    log_u, log_v = _finalise_scalings(state, row_mask, col_mask)
    transport = _transport_cost(plan, cost, row_mask, col_mask)
    return SolverResult(
        plan, log_u, log_v, residual, state.n_iters, transport, plan_mass=rows.sum(1),
        marginals=(rows, plan.sum(1)),
    )
