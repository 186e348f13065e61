"""The solver input contract (otviz/ot/_checks.py, docs/solver-contract.md), for every public
solver: one floating dtype and one device, bool masks of the right shape, batched input,
and NaN on masked entries that never reaches a plan or a gradient."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import typing
import warnings
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

import otviz.ot as ot
from otviz.ot._result import DEFAULT_MAX_ITERS, DEFAULT_TOL
from tests.helpers import ROOT
from tests.ot.cases import SOLVERS, dense_plan, plant_nan, random_problem

NAMES = sorted(SOLVERS)


def _refused(name: str, problem, message: str) -> None:
    with pytest.raises(ot.SolverInputError, match=message):
        SOLVERS[name](problem)


@pytest.mark.parametrize("name", NAMES)
def test_mixed_float_dtypes_are_refused(name: str) -> None:
    p = random_problem(0)
    _refused(name, replace(p, a=p.a.float()), r"float32 but \w+ is torch.float64|one dtype")


@pytest.mark.parametrize("name", NAMES)
def test_integer_tensors_are_refused(name: str) -> None:
    p = random_problem(1)
    ints = replace(p, cost=p.cost.round().long(), x=p.x.round().long())
    _refused(name, ints, "float32 or float64")


@pytest.mark.parametrize("name", NAMES)
def test_tensors_on_another_device_are_refused(name: str) -> None:
    p = random_problem(2)
    _refused(name, replace(p, a=p.a.to("meta")), "device|on meta")


@pytest.mark.parametrize("name", NAMES)
def test_masks_of_the_wrong_shape_or_dtype_are_refused(name: str) -> None:
    p = random_problem(3)
    _refused(name, replace(p, col_mask=p.col_mask[:, :-1]), "shape")
    _refused(name, replace(p, row_mask=p.row_mask.long()), "bool")


@pytest.mark.parametrize("name", NAMES)
def test_unbatched_input_is_refused_with_the_batched_call(name: str) -> None:
    p = random_problem(4, bsz=1)
    one = replace(p, x=p.x[0], y=p.y[0], cost=p.cost[0], a=p.a[0], b=p.b[0],
                  row_mask=p.row_mask[0], col_mask=p.col_mask[0], d1=p.d1[0], d2=p.d2[0])
    _refused(name, one, r"\[None\]")


@pytest.mark.parametrize("name", NAMES)
def test_nan_on_masked_entries_never_reaches_the_plan(name: str) -> None:
    """The plan of a problem with NaN in every masked entry (cost, masses, features,
    structure matrices) equals the plan of the same problem with finite junk there."""
    p = random_problem(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ot.NotConvergedWarning)
        clean = dense_plan(name, p)
        dirty = dense_plan(name, plant_nan(p))
    assert bool(torch.isfinite(dirty).all())
    assert torch.allclose(dirty, clean, rtol=1e-10, atol=1e-14)
    masked = ~p.row_mask[:, :, None] | ~p.col_mask[:, None, :]
    assert float(dirty[masked].abs().max()) == 0.0


@pytest.mark.parametrize("name", ["sinkhorn_log", "partial_ot_log", "fgw_isoftmax", "fgw_pgd"])
def test_nan_on_masked_entries_never_reaches_a_gradient(name: str) -> None:
    p = plant_nan(random_problem(6))
    cost = p.cost.clone().requires_grad_(True)
    eps = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    call = {
        "sinkhorn_log": lambda: ot.sinkhorn_log(cost, p.a, p.b, eps, 20, None, p.row_mask,
                                                p.col_mask),
        "partial_ot_log": lambda: ot.partial_ot_log(cost, p.a, p.b, eps, 0.5, 20, None,
                                                    p.row_mask, p.col_mask),
        "fgw_isoftmax": lambda: ot.fgw_isoftmax(cost, p.a, eps, p.d1, p.d2, 0.1,
                                                row_mask=p.row_mask, col_mask=p.col_mask),
        "fgw_pgd": lambda: ot.fgw_pgd(cost, p.a, eps, p.d1, p.d2, 0.1,
                                      row_mask=p.row_mask, col_mask=p.col_mask),
    }[name]
    (call().plan * torch.rand_like(p.cost)).sum().backward()
    assert bool(torch.isfinite(cost.grad).all()) and bool(torch.isfinite(eps.grad))
    masked = ~p.row_mask[:, :, None] | ~p.col_mask[:, None, :]
    assert float(cost.grad[masked].abs().max()) == 0.0


def test_nan_on_a_valid_entry_is_refused() -> None:
    p = random_problem(7)
    p.cost[0, 0, 0] = float("nan")
    for name in ("sinkhorn_log", "fgw_isoftmax", "partial_ot_log"):
        _refused(name, p, "NaN or infinite")


def test_sinkhorn_divergence_refuses_2d_clouds_instead_of_an_index_error() -> None:
    p = random_problem(8, bsz=1)
    with pytest.raises(ot.SolverInputError, match=r"batched \[B, N, d\]"):
        ot.sinkhorn_divergence(p.x[0], p.y[0], p.a, p.b, 0.2)


def test_lowrank_refuses_features_of_different_widths_and_bad_indices() -> None:
    p = random_problem(9)
    with pytest.raises(ot.SolverInputError, match="feature width"):
        knobs = ot.LowRankSettings(eps=0.2, tau_a=0.5, tau_b=0.5)
        ot.lowrank_uot(p.x, p.y[..., :3], p.anchors, p.a, p.b, knobs)
    with pytest.raises(ot.SolverInputError, match="index"):
        ot.lowrank_uot(
            p.x,
            p.y,
            p.anchors,
            p.a,
            p.b,
            ot.LowRankSettings(eps=0.2, tau_a=0.5, tau_b=0.5),
            image_index=torch.tensor([0, 5]),
        )


def _documented_caps() -> dict[str, str]:
    """``solver -> iteration cap`` from the table of docs/solver-contract.md."""
    text = (ROOT / "docs" / "solver-contract.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)=(\w+)` \|", text, flags=re.M)
    return {solver: f"{arg}={value}" for solver, arg, value in rows}


def _default(solver: Callable[..., object], arg: str) -> object:
    """The default of ``arg``: the solver's keyword, or the field of its settings object."""
    params = inspect.signature(solver).parameters
    if arg in params:
        return params[arg].default
    settings = typing.get_type_hints(solver)["settings"]
    return {f.name: f.default for f in dataclasses.fields(settings)}[arg]


def test_documented_iteration_caps_are_the_code_defaults() -> None:
    caps = _documented_caps()
    assert set(SOLVERS) <= set(caps)
    for solver, cap in caps.items():
        arg, value = cap.split("=")
        assert str(_default(getattr(ot, solver), arg)) == value, (solver, cap)
    assert DEFAULT_MAX_ITERS == 1000 and DEFAULT_TOL == 1e-4


def test_came_validates_like_the_solvers_and_ignores_nan_on_masked_features() -> None:
    p = random_problem(10)
    clean = ot.came_marginals(p.x, p.y, p.row_mask, p.col_mask)
    dirty_p = plant_nan(p)
    dirty = ot.came_marginals(dirty_p.x, dirty_p.y, p.row_mask, p.col_mask)
    assert torch.allclose(dirty.mu, clean.mu, rtol=1e-12) and torch.allclose(dirty.nu, clean.nu)
    assert bool(torch.isfinite(dirty.attn_t2v).all() & torch.isfinite(dirty.attn_v2t).all())
    for call, message in [
        (lambda: ot.came_marginals(p.x.float(), p.y), "one dtype"),
        (lambda: ot.came_marginals(p.x[0], p.y[0]), r"\[None\]"),
        (lambda: ot.came_marginals(p.x, p.y, p.row_mask[:, :-1]), "shape"),
        (lambda: ot.came_marginals(p.x, p.y[..., :2]), "feature width"),
    ]:
        with pytest.raises(ot.SolverInputError, match=message):
            call()


@pytest.mark.parametrize("rule", ["zero_shot", "long_tailed", "selective"])
def test_zero_shot_helpers_refuse_mixed_dtypes_and_widths(rule: str) -> None:
    p = random_problem(11)
    img, cls = p.x[0], p.y[0]
    call = {
        "zero_shot": lambda i, c: ot.zero_shot_predict(i, c, "fgw_pgd"),
        "long_tailed": lambda i, c: ot.long_tailed_predict(i, c, torch.ones(c.shape[0])),
        "selective": lambda i, c: ot.selective_predict(i, c, 0.5, "partial"),
    }[rule]
    with pytest.raises(ot.SolverInputError, match="one dtype"):
        call(img.float(), cls)
    with pytest.raises(ot.SolverInputError, match="one width"):
        call(img, cls[:, :2])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, a, b: ot.sinkhorn_log(c, a, b, 0.0), "eps"),
        (lambda c, a, b: ot.sinkhorn_log(c, a, b, -1.0), "eps"),
        (lambda c, a, b: ot.sinkhorn_unbalanced_log(c, a, b, 0.1, -0.5, 1.0), "tau_a"),
        (lambda c, a, b: ot.sinkhorn_log(c.masked_fill(c > 0.5, math.inf), a, b, 0.1), "NaN"),
        (lambda c, a, b: ot.sinkhorn_log(c[:, :0], a[:, :0], b, 0.1), "empty"),
        (lambda c, a, b: ot.sinkhorn_log(c, a, 2 * b, 0.1), "equal total masses"),
        (lambda c, a, b: ot.partial_ot_log(c, a, b, 0.1, 1.5), "available"),
    ],
)
def test_bad_input_is_refused_with_a_message(call, message):
    gen = torch.Generator().manual_seed(8)
    dt = torch.float64
    cost = torch.rand(2, 4, 3, generator=gen, dtype=dt)
    a, b = torch.full((2, 4), 0.25, dtype=dt), torch.full((2, 3), 1 / 3, dtype=dt)
    with pytest.raises(ot.SolverInputError, match=message):
        call(cost, a, b)


def test_stopping_short_is_flagged_and_warned():
    gen = torch.Generator().manual_seed(9)
    dt = torch.float64
    x = torch.nn.functional.normalize(torch.randn(2, 8, 3, generator=gen, dtype=dt), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(2, 6, 3, generator=gen, dtype=dt), dim=-1)
    a, b = torch.full((2, 8), 1 / 8, dtype=dt), torch.full((2, 6), 1 / 6, dtype=dt)
    cost = 1 - x @ y.transpose(1, 2)
    with pytest.warns(ot.NotConvergedWarning, match="marginal error"):
        short = ot.sinkhorn_log(cost, a, b, 0.01, n_iters=5)
    assert not bool(short.converged.any())
    with warnings.catch_warnings():
        warnings.simplefilter("error", ot.NotConvergedWarning)
        done = ot.sinkhorn_log(cost, a, b, 0.05)  # the default budget reaches the tolerance
        fixed = ot.sinkhorn_log(cost, a, b, 0.01, n_iters=5, tol=None)  # chosen count: silent
    assert bool(done.converged.all()) and done.n_iters < 1000
    assert torch.equal(fixed.converged, short.converged)
    with pytest.warns(ot.NotConvergedWarning, match="sinkhorn_divergence"):
        div = ot.sinkhorn_divergence(x, y, a, b, 0.01, n_iters=50)
    assert not bool(div.converged.all()) and float(div.marginal_error.max()) > 1e-2
