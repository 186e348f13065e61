"""Fused Gromov-Wasserstein inference (OT-CLIP Sec. 4.1-4.2): limits, POT references, and
the zero-shot / long-tailed classifiers built on it."""

import numpy as np
import ot
import pytest
import torch
import torch.nn.functional as F

from otviz.ot.fgw import (
    _linearised_cost,
    _structure_term,
    fgw_isoftmax,
    fgw_pgd,
    fgw_sinkhorn,
    structure_matrix,
)
from otviz.ot.sinkhorn import sinkhorn_log
from otviz.ot.unbalanced import sinkhorn_unbalanced_log
from otviz.ot.zeroshot import long_tailed_predict, zero_shot_predict
from tests.helpers import moved

DT = torch.float64


def _problem(seed: int, n: int = 7, k: int = 4, d: int = 5, batch: int = 2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, d, generator=gen, dtype=DT)
    y = torch.randn(batch, k, d, generator=gen, dtype=DT)
    cost = 1.0 - F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).transpose(1, 2)
    return x, y, cost, structure_matrix(x), structure_matrix(y)


def test_isoftmax_with_alpha0_zero_is_softmax():
    x, y, cost, d1, d2 = _problem(0)
    res = fgw_isoftmax(cost, None, 0.05, d1, d2, alpha0=0.0, n_iters=3)
    assert torch.allclose(res.plan, torch.softmax(-cost / 0.05, dim=2))
    img, cls = x[0], y[0]
    soft = zero_shot_predict(img, cls, "softmax", eps=0.05)
    fgw = zero_shot_predict(img, cls, "fgw_isoftmax", eps=0.05, alpha0=0.0)
    assert torch.equal(soft.labels, fgw.labels)
    assert torch.allclose(soft.scores, fgw.scores)


def test_pgd_with_alpha0_zero_sharpens_softmax():
    _, _, cost, d1, d2 = _problem(1)
    res = fgw_pgd(cost, None, 0.1, d1, d2, alpha0=0.0, n_iters=4)
    assert torch.allclose(res.plan, torch.softmax(-5 * cost / 0.1, dim=2))
    assert torch.equal(res.plan.argmax(2), cost.argmin(2))


def test_isoftmax_reaches_its_fixed_point():
    """Iterating Eq. 12 with a small alpha0 converges to P = softmax(-C(P) / eps)."""
    _, _, cost, d1, d2 = _problem(2)
    res = fgw_isoftmax(cost, None, 0.5, d1, d2, alpha0=0.02, n_iters=60)
    again = torch.softmax(-_linearised_cost(cost, d1, d2, res.plan, 0.02) / 0.5, dim=2)
    assert torch.allclose(res.plan, again, atol=1e-10)
    assert bool((res.marginal_error < 1e-12).all())
    assert not torch.allclose(res.plan, torch.softmax(-cost / 0.5, dim=2), atol=1e-3)


def test_structure_matrix_kinds():
    x, _, _, d1, _ = _problem(3)
    assert torch.allclose(structure_matrix(x, "distance"), 1.0 - d1)
    assert torch.allclose(d1.diagonal(dim1=1, dim2=2), torch.ones(2, 7, dtype=DT))
    with pytest.raises(ValueError):
        structure_matrix(x, "euclid")


def test_structure_term_matches_double_sum():
    _, _, cost, d1, d2 = _problem(4, n=3, k=2, batch=1)
    plan = torch.softmax(-cost, dim=2)
    ref = sum(
        d1[0, i, k] * plan[0, i, j] * d2[0, j, l] * plan[0, k, l]
        for i in range(3)
        for k in range(3)
        for j in range(2)
        for l in range(2)
    )
    assert float(_structure_term(d1, d2, plan)[0]) == pytest.approx(float(ref))


def test_fgw_sinkhorn_alpha0_zero_is_sinkhorn_and_matches_pot(device):
    _, _, cost, d1, d2 = _problem(5)
    a = torch.full((2, 7), 1 / 7, dtype=DT)
    b = torch.full((2, 4), 1 / 4, dtype=DT)
    on = moved((cost, a, b, d1, d2), device)
    res = moved(fgw_sinkhorn(*on[:3], 0.1, *on[3:], 0.0, n_inner=300, tol=None), "cpu")
    ref = sinkhorn_log(cost, a, b, 0.1, 300, None)
    assert torch.allclose(res.plan, ref.plan)
    pot = ot.sinkhorn(a[0].numpy(), b[0].numpy(), cost[0].numpy(), 0.1, stopThr=1e-14)
    assert np.allclose(res.plan[0].numpy(), pot, atol=1e-10)


def test_fgw_sinkhorn_matches_pot_entropic_fgw():
    """POT's entropic FGW (square loss, weight beta) linearises with the gradient
    (1-beta) M - 4 beta C1 T C2^T + (row/col constants), i.e. our iteration with
    alpha0 = 4 beta / (1 - beta) and eps = eps_pot / (1 - beta), started from the same plan."""
    _, _, cost, d1, d2 = _problem(6, batch=1)
    a = torch.full((1, 7), 1 / 7, dtype=DT)
    b = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=DT)
    beta, eps_pot, n_outer = 0.2, 0.05, 4
    alpha0, eps = 4 * beta / (1 - beta), eps_pot / (1 - beta)
    res = fgw_sinkhorn(cost, a, b, eps, d1, d2, alpha0, n_outer=n_outer, n_inner=2000, tol=None)
    start = sinkhorn_log(cost, a, b, eps, 2000, None).plan[0].numpy()
    pot = ot.gromov.entropic_fused_gromov_wasserstein(
        cost[0].numpy(), d1[0].numpy(), d2[0].numpy(), a[0].numpy(), b[0].numpy(),
        loss_fun="square_loss", epsilon=eps_pot, alpha=beta, G0=start, max_iter=n_outer,
        tol=0.0, stopThr=1e-15, numItermax=20000,
    )
    assert np.allclose(res.plan[0].numpy(), pot, atol=1e-8)
    assert float(res.marginal_error[0]) < 1e-8


def test_fgw_sinkhorn_unbalanced_inner_alpha0_zero():
    _, _, cost, d1, d2 = _problem(7)
    a = torch.ones(2, 7, dtype=DT)
    b = torch.ones(2, 4, dtype=DT)
    res = fgw_sinkhorn(cost, a, b, 0.1, d1, d2, 0.0, n_inner=200, tau_a=0.3, tau_b=0.5, tol=None)
    ref = sinkhorn_unbalanced_log(cost, a, b, 0.1, 0.3, 0.5, 200, None)
    assert torch.allclose(res.plan, ref.plan)


def test_fgw_masks_equal_dropping():
    _, _, cost, d1, d2 = _problem(8, batch=1)
    rows = torch.tensor([[True] * 5 + [False] * 2])
    cols = torch.tensor([[True] * 3 + [False]])
    res = fgw_isoftmax(cost, None, 0.2, d1, d2, 0.05, 4, row_mask=rows, col_mask=cols)
    ref = fgw_isoftmax(cost[:, :5, :3], None, 0.2, d1[:, :5, :5], d2[:, :3, :3], 0.05, 4)
    assert torch.allclose(res.plan[:, :5, :3], ref.plan)
    assert float(res.plan[:, 5:].sum() + res.plan[:, :, 3:].sum()) == 0.0


def test_graph_structure_resolves_an_ambiguous_image():
    """Nine images near class A and one image equidistant from A and B but close to the
    other images: the Gromov term pulls it to A (edge matching), the softmax cannot decide."""
    gen = torch.Generator().manual_seed(9)
    cls = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=DT)
    imgs = torch.tensor([1.0, 0.05, 0.3], dtype=DT) + 0.05 * torch.randn(9, 3, generator=gen,
                                                                         dtype=DT)
    odd = torch.tensor([[0.5, 0.5, 0.7]], dtype=DT)
    emb = torch.cat([imgs, odd])
    soft = zero_shot_predict(emb, cls, "softmax", eps=0.01)
    fgw = zero_shot_predict(emb, cls, "fgw_isoftmax", eps=0.01, alpha0=0.1, n_iters=5)
    assert float(soft.scores[-1, 0]) == pytest.approx(0.5, abs=1e-9)
    assert int(fgw.labels[-1]) == 0 and float(fgw.scores[-1, 0]) > 0.9
    assert torch.equal(fgw.labels[:9], soft.labels[:9])


def test_long_tailed_uniform_prior_matches_pot_sinkhorn():
    x, y, cost, _, _ = _problem(10, n=12, k=4, batch=1)
    prior = torch.ones(4, dtype=DT)
    pred = long_tailed_predict(x[0], y[0], prior, eps=0.05, alpha0=0.0, n_inner=2000,
                               tol=1e-12)
    a, b = np.ones(12), np.full(4, 3.0)
    pot = ot.sinkhorn(a, b, cost[0].numpy(), 0.05, stopThr=1e-14, numItermax=100000)
    assert np.allclose(pred.scores.numpy(), pot, atol=1e-8)
    assert torch.allclose(pred.scores.sum(0), torch.full((4,), 3.0, dtype=DT))
    assert torch.equal(pred.labels, torch.from_numpy(pot.argmax(1)))


def test_long_tailed_prior_shifts_predictions():
    x, y, _, _, _ = _problem(11, n=40, k=3, batch=1)
    prior = torch.tensor([0.7, 0.2, 0.1], dtype=DT)
    pred = long_tailed_predict(x[0], y[0], prior, eps=0.02, n_inner=500)
    assert torch.allclose(pred.scores.sum(0), 40 * prior, atol=1e-4)
    counts = torch.bincount(pred.labels, minlength=3)
    assert int(counts[0]) >= 20  # the head class takes most images
    soft = long_tailed_predict(x[0], y[0], prior, eps=0.02, n_inner=500, prior_strength=0.01)
    assert not torch.allclose(soft.scores.sum(0), 40 * prior, atol=1e-3)


def test_gradcheck_fgw_solvers():
    _, _, cost, d1, d2 = _problem(12, n=3, k=2, batch=1)
    cost = cost.clone().requires_grad_(True)
    a = torch.ones(1, 3, dtype=DT)
    b = torch.full((1, 2), 1.5, dtype=DT)
    assert torch.autograd.gradcheck(lambda c: fgw_isoftmax(c, None, 0.5, d1, d2, 0.1).plan, (cost,))
    assert torch.autograd.gradcheck(lambda c: fgw_pgd(c, None, 0.5, d1, d2, 0.1).plan, (cost,))
    assert torch.autograd.gradcheck(
        lambda c: fgw_sinkhorn(c, a, b, 0.5, d1, d2, 0.1, 2, 10, tol=None).plan, (cost,)
    )


def test_paper_and_unit_mass_scalings_predict_differently_by_hand():
    """Two images, two orthonormal classes (D2 = I), eps = alpha0 = 0.01. Image 0 is
    clearly class 0 (cosines 0.9, 0.1); image 1 leans to class 1 (cosines 0.496, 0.5) and
    resembles image 0 (D1_01 = d ~ 0.80). One FGW-ISoftmax step by hand:
    P0_1 = softmax(-[0.504, 0.5] / 0.01) = [0.401, 0.599], P0_0 ~ [1, 0], so the Gromov
    shift of row 1 is alpha0 (d P0_0 + P0_1) = 0.01 [d + 0.401, 0.599]. With the paper's
    scaling (raw plan, mass 2) the costs become [0.492, 0.494]: class 0; the unit-mass
    plan halves the shift, [0.498, 0.497]: class 1 stays, as softmax."""
    def unit(c0: float, c1: float) -> torch.Tensor:
        return torch.tensor([c0, c1, (1 - c0 * c0 - c1 * c1) ** 0.5], dtype=DT)

    images = torch.stack([unit(0.9, 0.1), unit(0.496, 0.5)])
    classes = torch.eye(3, dtype=DT)[:2]
    eps = alpha0 = 0.01
    d = float(images[0] @ images[1])
    p0 = torch.softmax(-torch.tensor([0.504, 0.5], dtype=DT) / eps, 0)
    # the unit-mass variant divides the plan by its mass n = 2
    for rule, plan_divisor in (("fgw_isoftmax", 1.0), ("fgw_isoftmax_unit", 2.0)):
        shift = alpha0 * torch.stack([d + p0[0], p0[1]]) / plan_divisor
        hand = torch.softmax(-(torch.tensor([0.504, 0.5], dtype=DT) - shift) / eps, 0)
        pred = zero_shot_predict(images, classes, rule, eps=eps, alpha0=alpha0, n_iters=1)
        assert torch.allclose(pred.scores[1], hand, atol=1e-9)
    labels = {rule: zero_shot_predict(images, classes, rule, eps=eps, n_iters=1).labels.tolist()
              for rule in ("softmax", "fgw_isoftmax", "fgw_isoftmax_unit")}
    assert labels == {"softmax": [0, 1], "fgw_isoftmax": [0, 0], "fgw_isoftmax_unit": [0, 1]}
    # at the default steps both FGW rules keep the split (PGD as well)
    for paper, previous in (("fgw_isoftmax", "fgw_isoftmax_unit"), ("fgw_pgd", "fgw_pgd_unit")):
        assert zero_shot_predict(images, classes, paper, eps=eps).labels.tolist() == [0, 0]
        assert zero_shot_predict(images, classes, previous, eps=eps).labels.tolist() == [0, 1]
