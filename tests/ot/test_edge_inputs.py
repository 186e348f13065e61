"""Issue 50's edge inputs for every public solver: an empty batch (``B = 0``) is an empty
result, an empty side (``N = 0`` or ``M = 0``) is refused naming its dimension, a tensor
``eps`` / ``tau`` of the other float dtype is cast to the problem's (the solve equals the
one given the cast knob), and a composite solver names itself in its refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

import otviz.ot as ot
from otviz.ot._errors import KnobError
from tests.ot.cases import SOLVERS, Problem, dense_plan, random_problem

Knob = float | torch.Tensor


def _masks(p: Problem) -> dict[str, torch.Tensor]:
    return {"row_mask": p.row_mask, "col_mask": p.col_mask}


#: Every public solver with its ``eps`` and (where it has one) ``tau`` given.
KNOBBED: dict[str, Callable[[Problem, Knob, Knob], object]] = {
    "sinkhorn_log": lambda p, e, t: ot.sinkhorn_log(p.cost, p.a, p.b, e, **_masks(p)),
    "sinkhorn_unbalanced_log": lambda p, e, t: ot.sinkhorn_unbalanced_log(
        p.cost, p.a, p.b, e, t, 0.5, **_masks(p)),
    "partial_ot_log": lambda p, e, t: ot.partial_ot_log(p.cost, p.a, p.b, e, 0.5, **_masks(p)),
    "dbot_log": lambda p, e, t: ot.dbot_log(p.cost, p.a, 0.5 * p.b, 2.0 * p.b, e, **_masks(p)),
    "fgw_isoftmax": lambda p, e, t: ot.fgw_isoftmax(p.cost, p.a, e, p.d1, p.d2, 0.1,
                                                    **_masks(p)),
    "fgw_pgd": lambda p, e, t: ot.fgw_pgd(p.cost, p.a, e, p.d1, p.d2, 0.1, **_masks(p)),
    "fgw_sinkhorn": lambda p, e, t: ot.fgw_sinkhorn(
        p.cost, p.a, p.b, e, p.d1, p.d2, 0.1, tau_a=t, **_masks(p)),
    "lowrank_uot": lambda p, e, t: ot.lowrank_uot(
        p.x, p.y, p.anchors, p.a, p.b,
        ot.LowRankSettings(eps=e, tau_a=t, tau_b=0.5, variant="positive"), **_masks(p)),
    "sinkhorn_divergence": lambda p, e, t: ot.sinkhorn_divergence(
        p.x, p.y, p.a, p.b, e, x_mask=p.row_mask, y_mask=p.col_mask),
}


def _plan(result: object) -> torch.Tensor:
    factors = getattr(result, "factors", None)
    return factors.dense() if factors is not None else result.plan


def _cut(p: Problem, batch: slice = slice(None), n: int | None = None,
         m: int | None = None) -> Problem:
    """``p`` restricted to the problems ``batch`` and the first ``n`` rows / ``m`` columns
    (the anchors are shared, kept whole)."""
    rows, cols = slice(None, n), slice(None, m)
    return replace(
        p, x=p.x[batch, rows], y=p.y[batch, cols], cost=p.cost[batch, rows, cols],
        a=p.a[batch, rows], b=p.b[batch, cols], row_mask=p.row_mask[batch, rows],
        col_mask=p.col_mask[batch, cols], d1=p.d1[batch, rows, rows],
        d2=p.d2[batch, cols, cols],
    )


def test_the_table_covers_every_public_solver():
    assert set(KNOBBED) == set(SOLVERS)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_an_empty_batch_is_an_empty_result(name):
    p = _cut(random_problem(0, bsz=3, n=6, m=5), batch=slice(0, 0))
    plan = dense_plan(name, p)
    assert plan.shape == (0, 6, 5) and plan.dtype == torch.float64


def test_came_of_an_empty_batch_is_empty():
    p = _cut(random_problem(0, bsz=3), batch=slice(0, 0))
    res = ot.came_marginals(p.x, p.y, p.row_mask, p.col_mask)
    assert res.mu.shape == (0, 6) and res.nu.shape == (0, 5)


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_a_per_problem_eps_of_an_empty_batch_is_empty_too(name):
    p = _cut(random_problem(0, bsz=3), batch=slice(0, 0))
    assert _plan(KNOBBED[name](p, torch.ones(0, dtype=torch.float64), 0.5)).shape[0] == 0


@pytest.mark.parametrize("side", ["N", "M"])
@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_an_empty_side_is_refused_naming_its_dimension(name, side):
    p = random_problem(0, bsz=2)
    p = _cut(p, n=0) if side == "N" else _cut(p, m=0)
    with pytest.raises(ot.SolverInputError, match=rf"^{name}: empty problem.*\({side} = 0\)"):
        SOLVERS[name](p)


@pytest.mark.parametrize("name", sorted(KNOBBED))
@pytest.mark.parametrize("problem_dtype", [torch.float32, torch.float64])
def test_a_knob_of_the_other_dtype_is_cast_to_the_problems(name, problem_dtype):
    """A ``[B]`` eps and tau of the other float dtype give the problem's dtype and the plan
    of the same knobs given in it: no bare dtype error, no update computed in float32 for
    a float64 problem."""
    p = random_problem(1, bsz=3)
    p = replace(p, **{f: getattr(p, f).to(problem_dtype) for f in
                      ("x", "y", "cost", "a", "b", "d1", "d2", "anchors")})
    other = torch.float64 if problem_dtype == torch.float32 else torch.float32
    eps = torch.tensor([0.15, 0.2, 0.3], dtype=other)
    tau = torch.tensor([0.4, 0.7, 1.3], dtype=other)
    mixed = _plan(KNOBBED[name](p, eps, tau))
    same = _plan(KNOBBED[name](p, eps.to(problem_dtype), tau.to(problem_dtype)))
    assert mixed.dtype == problem_dtype
    torch.testing.assert_close(mixed, same, rtol=0, atol=0)


def test_a_float32_tau_no_longer_rounds_a_float64_update():
    """The issue's 2.5e-7: the damping exponent tau / (tau + eps) was formed in float32.
    Cast, the solve is the float64 one of tau's (float32) values, to the last bit."""
    p = random_problem(2, bsz=3)
    tau32 = torch.tensor([0.3, 0.05, 2.0], dtype=torch.float32)
    eps32 = torch.tensor([0.05, 0.2, 1.0], dtype=torch.float32)
    mixed = ot.sinkhorn_unbalanced_log(p.cost, p.a, p.b, eps32, tau32, 0.5, 200, None,
                                       **_masks(p))
    for k in range(3):
        alone = ot.sinkhorn_unbalanced_log(
            p.cost[k:k + 1], p.a[k:k + 1], p.b[k:k + 1], float(eps32[k]), float(tau32[k]), 0.5,
            200, None, row_mask=p.row_mask[k:k + 1], col_mask=p.col_mask[k:k + 1])
        torch.testing.assert_close(mixed.plan[k], alone.plan[0], rtol=1e-12, atol=1e-14)


def test_a_cast_eps_keeps_its_gradient():
    p = random_problem(3, bsz=2)
    eps = torch.tensor([0.2, 0.3], dtype=torch.float32, requires_grad=True)
    ot.sinkhorn_log(p.cost, p.a, p.b, eps, **_masks(p)).cost.sum().backward()
    assert eps.grad is not None and eps.grad.dtype == torch.float32
    assert bool(torch.isfinite(eps.grad).all()) and bool((eps.grad != 0).all())


@pytest.mark.parametrize("knob", ["tau_a", "tau_b"])
def test_fgw_sinkhorn_names_itself_for_a_tau_of_the_wrong_length(knob):
    p = random_problem(0, bsz=3)
    with pytest.raises(KnobError, match=rf"^fgw_sinkhorn: {knob} has 2 values") as info:
        ot.fgw_sinkhorn(p.cost, p.a, p.b, 0.2, p.d1, p.d2, 0.1,
                        **{knob: torch.tensor([1.0, 2.0], dtype=torch.float64)}, **_masks(p))
    assert "sinkhorn_unbalanced_log" not in str(info.value)
