"""The backbone-quality measurements (issue 9): each metric against a reference on
constructed inputs, and the benchmark script end to end on a random tiny CLIP."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from otviz import assets
from otviz.eval.backbone_quality import target_rows, targets
from otviz.eval.binding import (
    BindingItem,
    binding_results,
    conflict_pair,
    peak_shares,
)
from otviz.eval.grounding_baselines import (
    centre_prior_heatmaps,
    colour_oracle_heatmaps,
    colour_shared,
)
from otviz.eval.grounding_metrics import peak_locations, pointing_hits
from otviz.eval.patch_probe import (
    ObjectFeatures,
    box_pooled,
    box_weights,
    linear_probe_accuracy,
)
from otviz.eval.single_object import candidates, describe
from otviz.eval.world_set import world_config_of
from otviz.patch_grid.tokens import TokenGeometry
from otviz.world import COLOURS, SHAPES, SceneObject, WorldConfig
from otviz.world.render import render_scene
from tests.helpers import ROOT


def test_peak_locations_on_hand_made_heatmaps() -> None:
    """2 x 2 grid on an 80 x 40 image: patch centres (20, 10), (60, 10), (20, 30), (60, 30)."""
    heat = torch.tensor([[0.0, 5.0, 1.0, 1.0],   # peak (60, 10): in box B
                         [9.0, 0.0, 0.0, 0.0],   # peak (20, 10): in box A
                         [0.0, 0.0, 0.0, 3.0],   # peak (60, 30): in neither
                         [2.0, 2.0, 2.0, 2.0],   # flat: no peak
                         [4.0, 4.0, 0.0, 4.0]])  # a 3-way tie: A, B, neither
    boxes = torch.tensor([[[0, 0, 40, 20], [40, 0, 80, 20]]] * 5, dtype=torch.float64)
    loc = peak_locations(heat, TokenGeometry.cell_centred((2, 2), (80, 40)), boxes)
    third = 1 / 3
    expected = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [third, third, third, 0]]
    assert torch.allclose(loc, torch.tensor(expected, dtype=torch.float64))
    assert peak_shares(loc[:4]) == {"on_a": 0.25, "on_b": 0.25, "elsewhere": 0.25,
                                    "no_peak": 0.25}
    assert peak_shares(loc[4:]) == pytest.approx({"on_a": third, "on_b": third,
                                                  "elsewhere": third, "no_peak": 0.0})
    # the first box wins where boxes overlap; pointing_hits agrees with box 0, the flat map
    # scoring the chance of a random token (1 of 4 centres in box A), the tie its share in A
    assert pointing_hits(heat, TokenGeometry.cell_centred((2, 2), (80, 40)),
                         boxes[:, 0]).tolist() == pytest.approx([0.0, 1.0, 0.0, 0.25, third])
    overlap = torch.tensor([[[0, 0, 80, 20], [40, 0, 80, 20]]], dtype=torch.float64)
    assert peak_locations(heat[:1], TokenGeometry.cell_centred((2, 2), (80, 40)),
                          overlap).tolist() == [[1.0, 0.0, 0.0, 0.0]]


def _objects() -> list[SceneObject]:
    return [SceneObject("circle", "red", "large", (4, 4, 32, 32)),
            SceneObject("square", "blue", "large", (44, 44, 72, 72)),
            SceneObject("square", "red", "small", (48, 6, 64, 22))]


def test_colour_oracle_points_to_unique_colours_and_halves_on_shared_ones() -> None:
    """On a rendered scene the oracle's peak lies on the only object of a unique colour; two
    red objects share one oracle map, whose (tied) peak lies on one or the other: their
    expected hits sum to 1 (50 % on average)."""
    objects = _objects()
    image = render_scene(objects, np.random.default_rng(0), WorldConfig())
    boxes = torch.tensor([o.box for o in objects], dtype=torch.float64)
    geometry = TokenGeometry.cell_centred((10, 10), (80, 80))
    heat = colour_oracle_heatmaps([image] * 3, [o.colour for o in objects], geometry)
    hits = pointing_hits(heat, geometry, boxes)
    assert hits[1] == 1  # blue: unique
    assert float(hits[[0, 2]].sum()) == pytest.approx(1)  # red: shared, the same map
    assert [colour_shared(types.SimpleNamespace(objects=objects), k) for k in range(3)] == [
        True, False, True]
    # a patch inside the blue square is (almost) all blue; background is not blue
    assert heat[1].max() > 0.9 and heat[1].reshape(10, 10)[0, 0] == 0


def test_centre_prior_and_uniform_map() -> None:
    geometry = TokenGeometry.cell_centred((10, 10), (80, 80))
    heat = centre_prior_heatmaps(2, geometry)
    centred = torch.tensor([[28, 28, 52, 52], [0, 0, 20, 20]], dtype=torch.float64)
    # the four central patches tie at the top, all four inside the centred box
    assert pointing_hits(heat, geometry, centred).tolist() == [1.0, 0.0]
    assert int(heat[0].argmax()) == 44 and heat[0, 44] == heat[0, 55]
    # the uniform map (flat): a box over exactly 3 x 2 patch centres, 6 of 100 patches
    boxes = torch.tensor([[8, 16, 32, 32]], dtype=torch.float64)
    flat = torch.ones(1, geometry.n)
    assert pointing_hits(flat, geometry, boxes).tolist() == [pytest.approx(0.06)]


def test_box_weights_and_pooling() -> None:
    """An 8-px-aligned box covers its cells fully; a box over half a cell weighs it 0.5."""
    w = box_weights(torch.tensor([[8, 0, 24, 8], [0, 0, 4, 8]]),
                    TokenGeometry.cell_centred((2, 4), (32, 16)))
    assert w[0].tolist() == [0, 1, 1, 0, 0, 0, 0, 0]
    assert w[1].tolist() == [0.5, 0, 0, 0, 0, 0, 0, 0]
    patches = torch.arange(16.0).reshape(2, 8, 1).double()
    pooled = box_pooled(patches, w)
    assert pooled[:, 0].tolist() == [1.5, 8.0]


def test_linear_probe_separable_and_scene_split() -> None:
    rng = np.random.default_rng(0)
    n = 120
    shapes = [SHAPES[k % 4] for k in range(n)]
    colours = [COLOURS[k % 3] for k in range(n)]
    onehot = np.eye(4)[[k % 4 for k in range(n)]]
    noise = rng.normal(size=(n, 4))
    objects = ObjectFeatures(np.concatenate([onehot * 5, noise], 1), shapes, colours,
                             np.arange(n) // 2)
    shape = linear_probe_accuracy(objects, "shape")
    assert shape["accuracy"] == 1.0 and shape["n_train"] == 84 and shape["n_test"] == 36
    colour = linear_probe_accuracy(objects, "colour")  # colour is not in the features
    assert colour["accuracy"] < 0.7
    with pytest.raises(ValueError):
        linear_probe_accuracy(objects, "size")


def test_conflict_pair_and_captions() -> None:
    objects = _objects()
    # red circle with blue square: a "large blue circle" is not in the scene
    assert conflict_pair(objects) == (0, 1)
    same_colour = [objects[0], objects[2]]
    assert conflict_pair(same_colour) is None
    # B's colour on A's shape and size already exists: no conflicting caption
    taken = [objects[0], objects[1], SceneObject("circle", "blue", "large", (40, 4, 68, 32))]
    assert conflict_pair(taken) == (1, 0)  # square in red: no large red square
    item = BindingItem(0, np.zeros((80, 80, 3), np.uint8), objects[0], objects[1])
    assert item.caption("true") == ("a large red circle",
                                    {"size": 1, "colour": 2, "shape": 3})
    assert item.caption("conflicting")[0] == "a large blue circle"


def test_binding_results_with_a_source_of_known_peaks() -> None:
    """A source that puts the shape word on A and every other word on B."""
    objects = _objects()
    items = [BindingItem(i, np.zeros((80, 80, 3), np.uint8), objects[0], objects[1])
             for i in range(3)]

    def source(images, captions, roles):
        out = {}
        for role in roles:
            heat = torch.zeros(len(captions), 100, dtype=torch.float64)
            heat[:, 11 if role == "shape" else 77] = 1.0  # cell (1,1) in A, (7,7) in B
            out[role] = heat
        return out

    res = binding_results(items, source, TokenGeometry.cell_centred((10, 10), (80, 80)))
    for kind in ("true", "conflicting"):
        assert res[kind]["shape"]["on_a"] == 1.0
        assert res[kind]["colour"]["on_b"] == 1.0 and res[kind]["size"]["on_b"] == 1.0


def test_zero_shot_candidates_differ_only_in_the_asked_attribute() -> None:
    obj = SceneObject("star", "green", "small", (0, 0, 16, 16))
    shape, truth = candidates("shape", obj)
    assert len(shape) == 8 and shape[truth].shape == "star"
    assert {(d.colour, d.size) for d in shape} == {("green", "small")}
    colour, truth = candidates("colour", obj)
    assert len(colour) == 8 and {d.shape for d in colour} == {"star"}
    assert len(candidates("size", obj)[0]) == 2
    pairs, truth = candidates("colour_shape", obj)
    assert len(pairs) == 64 and (pairs[truth].colour, pairs[truth].shape) == ("green", "star")
    assert describe(pairs[truth], "world") == "a green star"
    assert describe(shape[0], "clip") == "a photo of a small green circle"


def test_world_config_of_reads_the_recorded_world() -> None:
    recorded = {"image_size": 112, "small_px": [18, 24], "large_px": [34, 42], "negatives": False,
                "not_a_field_here": 3}
    cfg = world_config_of(types.SimpleNamespace(info={"world_config": recorded}))
    assert (cfg.image_size, cfg.small_px, cfg.large_px, cfg.negatives) == (
        112, (18, 24), (34, 42), True)
    assert world_config_of(types.SimpleNamespace(info={})) == WorldConfig()


def test_targets_compare_values_with_their_bars() -> None:
    results = {"zero_shot": {"world": {"shape": 0.95, "colour": 0.5}},
               "grounding": {"rows": [
                   {"name": "dense_uot", "pointing_shared_colour": 0.6},
                   {"name": "colour_oracle", "pointing_shared_colour": 0.6}]}}
    rows = {r["target"]: r for r in target_rows(results)}
    assert rows["zero-shot shape (world phrasing)"]["met"] is True
    assert rows["zero-shot colour (world phrasing)"]["met"] is False
    assert rows["zero-shot size (world phrasing)"]["met"] is None  # not measured
    strict = rows["Dense UOT: pointing, colour not unique (bar: colour oracle)"]
    assert strict["met"] is False and strict["bar"] == 0.6  # must exceed the oracle
    assert len(rows) == len(targets())


def test_script_end_to_end_on_a_random_tiny_clip(tmp_path: Path) -> None:
    """Quick mode with few samples on a random backbone: the shipped heads do not load
    for it, so the methods fall back to training-free and the results say so."""
    from tests.helpers import random_tiny_clip

    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location(
        "backbone_quality_script", ROOT / "benchmarks" / "backbone_quality.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "bq"
    results = script.main([
        "--backbone", str(random_tiny_clip(tmp_path / "bb", 0)),
        "--heads", str(assets.path("heads")), "--quick", "--out", str(out),
        "--cache-dir", str(tmp_path / "cache"), "--world-speed-count", "10",
        "--n-zero-shot", "16", "--n-probe-scenes", "24", "--n-binding", "4",
        "--n-grounding", "6", "--n-retrieval", "12", "--n-compositional", "10"])
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["quick"] and written["binding"]["n_scenes"] == 4
    assert "Backbone quality" in out.with_suffix(".md").read_text()
    assert all(s.startswith("training-free (head does not load")
               for s in results["method_sources"].values())
    for form in ("world", "clip"):
        assert set(written["zero_shot"][form]) >= {"shape", "colour", "size", "colour_shape"}
        assert all(0.0 <= v <= 1.0 for v in written["zero_shot"][form].values())
    names = [r["name"] for r in written["grounding"]["rows"]]
    assert names == ["dense_uot", "conceptot", "colour_oracle", "centre_prior", "uniform"]
    assert {"words_view", "filip"} <= set(written["binding"]["methods"])
    assert written["world_speed"]["count"] == 10
    assert all(r["met"] is not None for r in written["targets"])
