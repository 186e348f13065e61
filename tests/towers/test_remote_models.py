"""The real CLIPs the picker offers exist in open_clip's registry, every one with an
adapter for both towers, and the memory their labels
state is their parameter count (architecture built on the meta device, nothing
downloaded)."""

from __future__ import annotations

import re

import open_clip
import pytest
import torch

from otviz.towers import IMAGE_TOWERS, TEXT_TOWERS
from otviz.ui.context import REMOTE_MODELS, REMOTE_NOTES


@pytest.mark.parametrize(("name", "tag"), REMOTE_MODELS)
def test_offered_model_is_registered_and_its_note_is_measured(name, tag):
    assert tag in open_clip.list_pretrained_tags_by_model(name)
    with torch.device("meta"):
        model = open_clip.create_model(name, pretrained=None, pretrained_text=False,
                                       device="meta")
    assert type(model.visual) in IMAGE_TOWERS
    assert type(getattr(model, "text", model)) in TEXT_TOWERS
    params = sum(p.numel() for p in model.parameters())
    millions, gigabytes = re.search(r"(\d+) M parameters, ([\d.]+) GB", REMOTE_NOTES[(name, tag)]
                                    ).groups()
    assert int(millions) == round(params / 1e6)
    assert float(gigabytes) == round(params * 4 / 2**30, 2)
