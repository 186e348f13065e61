"""The shipped files are package data of ``otviz.assets``, located through one function, and
the checkout's ``checkpoints/`` and ``examples/`` are links to them: one copy."""

from __future__ import annotations

import pytest

from otviz import assets
from otviz.eval.backbone_quality import QualityConfig
from otviz.eval.runner import EvalConfig
from otviz.report.render import ReportConfig
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT
from otviz.ui.examples import EXAMPLES_DIR, load_examples
from tests.helpers import ROOT


def test_every_asset_is_inside_the_package():
    package = ROOT / "otviz" / "assets"
    for name in assets.ASSETS:
        path = assets.path(name)
        assert path.exists() and package in path.parents, name


def test_the_constants_and_defaults_read_the_assets():
    assert DEFAULT_CHECKPOINT == assets.path("tiny-clip")
    assert EXAMPLES_DIR == assets.path("examples")
    heads = str(assets.path("heads"))
    assert EvalConfig().heads == ReportConfig().heads == QualityConfig().heads == heads
    assert (assets.path("tiny-clip") / "model.safetensors").is_file()
    assert {e.image_path.parent for e in load_examples()} == {assets.path("examples")}


@pytest.mark.skipif((ROOT / "PKG-INFO").is_file(),
                    reason="an unpacked sdist: the links are the checkout's, not shipped")
def test_the_checkout_links_to_the_one_copy():
    assert (ROOT / "checkpoints").is_symlink() and (ROOT / "examples").is_symlink()
    assert (ROOT / "checkpoints").resolve() == assets.path("heads").parent
    assert (ROOT / "examples").resolve() == assets.path("examples")


def test_an_unknown_asset_is_refused_by_name():
    with pytest.raises(KeyError, match="known: tiny-clip, heads, manifest, examples"):
        assets.path("weights")
