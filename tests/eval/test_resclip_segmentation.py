"""``otviz eval --dataset voc:DIR --tables segmentation --features resclip``: ResCLIP (RCS +
SFR) against the set's class names. On a 12-block narrow random ViT (deep enough for RCS's
blocks 5-8): the table's rows equal, to the count, those of a run whose ``resclip-rcs``
patches are replaced by :func:`~otviz.towers.resclip_sfr.encode_with_classes` with the class
set built here from the prompt; the class set keys the features' identity (the cache, the
shard files); ``resclip`` is refused with the reason everywhere else."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from open_clip.factory import get_model_config

from otviz import cli
from otviz.backbone import Backbone
from otviz.checkpoints.identity import backbone_fingerprint, weights_hash
from otviz.cli import evaluate
from otviz.data.segmentation_sets import load_segmentation_set
from otviz.errors import UserInputError
from otviz.explainers.run import phrase_embeddings
from otviz.tiny_clip.model import register_tiny_clip
from otviz.towers.resclip_sfr import ClassSet, SfrSettings, encode_with_classes
from otviz.towers.shrunken import shrunken_config
from otviz.towers.sources import FeatureSource
from otviz.towers.vit import VitTower
from tests.eval.test_dataset_segmentation import _masks, write_voc

METHODS = "filip,dense_uot"


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random ViT-B/16 shrunk to width 64 on a 4 x 4 grid, with 12 blocks."""
    cfg = shrunken_config(get_model_config("ViT-B-16"), tmp_path_factory.mktemp("hf"))
    cfg["vision_cfg"]["layers"] = 12
    return register_tiny_clip(cfg, name="otviz-test-narrow-vit12")


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("voc") / "VOC2012"
    write_voc(root, _masks(rng), rng)
    return root


def _table(root: Path, model: str, features: str, tmp: Path, out: str) -> dict:
    argv = ["--dataset", f"voc:{root}", "--tables", "segmentation", "--methods", METHODS,
            "--explainers", "", "--threads", "1", "--quiet", "--model", model,
            "--features", features, "--cache-dir", str(tmp / f"cache-{out}"),
            "--out", str(tmp / out)]
    torch.manual_seed(0)  # the random weights: built first thing in the run
    assert evaluate.main(argv) == 0
    return json.loads((tmp / out / "segmentation.json").read_text())


def _counts(record: dict) -> dict[str, dict]:
    return {r["name"]: r for r in record["tables"]["segmentation"]["rows"]}


def test_table_reads_encode_with_classes(voc: Path, narrow: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    backbone = Backbone.from_pretrained(narrow, None)
    names = load_segmentation_set("voc", voc).names
    prompts = [f"a photo of a {n}." for n in ("background", *names)]  # VOC21: class 0
    classes = phrase_embeddings(backbone, prompts).detach()
    resclip = _table(voc, narrow, "resclip", tmp_path, "resclip")
    assert resclip["stamp"]["backbone_weights"] == weights_hash(backbone.model)
    table = resclip["tables"]["segmentation"]
    assert "features resclip" in table["title"]
    assert any("against background and the 20 class names" in n for n in table["notes"])
    own = VitTower._encode

    def direct(self: VitTower, pixels: torch.Tensor, source: FeatureSource):
        patches, pooled = own(self, pixels, source)
        if source.kind == "resclip-rcs":
            patches = encode_with_classes(self, pixels, classes)
        return patches, pooled

    with monkeypatch.context() as m:
        m.setattr(VitTower, "_encode", direct)
        reference = _table(voc, narrow, "resclip-rcs", tmp_path, "direct")
    plain = _table(voc, narrow, "resclip-rcs", tmp_path, "rcs")
    got, want, rcs = _counts(resclip), _counts(reference), _counts(plain)
    for name in METHODS.split(","):
        assert got[name] == want[name], name
    # the refinement changes some method's segmentation on this set
    assert any(got[n] != rcs[n] for n in METHODS.split(","))


def test_class_set_keys_the_identity(narrow: str) -> None:
    torch.manual_seed(0)
    backbone = Backbone.from_pretrained(narrow, None)
    a = phrase_embeddings(backbone, ["a photo of a cat.", "a photo of a dog."]).detach()
    b = phrase_embeddings(backbone, ["a photo of a cat.", "a photo of a bus."]).detach()
    rcs = backbone_fingerprint(backbone.with_features("resclip-rcs"))
    one = backbone_fingerprint(backbone.with_features("resclip", classes=ClassSet.of(a)))
    two = backbone_fingerprint(backbone.with_features("resclip", classes=ClassSet.of(b)))
    again = backbone_fingerprint(backbone.with_features("resclip", classes=ClassSet.of(a.clone())))
    assert one == again
    assert one["classes"] != two["classes"] and "classes" not in rcs
    assert {one["features"], rcs["features"]} == {"resclip", "resclip-rcs"}
    assert ClassSet.of(a) != ClassSet.of(a, SfrSettings(tau=1.0))  # the settings are keyed too
    # the view's patches are encode_with_classes's
    pixels = torch.randn(2, 3, 64, 64)
    view = backbone.with_features("resclip", classes=ClassSet.of(a))
    ids = backbone.words(["a cat", "a dog"]).ids
    patches = view.forward_tensors(pixels, ids)[0]
    assert torch.equal(patches, encode_with_classes(backbone.image_tower, pixels, a))


def test_resclip_refused_elsewhere(narrow: str, voc: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    world = ["eval", "--tables", "segmentation", "--features", "resclip", "--quiet", "--out", ""]
    assert cli.main(world) == 2  # the world's phrases are per caption: no fixed class set
    assert "needs a fixed class set" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a command whose --features never takes a class set
        cli.main(["explain", "x.png", "a", "--features", "resclip"])
    assert "needs a fixed class set" in capsys.readouterr().err
    backbone = Backbone.from_checkpoint()  # the tiny CLIP: too shallow for RCS
    with pytest.raises(UserInputError, match="needs a fixed class set"):
        backbone.with_features("resclip")
    classes = ClassSet.of(torch.randn(3, backbone.embed_dim))
    with pytest.raises(UserInputError, match="resclip-rcs"):
        backbone.with_features("resclip", classes=classes)
    with pytest.raises(UserInputError, match="read by resclip only"):
        backbone.with_features("naclip", classes=classes)
    torch.manual_seed(0)
    deep = Backbone.from_pretrained(narrow, None)
    with pytest.raises(UserInputError, match="class set"):
        deep.image_tower.encode(torch.randn(1, 3, 64, 64), FeatureSource("resclip"))
    with pytest.raises(UserInputError, match="resclip classes"):
        deep.with_features("resclip", classes=ClassSet.of(torch.randn(3, 5)))
