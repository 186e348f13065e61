"""Heads that start from the backbone: a trainable projection whose step 0 is the
training-free configuration.

The training-free configuration maps each patch / token through the model's own
projection into the joint space (``project`` of the image and text towers) and compares
there. A head started from the backbone (``MethodConfig.start == "backbone"``) reads the
same width features but projects them as

    z_i = (W_0 v_i + b_0 + U D v_i) / ||.||,

with ``(W_0, b_0)`` the model's projection read as an affine map (:func:`affine_map`,
frozen buffers stored with the head) and the update ``U D`` learned: a full residual
``Delta`` (``start_rank == 0``) or a rank-``r`` product whose ``U`` starts at zero. At step 0
the update is zero, so every projected feature, and with it every plan, equals the
training-free one; training moves the head away from the backbone only as far as the
local loss asks (AdamW's weight decay pulls the update, not the base, towards zero).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.knobs import HEAD_STARTS
from otviz.methods.base import PairBatch

#: The ``MethodConfig.start`` of a head started from the backbone; ``"random"`` is a new
#: random projection (the heads before this module); ``"auto"`` (a training request, never a
#: built head's) is the backbone's start where the towers' projections are affine maps, else
#: the random one (:func:`resolve_start`).
BACKBONE, RANDOM, AUTO = HEAD_STARTS
#: Relative error above which a tower's projection is not taken for an affine map.
AFFINE_TOLERANCE = 1e-4


@dataclass
class AffineMap:
    """``x -> x @ weight.T + bias``: ``weight [out, in]``, ``bias [out]``."""

    weight: Tensor
    bias: Tensor

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x), self.bias.to(x))


@dataclass
class BackboneStart:
    """What a head needs to start at the training-free configuration of one backbone.

    Attributes:
        patch_map: the image tower's projection of patch features (width -> joint space).
        token_map: the text tower's projection of token features.
        fit_batch: width-space token features of the captions the training-free
            configuration fits itself on (ConceptOT's k-means anchors), or None.
    """

    patch_map: AffineMap
    token_map: AffineMap
    fit_batch: PairBatch | None = None


def resolve_start(requested: str, start: BackboneStart | None) -> str:
    """The start a head is built with: ``requested`` itself, except ``"auto"``, which is
    ``"backbone"`` when the backbone's projections could be read as affine maps (``start``
    given) and ``"random"`` when not."""
    if requested != AUTO:
        return requested
    return BACKBONE if start is not None else RANDOM


@torch.no_grad()
def affine_map(project: Callable[[Tensor], Tensor], in_dim: int, like: Tensor) -> AffineMap:
    """``project`` (``[B, L, in_dim] -> [B, L, out]``, applied per position) as an
    :class:`AffineMap`, read off the images of 0 and of the unit vectors in float64 and
    checked on random inputs.

    Raises:
        ValueError: the projection is not affine (e.g. a layer norm inside it), so no head
            can start from it exactly; train with ``--start random``.
    """
    basis = torch.cat([torch.zeros(1, in_dim), torch.eye(in_dim)]).to(like.device)
    dtype = like.dtype
    images = project(basis[None].to(dtype))[0].double()
    bias = images[0]
    weight = (images[1:] - bias).T.contiguous()
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(1, 8, in_dim, generator=gen).to(like.device, dtype)
    want = project(probe).double()
    got = AffineMap(weight, bias)(probe.double())
    error = float((got - want).norm() / want.norm().clamp_min(1e-12))
    if not error <= AFFINE_TOLERANCE:
        raise ValueError(f"the tower's projection is not an affine map (relative error "
                         f"{error:.2e}); a head cannot start from it: use --start random or auto")
    return AffineMap(weight.to(dtype), bias.to(dtype))


class StartedProjection(nn.Module):
    """``z = (W_0 x + b_0 + Delta x) / ||.||`` (module docstring): ``W_0, b_0`` frozen
    buffers set by :meth:`start_at`, ``Delta`` zero at the start, full (``rank == 0``) or
    ``U D`` with ``U [out, r] = 0`` and ``D [r, in]`` random (scaled by ``1 / sqrt(in)``)."""

    def __init__(self, in_dim: int, out_dim: int, rank: int = 0) -> None:
        super().__init__()
        self.register_buffer("base_weight", torch.zeros(out_dim, in_dim))
        self.register_buffer("base_bias", torch.zeros(out_dim))
        self.delta: nn.Parameter | None = None
        self.up: nn.Parameter | None = None
        self.down: nn.Parameter | None = None
        if rank <= 0:
            self.delta = nn.Parameter(torch.zeros(out_dim, in_dim))
        else:
            self.up = nn.Parameter(torch.zeros(out_dim, rank))
            self.down = nn.Parameter(torch.randn(rank, in_dim) / math.sqrt(in_dim))

    @torch.no_grad()
    def start_at(self, base: AffineMap) -> None:
        """Set the base map to ``base`` and the update to zero (step 0 = ``base``)."""
        if tuple(base.weight.shape) != tuple(self.base_weight.shape):
            raise ValueError(f"the backbone's projection is {tuple(base.weight.shape)}, the "
                             f"head's {tuple(self.base_weight.shape)}")
        self.base_weight.copy_(base.weight)
        self.base_bias.copy_(base.bias)
        for update in (self.delta, self.up):
            if update is not None:
                update.zero_()

    def raw(self, x: Tensor) -> Tensor:
        """The projected features before normalisation."""
        out = F.linear(x, self.base_weight, self.base_bias)
        if self.delta is not None:
            return out + F.linear(x, self.delta)
        return out + F.linear(F.linear(x, self.down), self.up)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.raw(x), dim=-1)
