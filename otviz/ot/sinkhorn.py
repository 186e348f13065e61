"""Batched log-domain Sinkhorn scaling for entropic optimal transport.

One loop, :func:`_log_scaling_iterations`, serves both the balanced solver here and the
generalized (unbalanced) solver of :mod:`otviz.ot.unbalanced`: the generalized Sinkhorn
update of ConceptOT Eq. 3 is ``log a <- alpha * (log mu - log K b)``, and the balanced update
is the case ``alpha = 1``.

Conventions shared by every function here:

* problems are batched: ``cost [B, N, M]``, ``a [B, N]``, ``b [B, M]``;
* ``row_mask [B, N]`` / ``col_mask [B, M]`` (bool, True = real) handle ragged N and M:
  masked rows and columns carry zero mass; the log kernel and the log-scalings hold a large
  finite negative value :data:`NEG` there (never ``-inf`` inside the iterations, so no NaN
  reaches autograd), and the returned log-scalings are ``-inf`` there;
* at most ``n_iters`` iterations are run (autograd goes through all of them); with ``tol``
  the loop stops early once *every* problem's relative marginal error is below ``tol`` and
  warns when one is not (:mod:`otviz.ot._result`); ``tol=None`` runs exactly ``n_iters``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from otviz.ot._checks import check_equal_mass, clean_problem
from otviz.ot._knobs import per_problem
from otviz.ot._result import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TOL,
    SolverResult,
    judge_convergence,
    relative_error,
    safe_log,
)
from otviz.ot._settings import SinkhornSettings, settings_of
from otviz.ot._sync import known_false

# Bias added to the log-kernel of masked pairs: exp(NEG) == 0 in float32 and float64, and
# it stays finite so softmax-type gradients of the log-sum-exp are exactly zero there.
NEG = -1e9

# Plan entries per sub-batch of the dense solvers (8 MB in float32), see _in_cache_chunks.
CHUNK_ELEMS = 2**21


@dataclass
class _ScalingState:
    """Log-scalings after the loop: ``log_u [B, N]``, ``log_v [B, M]`` and iterations run.
    Masked entries hold :data:`NEG`."""

    log_u: Tensor
    log_v: Tensor
    n_iters: int


def _effective_mask(mask: Tensor | None) -> Tensor | None:
    """``mask``, or ``None`` when it surely masks nothing (skips needless passes over the
    data; an accelerator's mask is kept, :func:`otviz.ot._sync.known_false`)."""
    return None if mask is None or known_false(~mask) else mask


def _masked_log_kernel(
    cost: Tensor, eps: float | Tensor, row_mask: Tensor | None, col_mask: Tensor | None
) -> Tensor:
    """``-cost / eps`` with :data:`NEG` on masked pairs (the log Gibbs kernel ``log K``;
    ``eps`` a number, 0-D or ``[B]``)."""
    log_k = cost * (-1.0 / per_problem(eps, 3))
    if row_mask is not None:
        log_k = log_k.masked_fill(~row_mask[:, :, None], NEG)
    if col_mask is not None:
        log_k = log_k.masked_fill(~col_mask[:, None, :], NEG)
    return log_k


class _ShiftedKernel:
    """A batch of Gibbs kernels ``K = exp(shift) * K^`` for exact log-sum-exp products done as
    matrix-vector products.

    ``log K^ = log K - shift`` with the per-problem maximum ``shift [B, 1]`` of ``log K`` (so
    ``K^ <= 1``, no overflow) is exponentiated once; then
    ``LSE_j(log K_ij + g_j) = shift + m + log sum_j K^_ij exp(g_j - m)`` with
    ``m = max_j g_j``, one batched mat-vec per Sinkhorn half-step instead of an ``exp`` over
    ``[B, N, M]``. A sum can only fall below the smallest normal float (times 1e6) when the
    true shifted log-sum-exp is below about -73 in float32 (cost ranges above ~70 eps);
    such entries are recomputed by ``torch.logsumexp``, so results equal the plain
    log-domain ones in every case. Shifts are detached: the results do not depend on them,
    so gradients are exact.

    Build it with :meth:`from_cost` (one fused pass ``(min C - C) / eps``).
    """

    def __init__(self, log_k_shifted: Callable[[], Tensor], kernel: Tensor, shift: Tensor):
        self._log_k_shifted = log_k_shifted
        self.kernel = kernel
        self.shift = shift
        self.tiny = torch.finfo(kernel.dtype).tiny * 1e6

    @classmethod
    def from_cost(
        cls, cost: Tensor, eps: float | Tensor, row_mask: Tensor | None, col_mask: Tensor | None
    ) -> _ShiftedKernel:
        """Kernel of ``exp(-cost / eps)`` (zero on masked pairs): ``K^`` in one fused pass
        ``(min C - C) / eps`` and an in-place ``exp``. The shifted log kernel itself is only
        recomputed when an exact fallback needs it."""
        c = cost.detach()
        if row_mask is not None:
            c = c.masked_fill(~row_mask[:, :, None], float("inf"))
        if col_mask is not None:
            c = c.masked_fill(~col_mask[:, None, :], float("inf"))
        c_min = c.amin((1, 2))
        c_min = torch.where(torch.isfinite(c_min), c_min, torch.zeros_like(c_min))

        def log_k_shifted() -> Tensor:
            if isinstance(eps, Tensor):  # a learned temperature: keep its gradient
                log_ks = (c_min[:, None, None] - cost) / per_problem(eps, 3)
            else:
                log_ks = torch.add((c_min / eps)[:, None, None], cost, alpha=-1.0 / eps)
            if row_mask is not None:
                log_ks = log_ks.masked_fill(~row_mask[:, :, None], NEG)
            if col_mask is not None:
                log_ks = log_ks.masked_fill(~col_mask[:, None, :], NEG)
            return log_ks

        kernel = log_k_shifted().exp_()
        return cls(log_k_shifted, kernel, (-c_min / per_problem(eps, 1))[:, None])

    def row_lse(self, g: Tensor) -> Tensor:
        """``[B, N]``: ``LSE_j(log K_ij + g_j)``."""
        m = g.detach().amax(1, keepdim=True)
        # x^T K^T is the fast orientation of a batched mat-vec on CPU
        s = torch.bmm(torch.exp(g - m).unsqueeze(1), self.kernel.transpose(1, 2)).squeeze(1)
        out = self.shift + m + torch.log(s.clamp_min(self.tiny))
        return self._repair(
            out, s, lambda: torch.logsumexp(self._log_k_shifted() + g[:, None, :], 2)
        )

    def col_lse(self, f: Tensor) -> Tensor:
        """``[B, M]``: ``LSE_i(log K_ij + f_i)``."""
        m = f.detach().amax(1, keepdim=True)
        s = torch.bmm(torch.exp(f - m).unsqueeze(1), self.kernel).squeeze(1)
        out = self.shift + m + torch.log(s.clamp_min(self.tiny))
        return self._repair(
            out, s, lambda: torch.logsumexp(self._log_k_shifted() + f[:, :, None], 1)
        )

    def _repair(self, out: Tensor, s: Tensor, exact: Callable[[], Tensor]) -> Tensor:
        low = s <= self.tiny
        if known_false(low):
            return out
        return torch.where(low, self.shift + exact(), out)

    def into_plan(self, log_u: Tensor, log_v: Tensor) -> Tensor:
        """``[B, N, M]`` plan ``exp(log K_ij + log_u_i + log_v_j)`` (``log_u``/``log_v`` hold
        :data:`NEG` where masked). As ``K^ * e^{log_u + shift} * e^{log_v}`` (two passes, no
        exp over the plan) when those factors are known to be safely inside the float range
        (:func:`otviz.ot._sync.known_false`), else by one rank-2 ``baddbmm`` (the broadcast
        sum) and an ``exp``. The last call on a kernel: without autograd the kernel's memory
        is reused for the plan."""
        u = log_u + self.shift
        scalings = torch.cat([u, log_v], 1).detach()
        if known_false(~((scalings.abs() < 40.0) | (scalings < NEG / 2))):
            row, col = torch.exp(u).unsqueeze(-1), torch.exp(log_v).unsqueeze(1)
            if torch.is_grad_enabled():
                return self.kernel * row * col
            return self.kernel.mul_(row).mul_(col)
        left = torch.stack([u, torch.ones_like(u)], -1)  # [B, N, 2]
        right = torch.stack([torch.ones_like(log_v), log_v], 1)  # [B, 2, M]
        return torch.exp(torch.baddbmm(self._log_k_shifted(), left, right))


def _log_scaling_iterations(
    kernel: _ShiftedKernel,
    log_a: Tensor,
    log_b: Tensor,
    alpha_a: float,
    alpha_b: float,
    n_iters: int,
    tol: float | None = None,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> _ScalingState:
    """Generalized Sinkhorn in the log domain (ConceptOT Eq. 3; balanced when alphas are 1).

    Iterates ``f <- alpha_a (log a - LSE_j(log K_ij + g_j))`` then
    ``g <- alpha_b (log b - LSE_i(log K_ij + f_i))`` starting from ``f = g = 0``, with the
    log-sum-exps of :class:`_ShiftedKernel`.

    Args:
        kernel: the Gibbs kernels.
        log_a, log_b: ``[B, N]``, ``[B, M]`` log target masses (any finite value where masked).
        alpha_a, alpha_b: update exponents ``tau / (tau + eps)`` (1 for a hard marginal).
        n_iters: maximal number of (f, g) update pairs.
        tol: optional early stop once every problem's :func:`_row_update_gap` relative to
            the plan's mass is ``<= tol`` (the column equation holds exactly after each
            g-update, so this is the relative error of :mod:`otviz.ot._result`).
        row_mask, col_mask: validity masks; masked scalings are held at :data:`NEG`.
    """
    f = _hold(torch.zeros_like(log_a), row_mask)
    g = _hold(torch.zeros_like(log_b), col_mask)
    done = 0
    for _ in range(n_iters):
        log_kb = kernel.row_lse(g)
        f_next = _hold(alpha_a * (log_a - log_kb), row_mask)
        if tol is not None and done > 0:
            if bool((_relative_row_gap(f + log_kb, f_next + log_kb, row_mask) <= tol).all()):
                break
        f = f_next
        g = _hold(alpha_b * (log_b - kernel.col_lse(f)), col_mask)
        done += 1
    return _ScalingState(f, g, done)


def _row_update_gap(log_rows: Tensor, log_rows_next: Tensor, mask: Tensor | None) -> Tensor:
    """``[B]`` L1 distance ``|P 1 - P' 1|_1`` between the plan's row marginal and the one the
    next row update gives (``log`` of both; for a hard row constraint ``P' 1 = a``)."""
    return _l1(torch.exp(log_rows) - torch.exp(log_rows_next), mask)


def _relative_row_gap(log_rows: Tensor, log_rows_next: Tensor, mask: Tensor | None) -> Tensor:
    """``[B]`` :func:`_row_update_gap` over the plan's mass ``|P 1|_1`` (its relative error)."""
    return relative_error(
        _row_update_gap(log_rows, log_rows_next, mask), _l1(torch.exp(log_rows), mask)
    )


def _hold(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x.masked_fill(~mask, NEG)


def _masked_log(x: Tensor, mask: Tensor | None) -> Tensor:
    """``log x`` on valid entries, 0 on masked ones (finite, ignored by the masked kernel)."""
    out = safe_log(x)
    return out if mask is None else out.masked_fill(~mask, 0.0)


def _finalise_scalings(
    state: _ScalingState, row_mask: Tensor | None, col_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Log-scalings with ``-inf`` on masked entries (zero scaling), for the result."""
    log_u = state.log_u if row_mask is None else state.log_u.masked_fill(~row_mask, -float("inf"))
    log_v = state.log_v if col_mask is None else state.log_v.masked_fill(~col_mask, -float("inf"))
    return log_u, log_v


def _transport_cost(
    plan: Tensor, cost: Tensor, row_mask: Tensor | None, col_mask: Tensor | None
) -> Tensor:
    """``[B]`` linear cost ``<C, P>`` over valid pairs (masked costs may hold inf or NaN)."""
    if row_mask is not None:
        cost = cost.masked_fill(~row_mask[:, :, None], 0.0)
    if col_mask is not None:
        cost = cost.masked_fill(~col_mask[:, None, :], 0.0)
    return torch.bmm(plan.flatten(1).unsqueeze(1), cost.flatten(1).unsqueeze(2)).view(-1)


def _l1(x: Tensor, mask: Tensor | None) -> Tensor:
    x = x.abs()
    if mask is not None:
        x = x * mask.to(x.dtype)
    return x.sum(-1)


def _in_cache_chunks(
    solve: Callable[..., SolverResult],
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    settings: SinkhornSettings,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> SolverResult:
    """Run a batched dense solver ``solve(cost, a, b, settings, row_mask, col_mask)`` on
    consecutive sub-batches of at most :data:`CHUNK_ELEMS` plan entries and concatenate the
    results (``n_iters`` is the largest count run).

    Every Sinkhorn pass streams the ``[B, N, M]`` kernel; sub-batches small enough to stay
    in the CPU caches run about twice as fast per pair at large ``N * M`` as one pass over
    the whole batch (measured at N = 1024, M = 48), at the price of one copy of the plan."""
    bsz, n, m = cost.shape
    step = max(1, CHUNK_ELEMS // max(n * m, 1))
    if bsz <= step:
        return solve(cost, a, b, settings, row_mask, col_mask)

    def part(x: Tensor | None, i: int) -> Tensor | None:
        return None if x is None else x[i : i + step]

    parts = [
        solve(
            cost[i : i + step],
            a[i : i + step],
            b[i : i + step],
            settings_part(settings, i, step),
            part(row_mask, i),
            part(col_mask, i),
        )
        for i in range(0, bsz, step)
    ]
    first = parts[0]
    return SolverResult(
        plan=torch.cat([p.plan for p in parts]),
        log_u=torch.cat([p.log_u for p in parts]),
        log_v=torch.cat([p.log_v for p in parts]),
        marginal_error=torch.cat([p.marginal_error for p in parts]),
        n_iters=max(p.n_iters for p in parts),
        cost=torch.cat([p.cost for p in parts]),
        extras={k: torch.cat([p.extras[k] for p in parts]) for k in first.extras},
        plan_mass=torch.cat([p.plan_mass for p in parts]),
        marginals=(
            torch.cat([p.row_marginal for p in parts]),
            torch.cat([p.col_marginal for p in parts]),
        ),
    )


def settings_part(settings: SinkhornSettings, start: int, step: int) -> SinkhornSettings:
    """``settings`` for the sub-batch ``[start, start + step)``: its per-problem (``[B]``)
    knobs sliced, the others as they are."""
    cut = {
        name: value[start : start + step]
        for name, value in vars(settings).items()
        if isinstance(value, Tensor) and value.dim() == 1
    }
    return replace(settings, **cut) if cut else settings


def sinkhorn_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    n_iters: int = DEFAULT_MAX_ITERS,
    tol: float | None = DEFAULT_TOL,
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
        eps, n_iters, tol: the :class:`otviz.ot.SinkhornSettings` (``eps``: a number, a
            0-D or a ``[B]`` tensor, one per problem; ``tol``: stop once every
            problem's relative marginal error, ``|P1 - a|_1`` over the plan's mass, is
            ``<= tol``; warns when some problem is above it after ``n_iters``; ``None``:
            exactly ``n_iters`` iterations, :mod:`otviz.ot._result`).
        row_mask, col_mask: optional ``[B, N]``/``[B, M]`` bool validity masks (masked
            entries of ``cost``, ``a``, ``b`` may hold anything, NaN included).

    Raises:
        SolverInputError: a 2-D or empty cost, NaN/inf costs on valid pairs, negative or
            missing masses, unequal total masses, mixed dtypes or devices, integer tensors,
            masks of the wrong shape or dtype (:mod:`otviz.ot._checks`); its subclass
            ``KnobError`` for a bad ``eps`` (``<= 0``, NaN, of another batch, or below the
            dtype's floor for this cost, :func:`otviz.ot._knobs.eps_floor`), ``n_iters``
            or ``tol`` (:mod:`otviz.ot._knobs`).

    Returns:
        :class:`SolverResult` with the dense plan, ``log_u``/``log_v`` (``f/eps``, ``g/eps`` in
        dual terms; ``-inf`` where masked), ``marginal_error`` = L1 violation
        ``|P1 - a|_1 + |P^T1 - b|_1``, ``cost`` = ``<C, P>`` and the plan's
        ``row_marginal`` ``[B, N]`` and ``col_marginal`` ``[B, M]`` from the last update.
        Large batches run in cache-sized sub-batches (:func:`_in_cache_chunks`; ``tol``
        then applies per sub-batch).
    """
    settings = settings_of(
        "sinkhorn_log", SinkhornSettings, like=cost, eps=eps, n_iters=n_iters, tol=tol
    )
    cost, a, b = clean_problem(cost, a, b, settings.eps, "sinkhorn_log", row_mask, col_mask)
    check_equal_mass(a, b, "sinkhorn_log", row_mask, col_mask)
    res = _in_cache_chunks(_sinkhorn_log, cost, a, b, settings, row_mask, col_mask)
    return judge_convergence(res, tol, "sinkhorn_log", n_iters)


def _sinkhorn_log(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    settings: SinkhornSettings,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> SolverResult:
    row_mask, col_mask = _effective_mask(row_mask), _effective_mask(col_mask)
    kernel = _ShiftedKernel.from_cost(cost, settings.eps, row_mask, col_mask)
    log_a = _masked_log(a, row_mask)
    log_b = _masked_log(b, col_mask)
    state = _log_scaling_iterations(
        kernel, log_a, log_b, 1.0, 1.0, settings.n_iters, settings.tol, row_mask, col_mask
    )
    plan = kernel.into_plan(state.log_u, state.log_v)
    rows, cols = plan.sum(2), plan.sum(1)
    err = _l1(rows - a, row_mask) + _l1(cols - b, col_mask)
    log_u, log_v = _finalise_scalings(state, row_mask, col_mask)
    transport = _transport_cost(plan, cost, row_mask, col_mask)
    return SolverResult(
        plan,
        log_u,
        log_v,
        err,
        state.n_iters,
        transport,
        plan_mass=rows.sum(1),
        marginals=(rows, cols),
    )
