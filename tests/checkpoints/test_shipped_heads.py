"""The shipped method heads (``checkpoints/heads/<method>``) load on the shipped tiny CLIP,
score world pairs, and each has a manifest entry saying how it was made and measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.heads import head_meta
from otviz.checkpoints.identity import backbone_fingerprint
from otviz.checkpoints.manifest import read_manifest
from otviz.eval.world_set import EvalSet
from otviz.suite import ALIGN_METHODS, MethodSuite
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT

HEADS = DEFAULT_CHECKPOINT.parent / "heads"
MANIFEST = DEFAULT_CHECKPOINT.parent / "manifest.json"


@pytest.fixture(scope="module")
def backbone() -> Backbone:
    torch.set_num_threads(1)
    return Backbone.from_checkpoint()


@pytest.fixture(scope="module")
def suite(backbone: Backbone) -> MethodSuite:
    return MethodSuite.from_heads(backbone, HEADS)


def test_every_head_loads_on_the_shipped_backbone_and_scores(
    backbone: Backbone, suite: MethodSuite, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data = EvalSet.build(backbone, 4, "test", 0, str(tmp_path_factory.mktemp("cache")))
    images, negatives, _ = data.dataset.negative_items()
    idx = torch.arange(4)
    for name in ALIGN_METHODS:
        entry = suite.methods[name]
        assert entry.space == "width" and entry.source == str(HEADS / name)
        with torch.no_grad():
            pos = entry.method(data.pairs(idx, data.positives, "width"))
            neg = entry.method(data.pairs(images, negatives, "width"))
        assert torch.isfinite(pos.local_score).all() and torch.isfinite(neg.local_score).all()
        assert pos.local_score.shape == (4,) and pos.global_score.shape == (4,)
        # the frozen global score is the backbone's pooled cosine
        img, txt = data.global_embeddings()
        torch.testing.assert_close(
            pos.global_score, torch.nn.functional.cosine_similarity(img, txt, dim=-1),
            rtol=1e-4, atol=1e-4)


def test_heads_are_small_and_recorded_in_the_manifest(backbone: Backbone) -> None:
    weights = backbone_fingerprint(backbone)["weights"]
    entries = read_manifest(MANIFEST)["checkpoints"]
    for name in ALIGN_METHODS:
        folder = HEADS / name
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
        assert sum(p.stat().st_size for p in folder.iterdir()) < 2_000_000
        meta = head_meta(folder)
        assert meta["backbone"]["weights"] == weights
        entry = entries[f"heads/{name}"]
        assert entry["command"].startswith("otviz train --method ")
        assert entry["backbone"]["weights"] == weights
        assert entry["wall_time_s"] > 0 and entry["train_metrics"]["steps"] > 0
        assert {"avg_r1", "probe_overall", "pointing_game"} <= set(entry["eval"])
        assert entry["eval"]["command"].startswith("otviz eval")


def test_a_head_refuses_another_backbone(tmp_path: Path) -> None:
    from otviz.checkpoints.store import CheckpointError
    from tests.helpers import random_tiny_clip

    other = Backbone.from_checkpoint(random_tiny_clip(tmp_path / "bb", 5))
    with pytest.raises(CheckpointError, match="trained on backbone"):
        MethodSuite.from_heads(other, HEADS, ("conceptot",))
