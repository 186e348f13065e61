"""QC-Align and PowerCLIP behind the shared method contract."""

import pytest
import torch
import torch.nn.functional as F

from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.methods.masses import uniform_masses
from otviz.methods.powerclip import phrase_embeddings, region_embeddings, triplet_loss
from otviz.ot.came import came_marginals
from otviz.ot.divergence import sinkhorn_divergence
from otviz.ot.powerset import exact_r2t, exact_t2r, nla_t1, nla_t2
from otviz.patch_grid.masks import grid_cells, random_boxes
from tests.helpers import moved

DT = torch.float64


def _batch(seed: int, b: int = 3, grid=(3, 4), m: int = 6, d: int = 8, structure=False):
    gen = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    patch_mask = torch.ones(b, n, dtype=torch.bool)
    patch_mask[0, -2:] = False
    token_mask = torch.ones(b, m, dtype=torch.bool)
    token_mask[1, 4:] = False
    batch = PairBatch(
        patches=torch.randn(b, n, d, generator=gen, dtype=DT),
        tokens=torch.randn(b, m, d, generator=gen, dtype=DT),
        patch_mask=patch_mask,
        token_mask=token_mask,
        image_global=torch.randn(b, d, generator=gen, dtype=DT),
        text_global=torch.randn(b, d, generator=gen, dtype=DT),
        grid=grid,
    )
    if structure:
        batch.regions = random_boxes(grid, 5, seed=seed, batch_size=b)
        words = torch.eye(m, dtype=torch.bool)[None].expand(b, -1, -1)
        spans = torch.zeros(b, 2, m, dtype=torch.bool)
        spans[:, 0, :3] = True
        spans[:, 1, 2:] = True
        batch.nodes = torch.cat([words, spans], 1) & token_mask[:, None, :]
        batch.node_mask = batch.nodes.any(-1)
    return batch


def _method(name: str, **extra) -> torch.nn.Module:
    cfg = MethodConfig(trainable=False, eps=0.5, n_iters=200, extra=extra)
    return build_method(name, 8, 8, cfg).double()


def test_registered():
    assert METHODS["qc_align"].paper == "QC-Align"
    assert "powerclip" in METHODS


def test_qc_align_plan_meets_came_quotas(device: torch.device):
    batch = _batch(0)
    out = moved(_method("qc_align").to(device)(moved(batch, device)), "cpu")
    came = came_marginals(
        F.normalize(batch.patches, dim=-1), F.normalize(batch.tokens, dim=-1),
        batch.patch_mask, batch.token_mask,
    )
    plan = out.plan.dense()
    assert torch.allclose(out.row_reference, came.mu) and torch.allclose(out.col_reference, came.nu)
    assert torch.allclose(plan.sum(2), came.mu, atol=1e-8)
    assert torch.allclose(plan.sum(1), came.nu, atol=1e-8)
    assert bool((out.marginal_error < 1e-8).all())
    assert float(plan[0, -2:].abs().sum() + plan[1, :, 4:].abs().sum()) == 0.0
    sim = F.normalize(batch.patches, dim=-1) @ F.normalize(batch.tokens, dim=-1).transpose(1, 2)
    assert torch.allclose(out.local_score, (plan * sim).sum((1, 2)))
    sel = torch.zeros(6, dtype=torch.bool)
    sel[1:3] = True
    # the heatmap reads the plan relative to its quotas: sum_j Pi_ij / (mu_i nu_j)
    outer = came.mu[:, :, None] * came.nu[:, None, :]
    ratio = torch.where(outer > 0, plan / outer.clamp_min(1e-300), 0.0)
    assert torch.allclose(out.heatmap(sel), ratio[:, :, 1:3].sum(2))
    assert out.extras["came_attention_t2v"].shape == (3, 6, 12)


def test_qct_loss_is_sinkhorn_divergence_with_uniform_self_terms():
    batch = _batch(1)
    method = _method("qc_align")
    z = F.normalize(batch.patches, dim=-1)
    y = F.normalize(batch.tokens, dim=-1)
    came = came_marginals(z, y, batch.patch_mask, batch.token_mask)
    ref = sinkhorn_divergence(
        z, y, came.mu, came.nu, 0.5, 200, batch.patch_mask, batch.token_mask,
        uniform_masses(batch.patch_mask, DT), uniform_masses(batch.token_mask, DT),
        tol=None,  # the model's fixed iteration count
    )
    assert float(method.qct_loss(batch)) == pytest.approx(float(ref.value.mean()), abs=1e-12)


def test_qct_loss_gradcheck_through_projections():
    batch = _batch(2, b=2, grid=(2, 2), m=3, d=4)
    cfg = MethodConfig(trainable=True, concept_dim=3, eps=0.5, n_iters=5)
    method = build_method("qc_align", 4, 4, cfg).double()

    def fn(patches: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return method.qct_loss(
            PairBatch(patches, tokens, batch.patch_mask, batch.token_mask,
                      batch.image_global, batch.text_global, batch.grid)
        )

    p = batch.patches.clone().requires_grad_(True)
    t = batch.tokens.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(fn, (p, t))
    fn(p, t).backward()
    assert method.proj_v.linear.weight.grad is not None


@pytest.mark.parametrize("exact", [False, True])
def test_powerclip_score_with_given_structure(exact):
    batch = _batch(3, structure=True)
    tau, alpha = 0.01, 0.75
    out = _method("powerclip", tau=tau, alpha=alpha, exact=exact).align(batch)
    z = F.normalize(batch.patches, dim=-1)
    y = F.normalize(batch.tokens, dim=-1)
    emb, rmask = region_embeddings(z, batch.regions & batch.patch_mask[:, None, :])
    phr = phrase_embeddings(y, batch.nodes, batch.node_mask, batch.token_mask)
    q = emb @ phr.transpose(1, 2)
    if exact:
        ref = exact_r2t(q, rmask, batch.node_mask) + exact_t2r(q, rmask, batch.node_mask)[0]
    else:
        ref = nla_t1(q, tau, rmask, batch.node_mask) + nla_t2(q, tau, alpha, rmask,
                                                              batch.node_mask)
    assert torch.allclose(out.extras["raw_local_score"], ref)
    # local_score = S / S_max, S_max = R (mean_B ||p_B|| + max_B ||p_B||)
    norms = [phr[b, batch.node_mask[b]].norm(dim=-1) for b in range(3)]
    bound = torch.stack([rmask[b].sum() * (n.mean() + n.max()) for b, n in enumerate(norms)])
    assert torch.allclose(out.local_score, ref / bound)
    assert out.local_score.abs().max() <= 1.0
    assert torch.allclose(out.extras["region_node_scores"], q)


def test_powerclip_defaults_grid_cells_and_token_nodes():
    batch = _batch(5)
    out = _method("powerclip", n_regions=6).align(batch)
    regions = out.extras["regions"]
    assert regions.shape == (3, 6, 12)
    assert torch.equal(regions[1], grid_cells((3, 4), 2, 3))
    assert torch.equal(out.extras["node_mask"], batch.token_mask)
    assert torch.equal(out.extras["nodes"][0], torch.eye(6, dtype=torch.bool))


def test_powerclip_exact_guard():
    batch = _batch(6)
    batch.regions = random_boxes(batch.grid, 13, seed=0, batch_size=3)
    with pytest.raises(ValueError, match="at most 12"):
        _method("powerclip", exact=True).align(batch)


def test_powerclip_plan_grounds_a_word_on_its_region():
    """Token 0 points like the patches of grid cell 2 and away from the other cells: its best
    region subset is {cell 2} (the regions scoring positively) and its heatmap lies there."""
    gen = torch.Generator().manual_seed(7)
    grid, d = (4, 4), 8
    cells = grid_cells(grid, 2, 2)
    base = torch.eye(4, d, dtype=DT)
    patches = base[cells.to(torch.long).argmax(0)] + 0.05 * torch.randn(16, d, generator=gen,
                                                                         dtype=DT)
    tokens = torch.stack([base[2] - 0.3 * (base[0] + base[1] + base[3]), -base[0], -base[1]])
    batch = PairBatch(
        patches[None], tokens[None], torch.ones(1, 16, dtype=torch.bool),
        torch.ones(1, 3, dtype=torch.bool), patches.mean(0)[None], tokens.mean(0)[None], grid,
        regions=cells[None],
    )
    for exact in (False, True):
        out = _method("powerclip", exact=exact).align(batch)
        heat = out.heatmap(torch.tensor([True, False, False]))[0]
        assert float(heat[~cells[2]].sum()) < 1e-6 * float(heat.sum())
        assert torch.allclose(heat[cells[2]], heat[cells[2]].mean().expand(4))
        member = out.extras["node_best_regions"][0, 0]
        assert int(member.argmax()) == 2 and float(member[2]) > 0.99
        plan = out.plan.dense()
        assert float(plan.sum()) <= 1.0 + 1e-12
        assert torch.allclose(out.row_marginal, plan.sum(2))
        assert torch.allclose(out.col_marginal, plan.sum(1))


def test_powerclip_masks_keep_plan_on_valid_entries():
    batch = _batch(8, structure=True)
    out = _method("powerclip").align(batch)
    plan = out.plan.dense()
    assert float(plan[0, -2:].abs().sum()) == 0.0
    assert float(plan[1, :, 4:].abs().sum()) == 0.0


def test_powerset_loss_is_triplet_over_batch_matrix():
    batch = _batch(9, b=4, structure=True)
    method = _method("powerclip", tau=0.01, gamma=0.3)
    scores = torch.zeros(4, 4, dtype=DT)
    for i in range(4):
        for j in range(4):
            pair = batch.index(torch.tensor([i]), torch.tensor([j]))
            scores[i, j] = method.align(pair).extras["raw_local_score"][0]
    assert float(method.powerset_loss(batch)) == pytest.approx(float(triplet_loss(scores, 0.3)))


def test_powerset_loss_gradcheck():
    batch = _batch(10, b=2, grid=(2, 2), m=3, d=4)
    batch.regions = grid_cells((2, 2), 2, 1)[None].expand(2, -1, -1)
    cfg = MethodConfig(trainable=True, concept_dim=3, extra={"tau": 0.05})
    method = build_method("powerclip", 4, 4, cfg).double()

    def fn(patches: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return method.powerset_loss(
            PairBatch(patches, tokens, batch.patch_mask, batch.token_mask,
                      batch.image_global, batch.text_global, batch.grid, regions=batch.regions)
        )

    p = batch.patches.clone().requires_grad_(True)
    t = batch.tokens.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(fn, (p, t))
