"""Cost matrices between batched point clouds."""

from __future__ import annotations

from torch import Tensor


def cosine_similarity(z: Tensor, y: Tensor) -> Tensor:
    """``[B, N, M]`` inner products ``z_i . y_j`` of L2-normalised ``z [B, N, d]``,
    ``y [B, M, d]`` (their cosines)."""
    return z @ y.transpose(1, 2)


def cosine_cost(z: Tensor, y: Tensor) -> Tensor:
    """``[B, N, M]`` cosine cost ``C_ij = 1 - z_i . y_j`` (ConceptOT Sec. 2.2)."""
    return 1.0 - cosine_similarity(z, y)
