"""The on-disk feature cache against direct Backbone.encode on a randomly initialised tiny
CLIP: same features, no re-encoding on a hit, rebuilt on a changed backbone or data, never
reading a half-written entry."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from open_clip.tokenizer import SimpleTokenizer
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from otviz.backbone import Backbone
from otviz.data.datasets import WorldDataset, load_caption_csv
from otviz.data.feature_cache import META_FILE, FeatureCache, FeatureCacheError
from otviz.tiny_clip.model import create_tiny_clip, tiny_clip_config

CTX = 16
CFG = tiny_clip_config(embed_dim=32, vision_width=32, vision_layers=1, vision_heads=2,
                       text_width=32, text_layers=1, text_heads=2, context_length=CTX)
FP16_REL = 2.0**-11  # round-to-nearest float16: relative error of a normal number


def make_backbone(seed: int = 0, space: str = "width") -> Backbone:
    model = create_tiny_clip(CFG, seed=seed)
    preprocess = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    return Backbone(model, SimpleTokenizer(context_length=CTX), preprocess, space)


def count_forwards(backbone: Backbone, monkeypatch) -> list[int]:
    calls: list[int] = []
    original = backbone.forward_tensors

    def counting(pixels, ids):
        calls.append(ids.shape[0])
        return original(pixels, ids)

    monkeypatch.setattr(backbone, "forward_tensors", counting)
    return calls


@pytest.fixture(scope="module")
def backbone() -> Backbone:
    torch.set_num_threads(1)
    return make_backbone()


def direct(backbone: Backbone, dataset, indices):
    items = [dataset.item(i) for i in indices]
    return backbone.encode([im for im, _ in items], [c for _, c in items])


def test_float32_cache_returns_the_backbone_features(tmp_path, backbone):
    data = WorldDataset(5, "test", seed=0)
    cached = FeatureCache(tmp_path).get_or_build(backbone, data, batch_size=2, dtype="float32")
    ref = direct(backbone, data, range(5))
    batch = cached.pair_batch([4, 0, 2])
    want = ref.pair_batch().index(torch.tensor([4, 0, 2]), torch.tensor([4, 0, 2]))
    for name in ("patches", "tokens", "image_global", "text_global"):
        assert torch.allclose(getattr(batch, name), getattr(want, name), atol=1e-5), name
    assert torch.equal(batch.token_mask, want.token_mask) and batch.patch_mask.all()
    assert batch.grid == ref.grid == cached.grid
    assert torch.equal(cached.token_words([4, 0, 2]), ref.token_word[[4, 0, 2]])
    assert np.array_equal(cached.token_ids, ref.token_ids.numpy())
    assert cached.captions == [data.item(i)[1] for i in range(5)]
    assert cached.groups() == data.groups()


def test_float16_storage_error_is_within_rounding(tmp_path, backbone):
    data = WorldDataset(4, "test", seed=1)
    cached = FeatureCache(tmp_path).get_or_build(backbone, data, batch_size=4)
    ref = direct(backbone, data, range(4))
    assert cached.patches.dtype == np.float16 and cached.image_global.dtype == np.float32
    got = cached.pair_batch(range(4))
    for name in ("patches", "tokens"):
        g, r = getattr(got, name), getattr(ref, name)
        # half-precision rounding bound (relative 2^-11, absolute 2^-24 near zero), plus
        # float32 batch-composition noise
        assert torch.all((g - r).abs() <= FP16_REL * r.abs() + 2.0**-24 + 1e-5), name
    # what the methods compute from them: patch-token cosines move by well under 1e-3
    def cos(b):
        p = torch.nn.functional.normalize(b.patches, dim=-1)
        t = torch.nn.functional.normalize(b.tokens, dim=-1)
        return p @ t.transpose(1, 2)

    assert (cos(got) - cos(ref.pair_batch())).abs().max() < 1e-3


def test_second_call_reads_the_cache(tmp_path, backbone, monkeypatch):
    data = WorldDataset(3, "test", seed=0)
    cache = FeatureCache(tmp_path)
    calls = count_forwards(backbone, monkeypatch)
    seen = []
    first = cache.get_or_build(backbone, data, batch_size=2, progress=lambda d, t: seen.append(d))
    assert len(calls) == 2 and seen == [2, 3]
    again = cache.get_or_build(backbone, WorldDataset(3, "test", seed=0), batch_size=2)
    assert len(calls) == 2 and again.directory == first.directory
    assert isinstance(again.patches, np.memmap)  # memory-mapped, not loaded
    assert np.array_equal(again.tokens, first.tokens)


def test_changed_backbone_or_data_rebuilds(tmp_path, backbone, monkeypatch):
    cache = FeatureCache(tmp_path)
    data = WorldDataset(2, "test", seed=0)
    base = cache.get_or_build(backbone, data)
    others = [
        (make_backbone(seed=1), data),  # other weights
        (make_backbone(seed=0, space="projected"), data),  # other feature space
        (backbone, WorldDataset(2, "test", seed=5)),  # other world seed
        (backbone, WorldDataset(3, "test", seed=0)),  # other n
    ]
    dirs = {base.directory}
    for bb, ds in others:
        calls = count_forwards(bb, monkeypatch)
        entry = cache.get_or_build(bb, ds)
        assert calls, "a changed key must re-encode"
        dirs.add(entry.directory)
    assert len(dirs) == 5
    # weights changed in place: same object, new key
    with torch.no_grad():
        backbone.model.logit_scale.add_(1.0)
    try:
        calls = count_forwards(backbone, monkeypatch)
        assert cache.get_or_build(backbone, data).directory != base.directory and calls
    finally:
        with torch.no_grad():
            backbone.model.logit_scale.sub_(1.0)
    assert cache.get_or_build(backbone, data, key_info={"v": 2}).directory not in dirs


def test_crash_mid_build_leaves_nothing_readable(tmp_path, backbone, monkeypatch):
    cache = FeatureCache(tmp_path)
    data = WorldDataset(4, "test", seed=0)
    original = backbone.forward_tensors
    calls = []

    def crash_on_second(pixels, ids):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated crash")
        return original(pixels, ids)

    monkeypatch.setattr(backbone, "forward_tensors", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_build(backbone, data, batch_size=2)
    assert list(tmp_path.iterdir()) == []  # no entry, temporary directory removed
    monkeypatch.setattr(backbone, "forward_tensors", original)
    good = cache.get_or_build(backbone, data, batch_size=2)

    # a hard crash (no cleanup) of a non-atomic writer: arrays in place, meta.json missing
    shutil.copytree(good.directory, tmp_path / "copy")
    shutil.rmtree(good.directory)
    shutil.copytree(tmp_path / "copy", good.directory)
    (good.directory / META_FILE).unlink()
    calls = count_forwards(backbone, monkeypatch)
    rebuilt = cache.get_or_build(backbone, data, batch_size=2)
    assert calls and (rebuilt.directory / META_FILE).is_file()

    # a truncated array file under a valid meta.json is rejected too
    path = rebuilt.directory / "patches.npy"
    path.write_bytes(path.read_bytes()[:-100])
    calls.clear()
    again = cache.get_or_build(backbone, data, batch_size=2)
    assert calls and np.array_equal(again.patches, good.patches)

    # a meta.json from another key (a foreign or renamed entry) is not trusted
    meta = json.loads((again.directory / META_FILE).read_text())
    meta["key"] = "0" * 64
    (again.directory / META_FILE).write_text(json.dumps(meta))
    calls.clear()
    cache.get_or_build(backbone, data, batch_size=2)
    assert calls


def test_images_shared_by_captions_are_stored_once(tmp_path, backbone, monkeypatch):
    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        pixels = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{name}.png")
    rows = ["a.png,a red circle", "a.png,a circle", "a.png,red", "b.png,a blue square",
            "c.png,a star", "c.png,a green star"]
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    data = load_caption_csv(tmp_path / "pairs.csv")
    calls = count_forwards(backbone, monkeypatch)
    cached = FeatureCache(tmp_path / "cache").get_or_build(backbone, data, batch_size=1,
                                                           dtype="float32")
    # one forward per caption; chunks 2, 3 and 6 have no new image (padded with one)
    assert len(calls) == 6 and cached.n_images == 3 and cached.n_pairs == 6
    assert cached.groups() == [[0, 1, 2], [3], [4, 5]]
    ref = direct(backbone, data, range(6))
    batch = cached.pair_batch(range(6))
    for name in ("patches", "tokens", "image_global", "text_global"):
        assert torch.allclose(getattr(batch, name), getattr(ref, name), atol=1e-5), name
    # each image read once: the batch's sides hold the 3 distinct images, gathered per pair
    assert batch.sides is not None and batch.sides.patches.shape[0] == 3
    assert torch.equal(batch.sides.patches[batch.sides.image], batch.patches)
    # mismatched pairs for retrieval reranking: image 2 with caption 0
    cross = cached.pairs([2], [0])
    assert torch.allclose(cross.patches[0], ref.patches[4], atol=1e-5)
    assert torch.allclose(cross.tokens[0], ref.tokens[0], atol=1e-5)
    assert cross.sides is None  # nothing repeats
    img_g, txt_g = cached.global_embeddings()
    assert img_g.shape == (3, CFG["embed_dim"]) and txt_g.shape == (6, CFG["embed_dim"])


def test_bad_arguments(tmp_path, backbone):
    cache = FeatureCache(tmp_path)
    data = WorldDataset(2, "test", seed=0)
    with pytest.raises(FeatureCacheError):
        cache.get_or_build(backbone, data, dtype="bfloat16")
    entry = cache.get_or_build(backbone, data)
    with pytest.raises(IndexError):
        entry.pair_batch([2])
    with pytest.raises(ValueError):
        entry.pairs([0, 1], [0])



def test_least_recently_used_entries_are_evicted_beyond_the_cap(tmp_path, backbone):
    cache = FeatureCache(tmp_path)
    a, b, c = (cache.get_or_build(backbone, WorldDataset(2, "test", seed=s)).directory
               for s in (0, 1, 2))
    cache.get_or_build(backbone, WorldDataset(2, "test", seed=0))  # a used again: newest
    assert cache.entries() == [b, c, a]
    size = sum(f.stat().st_size for f in a.iterdir())
    assert cache.evict(3 * size) == [] and len(cache.entries()) == 3
    assert cache.evict(2 * size) == [b]
    assert cache.evict(0) == [c] and cache.entries() == [a]  # the newest always stays


def test_builds_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name, owner in (("dead", dead), ("live", str(os.getpid()))):
        d = tmp_path / f".{name}.x.building"
        d.mkdir()
        (d / "owner.pid").write_text(owner)
        (d / "patches.npy").write_bytes(b"\0" * 100)
    (tmp_path / ".discard.y").mkdir()
    removed = FeatureCache(tmp_path).remove_stale_builds()
    assert sorted(p.name for p in removed) == [".dead.x.building", ".discard.y"]
    assert (tmp_path / ".live.x.building").is_dir()
