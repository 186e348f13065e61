"""Global-only baseline (ConceptOT Sec. 3.2): pooled CLIP similarity, no local term."""

from __future__ import annotations

import torch

from otviz.methods.base import NO_LOCAL, Alignment, AlignmentMethod, PairBatch, register
from otviz.methods.projected import build_alignment, uniform_plan


@register
class GlobalOnly(AlignmentMethod):
    """Scores a pair by the cosine of the pooled embeddings alone: ``local_score = 0``.

    It has no parameters; its plan is the uniform product plan, so heatmaps are flat (the
    method carries no patch-token information)."""

    name = "global_only"
    label = "Global-only"
    order = 0
    has_plan = False  # the pooled cosine alone: its plan is uniform
    local_objective = NO_LOCAL
    paper = "ConceptOT Sec. 3.2"

    def align(self, batch: PairBatch) -> Alignment:
        plan = uniform_plan(batch)
        zero = torch.zeros(batch.size, dtype=batch.patches.dtype, device=batch.patches.device)
        return build_alignment(batch, plan, zero, row_marginal=plan.row, col_marginal=plan.col)
