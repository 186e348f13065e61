"""SAM regions: refused with a message naming the field when the weights, their file or the
package are missing (nothing is downloaded); with them, SAM's masks reach the tokens through
the token geometry (a stand-in ``segment_anything`` module records what it was given)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from otviz.errors import UserInputError
from otviz.patch_grid.masks import segment_token_masks
from otviz.patch_grid.sam import sam_regions
from otviz.patch_grid.tokens import TokenGeometry

STEM = TokenGeometry((6, 6), (48, 48), (8.0, 8.0), (0.5, 0.5))
IMAGE = np.zeros((48, 48, 3), dtype=np.uint8)


@pytest.mark.parametrize("path,match", [(None, "sam_checkpoint: SAM regions need the path"),
                                        ("", "sam_checkpoint: SAM regions need the path"),
                                        ("no/such/sam_vit_b.pth", "sam_checkpoint: no file")])
def test_sam_without_weights_is_refused(path, match):
    with pytest.raises(UserInputError, match=match):
        sam_regions(IMAGE, STEM, path)


def test_sam_unknown_model_type_is_refused(tmp_path: Path):
    weights = tmp_path / "sam.pth"
    weights.write_bytes(b"x")
    with pytest.raises(UserInputError, match="sam_model_type"):
        sam_regions(IMAGE, STEM, weights, model_type="vit_x")


def test_sam_without_the_package_is_refused(tmp_path: Path, monkeypatch):
    weights = tmp_path / "sam.pth"
    weights.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "segment_anything", None)  # import fails
    with pytest.raises(UserInputError, match="segment_anything package"):
        sam_regions(IMAGE, STEM, weights)


def test_sam_masks_reach_the_tokens_through_the_geometry(tmp_path: Path, monkeypatch):
    weights = tmp_path / "sam.pth"
    weights.write_bytes(b"x")
    top = np.zeros((48, 48), dtype=bool)
    top[:13] = True  # the stem's first two rows of cells end at y = 12.5
    disc = np.zeros((48, 48), dtype=bool)
    disc[20:40, 20:40] = True
    loaded = {}

    class Generator:
        def __init__(self, model):
            loaded["model"] = model

        def generate(self, image):
            loaded["image"] = image
            return [{"segmentation": top}, {"segmentation": disc}]

    fake = types.ModuleType("segment_anything")
    fake.SamAutomaticMaskGenerator = Generator
    fake.sam_model_registry = {"vit_b": lambda checkpoint: ("sam", checkpoint)}
    monkeypatch.setitem(sys.modules, "segment_anything", fake)
    got = sam_regions(IMAGE, STEM, weights)
    assert loaded["model"] == ("sam", str(weights)) and loaded["image"] is IMAGE
    want = segment_token_masks(torch.from_numpy(np.stack([top, disc])), STEM)
    assert torch.equal(got, want)
    rows = got[0].reshape(6, 6)
    assert bool(rows[:2].all()) and not bool(rows[2:].any())  # the stem's cells, not 8 px rows
