"""``otviz explain --heads DIR`` (issue 51, item 1): each trained head's per-word maps, read
at the reading the heads were trained on; heads beside other weights, or read another way,
are one line naming both, before any figure is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.heads import head_meta
from otviz.cli import main as otviz_main
from otviz.explain import Explainer
from otviz.suite import MethodSuite, load_head
from otviz.ui.examples import load_examples
from tests.helpers import random_tiny_clip

TRAINED_ON = "clearclip"


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> Path:
    """A ConceptOT head trained for 2 steps at ``clearclip`` on the embedded tiny CLIP."""
    tmp = tmp_path_factory.mktemp("explain-heads")
    argv = ["train", "--method", "conceptot", "--features", TRAINED_ON, "--n-train", "8",
            "--batch-size", "4", "--max-steps", "2", "--concept-dim", "16", "--start",
            "random", "--threads", "1", "--device", "cpu", "--quiet", "--cache-dir",
            str(tmp / "cache"), "--out", str(tmp / "runs"), "--publish", str(tmp / "heads")]
    assert otviz_main(argv) == 0
    return tmp / "heads"


def test_a_methods_word_maps_are_its_plans_word_columns(heads):
    """``Explainer.method_word_maps``: word k's map is the sum of the plan's columns over
    word k's tokens (ConceptOT Sec. 2.6), recomputed here from the dense plan."""
    backbone = Backbone.from_checkpoint().with_features(TRAINED_ON)
    suite = MethodSuite(backbone, {"conceptot": load_head(heads / "conceptot", backbone)}, "h")
    explainer = Explainer(backbone)
    example = load_examples()[0]
    encoded = explainer.encode(str(example.image_path), example.caption)
    maps = explainer.method_word_maps(encoded, suite, "conceptot")
    plan = explainer.align(encoded, suite, ["conceptot"])["conceptot"].alignment.plan.dense()[0]
    word_of, valid = encoded.features.token_word[0], encoded.features.token_mask[0]
    assert maps.shape == (len(encoded.words), *encoded.grid)
    for k in range(len(encoded.words)):
        want = plan[:, valid & (word_of == k)].sum(1).reshape(encoded.grid)
        torch.testing.assert_close(maps[k], want.to(maps.dtype), rtol=1e-5, atol=1e-8)
    assert float(maps.abs().sum()) > 0


def test_explain_draws_the_heads_at_their_reading(heads, tmp_path, capsys):
    out = tmp_path / "heads.png"
    assert otviz_main(["explain", "--example", "0", "--heads", str(heads), "--out",
                       str(out)]) == 0
    assert out.stat().st_size > 0 and capsys.readouterr().out == f"wrote {out}\n"


@pytest.mark.parametrize("flags", [["--features", "sclip"], ["--image-size", "160"]])
def test_another_reading_is_refused_naming_both(heads, tmp_path, capsys, flags):
    out = tmp_path / "x.png"
    with pytest.raises(SystemExit) as stop:
        otviz_main(["explain", "--example", "0", "--heads", str(heads), *flags, "--out",
                    str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and not out.exists()
    asked = "features sclip at the native size" if "sclip" in flags else (
        f"features {TRAINED_ON} at 160 px")
    assert (f"were trained on features {TRAINED_ON} at the native size, not on {asked}"
            in err), err
    assert len(err.strip().splitlines()) == 1


def test_heads_on_other_weights_are_refused_naming_both(heads, tmp_path, capsys):
    other = random_tiny_clip(tmp_path / "other", 5)
    with pytest.raises(SystemExit) as stop:
        otviz_main(["explain", "--example", "0", "--checkpoint", str(other), "--heads",
                    str(heads), "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    trained = head_meta(heads / "conceptot")["backbone"]["weights"][:8]
    assert stop.value.code == 2 and not (tmp_path / "x.png").exists()
    assert f"These heads were trained on otviz-tiny with weights {trained}, but this " in err
    assert "loads otviz-tiny from the flags with weights " in err
