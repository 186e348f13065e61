"""Generalized Sinkhorn (ConceptOT Eq. 3) against POT, Prop. 1 (i), masks, autograd.

POT mapping (derived in :mod:`otviz.ot.unbalanced`): Eq. 3 regularises with
``H(P) = sum P (log P - 1)``, which is POT's ``reg_type='entropy'`` (``KL(P || 1)``) up to a
constant. POT's default ``reg_type='kl'`` regularises with ``KL(P || a b^T)``; expanding,
``eps KL(P || a b^T) = eps H(P) - <eps log(a_i b_j), P> + const``, so Eq. 3 with cost ``C``
is POT-'kl' with cost ``C + eps log(a_i b_j)``.
"""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import ot
import pytest
import torch

from otviz.ot.sinkhorn import sinkhorn_log
from otviz.ot.unbalanced import _damping_exponent, sinkhorn_unbalanced_log
from tests.helpers import moved, random_ot_problem

DT = torch.float64
_problem = partial(random_ot_problem, col_mass=0.7)  # b has less mass than a


def _pot(a, b, c, eps, tau_a, tau_b, reg_type="entropy"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ot.unbalanced.sinkhorn_unbalanced(
            a, b, c, eps, (tau_a, tau_b), reg_type=reg_type, numItermax=200_000, stopThr=1e-15
        )


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize(
    ("eps", "tau_a", "tau_b"), [(0.1, 0.3, 0.5), (0.07, 0.2, 0.2), (0.5, 2.0, 0.1)]
)
def test_matches_pot_entropy_convention(
    eps: float, tau_a: float, tau_b: float, device: torch.device
) -> None:
    cost, a, b = _problem(1)
    res = sinkhorn_unbalanced_log(
        *moved((cost, a, b), device), eps, tau_a, tau_b, n_iters=50_000, tol=1e-13
    )
    res = moved(res, "cpu")
    assert bool((res.relative_error <= 1e-13).all())
    for i in range(cost.shape[0]):
        ref = _pot(a[i].numpy(), b[i].numpy(), cost[i].numpy(), eps, tau_a, tau_b)
        assert _rel(res.plan[i].numpy(), ref) < 1e-5
        ref_cost = float((ref * cost[i].numpy()).sum())
        assert abs(res.cost[i].item() - ref_cost) <= 1e-5 * abs(ref_cost)


def test_matches_pot_kl_convention_with_shifted_cost() -> None:
    cost, a, b = _problem(2)
    eps, tau_a, tau_b = 0.1, 0.4, 0.3
    res = sinkhorn_unbalanced_log(cost, a, b, eps, tau_a, tau_b, n_iters=50_000, tol=1e-13)
    for i in range(cost.shape[0]):
        shifted = cost[i] + eps * torch.log(a[i][:, None] * b[i][None, :])
        ref = _pot(a[i].numpy(), b[i].numpy(), shifted.numpy(), eps, tau_a, tau_b, "kl")
        assert _rel(res.plan[i].numpy(), ref) < 1e-5


def test_few_iterations_match_pot_iterates() -> None:
    # L = 5 as in ConceptOT: the same fixed iterate as POT's scaling loop after 5 steps
    cost, a, b = _problem(3)
    res = sinkhorn_unbalanced_log(cost, a, b, 0.07, 0.2, 0.2, n_iters=5, tol=None)
    for i in range(cost.shape[0]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = ot.unbalanced.sinkhorn_unbalanced(
                a[i].numpy(),
                b[i].numpy(),
                cost[i].numpy(),
                0.07,
                0.2,
                reg_type="entropy",
                numItermax=5,
                stopThr=0.0,
            )
        assert _rel(res.plan[i].numpy(), ref) < 1e-10


def test_infinite_tau_is_balanced_sinkhorn() -> None:
    cost, a, b = _problem(4)
    b = b / b.sum(1, keepdim=True)
    inf = float("inf")
    assert _damping_exponent(inf, 0.1) == 1.0
    ub = sinkhorn_unbalanced_log(cost, a, b, 0.1, inf, inf, n_iters=25, tol=None)
    bal = sinkhorn_log(cost, a, b, 0.1, n_iters=25, tol=None)
    assert torch.allclose(ub.plan, bal.plan, atol=1e-15)


def test_large_tau_approaches_balanced_ot() -> None:
    # Prop. 1 (i): the converged UOT plan tends to the balanced one as tau grows
    cost, a, b = _problem(5)
    b = b / b.sum(1, keepdim=True)
    bal = sinkhorn_log(cost, a, b, 0.1, n_iters=50_000, tol=1e-14).plan
    gaps = []
    for tau in (1.0, 10.0, 100.0):
        ub = sinkhorn_unbalanced_log(cost, a, b, 0.1, tau, tau, n_iters=100_000, tol=1e-12).plan
        gaps.append((ub - bal).abs().sum().item())
    # the gap shrinks like 1 / tau: each tenfold tau cuts it about tenfold
    assert all(later < 0.125 * earlier for earlier, later in zip(gaps[:-1], gaps[1:], strict=True))


def test_one_sided_hard_marginal() -> None:
    cost, a, b = _problem(6)
    res = sinkhorn_unbalanced_log(cost, a, b, 0.1, float("inf"), 0.3, n_iters=50_000, tol=1e-13)
    # the row marginal is enforced only up to the residual of the last column update
    assert torch.allclose(res.plan.sum(2), a, atol=1e-10)
    assert not torch.allclose(res.plan.sum(1), b, atol=1e-3)


def test_ragged_masks_equal_unpadded_problem(device: torch.device) -> None:
    cost, a, b = _problem(7)
    bsz, n, m = cost.shape
    gen = torch.Generator().manual_seed(8)
    big = torch.rand(bsz, n + 2, m + 3, generator=gen, dtype=DT)
    big[:, :n, :m] = cost
    big[:, :, m:] = float("nan")
    a_pad = torch.cat([a, torch.rand(bsz, 2, generator=gen, dtype=DT)], 1)
    b_pad = torch.cat([b, torch.rand(bsz, 3, generator=gen, dtype=DT)], 1)
    row_mask = torch.arange(n + 2)[None].expand(bsz, -1) < n
    col_mask = torch.arange(m + 3)[None].expand(bsz, -1) < m
    padded = sinkhorn_unbalanced_log(
        *moved((big, a_pad, b_pad), device), 0.1, 0.3, 0.5, n_iters=40,
        row_mask=row_mask.to(device), col_mask=col_mask.to(device),
    )
    padded = moved(padded, "cpu")
    plain = sinkhorn_unbalanced_log(cost, a, b, 0.1, 0.3, 0.5, n_iters=40)
    assert torch.allclose(padded.plan[:, :n, :m], plain.plan, atol=1e-15)
    assert padded.plan[:, n:].abs().max() == 0 and padded.plan[:, :, m:].abs().max() == 0
    assert torch.allclose(padded.marginal_error, plain.marginal_error)
    assert torch.allclose(padded.cost, plain.cost)


def test_marginal_error_is_the_l1_gap_to_the_next_row_update() -> None:
    cost, a, b = _problem(9)
    eps, tau = 0.1, 0.3
    res = sinkhorn_unbalanced_log(cost, a, b, eps, tau, tau, n_iters=4, tol=None)
    alpha = tau / (tau + eps)
    kv = (torch.exp(-cost / eps) * res.log_v.exp()[:, None, :]).sum(2)
    rows = res.log_u.exp() * kv  # P 1
    next_rows = (a / kv) ** alpha * kv  # P 1 after u <- (a / K v)^alpha
    assert torch.allclose(res.marginal_error, (rows - next_rows).abs().sum(1))
    assert torch.allclose(rows, res.plan.sum(2))
    more = sinkhorn_unbalanced_log(cost, a, b, eps, tau, tau, n_iters=40, tol=None)
    assert bool((more.marginal_error < res.marginal_error).all())
    # a hard row constraint: the same number is |P 1 - a|_1, as the balanced solver's rows
    hard = sinkhorn_unbalanced_log(cost, a, b, eps, float("inf"), tau, n_iters=3, tol=None)
    assert torch.allclose(hard.marginal_error, (hard.plan.sum(2) - a).abs().sum(1))


def test_gradcheck() -> None:
    cost, a, b = _problem(10, b=2, n=4, m=3)
    cost.requires_grad_(True)
    a.requires_grad_(True)
    b.requires_grad_(True)
    col_mask = torch.tensor([[True, True, False], [True, True, True]])

    def fn(c, aa, bb):
        r = sinkhorn_unbalanced_log(c, aa, bb, 0.2, 0.5, 1.0, n_iters=5, tol=None,
                                   col_mask=col_mask)
        return r.plan, r.cost

    assert torch.autograd.gradcheck(fn, (cost, a, b))


def test_inference_mode_equals_autograd_mode() -> None:
    # without autograd the plan reuses the kernel's memory: same numbers
    cost, a, b = _problem(11)
    with_grad = sinkhorn_unbalanced_log(cost, a, b, 0.1, 0.3, 0.5, n_iters=7, tol=None)
    with torch.no_grad():
        no_grad = sinkhorn_unbalanced_log(cost, a, b, 0.1, 0.3, 0.5, n_iters=7, tol=None)
    assert torch.equal(with_grad.plan, no_grad.plan)
    assert torch.equal(with_grad.cost, no_grad.cost)


def test_cache_chunks_equal_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import otviz.ot.sinkhorn as sk

    cost, a, b = _problem(12, b=5)
    row_mask = torch.ones(5, 7, dtype=torch.bool)
    row_mask[3, 5:] = False
    b_bal = b * ((a * row_mask).sum(1, keepdim=True) / b.sum(1, keepdim=True))
    kw = dict(n_iters=9, tol=None, row_mask=row_mask)
    whole = sinkhorn_unbalanced_log(cost, a, b, 0.1, 0.3, 0.5, **kw)
    whole_bal = sinkhorn_log(cost, a, b_bal, 0.1, **kw)
    monkeypatch.setattr(sk, "CHUNK_ELEMS", 2 * 7 * 5)  # sub-batches of 2 problems
    parts = sinkhorn_unbalanced_log(cost, a, b, 0.1, 0.3, 0.5, **kw)
    parts_bal = sinkhorn_log(cost, a, b_bal, 0.1, **kw)
    for one, many in [(whole, parts), (whole_bal, parts_bal)]:
        for field in ("plan", "log_u", "log_v", "marginal_error", "cost", "row_marginal",
                      "col_marginal"):
            assert torch.allclose(getattr(one, field), getattr(many, field), rtol=1e-12), field


@pytest.mark.parametrize("scale", [1.0, 1e-5, 1e-7])
def test_tiny_mass_is_judged_relative_to_the_mass(scale: float) -> None:
    """Masses far below the tolerance: the relative test iterates as at unit mass and the
    converged plan is POT's (reg_m = (tau_a, tau_b), reg = eps, entropy). Under the former
    absolute test masses of 1e-5 stopped after one iteration with a plan about 44 % off."""
    cost, a, b = _problem(13, b=1)
    a, b = a * scale, b * scale
    res = sinkhorn_unbalanced_log(cost, a, b, 0.05, 0.3, 0.5)
    ref = _pot(a[0].numpy(), b[0].numpy(), cost[0].numpy(), 0.05, 0.3, 0.5)
    assert bool(res.converged[0]) and res.n_iters > 5
    assert float(res.relative_error[0]) <= 1e-4
    assert _rel(res.plan[0].numpy(), ref) < 1e-3
