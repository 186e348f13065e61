"""Heads started from the backbone (otviz.methods.start): the model's projection read as an
affine map, step 0 equal to the training-free configuration for every method, the update
that trains, and the round trip through a head checkpoint."""

from __future__ import annotations

import dataclasses
from functools import cache
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from otviz.backbone import Backbone
from otviz.checkpoints.heads import load_method_checkpoint, save_method_checkpoint
from otviz.data.datasets import WorldDataset
from otviz.methods.base import MethodConfig, build_method
from otviz.methods.start import BackboneStart, StartedProjection, affine_map
from otviz.suite import ALIGN_METHODS, WORLD_FIT_CAPTIONS, MethodSuite
from otviz.train.config import TrainConfig
from otviz.train.loop import _start_method
from otviz.train.pairs import TensorPairs, backbone_start, requested_start


@cache
def _shipped() -> tuple[Backbone, object, object]:
    """The shipped backbone, its start and the width features of four world test pairs."""
    backbone = Backbone.from_checkpoint()
    world = WorldDataset(4, split="test", seed=0)
    items = [world.item(i) for i in range(4)]
    features = backbone.encode([im for im, _ in items], [c for _, c in items])
    return backbone, backbone_start(backbone, world=True), features


def test_affine_map_reads_an_affine_projection_and_refuses_a_layer_norm():
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    read = affine_map(linear, 6, torch.zeros(()))
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(read(x), linear(x), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="not an affine map"):
        affine_map(nn.Sequential(nn.LayerNorm(6), linear), 6, torch.zeros(()))


@pytest.mark.parametrize(
    ("name", "tether"),
    [(name, {}) for name in ALIGN_METHODS]
    + [("conceptot", {"anchor_hold": True}), ("conceptot", {"anchor_pull": 1.0})],
)
def test_step_zero_plan_is_the_training_free_plan(name, tether):
    """A head started from the backbone, before any step, gives the training-free plan and
    local score (same solver settings) on the same pairs: width features through the head,
    projected features through the training-free configuration; ConceptOT's too with its
    anchors held at or pulled toward the k-means anchors (otviz.train.anchor_tether)."""
    backbone, start, features = _shipped()
    config = TrainConfig(method=name, **tether)
    free_config = dataclasses.replace(config.method_config(), trainable=False)
    free = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS, (name,)).methods[name].method
    free.config = free_config
    source = TensorPairs.random(4, patch_dim=backbone.patch_dim, token_dim=backbone.token_dim)
    source.start = start
    head = _start_method(config, source).eval()
    with torch.no_grad():
        got = head(features.pair_batch())
        want = free(backbone.to_space(features, "projected").pair_batch())
    torch.testing.assert_close(got.plan.dense(), want.plan.dense(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.local_score, want.local_score, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("rank", [0, 3])
def test_the_update_trains_and_the_head_round_trips(tmp_path, rank):
    """The update starts at zero, takes a gradient, and a changed head loads back equal
    (base and update in the checkpoint)."""
    backbone, start, features = _shipped()
    config = TrainConfig(method="dense_uot", start_rank=rank)
    source = TensorPairs.random(4, patch_dim=backbone.patch_dim, token_dim=backbone.token_dim)
    source.start = start
    head = _start_method(config, source)
    proj = head.proj_v
    assert isinstance(proj, StartedProjection)
    update = proj.delta if rank == 0 else proj.up
    assert update is not None and float(update.detach().abs().max()) == 0.0
    batch = features.pair_batch()
    head(batch).local_score.sum().backward()
    assert float(update.grad.abs().max()) > 0
    with torch.no_grad():
        update.add_(0.01 * torch.randn_like(update))
    save_method_checkpoint(tmp_path / "head", head, backbone)
    loaded = load_method_checkpoint(tmp_path / "head", backbone)
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch).plan.dense(), head.eval()(batch).plan.dense())


def test_a_random_start_checkpoint_still_loads_with_its_own_projection(tmp_path):
    """Heads saved before the backbone start (no ``start`` in their config) load as the
    random-start heads they are."""
    backbone, _, features = _shipped()
    config = MethodConfig(concept_dim=8)
    head = build_method("filip", backbone.patch_dim, backbone.token_dim, config)
    save_method_checkpoint(tmp_path / "head", head, backbone)
    loaded = load_method_checkpoint(tmp_path / "head", backbone)
    assert loaded.config.start == "random" and loaded.proj_v.linear is not None
    batch = features.pair_batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch).local_score, head.eval()(batch).local_score)


def _stub_backbone(image_project: nn.Module) -> SimpleNamespace:
    """What :func:`backbone_start` reads of a backbone: the towers' projections and widths."""
    text = SimpleNamespace(project=nn.Linear(6, 4), width=6)
    return SimpleNamespace(model=SimpleNamespace(logit_scale=torch.zeros(())),
                           image_tower=SimpleNamespace(project=image_project, width=6),
                           text_tower=text)


def test_auto_starts_from_an_affine_backbone_and_random_from_a_layer_norm_one():
    """"auto" reads the backbone's projections where they are affine maps; where one is not
    (a layer norm inside, as CoCa's pooler), the run starts random instead of failing, while
    "backbone" asked for by name still refuses with the way out."""
    torch.manual_seed(0)
    affine = _stub_backbone(nn.Linear(6, 4))
    normed = _stub_backbone(nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 4)))
    assert isinstance(requested_start("auto", affine, world=False), BackboneStart)
    assert requested_start("auto", normed, world=False) is None
    assert requested_start("random", affine, world=False) is None
    with pytest.raises(ValueError, match="--start random or auto"):
        requested_start("backbone", normed, world=False)


@pytest.mark.parametrize(("has_start", "built"), [(True, "backbone"), (False, "random")])
def test_an_auto_head_records_the_start_it_was_built_with(tmp_path, has_start, built):
    backbone, start, _ = _shipped()
    source = TensorPairs.random(4, patch_dim=backbone.patch_dim, token_dim=backbone.token_dim)
    source.start = start if has_start else None
    head = _start_method(TrainConfig(method="dense_uot", start="auto"), source)
    assert head.config.start == built
    assert isinstance(head.proj_v, StartedProjection) is has_start
    save_method_checkpoint(tmp_path / "head", head, backbone)
    assert load_method_checkpoint(tmp_path / "head", backbone).config.start == built
