"""Result types and conventions shared by every solver in :mod:`otviz.ot`.

One meaning of ``marginal_error``, ``relative_error``, ``converged`` and ``tol`` across the
solvers (docs/solver-contract.md):

* ``marginal_error [B]`` is the *fixed-point residual* of the solver's constraints, an L1
  distance in units of mass between the plan's marginals and the marginals one more
  projection (scaling update) of each constraint would give it: ``|P 1 - a|_1`` (plus the
  column term) for hard marginals; for KL-relaxed marginals the gap to the next row
  update; for an inequality constraint (partial OT's bounds, DBOT's column box) the gap to
  the next Dykstra projection, which undoes the constraint's dual scaling and clips again.
  It is 0 exactly when the plan is a fixed point of every update, i.e. when the
  optimality (KKT) conditions of the entropic problem hold: feasibility alone does not make
  it 0 (an inequality whose dual is active on a slack bound still counts).
* ``relative_error [B]`` is ``marginal_error / plan_mass``, with ``plan_mass`` the plan's
  total mass ``1^T P 1``: scale-free, so a problem of tiny mass is judged like the same
  problem at unit mass (``inf`` when the plan has no mass: nothing can be judged).
* A solver given ``tol`` stops once every problem's ``relative_error`` is ``<= tol``, sets
  ``converged`` from the same test and warns (:class:`NotConvergedWarning`) when some
  problem is still above ``tol`` after ``n_iters``. ``tol=None`` runs exactly ``n_iters``
  (an unrolled solver inside a model, e.g. ConceptOT's ``L = 5``): ``converged`` is then
  judged against :data:`DEFAULT_TOL` and nothing is warned, the caller having chosen the
  count.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

#: Default relative marginal-error tolerance of the library solvers.
DEFAULT_TOL = 1e-4

#: Default iteration cap of the library solvers that iterate to ``tol``.
DEFAULT_MAX_ITERS = 1000


class NotConvergedWarning(RuntimeWarning):
    """A solver stopped at its iteration cap with a relative error above its tolerance."""


def relative_error(error: Tensor, mass: Tensor) -> Tensor:
    """``[B]`` ``error / mass``, ``inf`` where ``mass`` is not positive (an empty or
    underflowed plan cannot be judged)."""
    safe = mass.clamp_min(torch.finfo(mass.dtype).tiny)
    return torch.where(mass > 0, error / safe, torch.full_like(error, float("inf")))


@dataclass
class SolverResult:
    """Outcome of a batched OT solve.

    Attributes:
        plan: ``[B, N, M]`` transport plan (dense solvers), or ``None`` for factored solvers.
        log_u: ``[B, N]`` log row scaling (``f / eps`` in dual terms).
        log_v: ``[B, M]`` log column scaling.
        marginal_error: ``[B]`` L1 fixed-point residual in units of mass (module docstring).
        n_iters: iterations actually run.
        cost: ``[B]`` transport cost ``<C, plan>`` where the solver defines one.
        extras: solver-specific tensors (duals, partial results) for views.
        converged: ``[B]`` bool, ``relative_error <= tol`` (:data:`DEFAULT_TOL` when the
            solver ran a fixed count); filled from ``relative_error`` when not given.
        plan_mass: ``[B]`` the plan's total mass ``1^T P 1``, the scale of
            ``relative_error``; summed from ``plan`` when not given.
        marginals: the plan's row and column sums ``(P 1 [B, N], P^T 1 [B, M])`` when the
            solver kept them from its last updates; read them as :attr:`row_marginal` and
            :attr:`col_marginal`, which sum the plan when they are not given.

    Like POT's ``OTResult`` and ott's ``SinkhornOutput``, the result answers for its plan:
    :attr:`row_marginal`, :attr:`col_marginal` and :meth:`apply` (a factored result,
    :class:`otviz.ot.lowrank.LowRankResult`, answers through its factors).
    """

    plan: Tensor | None
    log_u: Tensor
    log_v: Tensor
    marginal_error: Tensor
    n_iters: int
    cost: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    converged: Tensor | None = None
    plan_mass: Tensor | None = None
    marginals: tuple[Tensor, Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.plan_mass is None:
            if self.plan is None:
                raise ValueError("SolverResult needs plan_mass when it holds no dense plan")
            self.plan_mass = self.plan.sum((1, 2))
        if self.converged is None:
            self.converged = self.relative_error <= DEFAULT_TOL

    @property
    def relative_error(self) -> Tensor:
        """``[B]`` ``marginal_error / plan_mass`` (module docstring)."""
        return relative_error(self.marginal_error.detach(), self.plan_mass.detach())

    @property
    def row_marginal(self) -> Tensor:
        """``[B, N]`` ``P 1``, the mass each row keeps."""
        return self.plan.sum(2) if self.marginals is None else self.marginals[0]

    @property
    def col_marginal(self) -> Tensor:
        """``[B, M]`` ``P^T 1``, the mass each column keeps."""
        return self.plan.sum(1) if self.marginals is None else self.marginals[1]

    def apply(self, x: Tensor) -> Tensor:
        """``P x`` for ``x [B, M, k]`` -> ``[B, N, k]``."""
        return torch.bmm(self.plan, x)

    def dense(self) -> Tensor:
        """``[B, N, M]`` the plan (so a result is a :class:`otviz.methods.base.TransportPlan`)."""
        return self.plan


def judge_convergence(
    result: SolverResult, tol: float | None, solver: str, n_max: int | None = None
) -> SolverResult:
    """Set ``result.converged`` against ``tol`` (:data:`DEFAULT_TOL` when ``None``) and warn
    when a tolerance was asked for and some problem did not reach it, with advice from
    what the solver saw (:func:`warn_unconverged`; ``n_max``: its iteration cap)."""
    rel = result.relative_error
    result.converged = rel <= (DEFAULT_TOL if tol is None else tol)
    warn_unconverged(rel, tol, result.n_iters, solver, n_max, (result.log_u, result.log_v))
    return result


def rounding_floor(potentials: tuple[Tensor, ...]) -> tuple[float, float]:
    """``(floor, span)``: the relative marginal error the dtype's rounding leaves a plan
    ``e^{f_i + g_j} K_ij`` whose log-scalings ``potentials`` reach ``span`` in magnitude
    (about ``cost / eps``): each factor is rounded to the machine epsilon ``u`` relative to
    its log, so a marginal moves by up to ``u span`` relative to itself. Masked (infinite)
    entries are left out."""
    span = 0.0
    for x in potentials:
        x = x.detach()
        span += float(torch.where(torch.isfinite(x), x.abs(), 0.0).amax()) if x.numel() else 0.0
    return torch.finfo(potentials[0].dtype).eps * span, span


def warn_unconverged(
    rel: Tensor,
    tol: float | None,
    n_iters: int,
    solver: str,
    n_max: int | None = None,
    potentials: tuple[Tensor, ...] | None = None,
) -> None:
    """Warn (:class:`NotConvergedWarning`) when ``tol`` is given and some relative error
    ``rel`` exceeds it (NaN errors count as exceeding), saying what would help: when the
    solver stopped before its cap ``n_max`` (its own test passed, the final plan's rounding
    did not) or ``tol`` lies below the dtype's :func:`rounding_floor` at the log-scalings
    ``potentials``, more iterations would not: a wider dtype, a larger eps or a looser tol
    would; otherwise more iterations (or a larger eps)."""
    if tol is None:
        return
    bad = ~(rel.detach() <= tol)
    if not bool(bad.any()):
        return
    worst = float(rel.detach().nan_to_num(float("inf")).max())
    ran = f"{n_iters}" if n_max is None else f"{n_iters} of {n_max}"
    head = (
        f"{solver}: {int(bad.sum())} of {rel.numel()} problems stopped after {ran} "
        f"iterations with relative marginal error up to {worst:.3g} > tol {tol:g}"
    )
    floor, span = rounding_floor(potentials) if potentials else (0.0, 0.0)
    stalled = n_max is not None and n_iters < n_max
    if potentials and (stalled or tol < floor):
        dtype = potentials[0].dtype
        wider = "pass float64 tensors, " if dtype != torch.float64 else ""
        advice = (
            f"{dtype} rounding limits the error here to about {floor:.2g} (machine epsilon x "
            f"log-scalings up to {span:.3g}, about cost / eps), so more iterations will not "
            f"reach tol: {wider}raise eps, or loosen tol"
        )
    else:
        advice = "raise n_iters or eps, or pass tol=None for a fixed iteration count"
    warnings.warn(f"{head}; {advice}", NotConvergedWarning, stacklevel=3)


def safe_log(x: Tensor, tiny: float = 1e-30) -> Tensor:
    """``log(x)`` clamped away from ``-inf`` for strictly non-negative inputs."""
    return torch.log(x.clamp_min(tiny))
