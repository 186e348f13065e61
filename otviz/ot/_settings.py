"""The knobs of each solver family, one frozen object per family, held apart from the
problem the way ott's ``Sinkhorn(threshold, max_iterations, ...)`` holds its settings
apart from the ``LinearProblem`` it is called on: a solver's private core takes the
problem's tensors and one settings object instead of repeating the tail
``eps, n_iters, tol`` in every signature."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from otviz.ot._result import DEFAULT_MAX_ITERS, DEFAULT_TOL


@dataclass(frozen=True, kw_only=True)
class SinkhornSettings:
    """Entropic scaling (:func:`otviz.ot.sinkhorn.sinkhorn_log`).

    Attributes:
        eps: entropic regularisation (> 0; a tensor for a learned temperature).
        n_iters: maximal iterations (each one row and one column update).
        tol: stop once every problem's relative marginal error is ``<= tol``; ``None``:
            exactly ``n_iters`` (:mod:`otviz.ot._result`).
    """

    eps: float | Tensor
    n_iters: int = DEFAULT_MAX_ITERS
    tol: float | None = DEFAULT_TOL


@dataclass(frozen=True, kw_only=True)
class UnbalancedSettings(SinkhornSettings):
    """Generalized Sinkhorn (ConceptOT Eq. 3,
    :func:`otviz.ot.unbalanced.sinkhorn_unbalanced_log`): the KL weights (>= 0) of the row
    and column marginals, ``float('inf')`` for a hard one."""

    tau_a: float
    tau_b: float


@dataclass(frozen=True, kw_only=True)
class LowRankSettings(UnbalancedSettings):
    """Low-rank generalized Sinkhorn through anchors (ConceptOT Alg. 1,
    :func:`otviz.ot.lowrank.lowrank_uot`).

    Attributes:
        kpp_reg: lambda added to ``K_PP`` (App. H: 1e-2).
        variant: ``"faithful"`` or ``"positive"`` (:mod:`otviz.ot.lowrank`).
        clamp: bound of the centred log-scalings (faithful; ``None`` disables).
        floor: the ``1e-8`` of Alg. 1 lines 9 and 13 (faithful; 0 disables).
    """

    kpp_reg: float = 1e-2
    variant: str = "faithful"
    clamp: float | None = 20.0
    floor: float = 1e-8
