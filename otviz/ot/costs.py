"""Cost matrices between batched point clouds."""

from __future__ import annotations

import torch
from torch import Tensor

#: Largest ``|C|`` of the cosine cost ``1 - z . y`` of unit vectors, the cost scale of the
#: eps floor (:func:`otviz.ot._knobs.eps_floor`) wherever a solver knows its cost is one.
COSINE_COST_SCALE = 2.0


def cosine_similarity(z: Tensor, y: Tensor) -> Tensor:
    """``[B, N, M]`` inner products ``z_i . y_j`` of L2-normalised ``z [B, N, d]``,
    ``y [B, M, d]`` (their cosines)."""
    return z @ y.transpose(1, 2)


def cosine_cost(z: Tensor, y: Tensor, z_scale: Tensor | None = None) -> Tensor:
    """``[B, N, M]`` cosine cost ``C_ij = 1 - z_i . y_j`` (ConceptOT Sec. 2.2) of unit
    vectors, or of ``z_i * z_scale_i`` when the rows of ``z`` come unnormalised with their
    inverse norms ``z_scale [B, N]``; one fused pass after the product."""
    one = torch.ones(1, 1, 1, dtype=z.dtype, device=z.device)
    if z_scale is None:
        return torch.baddbmm(one, z, y.transpose(1, 2), alpha=-1.0)
    return torch.addcmul(one, z @ y.transpose(1, 2), z_scale.unsqueeze(-1), value=-1.0)
