"""Result types shared by every solver in :mod:`otviz.ot`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class SolverResult:
    """Outcome of a batched OT solve.

    Attributes:
        plan: ``[B, N, M]`` transport plan (dense solvers), or ``None`` for factored solvers.
        log_u: ``[B, N]`` log row scaling (``f / eps`` in dual terms).
        log_v: ``[B, M]`` log column scaling.
        marginal_error: ``[B]`` L1 distance between the plan's marginals and the targets the
            solver enforces (for unbalanced solvers: the fixed-point residual of the scalings).
        n_iters: iterations actually run.
        cost: ``[B]`` transport cost ``<C, plan>`` where the solver defines one.
        extras: solver-specific tensors (duals, partial results) for views.
    """

    plan: Tensor | None
    log_u: Tensor
    log_v: Tensor
    marginal_error: Tensor
    n_iters: int
    cost: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)

    def converged(self, tol: float = 1e-3) -> Tensor:
        """``[B]`` bool: whether each problem's marginal error is below ``tol``."""
        return self.marginal_error <= tol


def masked_fill_inf(x: Tensor, mask: Tensor | None, value: float = -float("inf")) -> Tensor:
    """Return ``x`` with entries where ``mask`` is False replaced by ``value``."""
    if mask is None:
        return x
    return x.masked_fill(~mask, value)


def safe_log(x: Tensor, tiny: float = 1e-30) -> Tensor:
    """``log(x)`` clamped away from ``-inf`` for strictly non-negative inputs."""
    return torch.log(x.clamp_min(tiny))
