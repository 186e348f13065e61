"""Low-rank Nystrom UOT (ConceptOT Eq. 4-8, Algorithm 1): exactness, implicit score,
factored plan, variants, robustness, autograd."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import otviz.ot._sync as lowrank_sync
from otviz.ot import LowRankSettings, lowrank
from otviz.ot.lowrank import (
    _anchor_log_kernels,
    _regularised_anchor_gram,
    _robust_inverse,
)
from otviz.ot.unbalanced import sinkhorn_unbalanced_log
from tests.helpers import moved

DT = torch.float64
# the solver as ConceptOT runs it: exactly n_iters iterations (Alg. 1's L), no early stop
S = functools.partial(LowRankSettings, tol=None)
lowrank_uot = lowrank.lowrank_uot


def _data(seed: int, b: int = 3, n: int = 9, m: int = 5, d: int = 6):
    gen = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(b, n, d, generator=gen, dtype=DT), dim=-1)
    y = F.normalize(torch.randn(b, m, d, generator=gen, dtype=DT), dim=-1)
    mu = torch.softmax(torch.randn(b, n, generator=gen, dtype=DT), 1)
    nu = torch.softmax(torch.randn(b, m, generator=gen, dtype=DT), 1)
    return z, y, mu, nu


def _anchors(seed: int, r: int, d: int = 6) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(r, d, generator=gen, dtype=DT), dim=-1)


def _exact(z, y, anchors, mu, nu, **knobs):
    """Algorithm 1 without the App. H clamp and 1e-8 floor, lambda -> 0."""
    return lowrank_uot(z, y, anchors, mu, nu, S(**knobs, kpp_reg=1e-12, clamp=None, floor=0.0))


@pytest.mark.parametrize("n_iters", [5, 300])
def test_anchors_on_tokens_recover_dense_uot(n_iters: int) -> None:
    # P = Y (r = M): K_ZP K_PP^-1 K_PY = K_ZY K_YY^-1 K_YY = K exactly, so the low-rank
    # iterates are dense UOT's.
    z, y, mu, nu = _data(1)
    eps, ta, tb = 0.5, 0.2, 0.3
    dense = sinkhorn_unbalanced_log(
        1 - z @ y.transpose(1, 2), mu, nu, eps, ta, tb, n_iters, tol=None
    )
    low = _exact(z=z, y=y, anchors=y, mu=mu, nu=nu, eps=eps, tau_a=ta, tau_b=tb, n_iters=n_iters)
    plan = low.factors.dense()
    assert torch.allclose(plan, dense.plan, rtol=1e-8, atol=1e-12)
    assert torch.allclose(low.log_u, dense.log_u, atol=1e-8)
    assert torch.allclose(low.marginal_error, dense.marginal_error, rtol=1e-6, atol=1e-12)
    assert torch.allclose(low.cost, dense.cost, rtol=1e-8)


def _algorithm1_reference(z, y, anchors, mu, nu, eps, tau_a, tau_b, n_iters, clamp, floor):
    """Algorithm 1 with App. H's clamp (mean restored) in plain dense algebra: the Nystrom
    kernel materialised, no shifts, no log-domain tricks (a reference for small problems)."""
    k_zp = torch.exp((z @ anchors.T - 1) / eps)
    k_py = torch.exp((anchors @ y.transpose(1, 2) - 1) / eps)
    k_pp = torch.exp((anchors @ anchors.T - 1) / eps) + 1e-2 * torch.eye(len(anchors), dtype=DT)
    k = k_zp @ torch.linalg.solve(k_pp, k_py)
    alpha_a, alpha_b = tau_a / (tau_a + eps), tau_b / (tau_b + eps)

    def centre_clamp(x):
        mean = x.mean(1, keepdim=True)
        return x if clamp is None else (x - mean).clamp(-clamp, clamp) + mean

    def log_floored(kv):
        return torch.log(kv.clamp_min(0) + floor)

    log_a, log_b = torch.zeros_like(mu), torch.zeros_like(nu)
    for _ in range(n_iters):
        log_a = centre_clamp(alpha_a * (mu.log() - log_floored(k @ log_b.exp()[..., None])[..., 0]))
        kt_a = k.transpose(1, 2) @ log_a.exp()[..., None]
        log_b = centre_clamp(alpha_b * (nu.log() - log_floored(kt_a)[..., 0]))
    kb = (k @ log_b.exp()[..., None])[..., 0]
    plan = log_a.exp()[:, :, None] * k * log_b.exp()[:, None, :]
    # distance of the row scaling to the fixed point of its own (unclamped) update, the
    # floor included, plus the mass a negative K~ b hides from the iterations
    seen = kb.clamp_min(0) + floor
    next_a = torch.exp(alpha_a * (mu.log() - log_floored(kb)))
    residual = ((log_a.exp() - next_a).abs() * seen + log_a.exp() * (-kb).clamp_min(0)).sum(1)
    return log_a, log_b, plan, residual, kb


@pytest.mark.parametrize(("seed", "eps"), [(0, 0.1), (1, 0.05), (2, 0.03)])
def test_faithful_solver_equals_algorithm1_reference(
    seed: int, eps: float, device: torch.device
) -> None:
    # the default faithful solver (App. H clamp 20, 1e-8 floor) equals plain Algorithm 1
    gen = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(4, 30, 5, generator=gen, dtype=DT), dim=-1)
    y = F.normalize(torch.randn(4, 12, 5, generator=gen, dtype=DT), dim=-1)
    anchors = F.normalize(torch.randn(6, 5, generator=gen, dtype=DT), dim=-1)
    # skewed masses spread the log-scalings beyond App. H's clamp
    mu = torch.softmax(10 * torch.randn(4, 30, generator=gen, dtype=DT), 1)
    nu = torch.softmax(10 * torch.randn(4, 12, generator=gen, dtype=DT), 1)
    log_a, log_b, plan, residual, kb = _algorithm1_reference(
        z, y, anchors, mu, nu, eps, 0.2, 0.3, 5, 20.0, 1e-8
    )
    knobs = S(eps=eps, tau_a=0.2, tau_b=0.3, n_iters=5)
    res = moved(lowrank_uot(*moved((z, y, anchors, mu, nu), device), knobs), "cpu")
    assert torch.allclose(res.log_u, log_a, rtol=0, atol=1e-10)
    assert torch.allclose(res.log_v, log_b, rtol=0, atol=1e-10)
    assert torch.allclose(res.factors.dense(), plan, rtol=1e-10, atol=1e-12 * plan.abs().max())
    assert torch.allclose(res.marginal_error, residual, rtol=1e-10, atol=1e-10)
    sim = z @ y.transpose(1, 2)
    assert torch.allclose(res.score, (plan * sim).sum((1, 2)) / plan.sum((1, 2)), rtol=1e-10)
    # the plan's marginals come from the iterations' last products
    scale = plan.abs().amax((1, 2), keepdim=True)[..., 0]
    assert torch.allclose(res.row_marginal / scale, plan.sum(2) / scale, atol=1e-12)
    assert torch.allclose(res.col_marginal / scale, plan.sum(1) / scale, atol=1e-12)
    # these problems exercise both safeguards: the clamp is active (without it the scalings
    # differ) and the Nystrom product goes negative, where the floor alone sets the update
    unclamped = _algorithm1_reference(z, y, anchors, mu, nu, eps, 0.2, 0.3, 5, None, 1e-8)[0]
    assert not torch.allclose(unclamped, log_a)
    assert bool((kb < 0).any())


def test_float32_huge_masses_keep_the_reference_scalings_and_a_finite_score() -> None:
    # masses ~3e37 with alpha ~ 1 push log a towards 100: e^{log a} overflows float32, so
    # the floored sums fall back to the log domain, and Eq. 8 stays a ratio of shifted sums
    gen = torch.Generator().manual_seed(29)
    z = F.normalize(torch.randn(3, 20, 5, generator=gen, dtype=DT), dim=-1)
    y = F.normalize(torch.randn(3, 7, 5, generator=gen, dtype=DT), dim=-1)
    anchors = F.normalize(torch.randn(4, 5, generator=gen, dtype=DT), dim=-1)
    mu = torch.softmax(torch.randn(3, 20, generator=gen, dtype=DT), 1) * 3e37
    nu = torch.softmax(torch.randn(3, 7, generator=gen, dtype=DT), 1) * 3e37
    log_a, _, plan, _, _ = _algorithm1_reference(
        z, y, anchors, mu, nu, 0.1, 1e12, 1e12, 5, 20.0, 1e-8
    )
    assert log_a.max() > 88  # beyond float32's exp range
    knobs = S(eps=0.1, tau_a=1e12, tau_b=1e12, n_iters=5)
    res = lowrank_uot(z.float(), y.float(), anchors.float(), mu.float(), nu.float(), knobs)
    assert torch.allclose(res.log_u.double(), log_a, rtol=0, atol=2e-3)
    score = (plan * (z @ y.transpose(1, 2))).sum((1, 2)) / plan.sum((1, 2))
    assert torch.isfinite(res.score).all()
    assert torch.allclose(res.score.double(), score, rtol=0, atol=1e-4)


def test_nystrom_kernel_error_is_bounded_by_lambda() -> None:
    # with lambda > 0, K~ - K = -lambda K_ZY (K_YY + lambda I)^-1, so
    # |K~ - K|_2 <= lambda |K_ZY|_2 / lambda_min(K_YY + lambda I)
    z, y, _, _ = _data(2)
    eps = 0.5
    for lam in (1e-2, 1e-4):
        log_zp, log_py = _anchor_log_kernels(z, y, y, eps)
        k_reg = _regularised_anchor_gram(y, eps, lam)
        k_low = log_zp.exp() @ _robust_inverse(k_reg) @ log_py.exp()
        k = torch.exp((z @ y.transpose(1, 2) - 1) / eps)
        err = torch.linalg.matrix_norm(k_low - k, ord=2)
        bound = lam * torch.linalg.matrix_norm(k, ord=2) / torch.linalg.eigvalsh(k_reg)[:, 0]
        assert bool((err <= bound * (1 + 1e-9)).all())
        assert bool((err > 0).all())


@pytest.mark.parametrize("variant", ["faithful", "positive"])
def test_implicit_score_equals_materialised_plan(variant: str) -> None:
    z, y, mu, nu = _data(3, n=11, m=6)
    row_mask = torch.ones(3, 11, dtype=torch.bool)
    row_mask[0, 8:] = False
    col_mask = torch.ones(3, 6, dtype=torch.bool)
    col_mask[2, 4:] = False
    res = lowrank_uot(
        z,
        y,
        _anchors(4, 4),
        mu,
        nu,
        S(eps=0.3, tau_a=0.2, tau_b=0.2, variant=variant),
        row_mask=row_mask,
        col_mask=col_mask,
    )
    plan = res.factors.dense()
    sim = z @ y.transpose(1, 2)
    assert torch.allclose(res.score, (plan * sim).sum((1, 2)) / plan.sum((1, 2)), rtol=1e-10)
    assert torch.allclose(res.mass, plan.sum((1, 2)), rtol=1e-10)
    assert torch.allclose(res.cost, (plan * (1 - sim)).sum((1, 2)), rtol=1e-10)
    assert plan[0, 8:].abs().max() == 0 and plan[2, :, 4:].abs().max() == 0


@pytest.mark.parametrize("variant", ["faithful", "positive"])
def test_factored_products_equal_dense(variant: str, device: torch.device) -> None:
    z, y, mu, nu = _data(5)
    knobs = S(eps=0.3, tau_a=0.2, tau_b=0.2, variant=variant)
    res = moved(lowrank_uot(*moved((z, y, _anchors(6, 4), mu, nu), device), knobs), "cpu")
    plan = res.factors.dense()
    gen = torch.Generator().manual_seed(7)
    v = torch.randn(3, 5, 2, generator=gen, dtype=DT)
    w = torch.randn(3, 9, 2, generator=gen, dtype=DT)
    assert torch.allclose(res.factors.apply(v), plan @ v)
    assert torch.allclose(res.apply(v), plan @ v)
    assert torch.allclose(res.dense(), plan)
    # without the solver's own sums the marginals come through the factors
    bare = replace(res, marginals=None)
    assert torch.allclose(bare.row_marginal, plan.sum(2))
    assert torch.allclose(bare.col_marginal, plan.sum(1))
    assert torch.allclose(bare.row_marginal, res.row_marginal)
    f = res.factors
    scale = f.log_scale.exp()[:, None, None]
    assert torch.allclose(scale * f.left @ f.core @ f.right, plan)
    assert torch.allclose(res.factors.apply_t(w), plan.transpose(1, 2) @ w)


def test_ragged_masks_equal_unpadded_problem() -> None:
    z, y, mu, nu = _data(8, n=7, m=4)
    gen = torch.Generator().manual_seed(9)
    z_pad = torch.cat([z, torch.randn(3, 2, 6, generator=gen, dtype=DT)], 1)
    y_pad = torch.cat([y, torch.randn(3, 3, 6, generator=gen, dtype=DT)], 1)
    mu_pad = torch.cat([mu, torch.rand(3, 2, generator=gen, dtype=DT)], 1)
    nu_pad = torch.cat([nu, torch.rand(3, 3, generator=gen, dtype=DT)], 1)
    row_mask = torch.arange(9)[None].expand(3, -1) < 7
    col_mask = torch.arange(7)[None].expand(3, -1) < 4
    anchors = _anchors(10, 5)
    for variant in ("faithful", "positive"):
        kw = S(eps=0.3, tau_a=0.2, tau_b=0.4, variant=variant)
        padded = lowrank_uot(
            z_pad, y_pad, anchors, mu_pad, nu_pad, kw, row_mask=row_mask, col_mask=col_mask
        )
        plain = lowrank_uot(z, y, anchors, mu, nu, kw)
        assert torch.allclose(padded.factors.dense()[:, :7, :4], plain.factors.dense())
        assert torch.allclose(padded.score, plain.score)
        assert torch.allclose(padded.marginal_error, plain.marginal_error)


def test_per_pair_anchors_equal_shared_anchors() -> None:
    z, y, mu, nu = _data(11)
    anchors = _anchors(12, 4)
    shared = lowrank_uot(z, y, anchors, mu, nu, S(eps=0.3, tau_a=0.2, tau_b=0.2))
    per_pair = lowrank_uot(
        z, y, anchors.expand(3, -1, -1), mu, nu, S(eps=0.3, tau_a=0.2, tau_b=0.2)
    )
    assert torch.allclose(shared.factors.dense(), per_pair.factors.dense())
    assert torch.allclose(shared.score, per_pair.score)


def test_duplicated_anchors_use_pseudo_inverse_and_change_nothing(device: torch.device) -> None:
    # each anchor twice: K_PP is singular for lambda = 0, Cholesky fails, and the
    # least-squares fallback (pseudo-inverse) gives the kernel of the unique anchors.
    z, y, mu, nu = _data(13)
    anchors = _anchors(14, 3)
    twice = torch.cat([anchors, anchors], 0)
    kw = S(eps=0.5, tau_a=0.3, tau_b=0.3, kpp_reg=0.0, clamp=None, floor=0.0)
    _, info = torch.linalg.cholesky_ex(_regularised_anchor_gram(twice, 0.5, 0.0))
    assert info.item() != 0
    z, y, anchors, twice, mu, nu = moved((z, y, anchors, twice, mu, nu), device)
    once = lowrank_uot(z, y, anchors, mu, nu, kw)
    dup = lowrank_uot(z, y, twice, mu, nu, kw)
    assert torch.allclose(dup.factors.dense(), once.factors.dense(), rtol=1e-7)
    # the positive variant's diagonal splits a duplicated anchor's weight exactly as well
    once_p = lowrank_uot(z, y, anchors, mu, nu, replace(kw, variant="positive"))
    dup_p = lowrank_uot(z, y, twice, mu, nu, replace(kw, variant="positive"))
    assert torch.allclose(dup_p.factors.dense(), once_p.factors.dense(), rtol=1e-10)


def test_positive_variant_exact_for_orthogonal_anchors() -> None:
    # orthonormal anchors at small eps: K_PP ~ I (off-diagonal e^-20), so both variants give
    # the same kernel (the faithful one without Alg. 1's 1e-8 floor, which is not small
    # next to kernel entries of e^-20)
    z, y, mu, nu = _data(15, d=8)
    anchors = torch.eye(8, dtype=DT)[:5]
    kw = S(eps=0.05, tau_a=0.2, tau_b=0.2, kpp_reg=1e-2)
    faithful = lowrank_uot(z, y, anchors, mu, nu, replace(kw, clamp=None, floor=0.0))
    positive = lowrank_uot(z, y, anchors, mu, nu, replace(kw, variant="positive"))
    pf, pp = faithful.factors.dense(), positive.factors.dense()
    assert (pf - pp).abs().max() <= 1e-5 * pf.abs().max()
    assert torch.allclose(faithful.score, positive.score, rtol=1e-5)


def test_faithful_kernel_can_go_negative_positive_cannot() -> None:
    # clustered anchors in a low-dimensional space at the paper's lambda = 1e-2: the
    # Nystrom kernel K_ZP K_PP,lambda^-1 K_PY extrapolates below zero; K+ cannot.
    gen = torch.Generator().manual_seed(0)
    pole = torch.tensor([[0.0, 0.0, 1.0]], dtype=DT)
    anchors = F.normalize(pole + 0.3 * torch.randn(4, 3, generator=gen, dtype=DT), dim=-1)
    z = F.normalize(torch.randn(2, 20, 3, generator=gen, dtype=DT), dim=-1)
    y = F.normalize(torch.randn(2, 20, 3, generator=gen, dtype=DT), dim=-1)
    mu = torch.full((2, 20), 1 / 20, dtype=DT)
    log_zp, log_py = _anchor_log_kernels(z, y, anchors, 0.3)
    k_inv = _robust_inverse(_regularised_anchor_gram(anchors, 0.3, 1e-2))
    assert (log_zp.exp() @ k_inv @ log_py.exp()).min() < 0
    positive = lowrank_uot(
        z, y, anchors, mu, mu, S(eps=0.3, tau_a=0.2, tau_b=0.2, variant="positive")
    )
    assert positive.factors.dense().min() >= 0
    assert bool((positive.score.abs() <= 1).all())


def test_default_stabilisation_stays_finite_on_extreme_inputs() -> None:
    # eps tiny and nearly collinear anchors: App. H's safeguards keep everything finite
    z, y, mu, nu = _data(19)
    base = _anchors(20, 1)
    gen = torch.Generator().manual_seed(21)
    anchors = F.normalize(base + 1e-4 * torch.randn(6, 6, generator=gen, dtype=DT), dim=-1)
    for variant in ("faithful", "positive"):
        res = lowrank_uot(
            z.float(),
            y.float(),
            anchors.float(),
            mu.float(),
            nu.float(),
            S(eps=0.01, tau_a=0.2, tau_b=0.2, variant=variant),
        )
        assert torch.isfinite(res.score).all() and torch.isfinite(res.factors.dense()).all()
        assert torch.isfinite(res.marginal_error).all()


def test_unknown_variant_raises() -> None:
    z, y, mu, nu = _data(22)
    with pytest.raises(ValueError, match="variant"):
        lowrank_uot(z, y, _anchors(23, 3), mu, nu, S(eps=0.1, tau_a=0.2, tau_b=0.2, variant="nope"))


@pytest.mark.parametrize("variant", ["faithful", "positive"])
def test_gradcheck(variant: str) -> None:
    gen = torch.Generator().manual_seed(24)
    z = torch.randn(2, 4, 3, generator=gen, dtype=DT, requires_grad=True)
    y = torch.randn(2, 3, 3, generator=gen, dtype=DT, requires_grad=True)
    p = torch.randn(3, 3, generator=gen, dtype=DT, requires_grad=True)
    mu = torch.rand(2, 4, generator=gen, dtype=DT) + 0.2
    nu = torch.rand(2, 3, generator=gen, dtype=DT) + 0.2
    row_mask = torch.tensor([[True, True, True, False], [True] * 4])

    def fn(zz, yy, pp):
        res = lowrank_uot(
            F.normalize(zz, dim=-1),
            F.normalize(yy, dim=-1),
            F.normalize(pp, dim=-1),
            mu,
            nu,
            S(eps=0.5, tau_a=0.3, tau_b=0.4, n_iters=5, variant=variant),
            row_mask=row_mask,
        )
        return res.score, res.factors.dense(), res.marginal_error

    assert torch.autograd.gradcheck(fn, (z, y, p))


@pytest.mark.parametrize("variant", ["faithful", "positive"])
def test_inference_mode_equals_autograd_mode(variant: str) -> None:
    # without autograd the kernels are built in the product's memory: same numbers
    z, y, mu, nu = _data(25)
    z_scale = torch.rand(3, 9, dtype=DT) + 0.5
    kw = S(eps=0.3, tau_a=0.2, tau_b=0.2, variant=variant)
    with_grad = lowrank_uot(z, y, _anchors(26, 4), mu, nu, kw, z_scale=z_scale)
    with torch.no_grad():
        no_grad = lowrank_uot(z, y, _anchors(26, 4), mu, nu, kw, z_scale=z_scale)
    assert torch.allclose(with_grad.factors.dense(), no_grad.factors.dense(), rtol=1e-14)
    assert torch.allclose(with_grad.score, no_grad.score, rtol=1e-14)


def test_unnormalised_patches_with_scale_equal_normalised() -> None:
    z, y, mu, nu = _data(27)
    norms = torch.rand(3, 9, 1, dtype=DT) + 0.5
    anchors = _anchors(28, 4)
    unit = lowrank_uot(z, y, anchors, mu, nu, S(eps=0.3, tau_a=0.2, tau_b=0.2))
    raw = lowrank_uot(
        z * norms, y, anchors, mu, nu, S(eps=0.3, tau_a=0.2, tau_b=0.2), z_scale=1 / norms[..., 0]
    )
    assert torch.allclose(unit.factors.dense(), raw.factors.dense())
    assert torch.allclose(unit.score, raw.score)


def test_tiny_mass_is_judged_relative_to_the_mass() -> None:
    """Anchors on the tokens make the Nystrom kernel the dense one, so the plan is POT's
    unbalanced plan (reg_m = (tau_a, tau_b), entropy). At masses of 1e-6 the relative test
    iterates to it; the former absolute one stopped after one iteration."""
    import warnings

    import numpy as np
    import ot as pot

    z, y, mu, nu = _data(40, b=1)
    mu, nu = mu * 1e-6, nu * 1e-6
    res = lowrank.lowrank_uot(
        z,
        y,
        y[0],
        mu,
        nu,
        LowRankSettings(eps=0.1, tau_a=0.3, tau_b=0.5, kpp_reg=1e-12, clamp=None, floor=0.0),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pot.unbalanced.sinkhorn_unbalanced(
            mu[0].numpy(),
            nu[0].numpy(),
            (1 - z[0] @ y[0].T).numpy(),
            0.1,
            (0.3, 0.5),
            reg_type="entropy",
            numItermax=100_000,
            stopThr=1e-15,
        )
    assert bool(res.converged[0]) and res.n_iters > 5
    plan = res.factors.dense()[0].numpy()
    assert np.abs(plan - ref).max() <= 1e-3 * ref.max()


def test_inverse_without_host_reads_equals_cholesky_and_pseudo_inverse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one regular K_PP,lambda and one singular (duplicated anchors, lambda = 0): the
    # accelerator's path (triangular solves, Newton-Schulz) gives the host path's inverses
    anchors = _anchors(31, 3)
    regular = _regularised_anchor_gram(anchors[None], 0.5, 1e-2)
    singular = _regularised_anchor_gram(torch.cat([anchors, anchors])[None], 0.5, 0.0)
    k_reg = torch.cat([torch.block_diag(regular[0], torch.eye(3, dtype=DT))[None], singular])
    host = _robust_inverse(k_reg)
    assert torch.allclose(host[1], torch.linalg.pinv(singular[0], hermitian=True))
    monkeypatch.setattr(lowrank_sync, "HOST_DEVICES", ())
    device_path = _robust_inverse(k_reg)
    assert torch.allclose(device_path, host, rtol=1e-9, atol=1e-9)
