"""Issue 44: every solver knob is checked where it is given (a settings object, a public
solver's argument), by name, with a :class:`otviz.ot._errors.KnobError` (an
:class:`otviz.errors.InputError`); a per-problem ``eps`` / ``tau`` of shape ``[B]`` equals
B separate solves (B = M included); ``eps`` below the dtype's floor is refused naming the
floor; non-convergence advice follows what the solver saw."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import otviz.ot as ot
from otviz.errors import InputError
from otviz.ot._errors import KnobError
from otviz.ot._knobs import eps_floor
from tests.ot.cases import random_problem

NAN, INF = float("nan"), float("inf")

#: Bad values of each kind: wrong type, float for an int, bool for a number, NaN, inf,
#: negative, zero where > 0.
BAD_COUNT = ["5", 2.5, True, None, -1, 0]
BAD_POSITIVE = ["0.1", True, None, NAN, INF, -INF, -0.1, 0.0]
BAD_TAU = ["1", True, None, NAN, -INF, -0.5]
BAD_NONNEGATIVE = ["1", True, None, NAN, INF, -1e-3]
BAD_TOL = ["1e-4", True, NAN, INF, -1.0, 0.0]

BASE = {"eps": 0.1, "tau_a": 0.5, "tau_b": 0.5}
FIELDS = [
    ("eps", BAD_POSITIVE),
    ("n_iters", BAD_COUNT),
    ("tol", BAD_TOL),
    ("tau_a", BAD_TAU),
    ("tau_b", BAD_TAU),
    ("kpp_reg", BAD_NONNEGATIVE),
    ("variant", ["faithfull", "", 1, None]),
    ("clamp", ["20", True, NAN, INF, 0.0, -1.0]),
    ("floor", BAD_NONNEGATIVE),
]


def _cases(kinds):
    return [
        pytest.param(kind, name, bad, id=f"{kind.__name__}-{name}-{bad!r}")
        for kind in kinds
        for name, bads in FIELDS
        if name in kind.__dataclass_fields__
        for bad in bads
    ]


@pytest.mark.parametrize(
    ("kind", "name", "bad"),
    _cases((ot.SinkhornSettings, ot.UnbalancedSettings, ot.LowRankSettings)),
)
def test_every_settings_field_refuses_each_kind_of_bad_value_by_name(kind, name, bad):
    knobs = {k: v for k, v in BASE.items() if k in kind.__dataclass_fields__}
    with pytest.raises(KnobError, match=rf"{kind.__name__}: .*\b{name}\b") as caught:
        kind(**{**knobs, name: bad})
    assert isinstance(caught.value, InputError) and isinstance(caught.value, ot.SolverInputError)


def test_settings_accept_their_edge_values():
    ot.LowRankSettings(eps=1, tau_a=INF, tau_b=0, n_iters=1, tol=None, kpp_reg=0, clamp=None,
                       floor=0.0, variant="positive")
    ot.UnbalancedSettings(eps=torch.tensor([0.1, 0.2]), tau_a=torch.tensor([0.0, INF]),
                          tau_b=torch.tensor(1.0))


@pytest.mark.parametrize(
    "bad", [torch.tensor([0.1, NAN]), torch.tensor([[0.1]]), torch.tensor([1, 2]),
            torch.tensor(-1.0)],
    ids=["nan-entry", "2-D", "integer", "negative-0D"],
)
def test_tensor_eps_is_a_number_or_one_value_per_problem(bad):
    with pytest.raises(KnobError, match="eps"):
        ot.SinkhornSettings(eps=bad)


def test_an_empty_eps_is_the_eps_of_an_empty_batch_only():
    """``[0]`` is one value per problem of an empty batch: accepted by the settings, refused
    by a solve of a batch that has problems (its length named)."""
    ot.SinkhornSettings(eps=torch.tensor([], dtype=torch.float64))
    p = _problem()
    with pytest.raises(KnobError, match="eps has 0 values but the batch holds 2"):
        ot.sinkhorn_log(p.cost, p.a, p.b, torch.tensor([], dtype=p.cost.dtype))


def _problem(seed=0, bsz=2, n=6, m=5):
    return random_problem(seed, bsz=bsz, n=n, m=m)


#: Public solvers called with one bad keyword: ``(call(problem, **bad), knob)``.
def _calls():
    def m(p):
        return {"row_mask": p.row_mask, "col_mask": p.col_mask}

    def sk(p, **k):
        return ot.sinkhorn_log(p.cost, p.a, p.b, k.pop("eps", 0.2), **m(p), **k)

    def uot(p, **k):
        eps = k.pop("eps", 0.2)
        return ot.sinkhorn_unbalanced_log(p.cost, p.a, p.b, eps, 0.5, 0.5, **m(p), **k)

    def partial(p, **k):
        return ot.partial_ot_log(p.cost, p.a, p.b, k.pop("eps", 0.2), 0.5, **m(p), **k)

    def dbot(p, **k):
        return ot.dbot_log(p.cost, p.a, 0.5 * p.b, 2 * p.b, k.pop("eps", 0.2), **m(p), **k)

    def fgw(p, **k):
        return ot.fgw_sinkhorn(p.cost, p.a, p.b, k.pop("eps", 0.2), p.d1, p.d2, 0.1, **m(p), **k)

    def isoft(p, **k):
        return ot.fgw_isoftmax(p.cost, p.a, k.pop("eps", 0.2), p.d1, p.d2, 0.1, **m(p), **k)

    def pgd(p, **k):
        return ot.fgw_pgd(p.cost, p.a, k.pop("eps", 0.2), p.d1, p.d2, 0.1, **m(p), **k)

    def div(p, **k):
        return ot.sinkhorn_divergence(p.x, p.y, p.a, p.b, k.pop("eps", 0.2), x_mask=p.row_mask,
                                      y_mask=p.col_mask, **k)

    return {"sinkhorn_log": sk, "sinkhorn_unbalanced_log": uot, "partial_ot_log": partial,
            "dbot_log": dbot, "fgw_sinkhorn": fgw, "fgw_isoftmax": isoft, "fgw_pgd": pgd,
            "sinkhorn_divergence": div}


CALLS = _calls()
FEW_ITERATIONS = {"fgw_sinkhorn": {"n_inner": 5}, "fgw_isoftmax": {}, "fgw_pgd": {}}
ITERATED = ["sinkhorn_log", "sinkhorn_unbalanced_log", "partial_ot_log", "dbot_log",
            "sinkhorn_divergence"]


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("eps", [0.0, -0.1, NAN, INF, True, "0.1"])
def test_public_solvers_refuse_a_bad_eps_by_name(name, eps):
    with pytest.raises(KnobError, match=rf"^{name}: eps"):
        CALLS[name](_problem(), eps=eps)


@pytest.mark.parametrize("name", ITERATED)
@pytest.mark.parametrize("n_iters", [2.5, True, 0, "10"])
def test_public_solvers_refuse_a_bad_iteration_count_by_name(name, n_iters):
    with pytest.raises(KnobError, match=rf"^{name}: n_iters"):
        CALLS[name](_problem(), n_iters=n_iters)


@pytest.mark.parametrize(
    ("name", "knobs", "knob"),
    [
        ("fgw_sinkhorn", {"n_inner": 2.5}, "n_iters"),
        ("fgw_sinkhorn", {"n_outer": 1.5}, "n_outer"),
        ("fgw_sinkhorn", {"tau_a": -1.0}, "tau_a"),
        ("fgw_sinkhorn", {"tau_b": NAN}, "tau_b"),
        ("fgw_sinkhorn", {"scaling": "papr"}, "scaling"),
        ("fgw_isoftmax", {"n_iters": 2.5}, "n_iters"),
        ("fgw_pgd", {"n_iters": -1}, "n_iters"),
        ("sinkhorn_divergence", {"objective": "nope"}, "objective"),
        ("sinkhorn_divergence", {"tol": NAN}, "tol"),
        ("partial_ot_log", {"tol": -1e-4}, "tol"),
    ],
)
def test_other_solver_knobs_are_refused_by_name(name, knobs, knob):
    with pytest.raises(KnobError, match=rf"^{name}: .*\b{knob}\b"):
        CALLS[name](_problem(), **knobs)


@pytest.mark.parametrize("alpha0", [NAN, INF, True, "0.1"])
def test_fgw_refuses_a_bad_alpha0(alpha0):
    p = _problem()
    with pytest.raises(KnobError, match="alpha0"):
        ot.fgw_isoftmax(p.cost, p.a, 0.2, p.d1, p.d2, alpha0)


def test_structure_matrix_refuses_an_unknown_kind():
    with pytest.raises(KnobError, match="kind 'cosine'"):
        ot.structure_matrix(torch.randn(1, 3, 2), "cosine")


@pytest.mark.parametrize(
    ("knobs", "knob"),
    [({"negative_slope": NAN}, "negative_slope"), ({"negative_slope": -0.1}, "negative_slope"),
     ({"negative_slope": INF}, "negative_slope"), ({"temperature": 0.0}, "temperature"),
     ({"temperature": INF}, "temperature"), ({"temperature": True}, "temperature")],
)
def test_came_refuses_bad_knobs_by_name(knobs, knob):
    p = _problem()
    with pytest.raises(KnobError, match=knob):
        ot.came_marginals(p.x, p.y, **knobs)


def test_came_refuses_a_problem_without_a_valid_token():
    p = _problem()
    t_mask = p.col_mask.clone()
    t_mask[1] = False
    with pytest.raises(ot.SolverInputError, match="t_mask masks out every entry of problem 1"):
        ot.came_marginals(p.x, p.y, p.row_mask, t_mask)


def _solve_all(p, eps, tau):
    """Every solver with a per-problem knob on ``p``, a fixed iteration count (so the batched
    and the separate solves run the same iterations)."""
    masks = {"row_mask": p.row_mask, "col_mask": p.col_mask}
    low = ot.LowRankSettings(eps=eps, tau_a=tau, tau_b=0.7, n_iters=30, tol=None)
    return {
        "sinkhorn_log": ot.sinkhorn_log(p.cost, p.a, p.b, eps, 50, None, **masks).plan,
        "sinkhorn_unbalanced_log": ot.sinkhorn_unbalanced_log(
            p.cost, p.a, p.b, eps, tau, 0.7, 50, None, **masks).plan,
        "partial_ot_log": ot.partial_ot_log(p.cost, p.a, p.b, eps, 0.5, 50, None, **masks).plan,
        "dbot_log": ot.dbot_log(p.cost, p.a, 0.5 * p.b, 2 * p.b, eps, 50, None, **masks).plan,
        "fgw_sinkhorn": ot.fgw_sinkhorn(p.cost, p.a, p.b, eps, p.d1, p.d2, 0.1, 2, 30, tau,
                                        tol=None, **masks).plan,
        "fgw_isoftmax": ot.fgw_isoftmax(p.cost, p.a, eps, p.d1, p.d2, 0.1, **masks).plan,
        "fgw_pgd": ot.fgw_pgd(p.cost, p.a, eps, p.d1, p.d2, 0.1, **masks).plan,
        "sinkhorn_divergence": ot.sinkhorn_divergence(
            p.x, p.y, p.a, p.b, eps, 50, p.row_mask, p.col_mask, tol=None).value[:, None, None],
        "lowrank_uot": ot.lowrank_uot(p.x, p.y, p.anchors, p.a, p.b, low, **masks).dense(),
    }


def _part(p, i):
    return type(p)(*(getattr(p, f)[i : i + 1] if f != "anchors" else p.anchors
                     for f in p.__dataclass_fields__))


@pytest.mark.parametrize(("bsz", "m"), [(5, 5), (3, 5), (4, 2)], ids=["B=M", "B<M", "B>M"])
def test_per_problem_eps_and_tau_equal_separate_solves(bsz, m):
    p = _problem(seed=11 + bsz, bsz=bsz, n=4, m=m)
    gen = torch.Generator().manual_seed(bsz)
    eps = 0.05 + torch.rand(bsz, generator=gen, dtype=torch.float64)
    tau = torch.rand(bsz, generator=gen, dtype=torch.float64) * 2
    tau[0] = INF
    batched = _solve_all(p, eps, tau)
    separate = [_solve_all(_part(p, i), float(eps[i]), float(tau[i])) for i in range(bsz)]
    for name, plan in batched.items():
        expect = torch.cat([s[name] for s in separate])
        assert torch.allclose(plan, expect, rtol=1e-9, atol=1e-12), name


def test_per_problem_eps_through_distinct_sides_equals_the_gathered_call():
    p = _problem(seed=4, bsz=3)
    eps = torch.tensor([0.1, 0.3, 0.9], dtype=torch.float64)
    image_index, text_index = torch.tensor([0, 0, 2]), torch.tensor([1, 2, 2])
    knobs = ot.LowRankSettings(eps=eps, tau_a=0.5, tau_b=0.5, n_iters=20, tol=None)
    shared = ot.lowrank_uot(p.x, p.y, p.anchors, p.a, p.b, knobs, p.row_mask, p.col_mask,
                            image_index=image_index, text_index=text_index)
    gathered = ot.lowrank_uot(p.x[image_index], p.y[text_index], p.anchors, p.a, p.b, knobs,
                              p.row_mask[image_index], p.col_mask[text_index])
    assert torch.allclose(shared.dense(), gathered.dense(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_per_problem_eps_of_the_wrong_length_is_refused(name):
    with pytest.raises(KnobError, match="eps has 3 values but the batch holds 2"):
        CALLS[name](_problem(), eps=torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64))


def test_per_problem_eps_keeps_its_gradient():
    p = _problem(seed=7, bsz=3)
    eps = torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64, requires_grad=True)
    ot.sinkhorn_log(p.cost, p.a, p.b, eps, 30, None, p.row_mask, p.col_mask).cost.sum().backward()
    assert eps.grad is not None and bool(torch.isfinite(eps.grad).all())
    assert bool((eps.grad != 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_eps_below_the_dtype_floor_is_refused_naming_the_floor(name, dtype):
    p = _problem(seed=3)
    scale = float(p.cost.masked_fill(~(p.row_mask[:, :, None] & p.col_mask[:, None, :]), 0)
                  .abs().max())
    floor = eps_floor(dtype, scale)
    cast = type(p)(*(getattr(p, f).to(dtype) if getattr(p, f).is_floating_point()
                     else getattr(p, f) for f in p.__dataclass_fields__))
    for tiny in (1e-30, 0.5 * floor):
        with pytest.raises(KnobError, match=rf"^{name}: eps .* below the smallest eps {dtype}"):
            CALLS[name](cast, eps=tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ot.NotConvergedWarning)
        # just above: solved (a few iterations, maybe not converged), no refusal
        CALLS[name](cast, eps=2 * floor, **FEW_ITERATIONS.get(name, {"n_iters": 5}))


def test_eps_floors_follow_the_dtype_and_the_cost_scale():
    assert eps_floor(torch.float32, 1.0) == pytest.approx(4 * torch.finfo(torch.float32).eps)
    assert eps_floor(torch.float64, 1.0) == pytest.approx(1e-8)
    assert eps_floor(torch.float64, 3.0) == pytest.approx(3e-8)


def test_lowrank_refuses_eps_below_the_cosine_floor():
    p = _problem()
    knobs = ot.LowRankSettings(eps=1e-12, tau_a=0.5, tau_b=0.5)
    with pytest.raises(KnobError, match="lowrank_uot: eps 1e-12 is below"):
        ot.lowrank_uot(p.x.float(), p.y.float(), p.anchors.float(), p.a.float(), p.b.float(),
                       knobs)


def _paper_problem(seed):
    gen = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(3, 40, 16, generator=gen, dtype=torch.float64), dim=-1)
    y = F.normalize(torch.randn(3, 12, 16, generator=gen, dtype=torch.float64), dim=-1)
    anchors = F.normalize(torch.randn(8, 16, generator=gen, dtype=torch.float64), dim=-1)
    mu = torch.softmax(torch.randn(3, 40, generator=gen, dtype=torch.float64), 1)
    nu = torch.softmax(torch.randn(3, 12, generator=gen, dtype=torch.float64), 1)
    return z, y, anchors, mu, nu


@pytest.mark.parametrize("seed", [21, 22])
def test_faithful_lowrank_reports_convergence_at_the_papers_settings(seed):
    problem = _paper_problem(seed)
    paper = ot.LowRankSettings(eps=0.07, tau_a=0.2, tau_b=0.2, n_iters=4000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ot.NotConvergedWarning)
        res = ot.lowrank_uot(*problem, paper)
    assert bool(res.converged.all()) and res.n_iters < 4000
    # the plan it stopped at is a fixed point: many more iterations barely move it
    longer = ot.lowrank_uot(*problem, ot.LowRankSettings(
        eps=0.07, tau_a=0.2, tau_b=0.2, n_iters=res.n_iters + 2000, tol=None))
    moved = (longer.dense() - res.dense()).abs().sum((1, 2)) / res.mass
    assert float(moved.max()) < 10 * paper.tol
    # with no floor the residual reaches rounding, with it the floor is part of the fixed point
    assert float(longer.relative_error.max()) < 1e-10


def test_f32_rounding_is_named_instead_of_more_iterations():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(1, 40, 8, generator=gen), torch.randn(1, 12, 8, generator=gen)
    cost = torch.cdist(x, y) ** 2
    cost = cost / cost.max()
    a = torch.softmax(torch.randn(1, 40, generator=gen), 1)
    b = torch.softmax(torch.randn(1, 12, generator=gen), 1)
    with pytest.warns(ot.NotConvergedWarning) as record:
        res = ot.sinkhorn_log(cost, a, b, 0.01, n_iters=100_000, tol=1e-6)
    message = str(record[0].message)
    assert not bool(res.converged.all())
    assert "more iterations will not reach tol" in message and "float64" in message
    assert "raise n_iters" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", ot.NotConvergedWarning)  # what the advice says works
        wide = ot.sinkhorn_log(cost.double(), a.double(), b.double(), 0.01, 100_000, 1e-6)
    assert bool(wide.converged.all())


def test_too_few_iterations_advise_more_iterations():
    p = _problem(seed=5)
    with pytest.warns(ot.NotConvergedWarning, match=r"after 3 of 3 iterations.*raise n_iters"):
        ot.sinkhorn_log(p.cost, p.a, p.b, 0.01, 3, 1e-8, p.row_mask, p.col_mask)


def test_hostile_values_never_give_nan_plans():
    # each refused before: eps just above the floor solves to a finite plan, in both dtypes
    for dtype in (torch.float32, torch.float64):
        p = _problem(seed=9)
        cost, a, b = p.cost.to(dtype), p.a.to(dtype), p.b.to(dtype)
        eps = 2 * eps_floor(dtype, 1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ot.NotConvergedWarning)
            res = ot.sinkhorn_log(cost, a, b, eps, 20, None, p.row_mask, p.col_mask)
        assert bool(torch.isfinite(res.plan).all()), dtype
        assert math.isclose(float(res.plan.sum((1, 2))[0]), 1.0, rel_tol=1e-2)


def test_per_problem_knobs_follow_the_cache_sized_sub_batches(monkeypatch):
    import otviz.ot.sinkhorn as sinkhorn

    p = _problem(seed=12, bsz=7)
    eps = torch.linspace(0.05, 0.8, 7, dtype=torch.float64)
    tau = torch.linspace(0.1, 3.0, 7, dtype=torch.float64)
    whole = ot.sinkhorn_unbalanced_log(p.cost, p.a, p.b, eps, tau, 0.4, 30, None)
    monkeypatch.setattr(sinkhorn, "CHUNK_ELEMS", 2 * 6 * 5)  # two problems per sub-batch
    parts = ot.sinkhorn_unbalanced_log(p.cost, p.a, p.b, eps, tau, 0.4, 30, None)
    assert torch.allclose(parts.plan, whole.plan, rtol=1e-12, atol=1e-15)


def test_large_filler_on_masked_pairs_does_not_raise_the_floor():
    p = _problem(seed=13)
    pairs = p.row_mask[:, :, None] & p.col_mask[:, None, :]
    filled = p.cost.masked_fill(~pairs, 1e30)  # finite junk where masked
    res = ot.sinkhorn_log(filled, p.a, p.b, 1e-3, 5, None, p.row_mask, p.col_mask)
    plain = ot.sinkhorn_log(p.cost, p.a, p.b, 1e-3, 5, None, p.row_mask, p.col_mask)
    assert torch.equal(res.plan, plain.plan)
