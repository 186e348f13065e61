"""The trust metrics on known answers: a map that is the gold region localises perfectly,
Quantus' pointing game is otviz's own, a flat map fails the randomisation test by
construction, deletion ranks the region a model reads first, and the table has every row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from otviz.backbone import Backbone
from otviz.eval.grounding_metrics import pointing_hits
from otviz.eval.trust import adapter as T
from otviz.eval.trust.metrics import (
    TABLE_METRICS,
    TrustSettings,
    rank_similarity,
    trust_scores,
)
from otviz.eval.trust.table import MODEL_FREE, trust_tables, verdict
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from tests.helpers import random_tiny_clip, world_trust_inputs

FAST = TrustSettings(regions=3, fc_runs=3, ms_samples=2, mprt_blocks=1)


class FixedMaps(T.HeatmapSource):
    """A source whose maps are given: ``maps[target]`` ``[P, N]`` whatever the model."""

    kind = "baseline"

    def __init__(self, maps: Tensor) -> None:
        super().__init__("fixed", "Fixed")
        self.maps = maps

    def patch_maps(self, scorer, pixels: Tensor, targets: Tensor) -> Tensor:
        return self.maps[targets]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Backbone:
    torch.set_num_threads(1)
    return Backbone.from_checkpoint(random_tiny_clip(tmp_path_factory.mktemp("bb") / "bb", 4))


@pytest.fixture(scope="module")
def inputs(backbone) -> T.TrustInputs:
    return world_trust_inputs(backbone, seed=1, n=3)


def _patch_masks(inputs: T.TrustInputs) -> Tensor:
    """Each token's value in the gold masks, read at the pixel its token looks at."""
    x, y = inputs.scorer.geometry.centres().floor().long().T
    return torch.as_tensor(inputs.masks[:, 0])[:, y, x]


def test_the_gold_region_as_map_localises_perfectly(backbone, inputs) -> None:
    gold = _patch_masks(inputs).double()
    assert bool((gold.sum(1) > 0).all())
    scores = trust_scores(inputs.scorer, FixedMaps(gold), inputs.pixels, inputs.targets,
                          inputs.masks, FAST, metrics=["pointing", "mass", "rank", "auc"])
    for key in ("pointing", "mass", "rank", "auc"):
        assert np.allclose(scores.values[key], 1.0), key


def test_quantus_pointing_is_ours_on_maps_without_ties(backbone, inputs) -> None:
    torch.manual_seed(0)
    n = backbone.grid[0] * backbone.grid[1]
    maps = torch.rand(len(inputs.targets), n, dtype=torch.float64)
    scores = trust_scores(inputs.scorer, FixedMaps(maps), inputs.pixels, inputs.targets,
                          inputs.masks, FAST, metrics=["pointing"])
    scorer = inputs.scorer
    boxes = torch.tensor([T.box_to_model_pixels(p.box, (80, 80), scorer.geometry.size,
                                                scorer.preprocess)
                          for p in inputs.scorer.phrases], dtype=torch.float64)
    ours = pointing_hits(maps, inputs.scorer.geometry, boxes).double().numpy()
    assert 0 < ours.mean() < 1  # both hits and misses
    assert np.array_equal(scores.values["pointing"], ours)


def test_a_flat_map_fails_the_randomisation_test(backbone, inputs) -> None:
    sources = T.heatmap_sources({}, ())
    uniform = next(s for s in sources if s.name == "uniform")
    scores = trust_scores(inputs.scorer, uniform, inputs.pixels, inputs.targets, None, FAST,
                          metrics=["mprt", "random_logit"])
    assert np.allclose(scores.values["mprt"], 1.0)
    assert verdict(float(scores.values["mprt"].mean()), FAST) == MODEL_FREE
    flat, varying = np.ones((1, 16)), np.arange(16.0)[None]
    assert rank_similarity(flat, 2 * flat)[0] == 1.0
    assert rank_similarity(flat, varying)[0] == 0.0


class RegionMean(nn.Module):
    """A synthetic model: one class, the mean of the pixels in the top-left 8 x 8 corner."""

    grid = (4, 4)
    geometry = TokenGeometry.cell_centred((4, 4), (16, 16))

    def forward(self, pixels: Tensor) -> Tensor:
        return torch.as_tensor(pixels)[:, :, :8, :8].mean(dim=(1, 2, 3))[:, None]


def test_deletion_ranks_the_map_of_the_region_the_model_reads_first() -> None:
    rng = np.random.default_rng(0)
    pixels = rng.uniform(0.0, 0.2, size=(2, 3, 16, 16)).astype(np.float32)
    pixels[:, :, :8, :8] += 0.7  # the read region is bright: the baseline (mean) lowers it
    targets = np.zeros(2, dtype=np.int64)
    read = torch.zeros(2, 16, dtype=torch.float64)
    read[:, [0, 1, 4, 5]] = 1.0 + torch.arange(4, dtype=torch.float64) / 10  # top-left 2x2
    other = read.flip(1)  # the opposite corner
    settings = TrustSettings(regions=4, patch=4)
    model = RegionMean().eval()
    drop = {name: trust_scores(model, FixedMaps(maps), pixels, targets, None, settings,
                               metrics=["deletion", "insertion"]).values
            for name, maps in (("read", read), ("other", other))}
    assert (drop["read"]["deletion"] > 0.1).all()
    assert np.allclose(drop["other"]["deletion"], 0.0, atol=1e-6)
    assert (drop["read"]["insertion"] > drop["other"]["insertion"]).all()


def test_trust_table_rows_and_costs(backbone) -> None:
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip",))
    table, cost = trust_tables(suite, 2, seed=0, explainers=("legrad",), settings=FAST)
    assert [r["name"] for r in table.rows] == ["filip", "legrad", "colour_oracle",
                                               "centre_prior", "uniform"]
    for row in table.rows:
        if row["name"] in ("colour_oracle", "centre_prior", "uniform"):
            assert row["mprt"] == pytest.approx(1.0) and row["randomisation"] == MODEL_FREE
        assert row["ms_per_image"] > 0
        assert all(m.key in row for m in TABLE_METRICS)  # both pointing conventions
    assert [r["name"] for r in cost.rows] == ["maps", *(m.key for m in TABLE_METRICS)]
    assert all(cost.rows[k]["method"] > 0 for k in range(len(cost.rows)))
    assert any("deletion/insertion: 3 patches" in n for n in table.notes)


def test_eval_names_the_trust_table_only_on_request() -> None:
    from otviz.eval.runner import EvalConfig

    assert EvalConfig(tables="trust").table_names() == ["trust"]
    assert "trust" not in EvalConfig(tables="all").table_names()
    with pytest.raises(ValueError, match="trust"):
        EvalConfig(tables="trusty").table_names()


def test_mprt_shares_one_randomised_model_and_keeps_quantus_values(backbone, monkeypatch
                                                                    ) -> None:
    """MPRT draws the randomised model once per model for all its maps and scores each map
    exactly as Quantus' own ``MPRT(return_last_correlation=True)`` call, which draws it per
    map (the old path)."""
    import quantus

    from otviz.eval.trust.metrics import QUIET

    inputs = world_trust_inputs(backbone, seed=2, n=2)  # a model no other test randomised
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip",))
    n = backbone.grid[0] * backbone.grid[1]
    sources = [*T.heatmap_sources(suite.methods, ("legrad",))[:2],
               FixedMaps(torch.rand(len(inputs.targets), n, dtype=torch.float64,
                                    generator=torch.Generator().manual_seed(0)))]
    resets = []
    reset = T.RandomisedBlock.reset_parameters
    monkeypatch.setattr(T.RandomisedBlock, "reset_parameters",
                        lambda self: (resets.append(self), reset(self))[1])
    settings = TrustSettings(seed=3)
    ours = [trust_scores(inputs.scorer, s, inputs.pixels, inputs.targets, None, settings,
                         metrics=["mprt"]) for s in sources]
    assert len(resets) == len(inputs.scorer.units) >= 1  # once for the three maps
    for source, scores in zip(sources, ours, strict=True):
        reference = quantus.MPRT(similarity_func=rank_similarity, layer_order="top_down",
                                 seed=settings.seed, return_last_correlation=True, **QUIET)(
            model=inputs.scorer, x_batch=inputs.pixels, y_batch=inputs.targets,
            a_batch=scores.maps, channel_first=True, softmax=False, explain_func=source)
        assert np.array_equal(scores.values["mprt"], np.asarray(reference)), source.name
    assert len(resets) == 4 * len(inputs.scorer.units)  # Quantus: once per map
    assert not np.allclose(ours[0].values["mprt"], 1.0)  # a map that does change


def test_the_randomised_copy_shares_the_text_side_and_scores_as_a_full_copy(backbone,
                                                                          monkeypatch) -> None:
    """MPRT's copy of the model (:meth:`~otviz.eval.trust.adapter.PhraseScorer.__deepcopy__`)
    shares the text tower and the tokenizer, copies the image tower, leaves the model it
    copied untouched, and scores every kind of map (a method's, an explainer's reading
    ``model.visual``) exactly as a copy of everything does."""
    import copy

    from otviz.eval.trust import metrics as M

    inputs = world_trust_inputs(backbone, seed=5, n=2)
    scorer, model = inputs.scorer, inputs.scorer.backbone.model
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip",))
    sources = T.heatmap_sources(suite.methods, ("legrad",))[:2]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    twin = copy.deepcopy(scorer)
    twin_model = twin.backbone.model
    assert twin_model is not model and twin_model.visual is not model.visual
    assert twin.backbone.words is scorer.backbone.words
    text = [name for name, _ in model.named_parameters() if not name.startswith("visual.")]
    assert text and all(twin_model.get_parameter(n) is model.get_parameter(n) for n in text)
    assert all(twin_model.get_parameter(n) is not p for n, p in model.visual.named_parameters(
        prefix="visual"))
    assert twin.backbone.image_tower.visual is twin_model.visual  # the adapter reads the copy

    def mprt() -> list[np.ndarray]:
        M._RANDOMISED.clear()
        return [trust_scores(scorer, s, inputs.pixels, inputs.targets, None, FAST,
                             metrics=["mprt"]).values["mprt"] for s in sources]

    shared = mprt()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    monkeypatch.delattr(T.PhraseScorer, "__deepcopy__")  # the default: a copy of everything
    assert all(np.array_equal(a, b) for a, b in zip(shared, mprt(), strict=True))
    assert not all(np.allclose(v, 1.0) for v in shared)  # maps that do change
