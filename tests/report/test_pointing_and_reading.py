"""The report's figures of pointing show both conventions, each named, with the eval code's
values of the same rows; and every figure the report draws names the reading (model,
features, input size) it was computed on, as ``otviz eval``'s table titles do."""

from __future__ import annotations

import pytest
import torch

from otviz.backbone import Backbone
from otviz.eval.alignment_tables import grounding_table, probe_table
from otviz.eval.grounding_metrics import TOLERANCE_PX
from otviz.eval.segmentation import reading
from otviz.eval.world_set import EvalSet
from otviz.report.render import grounding_examples_figure, table_figures
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from otviz.viz.tables import titled
from tests.helpers import random_tiny_clip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[MethodSuite, EvalSet]:
    """A training-free FILIP suite on a random tiny CLIP and 4 world test images."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("report")
    backbone = Backbone.from_checkpoint(random_tiny_clip(root / "bb", 3))
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip",))
    return suite, EvalSet.build(backbone, 4, "test", 0, str(root / "cache"))


def test_grounding_bars_show_both_pointing_conventions_with_the_eval_values(world) -> None:
    suite, data = world
    hits: dict[str, dict] = {}
    table = grounding_table(suite, data, phrase_hits=hits)
    table.title = titled(table.title, suite.backbone)  # as otviz eval titles it
    ax = table_figures({"grounding": table})["grounding"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    strict, tol = "Pointing (strict)", f"Pointing (±{TOLERANCE_PX:g} px)"
    assert labels[:2] == [strict, tol]
    bars = dict(zip(labels, ax.containers, strict=False))
    for label, key, hit in ((strict, "pointing", "hit"), (tol, "pointing_tol", "hit_tol")):
        heights = [b.get_height() for b in bars[label]]
        assert heights == pytest.approx([100 * r[key] for r in table.rows], abs=1e-9)
        # each row's value: the mean of its phrases' hits under that convention
        assert [r[key] for r in table.rows] == pytest.approx(
            [sum(hits[r["name"]][hit]) / len(hits[r["name"]][hit]) for r in table.rows])
    assert any(r["pointing_tol"] > r["pointing"] for r in table.rows)  # the two differ here
    assert reading(suite.backbone) in ax.get_title().replace("\n", " ")


def test_a_table_without_the_tolerant_column_draws_the_strict_one_only(world) -> None:
    suite, data = world
    table = grounding_table(suite, data)
    for row in table.rows:
        del row["pointing_tol"]
    ax = table_figures({"grounding": table})["grounding"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["Pointing (strict)", "mean IoU", "hit@0.5"]


def test_the_heatmap_grid_names_its_reading(world) -> None:
    suite, data = world
    fig = grounding_examples_figure(suite, data, 2)
    title = fig._suptitle.get_text().replace("\n", " ")
    backbone = suite.backbone
    assert reading(backbone) in title
    assert f"features {backbone.features}, {backbone.image_size} px input" in title


def test_the_probe_matrix_carries_its_table_s_title_and_reading(world) -> None:
    suite, data = world
    table = probe_table(suite, data)
    table.title = titled(table.title, suite.backbone)  # as otviz eval titles it
    fig = table_figures({"probe": table})["probe"]
    assert fig._suptitle.get_text().replace("\n", " ") == table.title
    assert reading(suite.backbone) in table.title
