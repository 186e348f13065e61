"""Fused Gromov-Wasserstein transport by linearising the structural term (OT-CLIP Sec. 4.1-4.2).

The objective (OT-CLIP Eq. 11 / 14, Eq. 9 with a structural cost Eq. 10) is

    <C, P> - alpha0 <D1, P D2 P^T> - eps H(P)

over a constraint set: the row-only set ``C(a) = {P 1 = a}`` (zero-shot classification with
unknown label distribution), the transport polytope ``U(a, b)`` (long-tailed inference with a
known label prior) or the KL-relaxed marginals of unbalanced OT (U-FG OT). Every solver here
iterates the linearisation of OT-CLIP Eq. 12,

    C^(l) = C - alpha0 D1 P^(l) D2^T,

and re-solves an entropic problem with the cost ``C^(l)``: a row softmax (FGW-ISoftmax),
a KL mirror step from ``P^(l)`` (FGW-PGD, Eq. 13) or (generalized) Sinkhorn.

Two scalings of the Gromov term, chosen by ``scaling``:

* ``"paper"`` (default): Eq. 12 verbatim, the raw plan ``P^(l)``, with OT-CLIP Table 7's
  weights (``alpha0 = a1 = 0.01`` for FGW-ISoftmax / FGW-PGD zero-shot and for long-tailed
  CIFAR-100; 0.1 for ImageNet). Over ``C(1)`` or ``U(1, b)`` the plan has total mass ``n``
  (the number of images), so the term grows with the batch: OT-CLIP App. D.2 re-tunes it per
  batch size. (The FGW-PGD pseudocode of App. B.2 multiplies by a second weight
  ``a2 = 0.01`` as well; Eq. 11-13 have one ``alpha0``, used here.)
* ``"unit_mass"``: the plan scaled to unit mass, ``C - alpha0 D1 (P / 1^T P 1) D2^T``: for a
  fixed total mass ``n`` this is ``"paper"`` with ``alpha0 / n``, so one ``alpha0`` serves
  every batch size, and it keeps the shift bounded by ``alpha0 max |D1| max |D2|`` for
  relaxed marginals (with the raw plan, mass attracts more mass through the term and the
  unbalanced iteration can run away). The OT-CLIP training losses use it.

POT mapping. ``ot.gromov.entropic_fused_gromov_wasserstein(M, C1, C2, p, q,
loss_fun='square_loss', epsilon=eps_pot, alpha=beta)`` minimises ``(1 - beta) <M, T> +
beta sum L(C1_ik, C2_jl) T_ij T_kl - eps_pot H(T)``; with the square loss its gradient is
``(1 - beta) M - 4 beta C1 T C2^T`` plus terms constant on ``U(p, q)``, so its iterates
are this module's ``"paper"`` iteration over ``U(a, b)`` with ``alpha0 = 4 beta / (1 - beta)``
and ``eps = eps_pot / (1 - beta)`` (started from the same plan).

``D1 [B, N, N]`` and ``D2 [B, M, M]`` compare the rows (images) and columns (classes or
texts) among themselves. OT-CLIP Eq. 10 calls them cosine *distance* matrices while its
pseudocode (App. A.3, B.1-B.2) uses the cosine *similarity* ``f f^T``; both are offered by
:func:`structure_matrix` (default: similarity, as in the code the paper ran). The pseudocode
also accumulates the correction into ``C`` across iterations; Eq. 12, followed here, does not.

Argument order, as every solver of :mod:`otviz.ot`: ``(cost, a, [b,] eps, d1, d2, alpha0,
...)``.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.ot._checks import (
    SolverInputError,
    check_tau,
    check_tensors,
    clean_problem,
    clean_where_valid,
    pair_mask,
)
from otviz.ot._knobs import (
    KnobError,
    check_choice,
    check_count,
    check_number,
    knob_like,
    per_problem,
)
from otviz.ot._result import (
    DEFAULT_MAX_ITERS,
    DEFAULT_TOL,
    NotConvergedWarning,
    SolverResult,
    judge_convergence,
)
from otviz.ot._settings import UnbalancedSettings, settings_of
from otviz.ot.sinkhorn import NEG, _transport_cost, sinkhorn_log
from otviz.ot.unbalanced import sinkhorn_unbalanced_log

Structure = Literal["similarity", "distance"]
Scaling = Literal["paper", "unit_mass"]
SCALINGS: tuple[str, ...] = ("paper", "unit_mass")


def structure_matrix(x: Tensor, kind: Structure = "similarity") -> Tensor:
    """``[B, N, N]`` cosine similarity ``x x^T`` (normalised) or distance ``1 - x x^T``."""
    sim = F.normalize(x, dim=-1) @ F.normalize(x, dim=-1).transpose(-1, -2)
    if kind == "similarity":
        return sim
    if kind == "distance":
        return 1.0 - sim
    raise KnobError(f"structure_matrix: unknown kind {kind!r}; use 'similarity' or 'distance'")


def _linearised_cost(
    cost: Tensor, d1: Tensor, d2: Tensor, plan: Tensor, alpha0: float, scaling: Scaling = "paper"
) -> Tensor:
    """OT-CLIP Eq. 12's ``C - alpha0 D1 P D2^T`` (``scaling="paper"``) or its unit-mass form
    ``C - alpha0 D1 (P / 1^T P 1) D2^T`` (``"unit_mass"``), module docstring."""
    if alpha0 == 0.0:
        return cost
    if scaling == "unit_mass":
        plan = plan / plan.sum((-2, -1), keepdim=True).clamp_min(torch.finfo(plan.dtype).tiny)
    elif scaling != "paper":
        raise ValueError(f"unknown Gromov scaling {scaling!r}; use one of {SCALINGS}")
    return cost - alpha0 * d1 @ plan @ d2.transpose(-1, -2)


def _structure_term(d1: Tensor, d2: Tensor, plan: Tensor) -> Tensor:
    """``[B]`` edge agreement ``<D1, P D2 P^T>`` (the quantity weighted by alpha0 in Eq. 11)."""
    return (d1 * (plan @ d2 @ plan.transpose(-1, -2))).sum((-1, -2))


def _clean_fgw(
    cost: Tensor,
    a: Tensor | None,
    b: Tensor | None,
    eps: float,
    d1: Tensor,
    d2: Tensor,
    alpha0: float,
    scaling: str,
    solver: str,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor, Tensor]:
    """The checks of :mod:`otviz.ot._checks` for an FGW problem; returns ``(cost, a, b, d1,
    d2)`` with non-finite masked entries set to 0 (``d1`` is masked by ``row_mask`` on both
    sides, ``d2`` by ``col_mask``), so none reaches a plan."""
    check_number("alpha0", alpha0, solver)
    check_choice("scaling", scaling, SCALINGS, solver)
    check_tensors(solver, cost=cost, a=a, b=b, d1=d1, d2=d2)
    cost, a, b = clean_problem(cost, a, b, eps, solver, row_mask, col_mask)
    bsz, n, m = cost.shape
    if tuple(d1.shape) != (bsz, n, n) or tuple(d2.shape) != (bsz, m, m):
        raise SolverInputError(
            f"{solver}: d1, d2 must be [B, N, N], [B, M, M] = {(bsz, n, n)}, {(bsz, m, m)}; "
            f"got {tuple(d1.shape)}, {tuple(d2.shape)}"
        )
    d1 = clean_where_valid("d1", d1, pair_mask(row_mask, row_mask), solver)
    d2 = clean_where_valid("d2", d2, pair_mask(col_mask, col_mask), solver)
    return cost, a, b, d1, d2


def _row_masks(
    cost: Tensor, row_mask: Tensor | None, col_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    b, n, m = cost.shape
    rows = torch.ones(b, n, dtype=torch.bool, device=cost.device) if row_mask is None else row_mask
    cols = torch.ones(b, m, dtype=torch.bool, device=cost.device) if col_mask is None else col_mask
    return rows, cols


def _row_result(
    log_plan: Tensor,
    cost: Tensor,
    a: Tensor,
    rows: Tensor,
    d1: Tensor,
    d2: Tensor,
    n_iters: int,
) -> SolverResult:
    """Result of a row-constrained (``C(a)``) solve from its log plan."""
    plan = _row_plan(log_plan, rows)
    err = ((plan.sum(2) - a).abs() * rows.to(cost.dtype)).sum(1)
    log_u = torch.logsumexp(log_plan, dim=2).masked_fill(~rows, -torch.inf)
    log_v = torch.zeros_like(cost[:, 0])
    return SolverResult(
        plan,
        log_u,
        log_v,
        err,
        n_iters,
        _transport_cost(plan, cost, rows, None),
        {"structure": _structure_term(d1, d2, plan)},
    )


def _row_plan(log_plan: Tensor, rows: Tensor) -> Tensor:
    """``exp(log_plan)`` on valid rows, exactly 0 on masked ones (whatever they hold)."""
    return torch.where(rows[:, :, None], torch.exp(log_plan), 0.0)


def _row_log_softmax(logits: Tensor, a: Tensor, cols: Tensor) -> Tensor:
    """``log(a_i softmax_j(logits_ij))`` over valid columns."""
    return torch.log_softmax(logits.masked_fill(~cols[:, None, :], NEG), dim=2) + torch.log(
        a.clamp_min(torch.finfo(a.dtype).tiny)
    )[:, :, None]


def fgw_isoftmax(
    cost: Tensor,
    a: Tensor | None,
    eps: float,
    d1: Tensor,
    d2: Tensor,
    alpha0: float,
    n_iters: int = 3,
    scaling: Scaling = "paper",
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """FGromov OT-ISoftmax (OT-CLIP Eq. 11-12, App. B.1): ``P^(0) = softmax(-C / eps)`` then
    ``P^(l+1) = a * softmax(-C^(l) / eps)`` row-wise, the closed-form solution of Eq. 12 over
    ``C(a)``. With ``alpha0 = 0`` it is the plain softmax prediction.

    Args:
        cost: ``[B, N, M]`` cost, e.g. ``1 - cos(image, class)``.
        a: ``[B, N]`` row masses (``None``: ones, each image sums to one).
        eps: entropic regularisation (the softmax temperature, > 0).
        d1, d2: ``[B, N, N]``, ``[B, M, M]`` structure matrices.
        alpha0: weight of the structural (Gromov) term (Table 7's ``a1``).
        n_iters: linearisation steps (OT-CLIP Table 7: 3-5), a fixed count: the row
            constraint holds exactly at every step, so ``marginal_error`` is rounding and
            ``converged`` says only that the rows hold, not that the linearisation reached
            a fixed point of Eq. 12 (docs/solver-contract.md).
        scaling: ``"paper"`` (Eq. 12) or ``"unit_mass"`` (module docstring).
        row_mask, col_mask: optional validity masks (masked entries of ``cost``, ``a``,
            ``d1``, ``d2`` may hold anything, NaN included).
    """
    check_count("n_iters", n_iters, "fgw_isoftmax", low=0)
    cost, a, _, d1, d2 = _clean_fgw(
        cost, a, None, eps, d1, d2, alpha0, scaling, "fgw_isoftmax", row_mask, col_mask
    )
    rows, cols = _row_masks(cost, row_mask, col_mask)
    a = torch.ones_like(cost[:, :, 0]) if a is None else a
    eps = per_problem(knob_like(eps, cost), 3)
    log_plan = _row_log_softmax(-cost / eps, a, cols)
    for _ in range(n_iters):
        plan = _row_plan(log_plan, rows)
        c_l = _linearised_cost(cost, d1, d2, plan, alpha0, scaling)
        log_plan = _row_log_softmax(-c_l / eps, a, cols)
    return _row_result(log_plan, cost, a, rows, d1, d2, n_iters)


def fgw_pgd(
    cost: Tensor,
    a: Tensor | None,
    eps: float,
    d1: Tensor,
    d2: Tensor,
    alpha0: float,
    n_iters: int = 5,
    scaling: Scaling = "paper",
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """FGromov OT-PGD (OT-CLIP Eq. 13, App. B.2): KL-projected (mirror) gradient steps
    ``P <- Proj_{C(a)}^KL(P * exp(-G / eps))`` with the gradient ``G = C - alpha0 D1 P^ D2^T``
    of the non-entropic part and step size ``1 / eps``; the KL projection onto ``C(a)`` is a
    row normalisation. Starts from the softmax prediction ``softmax(-C / eps)`` (App. B.2
    starts from ``softmax(-C)``), so with ``alpha0 = 0`` the l-th iterate is
    ``softmax(-(l + 1) C / eps)`` and the predicted labels are the softmax ones. Arguments
    as :func:`fgw_isoftmax` (``n_iters``: Table 7's 5 steps).
    """
    check_count("n_iters", n_iters, "fgw_pgd", low=0)
    cost, a, _, d1, d2 = _clean_fgw(
        cost, a, None, eps, d1, d2, alpha0, scaling, "fgw_pgd", row_mask, col_mask
    )
    rows, cols = _row_masks(cost, row_mask, col_mask)
    a = torch.ones_like(cost[:, :, 0]) if a is None else a
    eps = per_problem(knob_like(eps, cost), 3)
    log_plan = _row_log_softmax(-cost / eps, a, cols)
    for _ in range(n_iters):
        plan = _row_plan(log_plan, rows)
        grad = _linearised_cost(cost, d1, d2, plan, alpha0, scaling)
        log_plan = _row_log_softmax(log_plan - grad / eps, a, cols)
    return _row_result(log_plan, cost, a, rows, d1, d2, n_iters)


def fgw_sinkhorn(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float,
    d1: Tensor,
    d2: Tensor,
    alpha0: float,
    n_outer: int = 3,
    n_inner: int = DEFAULT_MAX_ITERS,
    tau_a: float = float("inf"),
    tau_b: float = float("inf"),
    scaling: Scaling = "paper",
    tol: float | None = DEFAULT_TOL,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Fused Gromov OT over ``U(a, b)`` (OT-CLIP Eq. 14; FGromov OT of Eq. 9 with
    ``alpha1, alpha2 -> inf``) or with KL-relaxed marginals (U-FG OT, Eq. 9 with finite
    ``tau_a = alpha1``, ``tau_b = alpha2``): ``P^(0)`` solves the problem with ``alpha0 = 0``,
    then ``n_outer`` times ``P^(l+1)`` solves it with the cost ``C^(l)`` (Eq. 12, scaled by
    ``scaling``) by at most ``n_inner`` (generalized) Sinkhorn iterations to ``tol``
    (``None``: exactly ``n_inner``). ``alpha0 = 0`` with infinite taus is plain entropic OT
    (:func:`otviz.ot.sinkhorn.sinkhorn_log`).

    Returns the last inner solve's :class:`SolverResult` with ``cost = <C, P>`` for the
    original ``C``, ``extras['structure'] = <D1, P D2 P^T>``, ``n_iters`` the total count
    of inner iterations and ``converged`` (one warning) for that last solve.
    """
    solver = "fgw_sinkhorn"
    settings = settings_of(
        solver, UnbalancedSettings, like=cost, eps=eps, tau_a=tau_a, tau_b=tau_b,
        n_iters=n_inner, tol=tol,
    )
    eps, tau_a, tau_b = settings.eps, settings.tau_a, settings.tau_b
    check_count("n_outer", n_outer, solver, low=0)
    cost, a, b, d1, d2 = _clean_fgw(
        cost, a, b, eps, d1, d2, alpha0, scaling, solver, row_mask, col_mask
    )
    check_tau("tau_a", tau_a, solver, cost.shape[0])
    check_tau("tau_b", tau_b, solver, cost.shape[0])
    balanced = not isinstance(tau_a, Tensor) and not isinstance(tau_b, Tensor)
    balanced = balanced and tau_a == float("inf") and tau_b == float("inf")

    def solve(c: Tensor) -> SolverResult:
        inner = "sinkhorn_log" if balanced else "sinkhorn_unbalanced_log"
        with warnings.catch_warnings():  # judged once, on the last solve
            warnings.simplefilter("ignore", NotConvergedWarning)
            try:
                if balanced:
                    return sinkhorn_log(
                        c, a, b, eps, n_inner, tol, row_mask=row_mask, col_mask=col_mask
                    )
                return sinkhorn_unbalanced_log(
                    c, a, b, eps, tau_a, tau_b, n_inner, tol, row_mask=row_mask,
                    col_mask=col_mask,
                )
            except SolverInputError as e:  # a linearised cost's refusal: name the call made
                raise type(e)(str(e).replace(inner, solver, 1)) from None

    res = solve(cost)
    total = res.n_iters
    for _ in range(n_outer if alpha0 != 0.0 else 0):
        res = solve(_linearised_cost(cost, d1, d2, res.plan, alpha0, scaling))
        total += res.n_iters
    res.cost = _transport_cost(res.plan, cost, row_mask, col_mask)
    res.extras["structure"] = _structure_term(d1, d2, res.plan)
    res.n_iters = total
    return judge_convergence(res, tol, solver)
