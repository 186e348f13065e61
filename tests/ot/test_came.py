"""CAME marginals (QC-Align) against an explicit loop reference; positivity, unit mass, masks."""

import math

import pytest
import torch

from otviz.ot.came import came_marginals
from tests.helpers import moved

DT = torch.float64


def _leaky(x: float, slope: float) -> float:
    return x if x >= 0 else slope * x


def _cos(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(x @ y / (x.norm() * y.norm()))


def _softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [x / sum(e) for x in e]


def _reference(v: torch.Tensor, t: torch.Tensor, slope: float = 0.01):
    """CAME for one pair with plain Python loops, straight from QC-Align's description."""
    n, m = v.shape[0], t.shape[0]
    alpha = [_softmax([_leaky(_cos(t[j], v[i]), slope) for i in range(n)]) for j in range(m)]
    beta = [_softmax([_leaky(_cos(v[i], t[j]), slope) for j in range(m)]) for i in range(n)]
    t_ctx = [sum(alpha[j][i] * v[i] for i in range(n)) for j in range(m)]
    v_ctx = [sum(beta[i][j] * t[j] for j in range(m)) for i in range(n)]
    w_t = _softmax([_cos(t[j], t_ctx[j]) for j in range(m)])
    w_v = _softmax([_cos(v[i], v_ctx[i]) for i in range(n)])
    mu = [sum(alpha[j][i] * w_t[j] for j in range(m)) for i in range(n)]
    nu = [sum(beta[i][j] * w_v[i] for i in range(n)) for j in range(m)]
    return mu, nu


def test_matches_loop_reference(device):
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(2, 5, 4, generator=gen, dtype=DT)
    t = torch.randn(2, 3, 4, generator=gen, dtype=DT)
    res = moved(came_marginals(*moved((v, t), device)), "cpu")
    for b in range(2):
        mu, nu = _reference(v[b], t[b])
        assert res.mu[b].tolist() == pytest.approx(mu, abs=1e-12)
        assert res.nu[b].tolist() == pytest.approx(nu, abs=1e-12)


def test_positive_unit_mass_with_masks():
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(3, 7, 6, generator=gen, dtype=DT)
    t = torch.randn(3, 5, 6, generator=gen, dtype=DT)
    v_mask = torch.ones(3, 7, dtype=torch.bool)
    t_mask = torch.ones(3, 5, dtype=torch.bool)
    v_mask[0, 5:] = False
    t_mask[1, 2:] = False
    t_mask[2, 0] = False
    res = came_marginals(v, t, v_mask, t_mask)
    assert torch.allclose(res.mu.sum(1), torch.ones(3, dtype=DT))
    assert torch.allclose(res.nu.sum(1), torch.ones(3, dtype=DT))
    assert bool((res.mu[v_mask] > 0).all()) and bool((res.nu[t_mask] > 0).all())
    assert bool((res.mu[~v_mask] == 0).all()) and bool((res.nu[~t_mask] == 0).all())
    # masking equals dropping the padded entries
    for b in range(3):
        ref = came_marginals(v[b : b + 1, v_mask[b]], t[b : b + 1, t_mask[b]])
        assert torch.allclose(res.mu[b, v_mask[b]], ref.mu[0])
        assert torch.allclose(res.nu[b, t_mask[b]], ref.nu[0])


def test_swapping_modalities_swaps_marginals():
    gen = torch.Generator().manual_seed(2)
    v = torch.randn(2, 6, 5, generator=gen, dtype=DT)
    t = torch.randn(2, 4, 5, generator=gen, dtype=DT)
    a = came_marginals(v, t)
    b = came_marginals(t, v)
    assert torch.allclose(a.mu, b.nu) and torch.allclose(a.nu, b.mu)


def test_attended_units_get_more_quota():
    """A patch that duplicates a token's direction is attended by it and gets the largest mu."""
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(1, 3, 16, generator=gen, dtype=DT)
    v = torch.randn(1, 6, 16, generator=gen, dtype=DT)
    v[0, 2] = 3.0 * (t[0, 0] + t[0, 1] + t[0, 2])
    res = came_marginals(v, t, temperature=0.1)
    assert int(res.mu[0].argmax()) == 2


def test_gradcheck():
    gen = torch.Generator().manual_seed(4)
    v = torch.randn(1, 4, 3, generator=gen, dtype=DT, requires_grad=True)
    t = torch.randn(1, 3, 3, generator=gen, dtype=DT, requires_grad=True)
    v_mask = torch.tensor([[True, True, True, False]])

    def fn(v: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        res = came_marginals(v, t, v_mask)
        return res.mu, res.nu

    assert torch.autograd.gradcheck(fn, (v, t))
