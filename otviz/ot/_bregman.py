"""Log-domain KL (Bregman) projections of a batch of plans onto marginal constraint sets,
the building blocks of Dykstra's algorithm for entropic OT with inequality constraints
(Benamou et al. 2015, cited by OT-CLIP Sec. 4.3).

For every set here the KL projection of a plan ``P`` is a diagonal rescaling, so each
function takes a log plan ``y [B, N, M]`` (``NEG`` on masked pairs) and returns only the log
scaling to add (per row, per column or per problem). Solvers keep ``log P = log K + f + g``
and add these shifts to the dual-like vectors ``f`` / ``g``; the same vectors are the Dykstra
corrections to carry for the set.
"""

from __future__ import annotations

import torch
from torch import Tensor


def row_box_shift(y: Tensor, log_low: Tensor | None, log_high: Tensor | None) -> Tensor:
    """``[B, N]`` log row scaling of the KL projection onto ``{low <= P 1 <= high}``: each row
    sum is clipped into its box (``low == high`` is the equality ``P 1 = low``)."""
    s = torch.logsumexp(y, dim=2)
    t = s
    if log_low is not None:
        t = torch.maximum(t, log_low)
    if log_high is not None:
        t = torch.minimum(t, log_high)
    return t - s


def col_box_shift(y: Tensor, log_low: Tensor | None, log_high: Tensor | None) -> Tensor:
    """``[B, M]`` log column scaling of the KL projection onto ``{low <= P^T 1 <= high}``."""
    return row_box_shift(y.transpose(1, 2), log_low, log_high)


def total_mass_shift(y: Tensor, log_mass: Tensor) -> Tensor:
    """``[B]`` log scaling of the KL projection onto ``{1^T P 1 = mass}``."""
    return log_mass - torch.logsumexp(y.flatten(1), dim=1)


def box_update_gap(
    log_sums: Tensor,
    dual: Tensor,
    log_low: Tensor | None,
    log_high: Tensor | None,
    mask: Tensor | None,
) -> Tensor:
    """``[B]`` fixed-point residual of a box constraint ``low <= S <= high`` on the sums
    ``S`` (``log_sums [B, n]``: a plan's row or column sums) in Dykstra's algorithm: the L1
    distance ``sum_i |clip(S_i e^{-d_i}, low_i, high_i) - S_i|`` between the sums and those
    the next projection onto the box gives them, which first undoes the constraint's own
    log scaling ``dual`` (its Dykstra correction; the last box shift) and then clips.

    It is 0 exactly when ``S`` lies in the box and the scaling is 0 wherever ``S_i`` is
    strictly inside (``d_i > 0`` only at ``low``, ``d_i < 0`` only at ``high``): primal
    feasibility plus complementary slackness, the KKT conditions of the constraint. A
    feasible plan whose scaling still holds a bound that no longer binds is not at 0."""
    t = log_sums - dual
    if log_low is not None:
        t = torch.maximum(t, log_low)
    if log_high is not None:
        t = torch.minimum(t, log_high)
    gap = (torch.exp(t) - torch.exp(log_sums)).abs()
    return (gap if mask is None else gap * mask.to(gap.dtype)).sum(-1)
