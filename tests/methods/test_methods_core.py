"""The seven ConceptOT-paper methods: scores against brute-force formulas, plans against
their solvers, heatmaps, ragged batches, the training-free configuration, autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.methods.conceptot import anchor_diversity
from otviz.ot import LowRankSettings
from otviz.ot.lowrank import lowrank_uot
from otviz.ot.unbalanced import sinkhorn_unbalanced_log
from tests.helpers import moved

CORE = [
    "global_only",
    "global_patch",
    "filip",
    "text_attn",
    "balanced_ot",
    "dense_uot",
    "conceptot",
]
DT = torch.float64


def _batch(seed: int, b: int = 3, n: int = 12, m: int = 5, dv: int = 8, dt: int = 8) -> PairBatch:
    gen = torch.Generator().manual_seed(seed)
    patch_mask = torch.ones(b, n, dtype=torch.bool)
    patch_mask[0, n - 3 :] = False
    token_mask = torch.ones(b, m, dtype=torch.bool)
    token_mask[1, m - 2 :] = False
    return PairBatch(
        patches=torch.randn(b, n, dv, generator=gen, dtype=DT),
        tokens=torch.randn(b, m, dt, generator=gen, dtype=DT),
        patch_mask=patch_mask,
        token_mask=token_mask,
        image_global=torch.randn(b, 4, generator=gen, dtype=DT),
        text_global=torch.randn(b, 4, generator=gen, dtype=DT),
        grid=(3, 4),
    )


def _method(name: str, batch: PairBatch, trainable: bool = True, **cfg):
    torch.manual_seed(0)
    config = MethodConfig(**{"concept_dim": 6, "rank": 4, "trainable": trainable, **cfg})
    method = build_method(name, batch.patches.shape[-1], batch.tokens.shape[-1], config).double()
    if not trainable:
        method.fit_training_free(batch)
    return method


def test_all_core_methods_registered() -> None:
    assert set(CORE) <= set(METHODS)


@pytest.mark.parametrize("name", CORE)
def test_heatmap_is_plan_columns_summed(name: str, device: torch.device) -> None:
    batch = _batch(1)
    out = moved(_method(name, batch).to(device)(moved(batch, device)), "cpu")
    plan = out.plan.dense()
    select = torch.tensor([False, True, True, False, True])
    expected = (plan * (select & batch.token_mask)[:, None, :]).sum(2)
    assert torch.allclose(out.heatmap(select), expected)
    assert torch.allclose(out.row_marginal, plan.sum(2))
    assert torch.allclose(out.col_marginal, plan.sum(1))
    # masked patches and tokens carry nothing
    assert plan[0, 9:].abs().max() == 0 and plan[1, :, 3:].abs().max() == 0


@pytest.mark.parametrize("name", CORE)
def test_padding_does_not_change_scores(name: str, device: torch.device) -> None:
    batch = _batch(2)
    gen = torch.Generator().manual_seed(3)
    padded = PairBatch(
        patches=torch.cat([batch.patches, torch.randn(3, 4, 8, generator=gen, dtype=DT)], 1),
        tokens=torch.cat([batch.tokens, torch.randn(3, 2, 8, generator=gen, dtype=DT)], 1),
        patch_mask=torch.cat([batch.patch_mask, torch.zeros(3, 4, dtype=torch.bool)], 1),
        token_mask=torch.cat([batch.token_mask, torch.zeros(3, 2, dtype=torch.bool)], 1),
        image_global=batch.image_global,
        text_global=batch.text_global,
        grid=(4, 4),
    )
    method = _method(name, batch).to(device)
    a, b = (moved(method(moved(x, device)), "cpu") for x in (batch, padded))
    assert torch.allclose(a.local_score, b.local_score)
    assert torch.allclose(a.plan.dense(), b.plan.dense()[:, :12, :5])


def test_global_only() -> None:
    batch = _batch(4)
    out = _method("global_only", batch)(batch)
    assert torch.equal(out.local_score, torch.zeros(3, dtype=DT))
    cos = F.cosine_similarity(batch.image_global, batch.text_global, dim=-1)
    assert torch.allclose(out.global_score, cos)
    assert torch.allclose(out.plan.dense().sum((1, 2)), torch.ones(3, dtype=DT))


def _brute(batch: PairBatch, method, fn) -> torch.Tensor:
    """Score each pair with ``fn(z, y)`` on its valid rows only, by a loop."""
    z_all, y_all = method.project(batch)
    out = []
    for k in range(batch.size):
        out.append(fn(z_all[k][batch.patch_mask[k]], y_all[k][batch.token_mask[k]]))
    return torch.stack(out)


def test_global_patch_is_mean_cosine() -> None:
    batch = _batch(5)
    method = _method("global_patch", batch)
    expected = _brute(batch, method, lambda z, y: (z @ y.T).mean())
    assert torch.allclose(method(batch).local_score, expected)


def test_filip_is_mean_of_token_maxima() -> None:
    batch = _batch(6)
    method = _method("filip", batch)
    out = method(batch)
    expected = _brute(batch, method, lambda z, y: (z @ y.T).max(0).values.mean())
    assert torch.allclose(out.local_score, expected)
    # Eq. 8 on the one-hot plan returns the score
    z, y = method.project(batch)
    plan = out.plan.dense()
    ratio = (plan * (z @ y.transpose(1, 2))).sum((1, 2)) / plan.sum((1, 2))
    assert torch.allclose(ratio, expected)
    assert bool((plan > 0).sum(1).le(1).all())  # one patch per token


def test_text_attn_brute_force() -> None:
    batch = _batch(7)
    method = _method("text_attn", batch)
    temp = method.log_temperature.exp()

    def score(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        attn = torch.softmax(z @ y.T / temp, dim=0)
        return F.cosine_similarity(attn.T @ z, y, dim=-1).mean()

    assert torch.allclose(method(batch).local_score, _brute(batch, method, score))


def test_balanced_ot_meets_uniform_marginals_at_convergence() -> None:
    batch = _batch(8)
    out = _method("balanced_ot", batch, n_iters=2000)(batch)
    assert bool((out.marginal_error < 1e-8).all())
    assert torch.allclose(out.row_marginal, out.row_reference, atol=1e-8)
    assert torch.allclose(out.col_marginal, out.col_reference, atol=1e-8)
    n_valid = batch.patch_mask.sum(1, keepdim=True).to(DT)
    assert torch.allclose(out.row_reference, batch.patch_mask / n_valid)


def test_dense_uot_masses_and_solver(device: torch.device) -> None:
    batch = _batch(9)
    method = _method("dense_uot", batch)
    with torch.no_grad():  # move the mass heads off their uniform start
        method.masses.head_v.linear.weight.normal_()
        method.masses.head_t.linear.bias.fill_(0.3)
        method.masses.head_t.linear.weight.normal_()
    out = moved(method.to(device)(moved(batch, device)), "cpu")
    method.cpu()  # the references on the CPU
    # Eq. 1-2 by hand
    head_v = method.masses.head_v.linear
    logit = F.softplus(batch.patches @ head_v.weight[0] + head_v.bias) * batch.patch_mask
    assert torch.allclose(out.row_reference, logit / logit.sum(1, keepdim=True))
    z, y = method.project(batch)
    cfg = method.config
    ref = sinkhorn_unbalanced_log(
        1 - z @ y.transpose(1, 2),
        out.row_reference,
        out.col_reference,
        cfg.eps,
        cfg.tau_v,
        cfg.tau_t,
        cfg.n_iters,
        tol=None,  # the method's fixed iteration count
        row_mask=batch.patch_mask,
        col_mask=batch.token_mask,
    )
    assert torch.allclose(out.plan.dense(), ref.plan)
    sim = z @ y.transpose(1, 2)
    assert torch.allclose(out.local_score, (ref.plan * sim).sum((1, 2)) / ref.plan.sum((1, 2)))


def test_mass_heads_start_uniform() -> None:
    batch = _batch(10)
    out = _method("dense_uot", batch)(batch)
    n_valid = batch.patch_mask.sum(1, keepdim=True).to(DT)
    assert torch.allclose(out.row_reference, batch.patch_mask / n_valid)


@pytest.mark.parametrize("variant", ["faithful", "positive"])
def test_conceptot_uses_the_low_rank_solver(variant: str) -> None:
    batch = _batch(11)
    method = _method("conceptot", batch, lowrank_variant=variant)
    out = method(batch)
    z, y = method.project(batch)
    cfg = method.config
    anchors = F.normalize(method.anchors, dim=-1)
    ref = lowrank_uot(
        z,
        y,
        anchors,
        out.row_reference,
        out.col_reference,
        LowRankSettings(eps=cfg.eps, tau_a=cfg.tau_v, tau_b=cfg.tau_t, n_iters=cfg.n_iters,
                        kpp_reg=cfg.kpp_reg, variant=variant, tol=None),  # the fixed count
        row_mask=batch.patch_mask,
        col_mask=batch.token_mask,
    )
    expected = torch.tanh(ref.score) if variant == "faithful" else ref.score
    assert torch.allclose(out.local_score, expected)
    assert torch.allclose(out.plan.dense(), ref.factors.dense())
    # the anchor views: each patch's / token's best anchor has affinity 1
    cos_zp = z @ anchors.T
    affinity = torch.exp((cos_zp - cos_zp.amax(2, keepdim=True)) / cfg.eps)
    valid = batch.patch_mask
    assert torch.allclose(out.extras["patch_anchor_affinity"][valid], affinity[valid])
    assert torch.allclose(out.extras["patch_anchor_cosine"][valid], cos_zp[valid])
    assert out.extras["token_anchor_affinity"].shape == (3, 5, 4)


def test_anchor_diversity_formula() -> None:
    batch = _batch(12)
    method = _method("conceptot", batch)
    p = F.normalize(method.anchors, dim=-1)
    r = p.shape[0]
    brute = sum((p[k] @ p[m]) ** 2 for k in range(r) for m in range(r) if k != m) / (r * (r - 1))
    assert torch.allclose(method.regulariser(), brute)
    assert anchor_diversity(torch.eye(4, dtype=DT)) == 0
    assert torch.allclose(
        anchor_diversity(torch.ones(3, 2, dtype=DT) / 2**0.5), torch.tensor(1.0, dtype=DT)
    )


def test_training_free_anchors_from_kmeans() -> None:
    # tokens drawn around 3 directions: k-means with r = 3 recovers them, deterministically
    gen = torch.Generator().manual_seed(13)
    centres = F.normalize(torch.randn(3, 8, generator=gen, dtype=DT), dim=-1)
    tokens = centres[torch.arange(12) % 3] + 0.01 * torch.randn(12, 8, generator=gen, dtype=DT)
    batch = _batch(14, m=4)
    batch.tokens = tokens.reshape(3, 4, 8)
    batch.token_mask = torch.ones(3, 4, dtype=torch.bool)
    m1 = _method("conceptot", batch, trainable=False, rank=3)
    m2 = _method("conceptot", batch, trainable=False, rank=3)
    assert torch.equal(m1.anchors, m2.anchors)
    match = (F.normalize(m1.anchors, dim=-1) @ centres.T).max(0).values
    assert bool((match > 0.999).all())
    # more anchors than distinct tokens: the rest are seeded random unit vectors
    m3 = _method("conceptot", batch, trainable=False, rank=5)
    assert torch.allclose(m3.anchors.norm(dim=-1), torch.ones(5, dtype=DT))


def test_training_free_needs_one_feature_space() -> None:
    batch = _batch(15, dt=7)
    with pytest.raises(ValueError, match="one space"):
        _method("filip", batch, trainable=False)


@pytest.mark.parametrize("name", [n for n in CORE if n != "global_only"])
def test_caption_made_of_patches_beats_random_caption(name: str, device: torch.device) -> None:
    # training-free (identity projections): a caption whose tokens are some of the image's
    # patches must score higher than a random caption, pair by pair
    gen = torch.Generator().manual_seed(16)
    b, n, m, d = 4, 16, 4, 16
    patches = torch.randn(b, n, d, generator=gen, dtype=DT)
    pick = torch.stack([torch.randperm(n, generator=gen)[:m] for _ in range(b)])
    matched = torch.gather(patches, 1, pick[:, :, None].expand(-1, -1, d))
    random_tokens = torch.randn(b, m, d, generator=gen, dtype=DT)
    ones = dict(
        patch_mask=torch.ones(b, n, dtype=torch.bool),
        token_mask=torch.ones(b, m, dtype=torch.bool),
        image_global=torch.randn(b, d, generator=gen, dtype=DT),
        text_global=torch.randn(b, d, generator=gen, dtype=DT),
        grid=(4, 4),
    )
    good = PairBatch(patches=patches, tokens=matched, **ones)
    bad = PairBatch(patches=patches, tokens=random_tokens, **ones)
    method = _method(name, good, trainable=False).to(device)
    good, bad = moved((good, bad), device)
    assert bool((method(good).local_score > method(bad).local_score).all())


@pytest.mark.parametrize("name", [n for n in CORE if n != "global_only"])
def test_gradients_reach_every_parameter(name: str, device: torch.device) -> None:
    batch = _batch(17)
    method = _method(name, batch).to(device)
    out = method(moved(batch, device))
    (out.local_score.sum() + method.regulariser()).backward()
    for pname, p in method.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        # at their uniform start (w = 0) the normalised masses do not depend on the bias
        if not pname.endswith("linear.bias"):
            assert p.grad.abs().sum() > 0, pname
