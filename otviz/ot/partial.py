"""Entropic partial OT (OT-CLIP Eq. 16): transport exactly a total mass ``s`` with row sums
(and optionally column sums) bounded above,

    min <C, P> - eps H(P)   s.t.   P 1 <= a,   [P^T 1 <= b,]   1^T P 1 = s,

solved by Dykstra's iterative Bregman projections in the log domain (Benamou et al. 2015,
as OT-CLIP says; the same iteration as POT's ``ot.partial.entropic_partial_wasserstein``,
which always has the column bound). OT-CLIP's selective classification uses ``a = 1`` per
image and no column bound: ``s`` images are (softly) accepted.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from otviz.ot.bregman import col_box_shift, row_box_shift, total_mass_shift
from otviz.ot.result import SolverResult
from otviz.ot.sinkhorn import masked_log, masked_log_kernel, transport_cost


def _masked(shift: Tensor, mask: Tensor | None) -> Tensor:
    return shift if mask is None else shift.masked_fill(~mask, 0.0)


def partial_ot_log(
    cost: Tensor,
    mass: float | Tensor,
    eps: float,
    a: Tensor | None = None,
    b: Tensor | None = None,
    n_iters: int = 300,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> SolverResult:
    """Entropic partial OT with total mass ``mass`` by log-domain Dykstra.

    Args:
        cost: ``[B, N, M]`` cost.
        mass: total transported mass ``s`` (float or ``[B]``), at most ``sum a`` (and
            ``sum b``).
        eps: entropic regularisation.
        a: ``[B, N]`` row upper bounds (default ones).
        b: ``[B, M]`` column upper bounds (default: none).
        n_iters: Dykstra sweeps (rows, columns if bounded, total mass); the returned plan
            meets the total mass exactly.
        row_mask, col_mask: optional validity masks.

    Returns:
        :class:`SolverResult` with ``marginal_error`` = L1 excess over the row (and column)
        bounds plus ``|1^T P 1 - s|`` (0 up to rounding) and ``cost = <C, P>``.
    """
    log_k = masked_log_kernel(cost, eps, row_mask, col_mask)
    a = torch.ones_like(cost[:, :, 0]) if a is None else a
    log_a = masked_log(a, row_mask)
    log_b = None if b is None else masked_log(b, col_mask)
    mass_t = torch.as_tensor(mass, dtype=cost.dtype, device=cost.device).expand(cost.shape[0])
    log_s = torch.log(mass_t)
    f = torch.zeros_like(log_k[:, :, 0])
    g = torch.zeros_like(log_k[:, 0])
    h = torch.zeros_like(log_s)  # total-mass scaling, folded into f at the end
    c_row, c_col, c_tot = torch.zeros_like(f), torch.zeros_like(g), torch.zeros_like(h)

    def log_plan() -> Tensor:
        return log_k + f[:, :, None] + g[:, None, :] + h[:, None, None]

    for _ in range(n_iters):
        f = f + c_row
        shift = _masked(row_box_shift(log_plan(), None, log_a), row_mask)
        f, c_row = f + shift, -shift
        if log_b is not None:
            g = g + c_col
            shift = _masked(col_box_shift(log_plan(), None, log_b), col_mask)
            g, c_col = g + shift, -shift
        h = h + c_tot
        shift = total_mass_shift(log_plan(), log_s)
        h, c_tot = h + shift, -shift
    plan = torch.exp(log_plan())
    excess = torch.relu(plan.sum(2) - a)
    if row_mask is not None:
        excess = excess * row_mask.to(excess.dtype)
    err = excess.sum(1) + (plan.sum((1, 2)) - mass_t).abs()
    if b is not None:
        col_excess = torch.relu(plan.sum(1) - b)
        if col_mask is not None:
            col_excess = col_excess * col_mask.to(col_excess.dtype)
        err = err + col_excess.sum(1)
    log_u = f + h[:, None]
    log_v = g
    if row_mask is not None:
        log_u = log_u.masked_fill(~row_mask, -math.inf)
    if col_mask is not None:
        log_v = log_v.masked_fill(~col_mask, -math.inf)
    return SolverResult(
        plan, log_u, log_v, err, n_iters, transport_cost(plan, cost, row_mask, col_mask)
    )
