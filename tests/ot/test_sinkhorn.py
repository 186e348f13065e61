"""Balanced log-domain Sinkhorn against POT, ragged masks, early stopping, autograd."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

from otviz.ot.sinkhorn import _ShiftedKernel, sinkhorn_log
from tests.helpers import moved
from tests.helpers import random_ot_problem as _problem

DT = torch.float64


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("eps", [0.5, 0.05, 0.01])
def test_matches_pot_sinkhorn_log(eps: float, device: torch.device) -> None:
    cost, a, b = _problem(11)
    res = moved(sinkhorn_log(*moved((cost, a, b), device), eps, n_iters=50_000, tol=1e-13), "cpu")
    assert bool((res.marginal_error < 1e-12).all())
    for i in range(cost.shape[0]):
        ref = ot.sinkhorn(
            a[i].numpy(),
            b[i].numpy(),
            cost[i].numpy(),
            eps,
            method="sinkhorn_log",
            numItermax=200_000,
            stopThr=1e-15,
        )
        assert _rel(res.plan[i].numpy(), ref) < 1e-5
        ref_cost = float((ref * cost[i].numpy()).sum())
        assert abs(res.cost[i].item() - ref_cost) <= 1e-5 * abs(ref_cost)


def test_small_eps_uses_exact_fallback_in_float32(device: torch.device) -> None:
    # cost range / eps = 500 overflows exp's range in float32: the shifted mat-vec underflows
    # and the affected entries must be recomputed by logsumexp.
    gen = torch.Generator().manual_seed(3)
    log_k = -torch.rand(2, 6, 4, generator=gen) * 500.0
    g = torch.randn(2, 4, generator=gen) * 30.0
    f = torch.randn(2, 6, generator=gen) * 30.0
    log_k, g, f = moved((log_k, g, f), device)
    kern = _ShiftedKernel.from_cost(-log_k, 1.0, None, None)
    assert torch.allclose(kern.row_lse(g), torch.logsumexp(log_k + g[:, None, :], 2), rtol=1e-5)
    assert torch.allclose(kern.col_lse(f), torch.logsumexp(log_k + f[:, :, None], 1), rtol=1e-5)


def test_ragged_masks_equal_unpadded_problem(device: torch.device) -> None:
    cost, a, b = _problem(5)
    bsz, n, m = cost.shape
    gen = torch.Generator().manual_seed(6)
    big = torch.randn(bsz, n + 3, m + 2, generator=gen, dtype=DT)
    big[:, :n, :m] = cost
    big[:, n:, :] = float("inf")  # garbage in padding must not leak
    a_pad = torch.cat([a, torch.rand(bsz, 3, generator=gen, dtype=DT)], 1)
    b_pad = torch.cat([b, torch.rand(bsz, 2, generator=gen, dtype=DT)], 1)
    row_mask = torch.arange(n + 3)[None].expand(bsz, -1) < n
    col_mask = torch.arange(m + 2)[None].expand(bsz, -1) < m
    big, a_pad, b_pad, row_mask, col_mask = moved((big, a_pad, b_pad, row_mask, col_mask), device)
    padded = sinkhorn_log(big, a_pad, b_pad, 0.1, n_iters=30, row_mask=row_mask, col_mask=col_mask)
    padded = moved(padded, "cpu")
    plain = sinkhorn_log(cost, a, b, 0.1, n_iters=30)
    assert torch.allclose(padded.plan[:, :n, :m], plain.plan, atol=1e-14)
    assert padded.plan[:, n:].abs().max() == 0 and padded.plan[:, :, m:].abs().max() == 0
    assert torch.allclose(padded.marginal_error, plain.marginal_error, atol=1e-14)
    assert torch.allclose(padded.cost, plain.cost)
    assert torch.isinf(padded.log_u[:, n:]).all() and torch.isfinite(padded.log_u[:, :n]).all()


def test_per_problem_ragged_sizes() -> None:
    # each problem of the batch has its own N and M
    gen = torch.Generator().manual_seed(8)
    cost = torch.rand(2, 6, 5, generator=gen, dtype=DT)
    sizes = [(6, 3), (4, 5)]
    row_mask = torch.zeros(2, 6, dtype=torch.bool)
    col_mask = torch.zeros(2, 5, dtype=torch.bool)
    a = torch.zeros(2, 6, dtype=DT)
    b = torch.zeros(2, 5, dtype=DT)
    for k, (n, m) in enumerate(sizes):
        row_mask[k, :n] = True
        col_mask[k, :m] = True
        a[k, :n] = 1.0 / n
        b[k, :m] = 1.0 / m
    res = sinkhorn_log(cost, a, b, 0.2, n_iters=40, row_mask=row_mask, col_mask=col_mask)
    for k, (n, m) in enumerate(sizes):
        single = sinkhorn_log(cost[k : k + 1, :n, :m], a[k : k + 1, :n], b[k : k + 1, :m], 0.2, 40)
        assert torch.allclose(res.plan[k, :n, :m], single.plan[0], atol=1e-14)


def test_tolerance_stops_early_and_fixed_count_without() -> None:
    cost, a, b = _problem(2)
    fixed = sinkhorn_log(cost, a, b, 0.3, n_iters=7, tol=None)
    assert fixed.n_iters == 7
    early = sinkhorn_log(cost, a, b, 0.3, n_iters=10_000, tol=1e-9)
    assert early.n_iters < 10_000
    assert bool((early.marginal_error <= 1e-9).all())
    # the L1 marginal error is what it says
    p = early.plan
    direct = (p.sum(2) - a).abs().sum(1) + (p.sum(1) - b).abs().sum(1)
    assert torch.allclose(early.marginal_error, direct)


def test_gradcheck() -> None:
    cost, a, b = _problem(4, b=2, n=4, m=3)
    cost.requires_grad_(True)
    a.requires_grad_(True)
    row_mask = torch.tensor([[True, True, True, False], [True] * 4])
    with torch.no_grad():  # balanced: equal masses over the valid rows
        a.mul_(b.sum(1, keepdim=True) / (a * row_mask).sum(1, keepdim=True))

    def fn(c: torch.Tensor, aa: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = sinkhorn_log(c, aa, b, 0.3, n_iters=6, tol=None, row_mask=row_mask)
        return r.plan, r.cost

    assert torch.autograd.gradcheck(fn, (cost, a))
