"""Optimal-transport solvers: pure, batched (``[B, N, M]`` with masks for ragged sides),
log-domain and differentiable tensor functions, free of model code.

The public namespace below is the library contract: every solver takes its problem in the
order ``(cost, a, b, eps, ...)``, validates its inputs (:class:`SolverInputError`), and
returns a :class:`SolverResult` (plan, ``row_marginal``, ``col_marginal``, ``apply``,
``marginal_error``, ``converged``) or a subclass; a solver that stops before ``tol`` says
so (:class:`NotConvergedWarning`). An empty batch (``B = 0``) gives an empty result of the
problem's dtype; a problem with no row or column (``N = 0`` or ``M = 0``) is refused naming
the dimension; a tensor ``eps`` / ``tau`` of another float dtype or device than the problem
is cast to the problem's (docs/solver-contract.md). Each solver family's knobs form one
frozen settings object (:class:`SinkhornSettings`, :class:`UnbalancedSettings`,
:class:`LowRankSettings`), which the low-rank solver takes as is and the unchecked cores
(``solve_dense``, ``solve_lowrank``, for a caller that has checked its inputs once) all
take.
Everything else is internal: helper modules are underscore-named (``_checks``, ``_result``,
``_bregman``, like POT's ``ot/_*.py``) and a solver module's helpers are underscore-prefixed.

    >>> import torch, otviz.ot as ot
    >>> cost = torch.rand(1, 4, 3, dtype=torch.float64)
    >>> a = torch.full((1, 4), 1 / 4, dtype=torch.float64)
    >>> b = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    >>> result = ot.sinkhorn_log(cost, a, b, eps=0.1)
    >>> bool(result.converged)
    True
"""

from otviz.ot._checks import SolverInputError
from otviz.ot._result import NotConvergedWarning, SolverResult
from otviz.ot._settings import LowRankSettings, SinkhornSettings, UnbalancedSettings
from otviz.ot.came import CameResult, came_marginals
from otviz.ot.costs import cosine_cost, cosine_similarity
from otviz.ot.dbot import dbot_log
from otviz.ot.divergence import DivergenceResult, sinkhorn_divergence
from otviz.ot.fgw import fgw_isoftmax, fgw_pgd, fgw_sinkhorn, structure_matrix
from otviz.ot.lowrank import (
    LowRankPlan,
    LowRankProblem,
    LowRankResult,
    lowrank_uot,
    stabilised_score,
)
from otviz.ot.partial import partial_ot_log
from otviz.ot.powerset import (
    exact_r2t,
    exact_t2r,
    nla_t1,
    nla_t2,
    powerset_scores,
    powerset_similarity,
)
from otviz.ot.sinkhorn import sinkhorn_log
from otviz.ot.unbalanced import sinkhorn_unbalanced_log
from otviz.ot.zeroshot import (
    Prediction,
    long_tailed_predict,
    selective_predict,
    zero_shot_predict,
)

__all__ = [
    "CameResult",
    "DivergenceResult",
    "LowRankPlan",
    "LowRankProblem",
    "LowRankResult",
    "LowRankSettings",
    "NotConvergedWarning",
    "Prediction",
    "SinkhornSettings",
    "SolverInputError",
    "SolverResult",
    "UnbalancedSettings",
    "came_marginals",
    "cosine_cost",
    "cosine_similarity",
    "dbot_log",
    "exact_r2t",
    "exact_t2r",
    "fgw_isoftmax",
    "fgw_pgd",
    "fgw_sinkhorn",
    "long_tailed_predict",
    "lowrank_uot",
    "nla_t1",
    "nla_t2",
    "partial_ot_log",
    "powerset_scores",
    "powerset_similarity",
    "selective_predict",
    "sinkhorn_divergence",
    "sinkhorn_log",
    "sinkhorn_unbalanced_log",
    "stabilised_score",
    "structure_matrix",
    "zero_shot_predict",
]
