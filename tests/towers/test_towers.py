"""Every tower family gives the backbone contract, and its training-free projection is the
map the tower's own pooling applies: on a spatially uniform input every pooling (class
token, mean, attention over identical keys) returns that one position, so the pooled
embedding must equal the projection of the position (MaskCLIP's value/output path for
attention pools, the head per position for timm)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from otviz.backbone import Backbone, BackboneLoadError
from otviz.explain import Explainer
from otviz.suite import SCORED_METHODS, MethodSuite
from otviz.towers import IMAGE_TOWERS, ImageTower, image_tower
from otviz.towers.base import register_image_tower
from otviz.towers.resnet import ResNetTower
from otviz.towers.timm_tower import TimmTower
from otviz.towers.vit import VitTower
from tests.towers.conftest import FAMILIES, shrunk_backbone

CAPTION = "A small red circle, to the left of a blue square."


def _image(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((90, 120, 3)) * 255).astype(np.uint8)


def test_every_family_gives_the_contract(family):
    name, bb = family
    f = bb.encode([_image(), _image(1)], [CAPTION, "a dog"])
    h, w = bb.grid
    assert f.grid == (h, w) and f.patches.shape == (2, h * w, bb.patch_dim)
    assert f.tokens.shape == (2, bb.context_length, bb.token_dim)
    assert f.image_global.shape == f.text_global.shape == (2, bb.embed_dim)
    for b, c in enumerate(f.text.captions):  # content positions: the caption's kept tokens
        assert int(f.token_mask[b].sum()) == c.n_kept == len(c.token_ids)
        assert f.token_ids[b][f.token_mask[b]].tolist() == c.token_ids
    words = [w.text for w in f.words[0]]
    kept = f.token_word[0][f.token_mask[0]].tolist()
    lettered = [i for i, w in enumerate(words) if w.isalpha()]  # SigLIP drops punctuation
    assert set(lettered) <= set(kept) <= set(range(len(words)))  # every word has a token
    assert kept == sorted(kept)  # tokens follow the caption
    with torch.no_grad():  # the pooled embeddings are the model's own
        pixels = bb.image_tensor([_image(), _image(1)])
        own_image = bb.model.encode_image(pixels, normalize=False)
        own_text = bb.model.encode_text(f.token_ids, normalize=False)
    torch.testing.assert_close(f.image_global, own_image, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f.text_global, own_text, atol=1e-5, rtol=1e-5)
    projected = bb.to_space(f, "projected")
    assert projected.patches.shape == (2, h * w, bb.embed_dim)
    assert projected.tokens.shape == (2, bb.context_length, bb.embed_dim)


def test_projected_backbone_equals_width_then_projection(family, hf_dir):
    name, bb = family
    proj = Backbone(bb.model, _tokenizer(bb), bb.preprocess, space="projected")
    a = proj.encode([_image()], [CAPTION])
    b = bb.to_space(bb.encode([_image()], [CAPTION]), "projected")
    torch.testing.assert_close(a.patches, b.patches)
    torch.testing.assert_close(a.tokens, b.tokens)
    assert proj.patch_dim == proj.token_dim == bb.embed_dim


def _tokenizer(bb: Backbone):
    return bb.words.tokenizer


def _uniform_pooled(tower: ImageTower, row: torch.Tensor, n: int) -> torch.Tensor:
    """The tower's own pooling + projection of ``n`` copies of ``row`` (width space)."""
    v = tower.visual
    if isinstance(tower, VitTower):  # pre-norm tokens: class token + patches, all equal
        if v.attn_pool is not None:  # the pooler's key norm is the width space's norm
            raw = row.expand(1, n + 1, -1)
            pooled = v.ln_post(v.attn_pool(raw))[:, 0]
            return pooled @ v.proj
        raw = row.expand(1, n + 1, -1)
        pooled, _ = v._pool(raw)
        return pooled @ v.proj
    if isinstance(tower, ResNetTower):
        return v.attnpool(row[0, :, None, None].expand(1, -1, 2, 2))
    assert isinstance(tower, TimmTower)
    prefix = getattr(v.trunk, "num_prefix_tokens", None)
    uniform = (row[0, :, None, None].expand(1, -1, 2, 2) if prefix is None
               else row.expand(1, prefix + n, -1))
    return v.head(v.trunk.forward_head(uniform))


def test_projection_is_the_towers_pool_on_a_uniform_input(family):
    name, bb = family
    tower = bb.image_tower
    torch.manual_seed(1)
    row = torch.randn(1, 1, tower.width)
    with torch.no_grad():
        if isinstance(tower, ResNetTower):  # MaskCLIP drops the pool's position embedding
            tower.visual.attnpool.positional_embedding.zero_()
        if isinstance(tower, VitTower):
            width_row = tower.norm(row)
            expected = _uniform_pooled(tower, row, 4)
        else:
            width_row = row
            expected = _uniform_pooled(tower, row[0], 4)
        torch.testing.assert_close(tower.project(width_row)[0], expected, atol=1e-4, rtol=1e-4)


def test_text_projection_at_the_pooled_position_is_the_text_embedding(hf_dir):
    """CLIP pools the end-of-text token: its projected token is the text embedding."""
    bb = shrunk_backbone("ViT-B-32", hf_dir, space="projected")
    f = bb.encode([_image()], [CAPTION])
    eot = int(f.token_ids[0].argmax())
    torch.testing.assert_close(f.tokens[0, eot], f.text_global[0], atol=1e-5, rtol=1e-5)


def test_hf_text_mean_pool_of_width_tokens_is_the_text_embedding(hf_dir):
    bb = shrunk_backbone(FAMILIES["hf-text-xlmr"], hf_dir)
    f = bb.encode([_image()], [CAPTION])
    text = bb.model.text
    valid = (f.token_ids[0] != text.config.pad_token_id).float()
    mean = (f.tokens[0] * valid[:, None]).sum(0) / valid.sum()
    torch.testing.assert_close(text.proj(mean), f.text_global[0], atol=1e-5, rtol=1e-5)


def test_every_method_runs_on_every_family(family):
    name, bb = family
    suite = MethodSuite.training_free(bb, ["a red circle", "a blue square", "a dog"])
    explainer = Explainer(bb)
    encoded = explainer.encode(_image(), CAPTION)
    runs = explainer.align(encoded, suite, list(SCORED_METHODS))
    assert list(runs) == list(SCORED_METHODS)
    select = encoded.token_select([3])  # "circle"
    for run_name, run in runs.items():
        a = run.alignment
        scores = torch.cat([a.local_score, a.global_score])
        assert torch.isfinite(scores).all(), run_name
        if run_name != "global_only":
            heat = a.heatmap(select)
            assert heat.shape == (1, bb.grid[0] * bb.grid[1]) and torch.isfinite(heat).all()


def test_an_unknown_tower_names_the_known_ones():
    model = dataclasses.make_dataclass("Fake", [("visual", object)])(torch.nn.Identity())
    with pytest.raises(BackboneLoadError) as info:
        image_tower(model)
    for tower_class in IMAGE_TOWERS:
        assert tower_class.__name__ in str(info.value)


def test_a_tower_class_given_a_second_adapter_is_refused():
    vit = next(c for c, adapter in IMAGE_TOWERS.items() if adapter is VitTower)
    with pytest.raises(ValueError, match=f"adapter of the image tower {vit.__name__} is "
                                         "registered twice: .*VitTower and .*ResNetTower"):
        register_image_tower(vit)(ResNetTower)
    assert IMAGE_TOWERS[vit] is VitTower
