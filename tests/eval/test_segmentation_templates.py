"""The prompt templates of the dense-CLIP papers (:mod:`otviz.text.templates`): CLIP's 80
ImageNet templates as SCLIP lists them, the ensembled class embedding against an explicit
recomputation (each filled template encoded alone), one template equal to the single prompt,
and an explainer's map of the ensembled embedding against the map of its own encode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from otviz.eval.runner import load_backbone
from otviz.eval.segmentation import template_embeddings
from otviz.explainers import explain_pairs, phrase_embeddings
from otviz.text.templates import IMAGENET_TEMPLATES, SINGLE_TEMPLATE, TEMPLATE_SETS, ensembled

NAMES = ("cat", "traffic light", "television monitor")


@pytest.fixture(scope="module")
def backbone():
    return load_backbone()


def test_the_80_templates() -> None:
    assert len(IMAGENET_TEMPLATES) == len(set(IMAGENET_TEMPLATES)) == 80
    assert all(t.count("{}") == 1 for t in IMAGENET_TEMPLATES)
    assert IMAGENET_TEMPLATES[0] == "a bad photo of a {}."
    assert IMAGENET_TEMPLATES[-1] == "a tattoo of the {}."
    assert SINGLE_TEMPLATE in IMAGENET_TEMPLATES
    assert TEMPLATE_SETS["single"] == (SINGLE_TEMPLATE,)


def test_ensemble_equals_an_explicit_recomputation(backbone) -> None:
    """Each filled template encoded alone, normalised; the mean normalised (SCLIP)."""
    got = ensembled(lambda texts: phrase_embeddings(backbone, texts), NAMES,
                    IMAGENET_TEMPLATES)
    for c, name in enumerate(NAMES):
        each = torch.cat([phrase_embeddings(backbone, [t.format(name)]).double()
                          for t in IMAGENET_TEMPLATES])
        each = each / each.norm(dim=1, keepdim=True)
        expected = each.sum(0) / each.sum(0).norm()
        torch.testing.assert_close(got[c].double(), expected, atol=2e-6, rtol=0)
        single = phrase_embeddings(backbone, [SINGLE_TEMPLATE.format(name)])[0]
        assert (got[c] - single).abs().max() > 1e-3  # the ensemble is not the one prompt
    # every distinct text once, rows in the texts' order
    rows = template_embeddings(backbone, ["cat", "tie", "cat"], IMAGENET_TEMPLATES)
    torch.testing.assert_close(rows[0], rows[2], atol=0, rtol=0)
    torch.testing.assert_close(rows[:1], got[:1], atol=1e-6, rtol=0)


def test_one_template_is_the_single_prompt(backbone) -> None:
    """A one-template ensemble is the prompt's own unit embedding (a unit vector normalised
    again: float32 rounding), and an explainer's maps of it equal its maps of the prompt."""
    one = ensembled(lambda texts: phrase_embeddings(backbone, texts), NAMES, (SINGLE_TEMPLATE,))
    prompts = [SINGLE_TEMPLATE.format(n) for n in NAMES]
    torch.testing.assert_close(one, phrase_embeddings(backbone, prompts), atol=1e-7, rtol=0)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for _ in NAMES]
    for name in ("maskclip", "gradcam"):
        own = explain_pairs(backbone, name, images, prompts).maps
        given = explain_pairs(backbone, name, images, prompts, text=one).maps
        torch.testing.assert_close(given, own, atol=1e-5, rtol=1e-5)
        ensemble = explain_pairs(backbone, name, images, list(NAMES), text=template_embeddings(
            backbone, list(NAMES), IMAGENET_TEMPLATES)).maps
        assert ensemble.shape == own.shape and torch.isfinite(ensemble).all()


def test_unit_rows(backbone) -> None:
    got = template_embeddings(backbone, list(NAMES), IMAGENET_TEMPLATES)
    torch.testing.assert_close(got.norm(dim=1), torch.ones(len(NAMES)), atol=1e-6, rtol=0)
    assert F.cosine_similarity(got[0], got[1], dim=0) < 1 - 1e-4
