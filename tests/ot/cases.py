"""One random masked problem and every public solver of :mod:`otviz.ot` called on it, for
the tests that must hold for all of them (validation, NaN on masked entries)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

import otviz.ot as ot

EPS = 0.2


@dataclass
class Problem:
    """A batch of masked problems: point clouds ``x [B, N, d]``, ``y [B, M, d]``, their
    cosine ``cost``, masses ``a``, ``b`` (unit mass on valid entries), masks, structure
    matrices ``d1``, ``d2`` and shared ``anchors [r, d]``."""

    x: Tensor
    y: Tensor
    cost: Tensor
    a: Tensor
    b: Tensor
    row_mask: Tensor
    col_mask: Tensor
    d1: Tensor
    d2: Tensor
    anchors: Tensor


def random_problem(seed: int, bsz: int = 2, n: int = 6, m: int = 5, d: int = 4) -> Problem:
    """Float64 problems whose last row and last column are masked in every pair, the
    masked entries holding finite junk (see :func:`plant_nan`)."""
    gen = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(bsz, n, d, generator=gen, dtype=torch.float64), dim=-1)
    y = F.normalize(torch.randn(bsz, m, d, generator=gen, dtype=torch.float64), dim=-1)
    row_mask = torch.ones(bsz, n, dtype=torch.bool)
    col_mask = torch.ones(bsz, m, dtype=torch.bool)
    row_mask[:, -1] = False
    col_mask[:, -1] = False
    a = torch.rand(bsz, n, generator=gen, dtype=torch.float64) + 0.2
    b = torch.rand(bsz, m, generator=gen, dtype=torch.float64) + 0.2
    a = a / (a * row_mask).sum(1, keepdim=True)
    b = b / (b * col_mask).sum(1, keepdim=True)
    anchors = F.normalize(torch.randn(3, d, generator=gen, dtype=torch.float64), dim=-1)
    return Problem(
        x, y, 1.0 - x @ y.transpose(1, 2), a, b, row_mask, col_mask,
        x @ x.transpose(1, 2), y @ y.transpose(1, 2), anchors,
    )


def plant_nan(p: Problem) -> Problem:
    """``p`` with NaN in every masked entry of every tensor (valid entries unchanged)."""
    rows, cols = ~p.row_mask, ~p.col_mask
    nan = float("nan")
    return replace(
        p,
        x=p.x.masked_fill(rows[..., None], nan),
        y=p.y.masked_fill(cols[..., None], nan),
        cost=p.cost.masked_fill(rows[:, :, None] | cols[:, None, :], nan),
        a=p.a.masked_fill(rows, nan),
        b=p.b.masked_fill(cols, nan),
        d1=p.d1.masked_fill(rows[:, :, None] | rows[:, None, :], nan),
        d2=p.d2.masked_fill(cols[:, :, None] | cols[:, None, :], nan),
    )


def _dense(result: object) -> Tensor:
    factors = getattr(result, "factors", None)
    return factors.dense() if factors is not None else result.plan


def _masks(p: Problem) -> dict[str, Tensor]:
    return {"row_mask": p.row_mask, "col_mask": p.col_mask}


#: Every public solver, called on a :class:`Problem` at its defaults; returns its result.
SOLVERS: dict[str, Callable[[Problem], object]] = {
    "sinkhorn_log": lambda p: ot.sinkhorn_log(p.cost, p.a, p.b, EPS, **_masks(p)),
    "sinkhorn_unbalanced_log": lambda p: ot.sinkhorn_unbalanced_log(
        p.cost, p.a, p.b, EPS, 0.5, 0.5, **_masks(p)
    ),
    "partial_ot_log": lambda p: ot.partial_ot_log(p.cost, p.a, p.b, EPS, 0.5, **_masks(p)),
    "dbot_log": lambda p: ot.dbot_log(p.cost, p.a, 0.5 * p.b, 2.0 * p.b, EPS, **_masks(p)),
    "fgw_isoftmax": lambda p: ot.fgw_isoftmax(
        p.cost, p.a, EPS, p.d1, p.d2, 0.1, **_masks(p)
    ),
    "fgw_pgd": lambda p: ot.fgw_pgd(p.cost, p.a, EPS, p.d1, p.d2, 0.1, **_masks(p)),
    "fgw_sinkhorn": lambda p: ot.fgw_sinkhorn(
        p.cost, p.a, p.b, EPS, p.d1, p.d2, 0.1, **_masks(p)
    ),
    "lowrank_uot": lambda p: ot.lowrank_uot(
        p.x, p.y, p.anchors, p.a, p.b,
        ot.LowRankSettings(eps=EPS, tau_a=0.5, tau_b=0.5, variant="positive"), **_masks(p)
    ),
    "sinkhorn_divergence": lambda p: ot.sinkhorn_divergence(
        p.x, p.y, p.a, p.b, EPS, x_mask=p.row_mask, y_mask=p.col_mask
    ),
}


def dense_plan(name: str, p: Problem) -> Tensor:
    """The ``[B, N, M]`` plan solver ``name`` returns on ``p``."""
    return _dense(SOLVERS[name](p))
