"""PowerCLIP's head: the phrase map equals its documented formula and depends on the phrase,
region proposals, the triplet loss variants against their definitions, and a short seeded
training on world pairs that separates matched from mismatched pairs (the shipped head
collapsed: every q < 0)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.heads import load_method_checkpoint
from otviz.methods import MethodConfig, PairBatch, build_method
from otviz.methods.powerclip import best_node, region_node_scores, triplet_loss
from otviz.ot.powerset import nla_t1
from otviz.patch_grid.masks import grid_cells, random_boxes
from otviz.train.config import TrainConfig
from otviz.train.loop import train_method
from otviz.train.pairs import build_source

DT = torch.float64


def _pair(seed: int = 0, grid=(3, 4), m: int = 5, d: int = 8) -> PairBatch:
    gen = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1]
    batch = PairBatch(
        patches=torch.randn(2, n, d, generator=gen, dtype=DT),
        tokens=torch.randn(2, m, d, generator=gen, dtype=DT),
        patch_mask=torch.ones(2, n, dtype=torch.bool),
        token_mask=torch.ones(2, m, dtype=torch.bool),
        image_global=torch.randn(2, d, generator=gen, dtype=DT),
        text_global=torch.randn(2, d, generator=gen, dtype=DT),
        grid=grid,
    )
    batch.regions = random_boxes(grid, 4, seed=seed, batch_size=2)
    spans = torch.zeros(2, 3, m, dtype=torch.bool)
    spans[:, 0, :2] = True  # "a red"
    spans[:, 1, 2:] = True  # "circle left of"
    spans[:, 2, :] = True  # the whole caption
    batch.nodes, batch.node_mask = spans, spans.any(-1)
    return batch


def _method(**extra) -> torch.nn.Module:
    return build_method("powerclip", 8, 8, MethodConfig(trainable=False, extra=extra)).double()


@pytest.mark.parametrize("exact", [False, True])
def test_phrase_map_is_similarity_weighted_by_the_selected_subset(exact: bool) -> None:
    """The map, computed by hand from Eq. 2-4 and 10: the node's text-to-patch cosine (Fig. 6)
    shifted to start at 0, times the soft union of the regions in its best subset."""
    batch = _pair()
    tau = 0.05
    method = _method(tau=tau, exact=exact)
    out = method.align(batch)
    select = torch.zeros(2, 5, dtype=torch.bool)
    select[:, 2:] = True  # exactly node 1, "circle left of": tokens 2-4, one leaf
    got = type(method).phrase_patch_map(out, select)
    for b in range(2):
        # the training-free projections are the identity on unit-norm features
        v = batch.patches[b] / batch.patches[b].norm(dim=-1, keepdim=True)
        t = batch.tokens[b] / batch.tokens[b].norm(dim=-1, keepdim=True)
        leaf = t[2:].sum(0)
        p_b = leaf / leaf.norm()  # Eq. 3-4: one leaf
        sim = v @ p_b  # [N] Fig. 6
        regions = batch.regions[b].to(DT)
        q = torch.stack([(regions[r] @ v) / (regions[r] @ v).norm()
                         for r in range(4)]) @ p_b  # Eq. 2 and 10
        member = (q > 0).to(DT) if exact else torch.sigmoid(q / tau)
        union = torch.ones(regions.shape[1], dtype=DT)
        for r in range(4):
            union = union * (1 - member[r] * regions[r])
        want = (sim - sim.min()) * (1 - union)
        torch.testing.assert_close(got[b], want)


def test_two_phrases_of_one_image_get_different_maps() -> None:
    """The map depends on the phrase: two nodes of one caption whose selected subsets cover
    the same patches still differ, through their own text-to-patch similarity."""
    batch = _pair()
    batch.regions = torch.ones(2, 1, 12, dtype=torch.bool)  # one region: the whole image
    method = _method(tau=0.05)
    out = method.align(batch)
    first, second = (torch.zeros(2, 5, dtype=torch.bool) for _ in range(2))
    first[:, :2] = True
    second[:, 2:] = True
    a = type(method).phrase_patch_map(out, first)
    b = type(method).phrase_patch_map(out, second)
    cover = out.extras["node_subset_cover"][:, :2]
    assert bool((cover > 0).all())  # both nodes keep patches, so neither map is the fallback
    for i in range(2):
        rank_a, rank_b = a[i].argsort().argsort().to(DT), b[i].argsort().argsort().to(DT)
        assert torch.corrcoef(torch.stack([rank_a, rank_b]))[0, 1] < 0.9
        assert a[i].argmax() != b[i].argmax() or not torch.allclose(a[i], b[i])


def test_empty_subset_keeps_the_unweighted_similarity() -> None:
    """A node no region matches (every q < 0, exact mode: an empty best subset) shows its
    Fig. 6 similarity, shifted to start at 0, and the view labels it so."""
    batch = _pair()
    batch.regions = torch.ones(2, 1, 12, dtype=torch.bool)  # one region: q is one number
    method = _method(exact=True)
    q = method.align(batch).extras["region_node_scores"][:, 0, 1]
    batch.tokens[0, 2:] *= -torch.sign(q[0])  # node 1: q < 0 in image 0 (empty subset),
    batch.tokens[1, 2:] *= torch.sign(q[1])  # q > 0 in image 1 (the whole image chosen)
    out = method.align(batch)
    q = out.extras["region_node_scores"][:, :, 1]
    select = torch.zeros(2, 5, dtype=torch.bool)
    select[:, 2:] = True
    heat, label = type(method).shown_patch_map(out, select)
    sim = type(method).phrase_similarity_map(out, select)
    assert float(q[0, 0]) < 0 < float(q[1, 0])
    torch.testing.assert_close(heat, sim - sim.amin(-1, keepdim=True))  # cover 1 in image 1
    assert label == "Fig. 6 sim."


def test_text_to_patch_similarity_is_q_of_one_patch_regions() -> None:
    """Fig. 6's map: with every patch its own region, Eq. 10's region-node scores q are the
    text-to-patch similarities, so the two readouts agree patch by patch."""
    batch = _pair()
    n = batch.patches.shape[1]
    batch.regions = torch.eye(n, dtype=torch.bool).expand(2, n, n).clone()
    out = _method().align(batch)
    select = torch.zeros(2, 5, dtype=torch.bool)
    select[:, :2] = True  # exactly node 0
    got = type(_method()).phrase_similarity_map(out, select)
    torch.testing.assert_close(got, out.extras["region_node_scores"][:, :, 0])
    assert got.min() < 0 < got.max()  # signed: a cosine per leaf of the node


def test_best_node_is_the_largest_jaccard_overlap() -> None:
    nodes = _pair().nodes
    select = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 1, 1, 0]], dtype=torch.bool)
    assert best_node(nodes, nodes.any(-1), select).tolist() == [0, 1]
    masked = torch.tensor([[False, True, True]] * 2)
    assert best_node(nodes, masked, select)[0] == 2  # node 0 masked: the root overlaps best


def test_region_proposals_grid_or_seeded_boxes() -> None:
    batch = _pair()
    batch.regions = None
    boxes = _method(proposals="boxes", n_regions=10, proposal_seed=3).align(batch)
    assert torch.equal(boxes.extras["regions"][1], random_boxes((3, 4), 10, seed=3))
    grid = _method(n_regions=6).align(batch)
    assert torch.equal(grid.extras["regions"][0], grid_cells((3, 4), 2, 3))
    with pytest.raises(ValueError, match="proposals"):
        _method(proposals="sam").align(batch)


def test_triplet_loss_variants_match_their_definitions() -> None:
    gen = torch.Generator().manual_seed(0)
    sim = torch.randn(4, 4, generator=gen, dtype=DT)
    gamma = 0.3
    excluded = torch.zeros(4, 4, dtype=torch.bool)
    excluded[0, 1] = excluded[1, 0] = True  # pairs 0 and 1 share a caption

    def ref(x: torch.Tensor, mode: str) -> float:
        total = 0.0
        for i in range(4):
            negs = [x[i, j] for j in range(4) if j != i and not excluded[i, j]]
            hinges = [max(float(v - x[i, i]) + gamma, 0.0) for v in negs]
            total += max(hinges) if mode == "hardest" else sum(hinges) / len(hinges)
        return total / 4

    for mode in ("hardest", "all"):
        want = ref(sim, mode) + ref(sim.T, mode)
        got = triplet_loss(sim, gamma, mode, excluded)
        assert float(got) == pytest.approx(want)
    with pytest.raises(ValueError, match="negatives"):
        triplet_loss(sim, gamma, "semi-hard")


@pytest.fixture(scope="module")
def world_source(tmp_path_factory: pytest.TempPathFactory):
    """256 world training pairs encoded by the shipped backbone (any backbone works)."""
    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("pc-cache")
    return build_source(TrainConfig(method="powerclip", n_train=256, cache_dir=str(cache),
                                    device="cpu", threads=1))


def _t2r_matrix(method: torch.nn.Module, source, n: int = 48) -> torch.Tensor:
    """``[n, n]`` T2R (NLA-T1) of the first ``n`` pairs' images against their captions, on
    the random boxes the head trains on."""
    batch = source.pair_batch(torch.arange(n))
    batch.regions = random_boxes(batch.grid, 10, seed=123, batch_size=n)
    with torch.no_grad():
        inp = method.inputs(batch)
        q = region_node_scores(inp.region_emb[:, None], inp.phrase_emb[None])
        return nla_t1(q, method.tau, inp.region_mask[:, None, :], inp.node_mask[None])


def test_short_training_separates_matched_from_mismatched(world_source, tmp_path: Path):
    config = TrainConfig(method="powerclip", n_train=256, batch_size=32, max_steps=64,
                         lr=1e-3, warmup_frac=0.0, concept_dim=64, threads=1, device="cpu",
                         log_every=0, out=str(tmp_path / "run"), seed=0)
    result = train_method(config, source=world_source)
    backbone = Backbone.from_checkpoint()
    t2r = _t2r_matrix(load_method_checkpoint(result.head_checkpoint, backbone), world_source)
    eye = torch.eye(t2r.shape[0], dtype=torch.bool)
    matched, mismatched = t2r[eye].mean(), t2r[~eye].mean()
    assert matched > 0.01 and matched > 2 * mismatched
    local = [h["local"] for h in result.history]
    assert sum(local[-4:]) / 4 < config.powerset_gamma  # well below the trivial 2 gamma
