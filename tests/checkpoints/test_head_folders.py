"""Folders of published heads (``otviz/checkpoints/head_folders.py``): grouped by weights and
reading, named without their server folders, their provenance read from what the heads
and the publishing manifest record, and the one weights message."""

from __future__ import annotations

import calendar
import os
from pathlib import Path

import pytest

from otviz.checkpoints.head_folders import (
    describe_weights,
    folder_name,
    provenance,
    published,
    read_head_folder,
    weights_mismatch,
)
from otviz.checkpoints.heads import save_method_checkpoint
from otviz.checkpoints.manifest import update_manifest
from otviz.checkpoints.store import CheckpointError
from otviz.methods.base import METHODS, MethodConfig


def _identity(weights: str = "a" * 32, **choice) -> dict:
    return {"weights": weights, "name": "ViT-B-16",
            "tags": {"model_name": "ViT-B-16", "pretrained": "/home/me/clip/vit-b-16.pt"},
            "space": "width", "context_length": 77, "grid": [14, 14], **choice}


def _head(path: Path, method: str, identity: dict, steps: int, data: str = "world",
          n_train: int = 500) -> Path:
    head = METHODS[method](8, 8, MethodConfig(trainable=True, concept_dim=8, rank=4))
    return save_method_checkpoint(path, head, identity,
                                  train_config={"data": data, "n_train": n_train},
                                  metrics={"steps": steps})


def test_a_folder_is_grouped_by_weights_and_reading(tmp_path):
    root = tmp_path / "published"
    _head(root / "conceptot", "conceptot", _identity(features="clearclip"), 30)
    _head(root / "filip", "filip", _identity(features="clearclip"), 10)
    _head(root / "filip-336" / "head", "filip", _identity(features="clearclip",
                                                          image_size=336), 10)
    _head(root / "filip-again", "filip", _identity(features="clearclip"), 12)
    _head(root / "other", "qc_align", _identity("b" * 32), 5)
    (root / "notes").mkdir()  # not a head: skipped
    groups = read_head_folder(root)
    assert [(sorted(g.heads), g.backbone.get("features"), g.backbone.get("image_size"),
             g.backbone["weights"][0]) for g in groups] == [
        (["conceptot", "filip"], "clearclip", None, "a"),
        (["filip"], "clearclip", 336, "a"),
        (["filip"], "clearclip", None, "a"),  # a method twice starts another group
        (["qc_align"], None, None, "b"),  # other weights (features unrecorded: last)
    ]
    assert groups[1].heads["filip"] == root / "filip-336" / "head"
    assert {g.name for g in groups} == {"published"}


def test_heads_under_a_snapshots_heads_folder_are_found_and_named_by_repository(tmp_path):
    snapshot = tmp_path / "hub" / "models--me--my-heads" / "snapshots" / "0123abc"
    _head(snapshot / "heads" / "filip", "filip", _identity(), 3)
    groups = read_head_folder(snapshot)
    assert len(groups) == 1 and groups[0].name == "me/my-heads"
    assert folder_name(tmp_path / "hub") == "hub"


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_a_folder_without_heads_is_refused_by_its_name(tmp_path, where):
    target = tmp_path / "server-only" / where
    if where == "empty":
        target.mkdir(parents=True)
    elif where == "file":
        target.parent.mkdir(parents=True)
        target.write_text("x")
    with pytest.raises(CheckpointError) as caught:
        read_head_folder(target)
    assert str(caught.value).startswith(f"{where}: ")
    assert str(tmp_path) not in str(caught.value)


def test_provenance_reads_data_steps_reading_and_the_manifests_date(tmp_path):
    root = tmp_path / "heads"
    a = _head(root / "filip", "filip", _identity(features="layer:6", image_size=336), 62)
    b = _head(root / "conceptot", "conceptot", _identity(features="layer:6", image_size=336),
              186)
    update_manifest(tmp_path / "manifest.json", "heads/filip", {"created": "2026-11-26T13:56:09Z"})
    update_manifest(tmp_path / "manifest.json", "heads/conceptot",
                    {"created": "2026-11-28T01:00:00Z"})
    made = provenance({"filip": a, "conceptot": b})
    assert made.text == ("world, 500 pairs, 62-186 steps, features layer:6 at 336 px, "
                         "2026-11-26 to 2026-11-28")
    c = _head(tmp_path / "loose" / "qc", "qc_align", _identity(), 7,
              data="/srv/data/coco/captions_train.json")
    stamp = calendar.timegm((2026, 6, 1, 12, 0, 0))
    os.utime(c / "config.json", (stamp, stamp))  # no manifest: the file's date
    assert published(c) == "2026-06-01"
    assert provenance({"qc_align": c}).text == "captions_train.json, 7 steps, features last, " \
                                               "2026-06-01"
    assert provenance({"gone": tmp_path / "gone"}).text == ""


def test_the_weights_message_names_both_by_file_and_hash():
    trained, loaded = _identity("1a2b3c4d" + "0" * 24), _identity("5e6f7a8b" + "0" * 24)
    assert describe_weights(trained) == "ViT-B-16 / vit-b-16.pt with weights 1a2b3c4d"
    assert weights_mismatch(trained, trained, "x") is None
    assert weights_mismatch({}, loaded, "x") is None  # nothing recorded: loading decides
    message = weights_mismatch(trained, loaded, "ViT-B-16 / other.pt (local weight file)")
    assert message.startswith(
        "These heads were trained on ViT-B-16 / vit-b-16.pt with weights 1a2b3c4d, but this "
        "entry loads ViT-B-16 / other.pt (local weight file) with weights 5e6f7a8b: ")
    assert "/home/me" not in message and "otviz " not in message
