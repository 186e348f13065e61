"""The explainers beside the methods: their rows of the grounding table (each the scores of
its maps computed one phrase at a time, image and phrase text alone, after the methods' rows
and before the model-free baselines) and their columns of the Browse table."""

from __future__ import annotations

import pytest
import torch

from otviz.backbone import Backbone
from otviz.eval import alignment_tables as A
from otviz.eval import browse as B
from otviz.eval.grounding_metrics import grounding_scores, pointing_hits
from otviz.eval.world_set import EvalSet
from otviz.explainers import EXPLAINERS, explain_pairs, explainers_needed
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from tests.helpers import random_tiny_clip


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> MethodSuite:
    torch.set_num_threads(1)
    path = random_tiny_clip(tmp_path_factory.mktemp("bb") / "bb", 5)
    return MethodSuite.training_free(Backbone.from_checkpoint(path), WORLD_FIT_CAPTIONS[:20],
                                     ("filip",))


def test_explainer_rows_score_each_phrase_map(suite, tmp_path) -> None:
    backbone = suite.backbone
    data = EvalSet.build(backbone, 4, "test", 0, str(tmp_path / "cache"))
    table = A.grounding_table(suite, data, chunk=4, explainers=tuple(EXPLAINERS))
    names = [r["name"] for r in table.rows]
    assert names[: 1 + len(EXPLAINERS)] == ["filip", *EXPLAINERS] and names[-1] == "uniform"
    q = A.phrase_queries(data)
    for name in EXPLAINERS:
        row = next(r for r in table.rows if r["name"] == name)
        maps = torch.cat([
            explain_pairs(backbone, name, [data.samples[int(j)].image], [text]).maps
            for j, text in zip(q.image, q.texts, strict=True)
        ])
        scores = grounding_scores(maps, data.geometry, q.boxes)
        for key in ("pointing", "mean_iou", "hit@0.5"):
            assert row[key] == pytest.approx(scores[key], abs=1e-6), (name, key)
        hits = pointing_hits(maps, data.geometry, q.boxes)[q.shared_colour]
        if hits.numel():
            assert row["pointing_shared_colour"] == pytest.approx(float(hits.double().mean()))
        assert row["method"] == EXPLAINERS[name].label
        assert row["ms_per_phrase"] > 0


def test_browse_offers_the_explainers_as_columns(suite, tmp_path) -> None:
    data = EvalSet.build(suite.backbone, 3, "test", 0, str(tmp_path))
    sizes = torch.tensor([[80, 80]]).expand(3, 2)
    table = B.browse_table(suite, data, B.world_queries(data), sizes,
                           lambda j: data.samples[j].image, methods=("filip",),
                           explainers=explainers_needed(["filip", "legrad"]))
    assert explainers_needed(["filip", "conceptot"]) == ()
    assert table.methods == ("filip", *EXPLAINERS)
    images = [table.load_image(it.image) for it in table.items]
    phrases = [it.phrase for it in table.items]
    for k, name in enumerate(EXPLAINERS, start=1):
        expected = explain_pairs(suite.backbone, name, images, phrases).maps.float()
        assert torch.allclose(table.heatmaps[:, k], expected, atol=1e-6), name
        assert B.method_label(name) == EXPLAINERS[name].label
    assert B.method_label("filip") == "FILIP"
