"""Shared pieces of the patch-token methods: projection into the concept space, cheap plan
types for the non-OT methods, the plan-weighted score and the Alignment assembly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from otviz.methods.base import (
    Alignment,
    AlignmentMethod,
    DensePlan,
    MethodConfig,
    PairBatch,
    PairSides,
    Projection,
    TransportPlan,
    global_cosine,
)
from otviz.methods.masses import uniform_masses
from otviz.methods.start import BACKBONE, HEAD_STARTS, BackboneStart, StartedProjection
from otviz.ot import SinkhornSettings, SolverResult
from otviz.ot._sync import known_false
from otviz.ot.costs import cosine_similarity


class ProjectedMethod(AlignmentMethod):
    """A method that maps patches and tokens into the concept space (ConceptOT Sec. 2.1):
    ``z_i = W_v^T v_i / ||.||``, ``y_j = W_t^T t_j / ||.||``. In the training-free
    configuration (``config.trainable=False``) both maps are the identity followed by L2
    normalisation, so the caller passes features already in one space (equal widths). A
    trainable head with ``config.start == "backbone"`` starts at that configuration: each map
    is the model's own projection plus a zero-initialised update
    (:class:`otviz.methods.start.StartedProjection`, set by :meth:`start_from_backbone`), and
    ``config.concept_dim`` is the model's joint width."""

    proj_v: Projection | StartedProjection
    proj_t: Projection | StartedProjection

    def __init__(self, patch_dim: int, token_dim: int, config: MethodConfig | None = None):
        super().__init__(patch_dim, token_dim, config)
        cfg = self.config
        if not cfg.trainable and patch_dim != token_dim:
            raise ValueError(
                f"training-free {self.name or type(self).__name__} needs patch and token "
                f"features in one space; got widths {patch_dim} and {token_dim}"
            )
        if cfg.start not in HEAD_STARTS:
            raise ValueError(f"unknown head start {cfg.start!r}; known: {HEAD_STARTS}")
        self.concept_dim = cfg.concept_dim if cfg.trainable else patch_dim
        if cfg.trainable and cfg.start == BACKBONE:
            self.proj_v = StartedProjection(patch_dim, self.concept_dim, cfg.start_rank)
            self.proj_t = StartedProjection(token_dim, self.concept_dim, cfg.start_rank)
        else:
            self.proj_v = Projection(patch_dim, self.concept_dim, cfg.trainable)
            self.proj_t = Projection(token_dim, self.concept_dim, cfg.trainable)

    @property
    def projects(self) -> bool:
        """False in the training-free configuration (identity projections)."""
        return not (isinstance(self.proj_v, Projection) and self.proj_v.linear is None)

    def start_from_backbone(self, start: BackboneStart) -> None:
        """Both projections at the model's own (:class:`StartedProjection.start_at`)."""
        if not isinstance(self.proj_v, StartedProjection):
            raise ValueError(f"{self.name}: only a head configured with start='backbone' "
                             "can start from the backbone")
        self.proj_v.start_at(start.patch_map)
        self.proj_t.start_at(start.token_map)  # type: ignore[union-attr]

    def project(self, batch: PairBatch) -> tuple[Tensor, Tensor]:
        """``(z [B, N, d_c], y [B, M, d_c])`` unit-norm concept features (each distinct image
        and caption projected once when the batch has :class:`PairSides`)."""
        sides = batch.sides
        if sides is None:
            return self.proj_v(batch.patches), self.proj_t(batch.tokens)
        return self.proj_v(sides.patches)[sides.image], self.proj_t(sides.tokens)[sides.text]

    def project_scaled(self, batch: PairBatch) -> tuple[Tensor, Tensor, Tensor]:
        """``(z_raw, z_scale, y)``: patch features before normalisation with their inverse
        norms ``[B, N]`` (``z = z_raw * z_scale[..., None]``, as :meth:`project` gives it)
        and unit-norm tokens. The patch tensor is the largest of a pair; the OT methods
        only need it inside products, where the row scaling is applied to the result, so it
        is never normalised in memory."""
        z_raw, z_scale, y, sides = self.project_distinct(batch)
        if sides is None:
            return z_raw, z_scale, y
        z_raw = z_raw[sides.image] if self.projects else batch.patches
        return z_raw, z_scale[sides.image], y[sides.text]

    def project_distinct(self, batch: PairBatch) -> tuple[Tensor, Tensor, Tensor, PairSides | None]:
        """:meth:`project_scaled` of the batch's distinct images and captions when it has
        :class:`PairSides` (returned last; pair ``p`` uses rows ``sides.image[p]`` and
        ``sides.text[p]``), else of its pairs (``None`` last). The projections run once
        per distinct image / caption: in training with ``K_h`` hard negatives each way a
        batch of ``B`` items makes ``B (1 + 2 K_h)`` pairs but has only ``B`` of each."""
        sides = batch.sides
        source = batch if sides is None else sides
        z_raw = self.proj_v.raw(source.patches)
        z_scale = 1.0 / torch.linalg.vector_norm(z_raw, dim=-1).clamp_min(1e-12)
        return z_raw, z_scale, self.proj_t(source.tokens), sides


@dataclass
class OuterPlan:
    """Rank-one plan ``row ⊗ col`` (uniform plans of the non-transport baselines)."""

    row: Tensor  # [B, N]
    col: Tensor  # [B, M]

    def dense(self) -> Tensor:
        return self.row[:, :, None] * self.col[:, None, :]

    def apply(self, v: Tensor) -> Tensor:
        return self.row[:, :, None] * (self.col[:, None, :] @ v)


@dataclass
class AssignmentPlan:
    """Plan with one entry per column: mass ``weight[b, j]`` at row ``index[b, j]`` (FILIP's
    argmax matches). ``apply`` is a scatter, ``O(M k)``."""

    index: Tensor  # [B, M] long
    weight: Tensor  # [B, M]
    n_rows: int

    def dense(self) -> Tensor:
        b, m = self.index.shape
        out = self.weight.new_zeros(b, self.n_rows, m)
        return out.scatter_(1, self.index[:, None, :], self.weight[:, None, :])

    def apply(self, v: Tensor) -> Tensor:
        b, _, k = v.shape
        out = v.new_zeros(b, self.n_rows, k)
        src = self.weight[:, :, None] * v
        return out.scatter_add_(1, self.index[:, :, None].expand(-1, -1, k), src)


def fixed_count(config: MethodConfig) -> SinkhornSettings:
    """The Sinkhorn knobs of a method: ``config.eps`` and exactly ``config.n_iters``
    iterations (the model's fixed ``L``, ``tol=None``)."""
    return SinkhornSettings(eps=config.eps, n_iters=config.n_iters, tol=None)


def uniform_plan(batch: PairBatch) -> OuterPlan:
    """Product of the uniform distributions over valid patches and tokens."""
    dtype = batch.patches.dtype
    return OuterPlan(
        uniform_masses(batch.patch_mask, dtype), uniform_masses(batch.token_mask, dtype)
    )


def build_alignment(
    batch: PairBatch,
    plan: TransportPlan,
    local_score: Tensor,
    row_marginal: Tensor | None = None,
    col_marginal: Tensor | None = None,
    row_reference: Tensor | None = None,
    col_reference: Tensor | None = None,
    marginal_error: Tensor | None = None,
    extras: dict[str, Any] | None = None,
) -> Alignment:
    """Fill an :class:`Alignment`; marginals not given are ``plan @ 1`` and ``plan^T @ 1``
    (the latter from a dense plan, so factored plans should pass theirs)."""
    if row_marginal is None:
        ones = batch.token_mask.to(local_score.dtype).unsqueeze(-1)
        row_marginal = plan.apply(ones).squeeze(-1)
    if col_marginal is None:
        col_marginal = plan.dense().sum(1)
    return Alignment(
        local_score=local_score,
        global_score=global_cosine(batch),
        plan=plan,
        row_marginal=row_marginal,
        col_marginal=col_marginal,
        patch_mask=batch.patch_mask,
        token_mask=batch.token_mask,
        row_reference=row_reference,
        col_reference=col_reference,
        marginal_error=marginal_error,
        extras=extras or {},
    )


def masked_similarity(
    z: Tensor, y: Tensor, batch: PairBatch, fill: float, z_scale: Tensor | None = None
) -> Tensor:
    """``[B, N, M]`` cosines with ``fill`` on pairs involving a masked patch or token
    (``z`` may come unnormalised with its inverse norms ``z_scale``, see
    :meth:`ProjectedMethod.project_scaled`)."""
    sim = cosine_similarity(z, y)
    if z_scale is not None:
        sim = sim * z_scale.unsqueeze(-1)
    if known_false(~batch.patch_mask) and known_false(~batch.token_mask):
        return sim
    valid = batch.patch_mask[:, :, None] & batch.token_mask[:, None, :]
    return sim.masked_fill(~valid, fill)


def plan_weighted_score(plan: Tensor, sim: Tensor) -> Tensor:
    """``sum_ij P_ij s_ij / sum_ij P_ij`` (ConceptOT Eq. 8 in dense form), ``[B]``; the
    numerator is a batched dot product (no ``[B, N, M]`` temporary)."""
    num = torch.bmm(plan.flatten(1).unsqueeze(1), sim.flatten(1).unsqueeze(2)).view(-1)
    mass = plan.sum((1, 2))
    return num / mass.clamp_min(torch.finfo(mass.dtype).tiny)


def dense_plan_alignment(
    batch: PairBatch,
    plan: Tensor,
    sim: Tensor,
    row_reference: Tensor | None,
    col_reference: Tensor | None,
    marginal_error: Tensor | None,
) -> Alignment:
    """Alignment of a dense plan scored by Eq. 8 on the similarities ``sim``."""
    return build_alignment(
        batch,
        DensePlan(plan),
        plan_weighted_score(plan, sim),
        row_marginal=plan.sum(2),
        col_marginal=plan.sum(1),
        row_reference=row_reference,
        col_reference=col_reference,
        marginal_error=marginal_error,
    )


def cosine_ot_alignment(
    batch: PairBatch, res: SolverResult, row_reference: Tensor, col_reference: Tensor
) -> Alignment:
    """Alignment of a dense OT solve on the cosine cost ``C = 1 - z.y``, scored by Eq. 8 in
    dense form, ``sum P_ij z_i.y_j / sum P_ij = 1 - <C, P> / sum P``, from the solver's
    transport cost and marginals (no further pass over the plan)."""
    mass = res.plan_mass
    return build_alignment(
        batch,
        res,
        1.0 - res.cost / mass.clamp_min(torch.finfo(mass.dtype).tiny),
        row_marginal=res.row_marginal,
        col_marginal=res.col_marginal,
        row_reference=row_reference,
        col_reference=col_reference,
        marginal_error=res.marginal_error,
    )
