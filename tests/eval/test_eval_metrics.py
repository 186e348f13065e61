"""Evaluation metrics on hand-computed fixtures (the expected numbers are derived in the
comments) and against independent references (sorting, torchvision's box IoU, the
pre-training recall)."""

import math

import pytest
import torch
from torchvision.ops import box_iou as tv_box_iou

from otviz.eval.classification_metrics import (
    accuracy,
    per_class_accuracy,
    selective_accuracy,
    shot_split_accuracy,
)
from otviz.eval.grounding_metrics import (
    box_iou,
    grounding_scores,
    mean_offdiag_cosine,
    phrase_token_select,
    pointing_game,
    pointing_hits,
)
from otviz.eval.probe import probe_accuracy, probe_items
from otviz.eval.retrieval import (
    match_ranks,
    recall_at_k,
    relevance,
    two_stage_recall,
    two_stage_rerank,
)
from otviz.patch_grid.tokens import TokenGeometry
from otviz.world import World, WorldConfig

INF = float("inf")

# ----------------------------------------------------------------------------- retrieval


def test_recall_1to1_hand_counted():
    s = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.4, 0.8], [0.5, 0.6, 0.7]])
    # i2t: row 0 -> text 0 first (rank 0); row 1: 0.8 beats its 0.4 (rank 1); row 2: 0.7 top.
    # t2i: col 0: 0.9 top; col 1: 0.6 beats 0.4 (rank 1); col 2: 0.8 beats 0.7 (rank 1).
    r = recall_at_k(s, None, ks=(1, 2, 3))
    assert r["i2t_r1"] == pytest.approx(2 / 3) and r["i2t_r2"] == 1.0 and r["i2t_r3"] == 1.0
    assert r["t2i_r1"] == pytest.approx(1 / 3) and r["t2i_r2"] == 1.0


def test_recall_several_captions_per_image_hand_counted():
    # image 0 has texts {0, 1}, image 1 has texts {2, 3}
    s = torch.tensor([[0.1, 0.5, 0.6, 0.2], [0.3, 0.9, 0.4, 0.35]])
    gt = [[0, 1], [2, 3]]
    # i2t: image 0's best own text 0.5 is beaten by text 2 (0.6): rank 1;
    #      image 1's best own text 0.4 is beaten by text 1 (0.9): rank 1.
    # t2i: text 0 [0.1, 0.3] rank 1; text 1 [0.5, 0.9] rank 1; text 2 [0.6, 0.4] rank 1;
    #      text 3 [0.2, 0.35] rank 0.
    r = recall_at_k(s, gt, ks=(1, 2))
    assert r == {"i2t_r1": 0.0, "i2t_r2": 1.0, "t2i_r1": 0.25, "t2i_r2": 1.0}


def test_ties_count_against_the_match():
    r = recall_at_k(torch.zeros(3, 3), None, ks=(1, 3))
    assert r["i2t_r1"] == 0.0 and r["t2i_r1"] == 0.0
    assert r["i2t_r3"] == 1.0 and r["t2i_r3"] == 1.0  # K = n: always retrieved


def test_recall_matches_sorting_reference_and_pretrain_recall():
    g = torch.Generator().manual_seed(0)
    n_img, per = 7, 3
    s = torch.randn(n_img, n_img * per, generator=g)
    gt = [list(range(i * per, (i + 1) * per)) for i in range(n_img)]
    r = recall_at_k(s, gt, ks=(1, 5, 10))
    owner = torch.arange(n_img * per) // per
    # reference: position of the first relevant item in a full sort
    i2t_rank = [
        next(p for p, t in enumerate(s[i].argsort(descending=True).tolist()) if owner[t] == i)
        for i in range(n_img)
    ]
    t2i_rank = [
        s[:, t].argsort(descending=True).tolist().index(int(owner[t])) for t in range(n_img * per)
    ]
    for k in (1, 5, 10):
        assert r[f"i2t_r{k}"] == pytest.approx(sum(x < k for x in i2t_rank) / n_img)
        assert r[f"t2i_r{k}"] == pytest.approx(sum(x < k for x in t2i_rank) / (n_img * per))
    rel = relevance(gt, n_img, n_img * per)
    assert torch.equal(match_ranks(s, rel, chunk=2), match_ranks(s, rel))


def test_recall_of_square_scores_by_hand():
    sim = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.7, 0.0], [0.0, 0.95, 0.5]])
    r = recall_at_k(sim, ks=(1, 2))
    # image ranks of their captions: 0, 1 (0.8 > 0.7), 1 (0.95 > 0.5)
    assert r["i2t_r1"] == pytest.approx(1 / 3) and r["i2t_r2"] == 1.0
    # caption ranks of their images: col 0 -> 0, col 1 -> 1 (0.95 > 0.7), col 2 -> 0
    assert r["t2i_r1"] == pytest.approx(2 / 3) and r["t2i_r2"] == 1.0
    assert recall_at_k(torch.ones(3, 3), ks=(1,))["i2t_r1"] == 0.0  # ties count against


def test_recall_rejects_bad_ground_truth_and_nan():
    with pytest.raises(ValueError, match="square"):
        recall_at_k(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="belong to no image"):
        recall_at_k(torch.zeros(2, 3), [[0], [1]])
    with pytest.raises(ValueError, match="no matching text"):
        recall_at_k(torch.zeros(2, 2), [[0, 1], []])
    with pytest.raises(ValueError, match="NaN"):
        recall_at_k(torch.tensor([[0.0, math.nan], [0.0, 1.0]]))


G = torch.tensor([[0.9, 0.8, 0.1], [0.5, 0.6, 0.7], [0.2, 0.3, 0.4]])
L = torch.tensor([[0.0, 0.5, 9.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


class CountingLocal:
    """``s_l`` looked up in a matrix, recording every call's pairs."""

    def __init__(self, local: torch.Tensor):
        self.local, self.calls = local, []

    def __call__(self, image_idx: torch.Tensor, text_idx: torch.Tensor) -> torch.Tensor:
        self.calls.append(list(zip(image_idx.tolist(), text_idx.tolist(), strict=True)))
        return self.local[image_idx, text_idx]


def test_two_stage_rerank_hand_computed():
    fn = CountingLocal(L)
    out = two_stage_rerank(G, fn, k=2, lambda_l=1.0, direction="i2t")
    # row 0: top-2 global texts {0, 1}; text 2 (huge local 9.0) is no candidate -> -inf.
    # row 1: {2, 1}; row 2: {2, 1}.  Candidates get g + s_l.
    expected = torch.tensor([[0.9, 1.3, -INF], [-INF, 0.6, 0.7], [-INF, 0.3, 0.4]])
    assert torch.allclose(out, expected)
    assert len(fn.calls) == 1 and sorted(fn.calls[0]) == [
        (0, 0), (0, 1), (1, 1), (1, 2), (2, 1), (2, 2)
    ]
    t2i = two_stage_rerank(G, CountingLocal(L), k=2, lambda_l=1.0, direction="t2i")
    # col 0: images {0, 1} -> 0.9 + 0, 0.5 + 1.0; col 1: {0, 1} -> 0.8 + 0.5, 0.6;
    # col 2: {1, 2} -> 0.7, 0.4
    expected_t2i = torch.tensor([[0.9, 1.3, -INF], [1.5, 0.6, 0.7], [-INF, -INF, 0.4]])
    assert torch.allclose(t2i, expected_t2i)


def test_two_stage_recall_hand_counted_one_local_call():
    fn = CountingLocal(L)
    r = two_stage_recall(G, fn, k=2, lambda_l=1.0, ks=(1, 2))
    # i2t (matrix above): row 0 picks text 1 (miss), row 1 text 2 (miss), row 2 text 2 (hit)
    # t2i: col 0 picks image 1 (miss), col 1 image 0 (miss), col 2 image 1 (miss);
    # every match is the second candidate -> R@2 = 1 both ways.
    assert r == {"i2t_r1": pytest.approx(1 / 3), "i2t_r2": 1.0, "t2i_r1": 0.0, "t2i_r2": 1.0}
    # the union of both directions' candidates, scored once: 7 pairs, never (0,2) or (2,0)
    assert len(fn.calls) == 1
    assert sorted(fn.calls[0]) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 1), (2, 2)]
    # global-only ranking differs (lambda_l = 0 is the global protocol): i2t R@1 = 2/3
    assert two_stage_recall(G, CountingLocal(L), 2, 0.0, ks=(1,))["i2t_r1"] == pytest.approx(2 / 3)
    chunked = CountingLocal(L)
    assert two_stage_recall(G, chunked, 2, 1.0, ks=(1, 2), chunk_size=2) == r
    assert [len(c) for c in chunked.calls] == [2, 2, 2, 1]


def test_two_stage_with_all_candidates_equals_full_rerank():
    g = torch.Generator().manual_seed(1)
    gs, ls = torch.randn(5, 10, generator=g), torch.randn(5, 10, generator=g)
    gt = [[2 * i, 2 * i + 1] for i in range(5)]
    full = recall_at_k(gs + 0.5 * ls, gt, ks=(1, 3))
    assert two_stage_recall(gs, CountingLocal(ls), 10, 0.5, gt, ks=(1, 3)) == full


# ----------------------------------------------------------------------------- probe


def test_probe_accuracy_hand_counted_ties_fail():
    pos = torch.tensor([1.0, 2.0, 3.0, 4.0])
    neg = torch.tensor([0.0, 2.0, 5.0, 1.0])  # win, tie (fails), loss, win
    out = probe_accuracy(pos, neg, ["swap", "swap", "swap", "add"])
    assert out == {"swap": pytest.approx(1 / 3), "add": 1.0, "overall": 0.5}
    with pytest.raises(ValueError):
        probe_accuracy(pos, neg[:3], ["a"] * 4)


def test_probe_items_cover_every_world_negative():
    samples = World(WorldConfig(), "test", seed=0).samples(0, 4)
    items = probe_items(samples)
    assert len(items) == sum(len(s.negatives) for s in samples) > 0
    for it in items:
        s = samples[it.index]
        assert it.positive == s.caption and s.negatives[it.category] == it.negative
        assert it.negative != it.positive


# ----------------------------------------------------------------------------- grounding


def test_pointing_game_hand_computed():
    # grid 2x2 on an 80x40 image: patches 40x20 px, centres (20,10) (60,10) (20,30) (60,30)
    heat = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.2, 0.1], [0.0, 0.0, 0.0, 0.0]])
    gold = torch.tensor([[40, 0, 80, 20], [0, 0, 40, 20], [0, 0, 40, 40]])
    # hit (60,10) in box; miss (20,30) outside; flat map: the chance of a random patch, the
    # box holding 2 of the 4 centres
    geometry = TokenGeometry.cell_centred((2, 2), (80, 40))
    assert pointing_hits(heat, geometry, gold).tolist() == [1.0, 0.0, 0.5]
    assert pointing_game(heat, geometry, gold) == pytest.approx(1.5 / 3)
    # half-open boxes: a centre on x0 is inside, on x1 outside
    one = heat[:1]
    assert pointing_hits(one, geometry, torch.tensor([[60, 0, 80, 20]])).item()
    assert not pointing_hits(one, geometry, torch.tensor([[40, 0, 60, 20]])).item()


def test_box_iou_hand_computed_and_against_torchvision():
    a = torch.tensor([[0.0, 0, 2, 2], [0, 0, 2, 2], [0, 0, 1, 1], [0, 0, 0, 0]])
    b = torch.tensor([[1.0, 1, 3, 3], [0, 0, 2, 2], [2, 2, 3, 3], [0, 0, 0, 0]])
    # overlap 1x1, union 4 + 4 - 1 = 7; identical; disjoint; both empty
    assert box_iou(a, b).tolist() == pytest.approx([1 / 7, 1.0, 0.0, 0.0])
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(20, 2, generator=g) * 50
    wh = torch.rand(20, 2, generator=g) * 30 + 1
    p = torch.cat([xy, xy + wh], 1)
    q = p[torch.randperm(20, generator=g)] + torch.rand(20, 4, generator=g) * 5
    q[:, 2:] = torch.maximum(q[:, 2:], q[:, :2] + 0.5)
    ref = tv_box_iou(p.double(), q.double()).diagonal()
    assert torch.allclose(box_iou(p, q), ref)


def test_grounding_scores_hand_computed():
    heat = torch.tensor([[1.0, 0.6, 0.1, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    gold = torch.tensor([[0, 0, 80, 20], [0, 20, 80, 40], [0, 0, 40, 20]])
    # boxes at threshold 0.5 (pixels, grid 2x2 on 80x40):
    #   map 0 keeps patches 0,1 -> (0,0,80,20): IoU 1
    #   map 1 keeps patch 2 -> (0,20,40,40) vs (0,20,80,40): 800 / 1600 = 0.5 (a hit)
    #   map 2 keeps patch 3 -> (40,20,80,40) vs (0,0,40,20): 0
    # pointing: centres (20,10) in, (20,30) in, (60,30) out -> 2/3
    out = grounding_scores(heat, TokenGeometry.cell_centred((2, 2), (80, 40)), gold,
                           threshold=0.5)
    assert out == pytest.approx({"pointing": 2 / 3, "mean_iou": 0.5, "hit@0.5": 2 / 3, "n": 3})


def test_phrase_token_select():
    token_word = torch.tensor([[-1, 0, 1, 1, 2, -1]])
    mask = torch.tensor([[False, True, True, True, True, False]])
    sel = phrase_token_select(token_word, mask, torch.tensor([[1, 2]]))
    assert sel.tolist() == [[False, False, True, True, False, False]]


def test_mean_offdiag_cosine_closed_forms():
    # e1, e2, (e1+e2)/sqrt2: cosines 0, 1/sqrt2, 1/sqrt2 -> mean over 6 ordered pairs sqrt2/3
    a = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]])  # norms do not matter
    assert mean_offdiag_cosine(a) == pytest.approx(math.sqrt(2) / 3)
    assert mean_offdiag_cosine(torch.eye(5)) == pytest.approx(0.0)
    assert mean_offdiag_cosine(torch.ones(4, 3)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        mean_offdiag_cosine(torch.ones(1, 3))


# ----------------------------------------------------------------------------- classification

PRED = torch.tensor([0, 1, 1, 2, 2, 2])
LABELS = torch.tensor([0, 1, 2, 2, 2, 0])  # correct: yes yes no yes yes no


def test_accuracy_and_per_class_hand_counted():
    assert accuracy(PRED, LABELS) == pytest.approx(4 / 6)
    pc = per_class_accuracy(PRED, LABELS, 4)
    # class 0: samples 0, 5 -> 1/2; class 1: sample 1 -> 1; class 2: samples 2,3,4 -> 2/3
    assert pc[:3].tolist() == pytest.approx([0.5, 1.0, 2 / 3]) and math.isnan(pc[3])


def test_shot_split_hand_counted_and_thresholds():
    out = shot_split_accuracy(PRED, LABELS, [150, 50, 10, 5])
    # many: class 0 (150 > 100) 0.5; medium: class 1 (50) 1.0; few: class 2 (10) 2/3 and
    # class 3 (no test sample, skipped)
    assert out == pytest.approx(
        {"many": 0.5, "medium": 1.0, "few": 2 / 3, "mean_per_class": 13 / 18, "overall": 4 / 6}
    )
    # boundaries with a single class: 101 is many, 100 and 20 medium, 19 few
    one = torch.tensor([0])
    for count, group in ((101, "many"), (100, "medium"), (20, "medium"), (19, "few")):
        res = shot_split_accuracy(one, one, [count])
        assert res[group] == 1.0
        assert all(math.isnan(res[g]) for g in ("many", "medium", "few") if g != group)


def test_selective_accuracy_hand_counted():
    accept = torch.tensor([True, True, True, False, False, True])
    # accepted samples 0,1,2,5: right, right, wrong, wrong -> 0.5 at coverage 4/6
    out = selective_accuracy(PRED, LABELS, accept)
    assert out == pytest.approx({"accuracy": 0.5, "coverage": 4 / 6, "n_accepted": 4})
    none = selective_accuracy(PRED, LABELS, torch.zeros(6, dtype=torch.bool))
    assert math.isnan(none["accuracy"]) and none["coverage"] == 0.0
