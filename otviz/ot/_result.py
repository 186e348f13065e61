"""Result types and conventions shared by every solver in :mod:`otviz.ot`.

One meaning of ``marginal_error`` and ``tol`` across the solvers: ``marginal_error [B]`` is
an L1 distance in units of mass between the plan's marginals and the marginals the solver's
constraints ask for at its solution -- ``a`` and ``b`` for hard constraints, the bounds and
the total mass for inequality constraints (partial OT, DBOT), and for KL-relaxed marginals
the row marginal one more scaling update would give (0 exactly at the fixed point; equal to
``|P 1 - a|_1`` when the relaxation is hard). A solver given ``tol`` stops once every
problem's ``marginal_error`` is ``<= tol``, sets ``converged`` from the same test and warns
(:class:`NotConvergedWarning`) when some problem is still above ``tol`` after ``n_iters``.
``tol=None`` runs exactly ``n_iters`` (an unrolled solver inside a model, e.g. ConceptOT's
``L = 5``): ``converged`` is then judged against :data:`DEFAULT_TOL` and nothing is warned,
the caller having chosen the count.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

#: Default marginal-error tolerance (L1, units of mass) of the library solvers.
DEFAULT_TOL = 1e-4


class NotConvergedWarning(RuntimeWarning):
    """A solver stopped at its iteration cap with a marginal error above its tolerance."""


@dataclass
class SolverResult:
    """Outcome of a batched OT solve.

    Attributes:
        plan: ``[B, N, M]`` transport plan (dense solvers), or ``None`` for factored solvers.
        log_u: ``[B, N]`` log row scaling (``f / eps`` in dual terms).
        log_v: ``[B, M]`` log column scaling.
        marginal_error: ``[B]`` L1 marginal error (module docstring: one meaning for all).
        n_iters: iterations actually run.
        cost: ``[B]`` transport cost ``<C, plan>`` where the solver defines one.
        extras: solver-specific tensors (duals, partial results) for views.
        converged: ``[B]`` bool, ``marginal_error <= tol`` (:data:`DEFAULT_TOL` when the
            solver ran a fixed count); filled from ``marginal_error`` when not given.
    """

    plan: Tensor | None
    log_u: Tensor
    log_v: Tensor
    marginal_error: Tensor
    n_iters: int
    cost: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    converged: Tensor | None = None

    def __post_init__(self) -> None:
        if self.converged is None:
            self.converged = self.marginal_error <= DEFAULT_TOL


def judge_convergence(result: SolverResult, tol: float | None, solver: str) -> SolverResult:
    """Set ``result.converged`` against ``tol`` (:data:`DEFAULT_TOL` when ``None``) and warn
    when a tolerance was asked for and some problem did not reach it."""
    result.converged = result.marginal_error <= (DEFAULT_TOL if tol is None else tol)
    warn_unconverged(result.marginal_error, tol, result.n_iters, solver)
    return result


def warn_unconverged(error: Tensor, tol: float | None, n_iters: int, solver: str) -> None:
    """Warn (:class:`NotConvergedWarning`) when ``tol`` is given and some ``error`` exceeds it
    (NaN errors count as exceeding)."""
    if tol is None:
        return
    bad = ~(error.detach() <= tol)
    if bool(bad.any()):
        worst = float(error.detach().nan_to_num(float("inf")).max())
        warnings.warn(
            f"{solver}: {int(bad.sum())} of {error.numel()} problems stopped after "
            f"{n_iters} iterations with marginal error up to {worst:.3g} > tol {tol:g}; "
            "raise n_iters or eps, or pass tol=None for a fixed iteration count",
            NotConvergedWarning,
            stacklevel=3,
        )


def safe_log(x: Tensor, tiny: float = 1e-30) -> Tensor:
    """``log(x)`` clamped away from ``-inf`` for strictly non-negative inputs."""
    return torch.log(x.clamp_min(tiny))
