"""Faithful readouts and solver contracts (issue 13): QC-Align's relative heatmap against
its formula, signed (negative) plan mass reported and never drawn as mass, the Gromov term's
scale against a hand computation and POT, input validation and non-convergence warnings."""


import numpy as np
import ot
import pytest
import torch
import torch.nn.functional as F

from otviz.methods import MethodConfig, build_method
from otviz.methods.base import PairBatch
from otviz.ot import LowRankSettings
from otviz.ot.fgw import _linearised_cost, fgw_isoftmax, structure_matrix
from otviz.ot.lowrank import lowrank_uot
from otviz.patch_grid.boxes import heatmap_boxes
from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.mass import displayable_mass, negative_mass, negative_mass_note
from otviz.viz.tables import ScoreRow, score_frame

DT = torch.float64


def _batch(seed: int, n: int = 6, m: int = 4, d: int = 5) -> PairBatch:
    gen = torch.Generator().manual_seed(seed)
    token_mask = torch.ones(1, m, dtype=torch.bool)
    token_mask[0, -1] = False
    return PairBatch(
        patches=torch.randn(1, n, d, generator=gen),
        tokens=torch.randn(1, m, d, generator=gen),
        patch_mask=torch.ones(1, n, dtype=torch.bool),
        token_mask=token_mask,
        image_global=torch.randn(1, d, generator=gen),
        text_global=torch.randn(1, d, generator=gen),
        grid=(2, 3),
    )


def test_qc_align_heatmap_is_plan_over_marginals():
    batch = _batch(0)
    method = build_method("qc_align", 5, 5, MethodConfig(trainable=False, eps=0.5)).eval()
    out = method(batch)
    plan = out.plan.dense()[0].double().numpy()
    mu, nu = out.row_reference[0].double().numpy(), out.col_reference[0].double().numpy()
    select = torch.tensor([True, False, True, True])  # the padded token must not count
    expected = np.zeros(6)
    for i in range(6):
        for j in (0, 2):  # token 3 is masked
            expected[i] += plan[i, j] / (mu[i] * nu[j])
    assert np.allclose(out.heatmap(select)[0].double().numpy(), expected, rtol=1e-5)
    # the plan columns alone (the previous readout) are a different map
    assert not np.allclose(plan[:, [0, 2]].sum(1), expected)
    ratio = float(out.extras["quota_max_over_uniform"][0])
    assert ratio == pytest.approx(float(mu.max()) * 6, rel=1e-6)


def test_came_temperature_sharpens_quotas():
    batch = _batch(1)
    ratios = []
    for temp in (1.0, 0.05):
        cfg = MethodConfig(trainable=False, eps=0.5, extra={"came_temperature": temp})
        out = build_method("qc_align", 5, 5, cfg).eval()(batch)
        ratios.append(float(out.extras["quota_max_over_uniform"][0]))
    assert ratios[1] > ratios[0] >= 1.0


def test_faithful_conceptot_negative_mass_is_reported_not_drawn():
    # near-duplicate anchors make K_PP ill-conditioned: the faithful Nystrom plan goes negative
    gen = torch.Generator().manual_seed(3)
    z = F.normalize(torch.randn(1, 12, 4, generator=gen, dtype=DT), dim=-1)
    y = F.normalize(torch.randn(1, 5, 4, generator=gen, dtype=DT), dim=-1)
    base = F.normalize(torch.randn(3, 4, generator=gen, dtype=DT), dim=-1)
    anchors = F.normalize(torch.cat([base, base + 1e-3 * torch.randn(3, 4, generator=gen,
                                                                     dtype=DT)]), dim=-1)
    mu, nu = torch.full((1, 12), 1 / 12, dtype=DT), torch.full((1, 5), 0.2, dtype=DT)
    knobs = LowRankSettings(eps=0.05, tau_a=0.2, tau_b=0.2, n_iters=5, tol=None)
    res = lowrank_uot(z, y, anchors, mu, nu, knobs)
    plan = res.factors.dense()[0].numpy()
    neg = negative_mass(plan)
    assert neg > 0
    # the marginal error is computed from the plan: not zero for a signed plan
    assert float(res.marginal_error[0]) > 0
    shown, hidden = displayable_mass(plan)
    assert shown.min() >= 0 and hidden == pytest.approx(neg)
    assert "negative mass" in negative_mass_note(hidden)
    row = ScoreRow.make("conceptot", "ConceptOT", 0.1, 0.2, 0.5, 1e-3, 1.0, "x", neg)
    assert score_frame([row])["negative mass"][0] == f"{neg:.2e}"
    # an all-negative heatmap still gives a valid box (the whole grid), never x1 < x0
    box = heatmap_boxes(torch.tensor([[-3.0, -1.0, -2.0, -5.0, -1.0, -4.0]]),
                        TokenGeometry.cell_centred((2, 3), (3, 2)))[0]
    assert box.tolist() == [0, 0, 3, 2]


def test_gromov_term_scale_matches_hand_computation():
    """Eq. 12 on a 2-image, 2-class case by hand: C - alpha0 D1 P D2^T with the raw plan
    (rows sum to 1, mass n = 2); the unit-mass variant divides the term by 2."""
    cost = torch.tensor([[[0.2, 0.6], [0.5, 0.1]]], dtype=DT)
    plan = torch.tensor([[[0.7, 0.3], [0.4, 0.6]]], dtype=DT)
    d1 = torch.tensor([[[1.0, 0.5], [0.5, 1.0]]], dtype=DT)
    d2 = torch.tensor([[[1.0, 0.2], [0.2, 1.0]]], dtype=DT)
    alpha0 = 0.01
    # D1 P = [[0.9, 0.6], [0.75, 0.75]]; (D1 P) D2^T = [[1.02, 0.78], [0.9, 0.9]]
    term = torch.tensor([[[1.02, 0.78], [0.9, 0.9]]], dtype=DT)
    assert torch.allclose(_linearised_cost(cost, d1, d2, plan, alpha0), cost - alpha0 * term)
    unit = _linearised_cost(cost, d1, d2, plan, alpha0, "unit_mass")
    assert torch.allclose(unit, cost - alpha0 * term / 2)
    # the paper's scaling is n times the unit-mass one: FGW-ISoftmax with alpha0 matches the
    # unit-mass rule with n * alpha0
    x = torch.randn(1, 9, 4, dtype=DT, generator=torch.Generator().manual_seed(5))
    k = torch.randn(1, 3, 4, dtype=DT, generator=torch.Generator().manual_seed(6))
    c = 1 - F.normalize(x, dim=-1) @ F.normalize(k, dim=-1).transpose(1, 2)
    s1, s2 = structure_matrix(x), structure_matrix(k)
    paper = fgw_isoftmax(c, None, 0.1, s1, s2, 0.01, 3)
    unit = fgw_isoftmax(c, None, 0.1, s1, s2, 0.09, 3, "unit_mass")
    assert torch.allclose(paper.plan, unit.plan)


def test_fused_gromov_part_matches_pot_gradient():
    """POT's square-loss GW gradient: gwggrad = 2 (constC - C1 T (2 C2)^T), whose part that
    is not constant on U(a, b) is -4 C1 T C2^T, i.e. our structural shift with D = C and
    alpha0 = 4 (the FGW-to-POT mapping of otviz.ot.fgw)."""
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(5, 3, generator=gen, dtype=DT), torch.randn(4, 3, generator=gen, dtype=DT)
    c1, c2 = structure_matrix(x[None])[0].numpy(), structure_matrix(y[None])[0].numpy()
    p, q = np.full(5, 0.2), np.full(4, 0.25)
    t = np.outer(p, q) + 0.01 * np.array([[1, -1, 0, 0]] * 5)
    const, h1, h2 = ot.gromov.init_matrix(c1, c2, p, q, "square_loss")
    grad = ot.gromov.gwggrad(const, h1, h2, t)
    ours = -_linearised_cost(torch.zeros(1, 5, 4, dtype=DT), torch.from_numpy(c1)[None],
                            torch.from_numpy(c2)[None], torch.from_numpy(t)[None], 4.0)[0]
    assert np.allclose(grad - 2 * const, -ours.numpy(), atol=1e-12)
