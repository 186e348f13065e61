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
