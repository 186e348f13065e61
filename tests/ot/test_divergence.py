"""Sinkhorn divergence (QC-Align's QCT): zero on identical inputs, positive otherwise, values
checked against POT, masks, gradients."""

import numpy as np
import ot
import pytest
import torch

from otviz.methods.masses import uniform_masses
from otviz.ot.divergence import _normalised_cosine_cost, _ot_value, sinkhorn_divergence
from tests.helpers import moved

DT = torch.float64


def _clouds(seed: int, b: int = 4, n: int = 6, m: int = 5, d: int = 3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, d, generator=gen, dtype=DT)
    y = torch.randn(b, m, d, generator=gen, dtype=DT)
    a = torch.rand(b, n, generator=gen, dtype=DT) + 0.1
    c = torch.rand(b, m, generator=gen, dtype=DT) + 0.1
    return x, y, a / a.sum(1, keepdim=True), c / c.sum(1, keepdim=True)


@pytest.mark.parametrize("objective", ["sharp", "entropic"])
def test_zero_for_identical_inputs(objective):
    x, _, a, _ = _clouds(0)
    res = sinkhorn_divergence(x, x.clone(), a, a.clone(), eps=0.1, objective=objective)
    assert torch.allclose(res.value, torch.zeros_like(res.value), atol=1e-12)


@pytest.mark.parametrize("objective", ["sharp", "entropic"])
@pytest.mark.parametrize("eps", [0.05, 0.5])
def test_positive_for_different_inputs(objective, eps):
    for seed in range(5):
        x, y, a, b = _clouds(seed + 10)
        res = sinkhorn_divergence(x, y, a, b, eps=eps, n_iters=1000, objective=objective)
        assert bool((res.value > 0).all()), res.value
        assert bool((res.marginal_error < 1e-4).all())  # self terms converge slowly


def test_positive_when_only_weights_differ():
    x, _, a, b = _clouds(3, m=6)
    res = sinkhorn_divergence(x, x, a, b, eps=0.1, n_iters=300, objective="entropic")
    assert bool((res.value > 0).all())


def test_ot_value_matches_pot(device):
    x, y, a, b = _clouds(1, b=2)
    eps = 0.1
    cost = _normalised_cosine_cost(x, y)
    on = moved((cost, a, b), device)
    sharp, res = moved(_ot_value(*on, eps, "sharp", n_iters=500, tol=None), "cpu")
    ent, _ = moved(_ot_value(*on, eps, "entropic", n_iters=500, tol=None), "cpu")
    for i in range(2):
        c, ai, bi = cost[i].numpy(), a[i].numpy(), b[i].numpy()
        plan = ot.sinkhorn(ai, bi, c, eps, stopThr=1e-13, numItermax=10000)
        assert np.allclose(res.plan[i].numpy(), plan, atol=1e-9)
        assert float(sharp[i]) == pytest.approx(float((plan * c).sum()), abs=1e-9)
        kl = (plan * np.log(plan / np.outer(ai, bi))).sum()  # masses equal: -P + ab cancels
        assert float(ent[i]) == pytest.approx(float((plan * c).sum() + eps * kl), abs=1e-9)


def test_masks_equal_dropping_entries():
    x, y, a, b = _clouds(2, b=1, n=6, m=5)
    x_mask = torch.tensor([[True] * 4 + [False] * 2])
    y_mask = torch.tensor([[True] * 3 + [False] * 2])
    a_m = uniform_masses(x_mask, DT)
    b_m = uniform_masses(y_mask, DT)
    res = sinkhorn_divergence(x, y, a_m, b_m, 0.2, x_mask=x_mask, y_mask=y_mask)
    ref = sinkhorn_divergence(x[:, :4], y[:, :3], a_m[:, :4], b_m[:, :3], 0.2)
    assert torch.allclose(res.value, ref.value)
    assert torch.allclose(res.plan[:, :4, :3], ref.plan)
    assert float(res.plan[:, 4:].abs().sum() + res.plan[:, :, 3:].abs().sum()) == 0.0


def test_self_marginals_override():
    x, y, a, b = _clouds(4, b=2)
    ua = uniform_masses(torch.ones_like(a, dtype=torch.bool), DT)
    ub = uniform_masses(torch.ones_like(b, dtype=torch.bool), DT)
    res = sinkhorn_divergence(x, y, a, b, 0.5, a_self=ua, b_self=ub)
    wxx, _ = _ot_value(_normalised_cosine_cost(x, x), ua, ua, 0.5)
    cross, _ = _ot_value(_normalised_cosine_cost(x, y), a, b, 0.5)
    assert torch.allclose(res.self_x, wxx) and torch.allclose(res.cross, cross)


@pytest.mark.parametrize("objective", ["sharp", "entropic"])
def test_gradcheck(objective):
    x, y, a, b = _clouds(5, b=1, n=3, m=2, d=2)
    x.requires_grad_(True)
    y.requires_grad_(True)

    def fn(x, y):
        return sinkhorn_divergence(x, y, a, b, 0.5, n_iters=10, objective=objective,
                                   tol=None).value

    assert torch.autograd.gradcheck(fn, (x, y))
