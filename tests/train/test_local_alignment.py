"""FILIP's token-wise local loss in pre-training: the similarities by enumeration, the loss
against its definition and a closed form, the features against the backbone's, gradients
reaching the patch tokens, and the ``local_weight`` / ``init_from`` / ``bf16`` options."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from open_clip.tokenizer import SimpleTokenizer

from otviz.backbone import Backbone
from otviz.process_group import DistInfo
from otviz.tiny_clip.model import create_tiny_clip, load_tiny_clip, tiny_clip_config
from otviz.train.local_alignment import (
    EOT_TOKEN,
    SOT_TOKEN,
    content_mask,
    encode_with_tokens,
    filip_loss,
    token_max_similarities,
)
from otviz.train.losses import contrastive_loss
from otviz.train.pretrain import batch_loss, pretrain
from otviz.train.pretrain_config import PretrainConfig
from tests.train.test_pretrain import SMOKE

TINY = tiny_clip_config(embed_dim=16, vision_width=32, vision_layers=1, vision_heads=2,
                        text_width=32, text_layers=1, text_heads=2)


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def _captions(n: int, seed: int) -> torch.Tensor:
    """Token ids as open_clip lays them out: SOT, 1-5 words, EOT, zero padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, 32, dtype=torch.long)
    for i in range(n):
        k = int(torch.randint(1, 6, (), generator=g))
        ids[i, 0], ids[i, k + 1] = SOT_TOKEN, EOT_TOKEN
        ids[i, 1 : k + 1] = torch.randint(1, 300, (k,), generator=g)
    return ids


def test_token_max_similarities_by_enumeration():
    patches, tokens = _unit(3, 5, 8, seed=0), _unit(4, 6, 8, seed=1)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 0, 0],
                         [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    s_image, s_text = token_max_similarities(patches, tokens, mask)
    for i in range(3):
        for j in range(4):
            words = tokens[j][mask[j]]
            dots = patches[i] @ words.T  # [N, words]
            torch.testing.assert_close(s_image[i, j], dots.max(1).values.mean())
            torch.testing.assert_close(s_text[i, j], dots.max(0).values.mean())


def test_filip_loss_matches_definition_with_extra_negatives():
    patches, tokens = _unit(3, 5, 8, seed=2), _unit(5, 4, 8, seed=3)  # 3 captions + 2 negatives
    mask = torch.rand(5, 4, generator=torch.Generator().manual_seed(4)) > 0.4
    mask[:, 0] = True
    scale = torch.tensor(7.0)
    s_image, s_text = token_max_similarities(patches, tokens, mask)
    i2t = -torch.stack([(scale * s_image[i]).log_softmax(0)[i] for i in range(3)]).mean()
    t2i = -torch.stack([(scale * s_text[:, j]).log_softmax(0)[j] for j in range(3)]).mean()
    torch.testing.assert_close(filip_loss(patches, tokens, mask, scale), (i2t + t2i) / 2)


def test_filip_loss_closed_form_on_orthogonal_pairs():
    """Image i's patches and caption i's tokens all equal e_i: s = identity, so each of the
    2B cross-entropies is log(1 + (B - 1) e^{-scale})."""
    b, scale = 4, 3.0
    basis = torch.eye(b, 6)
    patches = basis[:, None, :].expand(b, 5, 6)
    tokens = basis[:, None, :].expand(b, 7, 6)
    mask = torch.ones(b, 7, dtype=torch.bool)
    expected = math.log(1 + (b - 1) * math.exp(-scale))
    assert abs(float(filip_loss(patches, tokens, mask, torch.tensor(scale))) - expected) < 1e-6


def test_content_mask_keeps_words_only():
    ids = torch.tensor([[SOT_TOKEN, 5, 9, EOT_TOKEN, 0, 0]])
    assert content_mask(ids).tolist() == [[False, True, True, False, False, False]]


def test_features_are_the_backbones_projected_features():
    model = create_tiny_clip(TINY, seed=0)
    images = torch.randn(2, 3, 80, 80, generator=torch.Generator().manual_seed(5))
    ids = _captions(3, seed=6)
    image_emb, text_emb, patches, tokens = encode_with_tokens(model, images, ids)
    ref_image, ref_text = model.encode_image(images, normalize=True), model.encode_text(
        ids, normalize=True)
    torch.testing.assert_close(image_emb, ref_image)
    torch.testing.assert_close(text_emb, ref_text)
    bb = Backbone(model, SimpleTokenizer(), preprocess=lambda im: im, space="projected")
    ref_patches, ref_tokens, _, _ = bb.forward_tensors(images, ids)
    torch.testing.assert_close(patches, F.normalize(ref_patches, dim=-1))
    torch.testing.assert_close(tokens, F.normalize(ref_tokens, dim=-1))


def test_local_loss_sends_gradients_to_every_patch_token():
    model = create_tiny_clip(TINY, seed=0)
    images = torch.randn(4, 3, 80, 80, generator=torch.Generator().manual_seed(7))
    ids = _captions(4, seed=8)
    _, _, patches, tokens = encode_with_tokens(model, images, ids)
    patches.retain_grad()
    filip_loss(patches, tokens, content_mask(ids), model.logit_scale.exp()).backward()
    per_patch = patches.grad.abs().sum(-1)  # [B, N]
    assert bool((per_patch > 0).any(1).all())  # every image's patch tokens get a signal
    assert float(model.visual.conv1.weight.grad.abs().sum()) > 0  # down to the patch stem
    assert float(model.text.token_embedding.weight.grad.abs().sum()) > 0


def test_batch_loss_adds_the_weighted_local_term():
    model = create_tiny_clip(TINY, seed=0)
    images = torch.randn(3, 3, 80, 80, generator=torch.Generator().manual_seed(9))
    ids = _captions(5, seed=10)  # 3 captions + 2 hard negatives
    config = PretrainConfig(local_weight=0.25)
    with torch.no_grad():
        total = batch_loss(model, images, ids, config, DistInfo(), 3)
        plain = batch_loss(model, images, ids, dataclasses.replace(config, local_weight=0.0),
                            DistInfo(), 3)
        img, txt, patches, tokens = encode_with_tokens(model, images, ids)
        scale = model.logit_scale.exp()
        torch.testing.assert_close(plain, contrastive_loss(img, txt, scale, "infonce"))
        local = filip_loss(patches, tokens[:3], content_mask(ids[:3]), scale)
        torch.testing.assert_close(total, plain + 0.25 * local)
        with torch.autocast("cpu", torch.bfloat16):
            low = batch_loss(model, images, ids, config, DistInfo(), 3)
    assert abs(float(low) - float(total)) < 0.05 * float(total)


def test_init_from_continues_from_a_checkpoint(tmp_path):
    """A run started from a checkpoint at learning rate 0 ends with its exact parameters (the
    stem's batch-norm running statistics follow the data, as in any training step); with
    the local term on and bf16 it trains and still saves a loadable checkpoint."""
    small = dict(SMOKE, steps=2, n_train=64, n_test=16, save_every=0)
    pretrain(PretrainConfig(**small, out=str(tmp_path / "first")))
    pretrain(PretrainConfig(**dict(small, lr=0.0, local_weight=1.0),
                            init_from=str(tmp_path / "first"), out=str(tmp_path / "same")))
    (a, _), (b, _) = load_tiny_clip(tmp_path / "first"), load_tiny_clip(tmp_path / "same")
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(x, y), name
    pretrain(PretrainConfig(**dict(small, local_weight=1.0, bf16=True),
                            init_from=str(tmp_path / "first"), out=str(tmp_path / "moved")))
    c, meta = load_tiny_clip(tmp_path / "moved")
    assert meta["recipe"]["local_weight"] == 1.0 and meta["recipe"]["bf16"]
    first_conv = "visual.conv1.layers.0.weight"  # the convolutional stem's first layer
    assert not torch.equal(a.get_parameter(first_conv), c.get_parameter(first_conv))
