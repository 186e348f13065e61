"""A non-ViT backbone end to end: a random ModifiedResNet saved to a local weight file,
loaded by ``--pretrained FILE`` (open_clip's loading, no download, no misleading "initialized
randomly" notice), heads trained on it by ``otviz train`` and taken by the app's context."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.heads import head_meta
from otviz.cli import main
from otviz.suite import WORLD_FIT_CAPTIONS
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT, create_tiny_clip
from otviz.towers.shrunken import register_shrunken
from otviz.ui.context import SEPARATOR, AppContext, BackboneChoice, HeadSet

RANDOM_NOTICE = "initialized randomly"
SMALL = ["--n-train", "8", "--batch-size", "4", "--max-steps", "2", "--concept-dim", "16",
         "--threads", "1", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def resnet_file(tmp_path_factory, hf_dir) -> tuple[str, Path]:
    """``(model name, weight file)`` of a random shrunken RN50."""
    name = register_shrunken("RN50", hf_dir)
    torch.manual_seed(3)
    model = open_clip.create_model(name, pretrained=None)
    path = tmp_path_factory.mktemp("rn") / "rn50-random.pt"
    torch.save(model.state_dict(), path)
    return name, path


def test_a_local_weight_file_loads_quietly(resnet_file, caplog):
    name, path = resnet_file
    with caplog.at_level(logging.WARNING):
        bb = Backbone.from_pretrained(name, str(path))
    assert not [r for r in caplog.records if RANDOM_NOTICE in r.getMessage()]
    saved = torch.load(path, weights_only=True)
    for key, value in bb.model.state_dict().items():
        torch.testing.assert_close(value, saved[key])


def test_the_tiny_clip_checkpoint_loads_quietly_but_a_random_init_still_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        Backbone.from_checkpoint(DEFAULT_CHECKPOINT)
    assert not [r for r in caplog.records if RANDOM_NOTICE in r.getMessage()]
    with caplog.at_level(logging.WARNING):
        create_tiny_clip()
    assert [r for r in caplog.records if RANDOM_NOTICE in r.getMessage()]
    logging.getLogger().warning("an unrelated warning")  # other records still pass
    assert caplog.records[-1].getMessage() == "an unrelated warning"


def test_heads_trained_on_a_resnet_load_in_the_app(resnet_file, tmp_path):
    name, path = resnet_file
    heads = tmp_path / "heads"
    argv = ["train", "--method", "dense_uot", *SMALL, "--open-clip-model", name, "--pretrained",
            str(path), "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "runs"),
            "--publish", str(heads)]
    assert main(argv) == 0
    meta = head_meta(heads / "dense_uot")
    assert meta["backbone"]["tags"] == {"model_name": name, "pretrained": str(path)}
    label = f"{name} / {path.name}"
    ctx = AppContext([BackboneChoice(label, lambda: Backbone.from_pretrained(name, str(path)),
                                     WORLD_FIT_CAPTIONS, name, str(path))])
    ctx.head_sets.append(HeadSet("trained", label, {"dense_uot": heads / "dense_uot"}))
    suite = ctx.suite(f"{label}{SEPARATOR}trained")
    assert suite.methods["dense_uot"].space == "width"
    explainer = ctx.explainer(label)
    image = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    encoded = explainer.encode(image, "a small red circle")
    run = explainer.align(encoded, suite, ["dense_uot"])["dense_uot"]
    assert run.alignment.row_marginal.shape == (1, 4)  # the 2 x 2 map of layer4
    assert torch.isfinite(run.alignment.local_score).all()
