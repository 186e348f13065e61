"""BackboneSpec: the flags and config fields of every command give one frozen value whose
``build()`` is the backbone the old per-command code built (same fingerprint, same features),
bad fields are refused naming them before anything loads, and no module outside the
backbone's own builds a backbone itself."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.backbone_spec import BackboneSpec
from otviz.checkpoints.identity import backbone_fingerprint
from otviz.cli.explain import build_parser
from otviz.errors import UserInputError
from otviz.eval.config import EvalConfig
from otviz.eval.runner import eval_spec
from otviz.tiny_clip.model import register_tiny_clip
from otviz.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]

#: Modules that still call ``Backbone.from_pretrained`` / ``from_checkpoint`` themselves,
#: with the reason each must.
ALLOWED_CALLERS: dict[str, str] = {
    "otviz/backbone.py": "defines them",
    "otviz/backbone_spec.py": "the one place that builds a backbone",
}


def _same(a: Backbone, b: Backbone) -> None:
    """Same identity (weights hash, tags, reading) and the same patch features."""
    assert backbone_fingerprint(a) == backbone_fingerprint(b)
    torch.manual_seed(1)
    pixels = torch.rand(2, 3, a.image_size, a.image_size)
    ids = a.words(["a red circle", "two blue squares"]).ids
    with torch.no_grad():
        for x, y in zip(a.forward_tensors(pixels, ids), b.forward_tensors(pixels, ids),
                        strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("features, side", [("last", 0), ("layer:1", 0), ("sclip", 96)])
def test_train_config_builds_what_the_old_code_built(features, side):
    """TrainConfig's fields (the tiny CLIP, a reading) -> spec -> build equals the old
    ``from_checkpoint().with_features(...)`` of otviz/train/pairs.py."""
    config = TrainConfig(features=features, image_size=side)
    built = BackboneSpec.from_fields(config, device="cpu").build()
    old = Backbone.from_checkpoint().with_features(features, side or None, proxy=None)
    _same(built, old)
    assert built.image_size == (side or old.image_size)


def test_a_random_open_clip_model_by_name_builds_the_same_backbone():
    """``otviz train --open-clip-model NAME`` / ``otviz eval --dataset .. --model NAME``
    with random weights: the spec's backbone equals ``from_pretrained(NAME, None)`` built
    from the same seed, under both spellings of the field."""
    name = register_tiny_clip()
    torch.manual_seed(3)
    old = Backbone.from_pretrained(name, None).with_features("layer:1")
    torch.manual_seed(3)
    train = BackboneSpec.from_fields(TrainConfig(open_clip_model=name, features="layer:1"),
                                     device="cpu").build()
    torch.manual_seed(3)
    evaluated = eval_spec(EvalConfig(dataset="voc:x", model=name, features="layer:1")).build()
    _same(train, old)
    _same(evaluated, old)
    assert train.info == {"model_name": name, "pretrained": None}


def test_explain_flags_and_eval_fields_read_the_same_spec():
    """The one parser reads ``otviz explain``'s flags and EvalConfig's fields alike."""
    args = build_parser().parse_args(["--example", "0", "--features", "SCLIP",
                                      "--image-size", "96", "--checkpoint", "ck"])
    from_flags = BackboneSpec.from_fields(args)
    from_config = BackboneSpec.from_fields(EvalConfig(backbone="ck", features="sclip",
                                                      image_size=96))
    assert from_flags == from_config == BackboneSpec(checkpoint="ck", features="sclip",
                                                     image_size=96)
    world = eval_spec(EvalConfig(model="ViT-B-16", pretrained="openai"))
    assert world.model is None and world.pretrained is None  # the world's tables: tiny CLIP


def test_every_commands_flags_name_one_spec():
    """``otviz train --open-clip-model``, ``otviz eval --dataset .. --model`` and ``otviz
    explain --model`` (each command's own spelling, its config between) give equal specs."""
    from otviz.cli import evaluate, train
    from otviz.cli.args import dataclass_from_args

    reading = ["--features", "proxy", "--proxy", "vit_small_patch16_224.dino:random",
               "--image-size", "448"]
    weights = ["--pretrained", "openai"]
    trained = dataclass_from_args(TrainConfig, train.build_parser().parse_args(
        ["--open-clip-model", "ViT-B-16", *weights, *reading]))
    evaluated = dataclass_from_args(EvalConfig, evaluate.build_parser().parse_args(
        ["--dataset", "voc:x", "--model", "ViT-B-16", *weights, *reading]))
    explained = build_parser().parse_args(["--example", "0", "--model", "ViT-B-16",
                                           *weights, *reading])
    expected = BackboneSpec(model="ViT-B-16", pretrained="openai", features="proxy",
                            image_size=448, proxy="vit_small_patch16_224.dino:random")
    assert BackboneSpec.from_fields(trained, device="cpu") == expected
    assert eval_spec(evaluated) == expected
    assert BackboneSpec.from_fields(explained) == expected


def test_fingerprint_is_the_built_backbones_identity():
    spec = BackboneSpec(features="layer:-2")
    assert spec.fingerprint() == backbone_fingerprint(
        Backbone.from_checkpoint().with_features("layer:-2"))
    assert spec.fingerprint()["features"] == "layer:-2"


def test_frozen_and_hashable():
    spec = BackboneSpec(model="ViT-B-16", pretrained="openai")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.features = "sclip"  # type: ignore[misc]
    assert {spec: 1}[BackboneSpec(model="ViT-B-16", pretrained="openai")] == 1


@pytest.mark.parametrize("fields, named", [
    ({"model": "ViT-B-16", "checkpoint": "ck"}, "checkpoint:"),
    ({"pretrained": "openai"}, "pretrained:"),
    ({"model": "  "}, "model:"),
    ({"checkpoint": 3}, "checkpoint:"),
    ({"features": "layer:x"}, "features:"),
    ({"features": "dense"}, "features:"),
    ({"image_size": 0}, "image_size:"),
    ({"image_size": -16}, "image_size:"),
    ({"image_size": 96.0}, "image_size:"),
    ({"image_size": True}, "image_size:"),
    ({"features": "proxy"}, "proxy:"),
    ({"proxy": "vit_small_patch16_224.dino:random"}, "proxy:"),
    ({"device": ""}, "device:"),
    ({"device": "auto"}, "device:"),
    ({"device": None}, "device:"),
])
def test_bad_fields_refused_naming_them(fields, named):
    with pytest.raises(UserInputError) as e:
        BackboneSpec(**fields)
    assert str(e.value).startswith(named)


def test_feature_source_is_kept_in_its_canonical_text():
    assert BackboneSpec(features=" Layer:3 ").features == "layer:3"
    assert BackboneSpec(features="proxy", proxy="x:random").proxy == "x:random"


def _builders(tree: ast.AST) -> list[int]:
    """Lines of ``Backbone.from_pretrained`` / ``Backbone.from_checkpoint`` in ``tree``
    (called or passed on as a loader)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr in ("from_pretrained", "from_checkpoint")
            and isinstance(node.value, ast.Name) and node.value.id == "Backbone"]


def test_no_module_builds_a_backbone_but_the_spec():
    """Every command, the app, training, evaluation and the benchmarks build through
    BackboneSpec: no ``Backbone.from_pretrained`` / ``from_checkpoint`` elsewhere in the
    package, app.py or benchmarks/ (the allow-list says why where one stays)."""
    files = [*sorted((ROOT / "otviz").rglob("*.py")), ROOT / "app.py",
             *sorted((ROOT / "benchmarks").glob("*.py"))]
    found = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        lines = _builders(ast.parse(path.read_text(), rel))
        if lines and rel not in ALLOWED_CALLERS and not rel.startswith("otviz/towers/"):
            found[rel] = lines
    assert found == {}, "build these through otviz.backbone_spec.BackboneSpec"
