"""Hard-negative mining (ConceptOT Sec. 2.4, Alg. 2 line 6) against brute-force selection."""

from __future__ import annotations

import pytest
import torch

from otviz.train.losses import negative_pairs
from otviz.train.negatives import caption_ids, mine_hard_negatives, positive_mask


def brute_force(sim: torch.Tensor, k: int, excluded: torch.Tensor) -> tuple[list, list]:
    """Per row i: the (up to) k columns j != i, not excluded, by decreasing sim[i, j]; and
    per column i the k rows j by decreasing sim[j, i]. Python sorting, no topk."""
    b = sim.shape[0]
    texts, images = [], []
    for i in range(b):
        cand = [j for j in range(b) if j != i and not excluded[i, j]]
        texts.append(sorted(cand, key=lambda j: -float(sim[i, j]))[:k])
        cand = [j for j in range(b) if j != i and not excluded[j, i]]
        images.append(sorted(cand, key=lambda j: -float(sim[j, i]))[:k])
    return texts, images


def as_lists(idx: torch.Tensor, valid: torch.Tensor) -> list[list[int]]:
    rows = zip(idx.tolist(), valid.tolist(), strict=True)
    return [[j for j, v in zip(r, m, strict=True) if v] for r, m in rows]


@pytest.mark.parametrize("k", [1, 4, 7])
def test_top_k_by_global_score_excluding_the_positive(k: int) -> None:
    torch.manual_seed(0)
    sim = torch.randn(8, 8)
    sim.diagonal().add_(5.0)  # the positive scores highest: it must still never be chosen
    neg = mine_hard_negatives(sim, k)
    texts, images = brute_force(sim, k, torch.zeros(8, 8, dtype=torch.bool))
    assert as_lists(neg.text, neg.text_valid) == texts
    assert as_lists(neg.image, neg.image_valid) == images
    assert neg.text_valid.all() and neg.image_valid.all()


def test_directions_differ_on_an_asymmetric_matrix() -> None:
    """Image i's hard captions follow row i, caption i's hard images follow column i."""
    sim = torch.tensor(
        [[0.9, 0.8, 0.1], [0.2, 0.9, 0.0], [0.7, 0.3, 0.9]]
    )
    neg = mine_hard_negatives(sim, 1)
    assert neg.text[:, 0].tolist() == [1, 0, 0]  # row maxima off the diagonal
    assert neg.image[:, 0].tolist() == [2, 0, 0]  # column maxima off the diagonal


def test_caption_ids_ignore_case_and_white_space() -> None:
    ids = caption_ids(["A red  circle", "a red circle", "a blue square", " a BLUE square "])
    assert ids.tolist() == [0, 0, 1, 1]


def test_duplicate_captions_and_shared_images_are_not_negatives() -> None:
    torch.manual_seed(1)
    b, k = 10, 3
    sim = torch.randn(b, b)
    captions = ["c0", "c1", "c0", "c3", "c4", "C1", "c6", "c7", "c8", "c9"]
    image_ids = torch.tensor([0, 1, 2, 3, 3, 5, 6, 7, 8, 8])  # COCO-like shared images
    excluded = positive_mask(image_ids, caption_ids(captions))
    # the mask is exactly: same image or same caption text
    for i in range(b):
        for j in range(b):
            same = image_ids[i] == image_ids[j] or captions[i].lower() == captions[j].lower()
            assert bool(excluded[i, j]) == bool(same)
    sim[0, 2] = sim[2, 0] = 10.0  # a duplicate caption with the highest score
    neg = mine_hard_negatives(sim, k, excluded)
    texts, images = brute_force(sim, k, excluded)
    assert as_lists(neg.text, neg.text_valid) == texts
    assert as_lists(neg.image, neg.image_valid) == images
    assert 2 not in texts[0] and 0 not in images[2]


def test_too_few_candidates_are_marked_invalid() -> None:
    sim = torch.randn(3, 3)
    excluded = positive_mask(torch.arange(3), torch.tensor([0, 0, 1]))  # 0 and 1 duplicate
    neg = mine_hard_negatives(sim, 4, excluded)
    assert neg.text.shape == (3, 4)
    # pairs 0 and 1 have one candidate (2) each, pair 2 has two
    assert neg.text_valid.sum(1).tolist() == [1, 1, 2]
    assert neg.image_valid.sum(1).tolist() == [1, 1, 2]
    assert neg.text[0, 0] == 2 and neg.image[1, 0] == 2


def test_mining_does_not_differentiate() -> None:
    sim = torch.randn(5, 5, requires_grad=True)
    neg = mine_hard_negatives(sim, 2)
    assert not neg.text.requires_grad


def test_negative_pairs_layout() -> None:
    """Positives first, then image i with each hard caption, then caption i with each hard
    image: the layout the loss splits."""
    sim = torch.randn(6, 6)
    neg = mine_hard_negatives(sim, 2)
    rows = torch.tensor([1, 4])
    img, txt = negative_pairs(rows, neg)
    assert img.tolist()[:2] == [1, 4] and txt.tolist()[:2] == [1, 4]
    assert img[2:6].tolist() == [1, 1, 4, 4]
    assert txt[2:6].tolist() == neg.text[rows].reshape(-1).tolist()
    assert img[6:].tolist() == neg.image[rows].reshape(-1).tolist()
    assert txt[6:].tolist() == [1, 1, 4, 4]
