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

from torch import Tensor

from otviz.ot.result import SolverResult, safe_log
from otviz.ot.sinkhorn import (
    ShiftedKernel,
    effective_mask,
    finalise_scalings,
    in_cache_chunks,
    log_scaling_iterations,
    masked_log,
    transport_cost,
)


def damping_exponent(tau: float, eps: float) -> float:
    """``alpha = tau / (tau + eps)`` of the generalized Sinkhorn update (1 for ``tau = inf``)."""
    return 1.0 if tau == float("inf") else tau / (tau + eps)


def _max_abs(x: Tensor, mask: Tensor | None) -> Tensor:
    x = x.abs()
    if mask is not None:
        x = x.masked_fill(~mask, 0.0)
    return x.amax(-1)


def sinkhorn_unbalanced_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    tau_a: float,
    tau_b: float,
    n_iters: int = 5,
    tol: float | None = None,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Entropic unbalanced OT (ConceptOT Eq. 3) by batched log-domain generalized Sinkhorn.

    Args:
        cost: ``[B, N, M]`` cost matrices (ConceptOT: ``1 - z_i . y_j``).
        a, b: ``[B, N]``, ``[B, M]`` positive reference masses mu, nu.
        eps: entropic regularisation.
        tau_a, tau_b: KL weights on the row / column marginals (``float('inf')``: hard
            constraint, the balanced update on that side).
        n_iters: iterations L (ConceptOT default 5).
        tol: optional early stop once every problem's fixed-point residual is ``<= tol``.
        row_mask, col_mask: optional ``[B, N]``/``[B, M]`` bool validity masks.

    Returns:
        :class:`SolverResult` with the dense plan, log-scalings (``-inf`` where masked),
        ``cost = <C, P>`` and ``marginal_error`` = the **fixed-point residual**
        ``max_i |log u_i - alpha_a (log a_i - log (K v)_i)|`` over valid rows: how far the
        row scaling is from its own update (the column update holds exactly after the last
        half-step). It is not a marginal violation: unbalanced plans need not meet ``a, b``.
        ``extras`` hold the plan's ``row_marginal`` ``[B, N]`` and ``col_marginal`` ``[B, M]``.
        Large batches run in cache-sized sub-batches (:func:`otviz.ot.sinkhorn.in_cache_chunks`;
        ``tol`` then applies per sub-batch).
    """
    return in_cache_chunks(
        _sinkhorn_unbalanced_log,
        cost,
        a,
        b,
        row_mask,
        col_mask,
        eps=eps,
        tau_a=tau_a,
        tau_b=tau_b,
        n_iters=n_iters,
        tol=tol,
    )


def _sinkhorn_unbalanced_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    tau_a: float,
    tau_b: float,
    n_iters: int,
    tol: float | None,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> SolverResult:
    row_mask, col_mask = effective_mask(row_mask), effective_mask(col_mask)
    alpha_a = damping_exponent(tau_a, eps)
    alpha_b = damping_exponent(tau_b, eps)
    kernel = ShiftedKernel.from_cost(cost, eps, row_mask, col_mask)

    def row_error(delta: Tensor) -> Tensor:
        return _max_abs(delta, row_mask)

    log_a = masked_log(a, row_mask)
    state = log_scaling_iterations(
        kernel,
        log_a,
        masked_log(b, col_mask),
        alpha_a,
        alpha_b,
        n_iters,
        tol,
        row_error,
        row_mask,
        col_mask,
    )
    plan = kernel.into_plan(state.log_u, state.log_v)
    rows = plan.sum(2)
    # log (K v)_i = log (P 1)_i - log u_i
    log_kv = safe_log(rows) - state.log_u
    residual = _max_abs(state.log_u - alpha_a * (log_a - log_kv), row_mask)
    log_u, log_v = finalise_scalings(state, row_mask, col_mask)
    transport = transport_cost(plan, cost, row_mask, col_mask)
    extras = {"row_marginal": rows, "col_marginal": plan.sum(1)}
    return SolverResult(plan, log_u, log_v, residual, state.n_iters, transport, extras)
