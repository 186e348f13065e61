"""Tiny-CLIP pre-training: the loss, the schedule, the CLI, a smoke run that lowers the loss
and writes a loadable checkpoint with its held-out retrieval, and the data-parallel engine
(:mod:`otviz.train.distributed`): a step over two processes is the full-batch step
(``tests/train/test_train_ddp.py``: ``--processes 2`` and a ``torchrun`` job train the same
run; there, the two-process run reports every step, scores the held-out retrieval and keeps
one union of the token rows)."""

from __future__ import annotations

import dataclasses
import math
import os
import shlex

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F

from otviz.backbone import Backbone
from otviz.checkpoints.store import load_meta
from otviz.cli import main as cli_main
from otviz.eval.held_out import HeldOutRetrieval, embed_split
from otviz.eval.retrieval import recall_at_k
from otviz.tiny_clip.model import load_tiny_clip
from otviz.train.losses import contrastive_loss, infonce_loss
from otviz.train.pretrain import _lr_lambda, command_line, pretrain, world_version
from otviz.train.pretrain_config import PretrainConfig
from otviz.world import WorldConfig

SMOKE = dict(
    steps=40, batch_size=32, lr=2e-3, warmup_steps=5, n_train=512, n_test=64, hard_negatives=1,
    embed_dim=32, vision_width=32, vision_layers=1, vision_heads=2, text_width=32,
    text_layers=1, text_heads=2, eval_every=0, threads=1, processes=1,
)


def test_infonce_matches_definition():
    g = torch.Generator().manual_seed(0)
    a = F.normalize(torch.randn(5, 8, generator=g), dim=-1)
    b = F.normalize(torch.randn(5, 8, generator=g), dim=-1)
    scale = torch.tensor(10.0)
    logits = scale * a @ b.T
    i2t = -torch.stack([logits[i].log_softmax(0)[i] for i in range(5)]).mean()
    t2i = -torch.stack([logits[:, j].log_softmax(0)[j] for j in range(5)]).mean()
    torch.testing.assert_close(infonce_loss(a, b, scale), (i2t + t2i) / 2)
    # perfectly separated pairs at a high temperature: loss near zero
    eye = torch.eye(5, 8)
    assert infonce_loss(eye, eye, torch.tensor(100.0)) < 1e-6


def test_infonce_hard_negatives_only_in_image_to_text():
    g = torch.Generator().manual_seed(2)
    img = F.normalize(torch.randn(3, 8, generator=g), dim=-1)
    txt = F.normalize(torch.randn(7, 8, generator=g), dim=-1)  # 3 captions + 4 negatives
    scale = torch.tensor(5.0)
    logits = scale * img @ txt.T
    i2t = -torch.stack([logits[i].log_softmax(0)[i] for i in range(3)]).mean()
    t2i = -torch.stack([logits[:3, j].log_softmax(0)[j] for j in range(3)]).mean()
    torch.testing.assert_close(infonce_loss(img, txt, scale), (i2t + t2i) / 2)
    assert infonce_loss(img, txt, scale) > infonce_loss(img, txt[:3], scale)


def test_draw_negatives_respects_validity():
    from otviz.data.rendered import RenderedSplit, draw_negatives

    n, c, length = 4, 6, 5
    neg_ids = torch.arange(n * c).view(n, c, 1).expand(n, c, length).clone()
    valid = torch.zeros(n, c, dtype=torch.bool)
    valid[0, [1, 4]] = valid[1, 0] = valid[2, :] = valid[3, 5] = True
    split = RenderedSplit(torch.zeros(n, 2, 2, 3, dtype=torch.uint8),
                          torch.zeros(n, length, dtype=torch.long), ["x"] * n, neg_ids, valid)
    g = torch.Generator().manual_seed(0)
    out = draw_negatives(split, torch.tensor([0, 1, 3, 0]), 50, g)
    assert out.shape == (200, length)
    chosen = out[:, 0].view(4, 50)
    assert set(chosen[0].tolist()) == {1, 4} and set(chosen[3].tolist()) == {1, 4}
    assert set(chosen[1].tolist()) == {6} and set(chosen[2].tolist()) == {23}
    split.negative_valid[1] = False
    with pytest.raises(ValueError, match="no hard negative"):
        draw_negatives(split, torch.tensor([1]), 1, g)


def test_world_negatives_tokenised():
    from otviz.data.rendered import render_split
    from otviz.world import NEGATIVE_CATEGORIES, World, WorldConfig

    split = render_split("train", 20, 0, 32, WorldConfig(negatives=True))
    assert split.negative_ids.shape == (20, len(NEGATIVE_CATEGORIES), 32)
    plain = render_split("train", 20, 0, 32, WorldConfig(negatives=False))
    assert plain.negative_ids is None and torch.equal(plain.images, split.images)
    s = World(WorldConfig(negatives=True), "train", 0).sample(7)
    from open_clip.tokenizer import SimpleTokenizer

    tok = SimpleTokenizer(context_length=32)
    for k, cat in enumerate(NEGATIVE_CATEGORIES):
        if cat in s.negatives:
            assert split.negative_valid[7, k]
            assert torch.equal(split.negative_ids[7, k], tok(s.negatives[cat])[0])
        else:
            assert not split.negative_valid[7, k]


def test_render_shards_and_chunks(monkeypatch):
    from otviz.data import rendered as data
    from otviz.world import WorldConfig

    cfg = WorldConfig(negatives=True)
    full = data.render_split("train", 11, 5, 32, cfg)
    monkeypatch.setattr(data, "_CHUNK", 2)
    shards = [data.render_split("train", 11, 5, 32, cfg, shard=(k, 3)) for k in range(3)]
    for k, part in enumerate(shards):
        assert torch.equal(part.images, full.images[k::3])
        assert torch.equal(part.ids, full.ids[k::3])
        assert torch.equal(part.negative_ids, full.negative_ids[k::3])
        assert part.captions == full.captions[k::3]
    with pytest.raises(ValueError):
        data.render_split("train", 2, 5, 32, cfg, shard=(2, 3))


def test_loss_kinds():
    """InfoNCE is ours; the other kinds are OT-CLIP's, whose own InfoNCE must agree."""
    from otviz.train.otclip_losses import KINDS, otclip_loss

    g = torch.Generator().manual_seed(1)
    a = F.normalize(torch.randn(6, 8, generator=g), dim=-1)
    b = F.normalize(torch.randn(6, 8, generator=g), dim=-1)
    scale = torch.tensor(20.0)
    torch.testing.assert_close(contrastive_loss(a, b, scale, "infonce"), infonce_loss(a, b, scale))
    torch.testing.assert_close(otclip_loss(a, b, scale, "infonce"), infonce_loss(a, b, scale))
    for kind in KINDS[1:]:
        torch.testing.assert_close(contrastive_loss(a, b, scale, kind),
                                   otclip_loss(a, b, scale, kind))
    with pytest.raises(ValueError):
        contrastive_loss(a, b, scale, "no-such-loss")
    with pytest.raises(ValueError, match="unknown global loss"):
        pretrain(PretrainConfig(loss="no-such-loss"))
    with pytest.raises(ValueError, match="hard_negatives"):
        pretrain(PretrainConfig(loss="dbot", hard_negatives=1))


def test_schedule_warmup_then_cosine():
    f = _lr_lambda(PretrainConfig(steps=110, warmup_steps=10))
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.5)
    assert f(110) == pytest.approx(0.0, abs=1e-12)
    assert all(f(s) >= f(s + 1) for s in range(10, 110))
    assert f(35) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))


def test_command_line_round_trip(monkeypatch):
    config = PretrainConfig(steps=7, lr=3e-4, out="x y", max_shift=0)
    cmd = command_line(config)
    assert cmd.startswith("otviz pretrain ")
    assert "--steps 7" in cmd and "--max-shift 0" in cmd and "'x y'" in cmd
    seen = []

    def fake_pretrain(c, progress=None, held_out=None):
        seen.append((c, held_out))
        return {}

    monkeypatch.setattr("otviz.train.pretrain.pretrain", fake_pretrain)
    assert cli_main(shlex.split(cmd)[1:]) == 0
    assert seen == [(config, HeldOutRetrieval)]


def test_pretrain_smoke(tmp_path):
    calls = []
    config = PretrainConfig(**SMOKE, out=str(tmp_path / "ck"))
    threads = torch.get_num_threads()
    metrics = pretrain(config, progress=lambda step, total, info: calls.append((step, info)),
                       held_out=HeldOutRetrieval)
    assert torch.get_num_threads() == threads
    assert [s for s, _ in calls] == list(range(1, 41))
    losses = torch.tensor([info["loss"] for _, info in calls])
    assert losses[-10:].mean() < losses[:5].mean() - 0.3  # it learns
    for key in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r10", "ambiguous_caption_share",
                "t2i_r1_ceiling", "wall_time_s", "checkpoint_bytes"):
        assert key in metrics
    assert 0 < metrics["t2i_r1_ceiling"] <= 1
    # the checkpoint loads, as a model and as a backbone, and reproduces the metrics
    meta = load_meta(tmp_path / "ck")
    assert meta["recipe"] == dataclasses.asdict(config)
    assert meta["metrics"]["i2t_r1"] == metrics["i2t_r1"]
    assert meta["command"] == command_line(config)
    assert meta["world_version"] == world_version(WorldConfig(negatives=False))
    assert len(meta["world_version"]) == 16
    assert meta["tokenizer"].startswith("open_clip.SimpleTokenizer")
    model, _ = load_tiny_clip(tmp_path / "ck")
    bb = Backbone.from_checkpoint(tmp_path / "ck")
    assert bb.patch_dim == 32 and bb.grid == (10, 10)
    from otviz.data.rendered import render_split

    test = render_split("test", 64, config.seed, config.context_length)
    pp = model.visual.preprocess_cfg
    img, txt = embed_split(model, test, tuple(pp["mean"]), tuple(pp["std"]))
    assert recall_at_k(img @ txt.T)["i2t_r1"] == metrics["i2t_r1"]


def _grad_step(report) -> tuple[bool, float, float] | None:
    """One process of a launched 2-process job: its half of a fixed batch through the
    data-parallel step (gathered embeddings, summed gradients); rank 0 compares the
    gradients with one process's full-batch step."""
    from otviz.tiny_clip.model import create_tiny_clip, tiny_clip_config
    from otviz.train import distributed as D

    torch.set_num_threads(1)
    info = D.setup("cpu")
    try:
        cfg = tiny_clip_config(embed_dim=16, vision_width=32, vision_layers=1, vision_heads=2,
                               text_width=32, text_layers=1, text_heads=2)
        g = torch.Generator().manual_seed(0)
        images = torch.randn(8, 3, 80, 80, generator=g)
        texts = torch.randint(1, 300, (8, 32), generator=g)
        negs = torch.randint(1, 300, (8, 32), generator=g)
        texts[:, 9] = negs[:, 11] = 49407

        def step(model, info, img, txt, neg):
            b = img.shape[0]
            i, t, s = model(img, torch.cat([txt, neg]))
            i = D.gather(i, info)
            t = torch.cat([D.gather(t[:b], info), D.gather(t[b:], info)])
            contrastive_loss(i, t, s, "infonce").backward()
            D.sum_gradients(model, info)
            if info.distributed:
                model.logit_scale.grad.div_(info.world_size)
            return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

        half = slice(4 * info.rank, 4 * info.rank + 4)
        split = step(create_tiny_clip(cfg, seed=1), info, images[half], texts[half], negs[half])
        if not info.is_main:
            return None
        full = step(create_tiny_clip(cfg, seed=1), D.DistInfo(), images, texts, negs)
        diff = max(float((split[n] - full[n]).abs().max()) for n in full)
        scale = max(float(full[n].abs().max()) for n in full)
        return sorted(split) == sorted(full), diff, scale
    finally:
        D.teardown(info)


def test_data_parallel_step_equals_full_batch_step():
    """Gathered embeddings + summed gradients over 2 processes == one full-batch step."""
    from otviz.train.distributed import launch

    same_keys, diff, scale = launch(_grad_step, (), 2)
    assert same_keys and scale > 0
    assert diff <= 1e-5 * scale


def _fail(report) -> None:
    raise ValueError("no such file: x.pt")


def test_a_failed_process_raises_with_its_traceback():
    from otviz.train.distributed import launch

    with pytest.raises(RuntimeError, match="(?s)data-parallel process failed.*no such file"):
        launch(_fail, (), 2)


def test_world_version_fingerprints_the_rendered_samples():
    """Same config, same fingerprint; a config that renders other samples changes it."""
    base = world_version(WorldConfig(negatives=False), per_split=4)
    assert base == world_version(WorldConfig(negatives=False), per_split=4)
    assert base != world_version(WorldConfig(negatives=False, pixel_noise=0.0), per_split=4)
    assert base != world_version(WorldConfig(negatives=True), per_split=4)


def test_negative_weights_parse_and_bias_the_draw():
    from otviz.data.rendered import RenderedSplit, draw_negatives, negative_weights
    from otviz.world import NEGATIVE_CATEGORIES

    assert negative_weights("") is None
    w = negative_weights("replace_obj:3, swap_obj:0")
    assert w.tolist() == [3.0 if c == "replace_obj" else 0.0 if c == "swap_obj" else 1.0
                          for c in NEGATIVE_CATEGORIES]
    for bad in ("colour:2", "replace_obj", "replace_obj:-1"):
        with pytest.raises(ValueError):
            negative_weights(bad)
    C = len(NEGATIVE_CATEGORIES)
    ids = torch.arange(C).view(1, C, 1).expand(1, C, 2).clone()  # category c -> token id c
    split = RenderedSplit(torch.zeros(1, 2, 2, 3, dtype=torch.uint8), torch.zeros(1, 2),
                          ["x"], ids, torch.ones(1, C, dtype=torch.bool))
    weights = torch.zeros(C)
    weights[[0, 3]] = torch.tensor([3.0, 1.0])
    drawn = draw_negatives(split, torch.zeros(4000, dtype=torch.long), 1,
                           torch.Generator().manual_seed(0), weights)[:, 0]
    assert set(drawn.tolist()) == {0, 3}  # zero-weight categories never drawn
    assert abs((drawn == 0).float().mean().item() - 0.75) < 0.03  # odds 3 : 1


def test_world_scaled_keeps_layout_and_scales_objects():
    base = WorldConfig()
    assert base.scaled(base.image_size) is base
    big = base.scaled(112)
    assert big.image_size == 112
    assert big.small_px == (round(14 * 1.4), round(18 * 1.4))
    assert big.large_px == (round(24 * 1.4), round(30 * 1.4))
    from otviz.world import World

    s = World(big, split="train", seed=0).sample(0)
    assert s.image.shape == (112, 112, 3)


def test_pretrain_resumes_to_the_same_weights(tmp_path):
    """A run stopped after a saved step and resumed ends with exactly the weights of an
    uninterrupted run, and leaves no training state behind."""
    base = dict(SMOKE, steps=6, n_train=128, n_test=16, save_every=2)
    whole = tmp_path / "whole"
    pretrain(PretrainConfig(**base, out=str(whole)))

    class Stop(Exception):
        pass

    def stop_at_5(step, total, entry):
        if step == 5:
            raise Stop

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        pretrain(PretrainConfig(**base, out=str(cut)), progress=stop_at_5)
    assert (tmp_path / "cut.resume" / "state.json").is_file()
    with pytest.raises(ValueError, match="another recipe"):
        pretrain(PretrainConfig(**dict(base, lr=1e-3), out=str(cut)))
    seen = []
    pretrain(PretrainConfig(**base, out=str(cut)), progress=lambda s, t, e: seen.append(s))
    assert seen == [5, 6]  # resumed after step 4, the last saved one
    assert not (tmp_path / "cut.resume").exists()
    (a, _), (b, _) = load_tiny_clip(whole), load_tiny_clip(cut)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert [e["loss"] for e in load_meta(whole)["log"]] == [e["loss"] for e in
                                                            load_meta(cut)["log"]]
