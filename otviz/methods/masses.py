"""Reference masses mu, nu of patches and tokens (ConceptOT Eq. 1-2).

Shared by Dense UOT and ConceptOT. Trainable: scalar softplus heads on the backbone features,
normalised over the valid entries. Training-free: uniform over the valid entries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.methods.base import PairBatch


def uniform_masses(mask: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``[B, n]`` uniform distribution over the True entries of ``mask`` (0 elsewhere)."""
    w = mask.to(dtype or torch.get_default_dtype())
    return w / w.sum(1, keepdim=True).clamp_min(1.0)


def max_over_uniform(masses: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` ``max_i m_i / (1 / N_valid)``: how far the largest mass is above the uniform
    one over the ``mask``'s valid entries (1: uniform masses), for masses summing to one."""
    n_valid = mask.sum(1).clamp_min(1).to(masses.dtype)
    return masses.amax(1) * n_valid


class MassHead(nn.Module):
    """``softplus(w^T x + b)`` normalised over the valid entries (Eq. 1 / Eq. 2).

    The head starts at ``w = 0``, ``b = 0``: uniform masses until training moves it.
    """

    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        logit = F.softplus(self.linear(x).squeeze(-1)) * mask.to(x.dtype)
        return logit / logit.sum(1, keepdim=True).clamp_min(1e-12)


class ReferenceMasses(nn.Module):
    """The pair of reference masses ``(mu [B, N], nu [B, M])`` of a batch.

    Args:
        patch_dim, token_dim: widths of the backbone features the heads read.
        trainable: False gives uniform masses (the training-free configuration).
    """

    def __init__(self, patch_dim: int, token_dim: int, trainable: bool = True) -> None:
        super().__init__()
        self.head_v = MassHead(patch_dim) if trainable else None
        self.head_t = MassHead(token_dim) if trainable else None

    def forward(self, batch: PairBatch) -> tuple[Tensor, Tensor]:
        if self.head_v is None or self.head_t is None:
            dtype = batch.patches.dtype
            return uniform_masses(batch.patch_mask, dtype), uniform_masses(batch.token_mask, dtype)
        return (
            self.head_v(batch.patches, batch.patch_mask),
            self.head_t(batch.tokens, batch.token_mask),
        )
