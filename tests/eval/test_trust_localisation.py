"""One rule for ties in every localisation score, against closed forms, exact enumeration of
the tie-breaks and Quantus where no tie decides; and the trust table's pointing equal to the
grounding table's on the same rows for every method, explainer and baseline."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from otviz.backbone import Backbone
from otviz.eval import alignment_tables as A
from otviz.eval.grounding_metrics import empty_regions, pointing_hits, tokens_in_boxes
from otviz.eval.trust import localisation as L
from otviz.eval.trust.adapter import to_pixels
from otviz.eval.trust.metrics import require_quantus
from otviz.eval.trust.table import trust_tables
from otviz.eval.world_set import EvalSet
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from tests.helpers import random_tiny_clip

#: A 4 x 4 grid of 8-px cells on a 32 x 32 picture: token k looks at (8 (k % 4) + 4,
#: 8 (k // 4) + 4).
GEOMETRY = TokenGeometry.cell_centred((4, 4), (32, 32))


def _painted(token_maps: torch.Tensor) -> np.ndarray:
    return to_pixels(token_maps.double(), GEOMETRY).numpy()


def _region(boxes: torch.Tensor) -> np.ndarray:
    return _painted(tokens_in_boxes(GEOMETRY, boxes).double())


def test_three_rows_peak_outside_flat_and_empty_region() -> None:
    """The issue's batch: Quantus 0.6.0 gives [hit? no, yes, yes]; the tie rule gives [0, the
    chance of a random token, 0] and counts the empty region."""
    peak_outside = torch.zeros(16).index_fill(0, torch.tensor([15]), 1.0)
    maps = torch.stack([peak_outside, torch.full((16,), 0.3), torch.rand(16)])
    boxes = torch.tensor([[0, 0, 16, 16], [0, 0, 16, 32], [1, 1, 3, 3]], dtype=torch.float64)
    inside = tokens_in_boxes(GEOMETRY, boxes)
    chance = float(inside[1].double().mean())
    assert chance == 8 / 16  # 2 columns x 4 rows of centres
    expected = [0.0, chance, 0.0]
    assert pointing_hits(maps, GEOMETRY, boxes).tolist() == expected
    assert L.pointing(_painted(maps), _region(boxes), GEOMETRY).tolist() == expected
    assert empty_regions(inside).tolist() == [False, False, True]
    assert L.empty_masks(_region(boxes)).tolist() == [False, False, True]
    quantus = require_quantus()
    old = quantus.PointingGame(disable_warnings=True).evaluate_batch(
        a_batch=_painted(maps), s_batch=_region(boxes))
    assert [bool(h) for h in old] == [False, True, True]


def test_a_plateau_scores_its_share_in_the_gold_region() -> None:
    """Six tokens tie for the peak, two of them in the box: expected hit 2/6, on both tables'
    reading."""
    heat = torch.rand(1, 16, generator=torch.Generator().manual_seed(3)) * 0.5
    plateau = torch.tensor([0, 1, 2, 3, 4, 5])
    heat[0, plateau] = 0.9
    box = torch.tensor([[0, 0, 16, 8]], dtype=torch.float64)  # tokens 0 and 1
    assert tokens_in_boxes(GEOMETRY, box)[0].nonzero().flatten().tolist() == [0, 1]
    assert pointing_hits(heat, GEOMETRY, box).tolist() == [pytest.approx(2 / 6)]
    assert L.pointing(_painted(heat), _region(box), GEOMETRY).tolist() == [
        pytest.approx(2 / 6)]


@pytest.mark.parametrize("level", [0.0, 0.25, 7.0])
def test_the_uniform_map_scores_chance(level: float) -> None:
    """A flat map (any level, zero too) scores the share of tokens in the region; relevance
    mass the share of pixels, relevance rank the same share in expectation, AUC 1/2."""
    boxes = torch.tensor([[0, 0, 24, 16], [8, 8, 32, 32]], dtype=torch.float64)
    flat = torch.full((2, 16), level)
    share = tokens_in_boxes(GEOMETRY, boxes).double().mean(dim=1)
    assert share.tolist() == [6 / 16, 9 / 16]
    assert torch.equal(pointing_hits(flat, GEOMETRY, boxes), share)
    maps, masks = _painted(flat), _region(boxes)
    assert np.allclose(L.pointing(maps, masks, GEOMETRY), share.numpy())
    pixels = (masks > 0).reshape(2, -1).mean(axis=1)  # equal cells: the same share here
    assert np.allclose(L.mass_accuracy(maps, masks), pixels)
    assert np.allclose(L.rank_accuracy(maps, masks), pixels)
    assert np.allclose(L.roc_auc(maps, masks), 0.5)


def _enumerated_rank(a: np.ndarray, s: np.ndarray) -> float:
    """Rank accuracy averaged over every order of each tied group (exact enumeration)."""
    k = int(s.sum())
    groups = [np.flatnonzero(a == v) for v in np.unique(a)[::-1]]
    total, count = 0.0, 0
    for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
        top = np.concatenate(orders)[:k]
        total += s[top].sum() / k
        count += 1
    return total / count


def _pairwise_auc(a: np.ndarray, s: np.ndarray) -> float:
    """P(inside > outside) + P(tie) / 2 over every (inside, outside) pair."""
    pos, neg = a[s][:, None], a[~s][None, :]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean())


def test_rank_and_auc_with_ties_against_enumeration_and_pairs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 3, size=7).astype(np.float32)  # many ties
        s = rng.random(7) < 0.4
        s[rng.integers(7)] = True
        maps, masks = a[None, None, None], s.astype(np.float32)[None, None, None]
        assert L.rank_accuracy(maps, masks)[0] == pytest.approx(_enumerated_rank(a, s))
        if 0 < s.sum() < s.size:
            assert L.roc_auc(maps, masks)[0] == pytest.approx(_pairwise_auc(a, s))


def test_localisation_equals_quantus_where_no_tie_decides() -> None:
    """Distinct token values (ties only inside a cell, which mass and AUC ignore): mass and
    AUC equal Quantus'; rank equals it on a map with distinct pixels; pointing equals it on
    maps whose peak is one token."""
    quantus = require_quantus()
    quiet = {"disable_warnings": True}
    gen = torch.Generator().manual_seed(1)
    heat = torch.rand(5, 16, generator=gen, dtype=torch.float64)
    boxes = torch.tensor([[0, 0, 16, 16], [8, 8, 32, 24], [0, 16, 32, 32], [16, 0, 32, 8],
                          [4, 4, 28, 28]], dtype=torch.float64)
    maps, masks = _painted(heat), _region(boxes)
    for ours, theirs in [(L.mass_accuracy, quantus.RelevanceMassAccuracy),
                         (L.roc_auc, quantus.AUC)]:
        assert np.allclose(ours(maps, masks), theirs(**quiet).evaluate_batch(
            a_batch=maps, s_batch=masks))
    assert np.array_equal(L.pointing(maps, masks, GEOMETRY), np.asarray(
        quantus.PointingGame(**quiet).evaluate_batch(a_batch=maps, s_batch=masks), float))
    distinct = np.random.default_rng(2).random(maps.shape).astype(np.float32)
    assert np.allclose(L.rank_accuracy(distinct, masks), quantus.RelevanceRankAccuracy(
        **quiet).evaluate_batch(a_batch=distinct, s_batch=masks))


def test_token_values_read_a_painted_map_back_exactly() -> None:
    geometry = TokenGeometry((5, 7), (61, 45), (9.0, 6.5), (3.0, 2.5))
    heat = torch.rand(3, geometry.n, generator=torch.Generator().manual_seed(4))
    painted = to_pixels(heat, geometry).numpy()
    assert torch.equal(L.token_values(painted, geometry), heat.float())


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Backbone:
    torch.set_num_threads(1)
    return Backbone.from_checkpoint(random_tiny_clip(tmp_path_factory.mktemp("bb") / "bb", 4))


def test_trust_pointing_is_the_grounding_pointing_for_every_row(backbone, tmp_path) -> None:
    """The same world test rows, every kind of row (methods, PowerCLIP's often flat map
    among them, an explainer, the baselines): the two tables give one pointing figure."""
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20],
                                      ("filip", "dense_uot", "powerclip"))
    n, seed = 4, 5
    trust, _ = trust_tables(suite, n, seed=seed, explainers=("legrad",),
                            metrics=["pointing", "pointing_tol"])
    data = EvalSet.build(backbone, n, "test", seed, str(tmp_path / "cache"))
    grounding = A.grounding_table(suite, data, chunk=4, explainers=("legrad",))
    for key in ("pointing", "pointing_tol"):  # both conventions: strict and 15 px
        ground = {r["name"]: r[key] for r in grounding.rows}
        rows = {r["name"]: r[key] for r in trust.rows}
        assert set(rows) == {"filip", "dense_uot", "powerclip", "legrad", "colour_oracle",
                             "centre_prior", "uniform"}
        for name, value in rows.items():
            assert value == pytest.approx(ground[name], abs=1e-9), (key, name)
    assert any(r["pointing_tol"] > r["pointing"] for r in trust.rows)
    assert any("phrase(s) whose gold region holds no token score 0" in n for n in trust.notes)
    assert any("phrase(s) whose gold region holds no token score 0" in n
               for n in grounding.notes)
