"""One feature choice (``Backbone.with_features``), honoured everywhere: the views' methods,
the explainers, the caches, ``otviz eval``, ``otviz explain`` and ``otviz train`` read the
chosen source (their maps differ from ``last`` and equal what the source's own features
give), and a head refuses a source it was not trained on."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.heads import head_meta, load_method_checkpoint
from otviz.checkpoints.identity import training_flags
from otviz.checkpoints.store import CheckpointError
from otviz.cli import main
from otviz.cli.args import dataclass_from_args
from otviz.cli.train import build_parser as train_parser
from otviz.data.datasets import WorldDataset
from otviz.data.feature_cache import FeatureCache
from otviz.errors import UserInputError
from otviz.eval.runner import read_tables
from otviz.explain import Explainer
from otviz.explainers import EXPLAINERS
from otviz.explainers.run import explain_pairs, unavailable
from otviz.methods import PairBatch
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite, load_head
from otviz.towers.sources import FeatureSource
from otviz.towers.vit import MAX_ATTENTION_BYTES
from otviz.train.config import TrainConfig
from otviz.ui.examples import load_examples
from tests.helpers import random_tiny_clip

SOURCE = "clearclip"


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    example = load_examples()[0]
    return Backbone.from_checkpoint(), str(example.image_path), example.caption


def test_every_method_of_the_views_reads_the_chosen_source(shipped):
    backbone, image, caption = shipped
    view = backbone.with_features(SOURCE)
    explainer = Explainer(backbone)
    last = explainer.encode(image, caption)
    explainer.backbone = view  # a change of source re-encodes once, then is cached
    chosen = explainer.encode(image, caption)
    assert chosen.key[:2] == last.key[:2] and chosen.key != last.key
    assert explainer.encode(image, caption) is chosen
    own, _ = view.image_tower.encode(view.image_tensor([image]), FeatureSource(SOURCE))
    assert torch.allclose(chosen.features.patches, own)
    assert not torch.allclose(chosen.features.patches, last.features.patches, atol=1e-3)
    suite = MethodSuite.training_free(view, WORLD_FIT_CAPTIONS)
    runs = explainer.align(chosen, suite, list(suite.methods))
    runs_last = Explainer(backbone).align(last, suite, list(suite.methods))
    select = chosen.token_select([0])
    for name, entry in suite.methods.items():
        reference = explainer.pair_batch(last, entry.space)  # text, regions, nodes: no image
        patches = own if entry.space == "width" else view.image_tower.project(own)
        batch = PairBatch(**{**vars(reference), "patches": patches})
        with torch.no_grad():
            expected = entry.method.phrase_patch_map(entry.method(batch), select)
        ours = entry.method.phrase_patch_map(runs[name].alignment, select)
        assert torch.allclose(ours, expected, atol=1e-6), name
        if ours.std() > 1e-9:  # a global method's map is flat: it reads no patch
            theirs = entry.method.phrase_patch_map(runs_last[name].alignment, select)
            assert not torch.allclose(ours, theirs, atol=1e-6), name


def test_the_feature_cache_keys_on_the_source_and_size(shipped, tmp_path):
    backbone, _, _ = shipped
    cache, data = FeatureCache(tmp_path), WorldDataset(2, split="train", seed=0)
    keys = {cache.key(b, data)[0] for b in (backbone, backbone.with_features("last"),
                                            backbone.with_features(SOURCE),
                                            backbone.with_features("last", 160))}
    assert len(keys) == 3  # the default view is the default backbone


def test_the_explainers_run_at_a_larger_input(shipped):
    backbone, image, _ = shipped
    big = backbone.with_features("last", 2 * backbone.image_size)
    assert big.grid == (2 * backbone.grid[0], 2 * backbone.grid[1])
    assert big.geometry_on(300, 200).grid == big.grid
    for name in EXPLAINERS:
        reason = unavailable(big, name)
        if name == "gradcam":
            assert "native" in reason
            continue
        assert reason is None
        maps = explain_pairs(big, name, [image], ["a red cube"]).maps
        assert maps.shape == (1, big.grid[0] * big.grid[1]) and torch.isfinite(maps).all()
    maskclip = explain_pairs(backbone, "maskclip", [image], ["a red cube"]).maps
    own, _ = backbone.image_tower.encode(backbone.image_tensor([image]), FeatureSource("maskclip"))
    assert maskclip.shape[1] == own.shape[1]


@pytest.fixture(scope="module")
def trained_on_source(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("feat")
    paths = {"bb": random_tiny_clip(root / "bb", 0), "cache": root / "cache",
             "heads": root / "heads"}
    argv = ["train", "--method", "filip", "--features", SOURCE, "--n-train", "16",
            "--batch-size", "8", "--max-steps", "2", "--concept-dim", "16", "--threads", "1",
            "--device", "cpu", "--quiet", "--backbone", str(paths["bb"]), "--cache-dir",
            str(paths["cache"]), "--out", str(root / "runs"), "--publish", str(paths["heads"]),
            "--manifest", str(root / "manifest.json")]
    assert main(argv) == 0
    return paths


def test_a_head_records_its_source_and_refuses_another(trained_on_source):
    head = trained_on_source["heads"] / "filip"
    assert head_meta(head)["backbone"]["features"] == SOURCE
    backbone = Backbone.from_checkpoint(trained_on_source["bb"])
    with pytest.raises(CheckpointError, match=f"trained on features {SOURCE} at the native "
                                              "size; this backbone reads features last"):
        load_head(head, backbone)
    assert load_head(head, backbone.with_features(SOURCE)).method.name == "filip"


def _grounding(paths: dict[str, Path], out: Path, *extra: str) -> dict:
    argv = ["eval", "--backbone", str(paths["bb"]), "--tables", "grounding", "--n-test", "3",
            "--n-compositional", "0", "--threads", "1", "--cache-dir", str(paths["cache"]),
            "--out", str(out), "--quiet", *extra]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    return {r["name"]: r for r in read_tables(out / "tables.json")["grounding"].rows}


def test_eval_reads_the_chosen_source(trained_on_source, tmp_path):
    free = ("--heads", "training-free", "--methods", "filip,conceptot", "--explainers",
            "maskclip")
    last = _grounding(trained_on_source, tmp_path / "last", *free)
    chosen = _grounding(trained_on_source, tmp_path / "chosen", *free, "--features", SOURCE)
    timeless = [k for k in chosen["maskclip"] if not k.startswith("ms_")]
    assert all(chosen["maskclip"][k] == last["maskclip"][k] for k in timeless)  # own source
    assert any(chosen[m] != last[m] for m in ("filip", "conceptot"))
    heads = _grounding(trained_on_source, tmp_path / "heads", "--heads",
                       str(trained_on_source["heads"]), "--methods", "filip", "--features",
                       SOURCE)
    assert "filip" in heads


@pytest.fixture(scope="module")
def vit_b16() -> Backbone:
    torch.manual_seed(0)
    return Backbone.from_pretrained("ViT-B-16", None)


@pytest.mark.parametrize(("side", "says"), [
    (0, "0 is not a positive whole number"), (-1, "-1 is not a positive whole number"),
    (True, "True is not a positive whole number"), (2.5, "2.5 is not a positive whole number"),
    (15, "15 px is below one of the open_clip ViT tower's 16 px patches"),
    (232, "232 px is not a multiple of the open_clip ViT tower's 16 px patches; take 224 or 240"),
    (100000, "100000 px would need about 68,212,106.1 GiB for one image's attention (12 heads, "
             "39,062,501 tokens), over the 4 GiB cap; the largest side within it is 1552 px")])
def test_odd_sizes_are_refused_at_once_naming_the_image_size(vit_b16, side, says):
    """Refused before anything is allocated: the model's forward is never entered."""
    entered = []
    handle = vit_b16.model.visual.register_forward_pre_hook(lambda *_: entered.append(1))
    try:
        with pytest.raises(UserInputError, match=f"^image size: {re.escape(says)}"):
            vit_b16.with_features("last", side)
    finally:
        handle.remove()
    assert entered == []


def test_the_size_cap_is_the_attention_estimate_at_its_edge(vit_b16):
    """1552 px (97^2 + 1 tokens, 12 heads, float32) fits the 4 GiB cap; 1568 px does not
    (and 100000 px above: (6250^2 + 1)^2 * 12 * 4 bytes = 68,212,106.1 GiB)."""
    assert f"{((100000 // 16) ** 2 + 1) ** 2 * 12 * 4 / 2**30:,.1f}" == "68,212,106.1"
    assert ((1552 // 16) ** 2 + 1) ** 2 * 12 * 4 <= MAX_ATTENTION_BYTES
    assert ((1568 // 16) ** 2 + 1) ** 2 * 12 * 4 > MAX_ATTENTION_BYTES
    assert vit_b16.with_features("last", 1552).grid == (97, 97)
    with pytest.raises(UserInputError, match="1568 px would need about 4.1 GiB"):
        vit_b16.with_features("last", 1568)


def test_the_command_line_refuses_odd_sizes_in_one_line(capsys):
    for side in ("15", "100000", "84"):
        with pytest.raises(SystemExit) as exit_:
            main(["explain", "--example", "0", "--image-size", side])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"otviz explain: error: image size: {side} px ") and "\n" not in err


def test_explain_draws_the_chosen_source(tmp_path):
    out = tmp_path / "w.png"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["explain", "--example", "0", "--features", "naclip", "--image-size",
                     "160", "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["explain", "--example", "0", "--features", "layer:x"])


@pytest.mark.parametrize("identity", [
    {"features": "naclip", "image_size": 448},
    {"features": "layer:-2"},
    {},
    {"features": "proxy", "proxy": {"name": "vit_small_patch16_224", "weights": "0f"}},
])
def test_the_refusals_training_flags_train_the_reading_they_name(identity):
    """A head refused for its reading names ``otviz train`` flags; the train command parses
    them into a config reading the same features at the same size."""
    flags = training_flags(identity).replace("[:FILE]", ":random").split()
    config = dataclass_from_args(TrainConfig, train_parser().parse_args(flags))
    assert (config.features, config.image_size) == (identity.get("features", "last"),
                                                    identity.get("image_size", 0))
    name = identity.get("proxy", {}).get("name")
    assert config.proxy == (f"{name}:random" if name else "")


def test_a_resclip_reading_is_not_told_to_train_a_head_on_resclip(trained_on_source):
    """Training refuses ``resclip`` (no fixed class set): the refusal of a head on a resclip
    reading says so and names resclip-rcs, not a command that fails."""
    assert training_flags({"features": "resclip"}) is None
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--features", "resclip"])
    head = trained_on_source["heads"] / "filip"
    reading = {**head_meta(head)["backbone"], "features": "resclip"}
    with pytest.raises(CheckpointError, match="no head is trained on it .*resclip-rcs") as e:
        load_method_checkpoint(head, reading)
    assert "--features resclip" not in str(e.value)
    reading["features"] = "naclip"
    with pytest.raises(CheckpointError, match="otviz train --features naclip\\)"):
        load_method_checkpoint(head, reading)
