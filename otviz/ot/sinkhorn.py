"""Batched log-domain Sinkhorn scaling for entropic optimal transport.

One loop, :func:`log_scaling_iterations`, serves both the balanced solver here and the
generalized (unbalanced) solver of :mod:`otviz.ot.unbalanced`: the generalized Sinkhorn
update of ConceptOT Eq. 3 is ``log a <- alpha * (log mu - log K b)``, and the balanced update
is the case ``alpha = 1``.

Conventions shared by every function here:

* problems are batched: ``cost [B, N, M]``, ``a [B, N]``, ``b [B, M]``;
* ``row_mask [B, N]`` / ``col_mask [B, M]`` (bool, True = real) handle ragged N and M:
  masked rows and columns carry zero mass; the log kernel and the log-scalings hold a large
  finite negative value :data:`NEG` there (never ``-inf`` inside the iterations, so no NaN
  reaches autograd), and the returned log-scalings are ``-inf`` there;
* a fixed number of iterations is run (autograd goes through all of them); with ``tol`` the
  loop stops early once *every* problem in the batch is below ``tol``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from otviz.ot.result import SolverResult, safe_log

# Bias added to the log-kernel of masked pairs: exp(NEG) == 0 in float32 and float64, and
# it stays finite so softmax-type gradients of the log-sum-exp are exactly zero there.
NEG = -1e9


@dataclass
class ScalingState:
    """Log-scalings after the loop: ``log_u [B, N]``, ``log_v [B, M]`` and iterations run.
    Masked entries hold :data:`NEG`."""

    log_u: Tensor
    log_v: Tensor
    n_iters: int


def masked_log_kernel(
    cost: Tensor, eps: float, row_mask: Tensor | None, col_mask: Tensor | None
) -> Tensor:
    """``-cost / eps`` with :data:`NEG` on masked pairs (the log Gibbs kernel ``log K``)."""
    log_k = cost * (-1.0 / eps)
    if row_mask is not None:
        log_k = log_k.masked_fill(~row_mask[:, :, None], NEG)
    if col_mask is not None:
        log_k = log_k.masked_fill(~col_mask[:, None, :], NEG)
    return log_k


class ShiftedKernel:
    """Exact log-sum-exp products with a log kernel, done as matrix-vector products.

    ``LSE_j(log K_ij + g_j) = s + m + log sum_j exp(log K_ij - s) exp(g_j - m)`` with the
    per-problem maximum ``s`` of ``log K`` and ``m = max_j g_j`` (likewise for columns). The
    shifted kernel is exponentiated once, so each Sinkhorn half-step costs one batched
    mat-vec instead of an ``exp`` over ``[B, N, M]``. Every term of the sum is ``<= 1`` (no
    overflow); a sum can only fall below the smallest normal float when the true shifted
    log-sum-exp is below about ``log(tiny)`` (-73 in float32 with the margin used here, e.g.
    cost ranges above ~70 eps), and such entries are recomputed by ``torch.logsumexp``, so
    the result equals the plain log-domain one in every case. The shifts are detached: the
    expression does not depend on them, so gradients are exact.
    """

    def __init__(self, log_k: Tensor) -> None:
        self.log_k = log_k
        self.shift = log_k.detach().amax((1, 2))[:, None]  # [B, 1]
        self.kernel = torch.exp(log_k - self.shift[:, :, None])
        self.tiny = torch.finfo(log_k.dtype).tiny * 1e6

    def row_lse(self, g: Tensor) -> Tensor:
        """``[B, N]``: ``LSE_j(log K_ij + g_j)``."""
        m = g.detach().amax(1, keepdim=True)
        s = torch.bmm(self.kernel, torch.exp(g - m).unsqueeze(-1)).squeeze(-1)
        out = self.shift + m + torch.log(s.clamp_min(self.tiny))
        return self._repair(out, s, lambda: torch.logsumexp(self.log_k + g[:, None, :], dim=2))

    def col_lse(self, f: Tensor) -> Tensor:
        """``[B, M]``: ``LSE_i(log K_ij + f_i)``."""
        m = f.detach().amax(1, keepdim=True)
        s = torch.bmm(torch.exp(f - m).unsqueeze(1), self.kernel).squeeze(1)
        out = self.shift + m + torch.log(s.clamp_min(self.tiny))
        return self._repair(out, s, lambda: torch.logsumexp(self.log_k + f[:, :, None], dim=1))

    def _repair(self, out: Tensor, s: Tensor, exact: Callable[[], Tensor]) -> Tensor:
        low = s <= self.tiny
        if bool(low.any()):
            return torch.where(low, exact(), out)
        return out


def log_scaling_iterations(
    log_k: Tensor,
    log_a: Tensor,
    log_b: Tensor,
    alpha_a: float,
    alpha_b: float,
    n_iters: int,
    tol: float | None = None,
    row_error: Callable[[Tensor], Tensor] | None = None,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> ScalingState:
    """Generalized Sinkhorn in the log domain (ConceptOT Eq. 3; balanced when alphas are 1).

    Iterates ``f <- alpha_a (log a - LSE_j(log K_ij + g_j))`` then
    ``g <- alpha_b (log b - LSE_i(log K_ij + f_i))`` starting from ``f = g = 0``, with the
    log-sum-exps of :class:`ShiftedKernel`.

    Args:
        log_k: ``[B, N, M]`` log kernel, :data:`NEG` on masked pairs.
        log_a, log_b: ``[B, N]``, ``[B, M]`` log target masses (any finite value where masked).
        alpha_a, alpha_b: update exponents ``tau / (tau + eps)`` (1 for a hard marginal).
        n_iters: maximal number of (f, g) update pairs.
        tol: optional early-stop threshold on ``row_error``.
        row_error: maps ``delta = f - f_next [B, N]`` (the change the next row update would
            make; the column equation holds exactly after each g-update) to a ``[B]`` error.
        row_mask, col_mask: validity masks; masked scalings are held at :data:`NEG`.
    """
    kernel = ShiftedKernel(log_k)
    f = _hold(torch.zeros_like(log_a), row_mask)
    g = _hold(torch.zeros_like(log_b), col_mask)
    done = 0
    for _ in range(n_iters):
        f_next = _hold(alpha_a * (log_a - kernel.row_lse(g)), row_mask)
        if tol is not None and done > 0 and row_error is not None:
            if bool((row_error(f - f_next) <= tol).all()):
                break
        f = f_next
        g = _hold(alpha_b * (log_b - kernel.col_lse(f)), col_mask)
        done += 1
    return ScalingState(f, g, done)


def _hold(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x.masked_fill(~mask, NEG)


def masked_log(x: Tensor, mask: Tensor | None) -> Tensor:
    """``log x`` on valid entries, 0 on masked ones (finite, ignored by the masked kernel)."""
    out = safe_log(x)
    return out if mask is None else out.masked_fill(~mask, 0.0)


def finalise_scalings(
    state: ScalingState, row_mask: Tensor | None, col_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Log-scalings with ``-inf`` on masked entries (zero scaling), for the result."""
    log_u = state.log_u if row_mask is None else state.log_u.masked_fill(~row_mask, -float("inf"))
    log_v = state.log_v if col_mask is None else state.log_v.masked_fill(~col_mask, -float("inf"))
    return log_u, log_v


def transport_cost(
    plan: Tensor, cost: Tensor, row_mask: Tensor | None, col_mask: Tensor | None
) -> Tensor:
    """``[B]`` linear cost ``<C, P>`` over valid pairs (masked costs may hold inf or NaN)."""
    if row_mask is not None:
        cost = cost.masked_fill(~row_mask[:, :, None], 0.0)
    if col_mask is not None:
        cost = cost.masked_fill(~col_mask[:, None, :], 0.0)
    return (plan * cost).sum((1, 2))


def _l1(x: Tensor, mask: Tensor | None) -> Tensor:
    x = x.abs()
    if mask is not None:
        x = x * mask.to(x.dtype)
    return x.sum(-1)


def sinkhorn_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    n_iters: int = 100,
    tol: float | None = None,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Entropic balanced OT, ``min <C, P> + eps * sum P (log P - 1)`` s.t. ``P 1 = a``,
    ``P^T 1 = b``, by batched log-domain Sinkhorn (the ``tau -> inf`` limit of ConceptOT Eq. 3,
    Prop. 1 (i)).

    Args:
        cost: ``[B, N, M]`` cost matrices.
        a, b: ``[B, N]``, ``[B, M]`` marginals (equal total mass per problem over valid
            entries; masked entries are ignored).
        eps: entropic regularisation.
        n_iters: iterations (each one row and one column update).
        tol: optional early stop once every problem's L1 marginal error is ``<= tol``.
        row_mask, col_mask: optional ``[B, N]``/``[B, M]`` bool validity masks.

    Returns:
        :class:`SolverResult` with the dense plan, ``log_u``/``log_v`` (``f/eps``, ``g/eps`` in
        dual terms; ``-inf`` where masked), ``marginal_error`` = L1 violation
        ``|P1 - a|_1 + |P^T1 - b|_1`` and ``cost`` = ``<C, P>``.
    """
    log_k = masked_log_kernel(cost, eps, row_mask, col_mask)
    log_a = masked_log(a, row_mask)
    log_b = masked_log(b, col_mask)

    def row_error(delta: Tensor) -> Tensor:
        # row marginal of the current plan is a * exp(delta); columns are exact.
        return _l1(a * torch.expm1(delta), row_mask)

    state = log_scaling_iterations(
        log_k, log_a, log_b, 1.0, 1.0, n_iters, tol, row_error, row_mask, col_mask
    )
    plan = torch.exp(log_k + state.log_u[:, :, None] + state.log_v[:, None, :])
    err = _l1(plan.sum(2) - a, row_mask) + _l1(plan.sum(1) - b, col_mask)
    log_u, log_v = finalise_scalings(state, row_mask, col_mask)
    transport = transport_cost(plan, cost, row_mask, col_mask)
    return SolverResult(plan, log_u, log_v, err, state.n_iters, transport)
