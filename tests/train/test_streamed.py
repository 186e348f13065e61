"""Training streamed from webdataset shards: the curve of the feature cache on the same pairs
in the same order (float32 features both ways; tolerance 1e-4 relative: the backbone encodes
each step's rows in batches of another size than the cache's, which moves float32 sums in
their last digits), with any number of DataLoader workers; no feature cache written; a run
stopped mid-epoch resumes from its state's step (recorded with the position in the epoch)
to the uninterrupted curve; an image that passes its header but does not decode drops its row
and is named; the issue's command on a random-weight ViT-B/16 file publishes heads that
record the file's weights and the reading. (``torchrun`` with 2 processes gives the
1-process curve: tests/train/test_train_ddp.py, whose one job runs every data-parallel
training check.)"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.store import load_meta
from otviz.data.datasets import WorldDataset
from otviz.data.feature_cache import FeatureCache
from otviz.train.config import TrainConfig
from otviz.train.loop import train_method
from otviz.train.pairs import CachedPairs, build_source
from otviz.train.streamed import StreamedPairs, batch_pairs
from otviz.world.export import export_shards
from tests import helpers
from tests.shared_artifacts import TRAINED_ON, VIT, VitHeads

N, BATCH = 24, 6  # 4 steps an epoch


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


def config(root: Path, **overrides) -> TrainConfig:
    values = dict(method="conceptot", data=str(root / "shards"), backbone=str(root / "bb"),
                  batch_size=BATCH, max_steps=6, concept_dim=16, rank=4, lr=1e-2,
                  hard_negatives=2, warmup_frac=0.2, threads=1, device="cpu", log_every=0,
                  workers=0, out=str(root / "run"), cache_dir=str(root / "cache"))
    values.update(overrides)
    return TrainConfig(**values)


def make_data(root: Path) -> None:
    helpers.random_tiny_clip(root / "bb", 0)
    export_shards(root / "shards", N, "train", seed=0, per_shard=7)


class SameOrder:
    """Cached features served in a streamed source's order (the reference curve)."""

    def __init__(self, cached: CachedPairs, streamed: StreamedPairs) -> None:
        self.cached, self.streamed = cached, streamed
        for name in ("n_pairs", "patch_dim", "token_dim", "embed_dim", "logit_scale",
                     "identity", "image_ids", "text_ids"):
            setattr(self, name, getattr(cached, name))
        self.start = streamed.start

    def step_batch(self, step: int, device: str):
        epoch, b = divmod(step, self.streamed.steps_per_epoch)
        order = self.streamed.order(epoch)
        idx = torch.from_numpy(batch_pairs(order, BATCH, b, np.arange(BATCH)))
        return idx, self.cached.pair_batch(idx, device)


def test_an_epoch_reads_each_pair_once_each_process_a_stretch_of_it() -> None:
    order = np.random.default_rng(0).permutation(26)  # 26 pairs, 6 lanes of 4, 2 wait
    steps = [batch_pairs(order, 6, b, np.arange(6)) for b in range(4)]
    seen = np.concatenate(steps)
    assert len(set(seen.tolist())) == 24 and set(seen) <= set(order[:24])
    first_process = np.concatenate([s[:3] for s in steps])  # rows 0-2 of every step
    assert sorted(first_process.tolist()) == sorted(order[:12].tolist())


def curve(result, key: str = "loss") -> list[float]:
    return [h[key] for h in result.history]


def test_streamed_curve_is_the_cached_curve_on_the_same_pairs(tmp_path: Path) -> None:
    make_data(tmp_path)
    cfg = config(tmp_path)
    streamed = train_method(dataclasses.replace(cfg, workers=2))
    assert streamed.status == "finished" and streamed.steps == 6  # into a second epoch
    assert not (tmp_path / "cache").exists()  # shards stream: no feature cache
    assert streamed.data_summary == "shards: 4 listed, 24 pairs, nothing skipped"
    assert all(h["pairs"] == BATCH for h in streamed.history)

    source = build_source(cfg)
    assert isinstance(source, StreamedPairs)
    backbone = Backbone.from_checkpoint(cfg.backbone)
    features = FeatureCache(tmp_path / "ref-cache").get_or_build(
        backbone, WorldDataset(N, "train", seed=0), dtype="float32")
    cached = CachedPairs(features, source.identity, source.logit_scale)
    assert cached.text_ids.tolist() == source.text_ids.tolist()  # the same pairs, in order
    reference = train_method(dataclasses.replace(cfg, out=str(tmp_path / "ref")),
                             source=SameOrder(cached, source))
    for key in ("loss", "local", "global", "grad_norm"):
        assert curve(streamed, key) == pytest.approx(curve(reference, key), rel=1e-4), key
    assert len(set(curve(reference))) > 1  # the curve moves: equality is not trivial


def test_a_run_stopped_mid_epoch_resumes_on_the_same_curve(tmp_path: Path) -> None:
    make_data(tmp_path)
    whole = train_method(config(tmp_path, out=str(tmp_path / "whole")))
    cfg = config(tmp_path, out=str(tmp_path / "parts"), checkpoint_every=1)
    done: list[int] = []
    first = train_method(cfg, progress=lambda step, total, m: done.extend([step] * ("loss" in m)),
                         stop=lambda: len(done) >= 2)  # after 2 steps (indexing reports too)
    assert first.status == "stopped" and first.steps == 2
    position = load_meta(tmp_path / "parts" / "state")["progress"]["position"]
    source = build_source(cfg)
    lane0 = batch_pairs(source.order(0), BATCH, 2, np.zeros(1, dtype=np.int64))[0]
    assert position == {"epoch": 0, "batch": 2, "pairs_done_in_epoch": 2 * BATCH,
                        "next": source.index.where(int(lane0))}
    rest = train_method(dataclasses.replace(cfg, workers=1))
    assert rest.status == "finished" and "resumed from" in " ".join(rest.notes)
    assert curve(rest) == pytest.approx(curve(whole), rel=1e-6)


def test_an_image_that_does_not_decode_drops_its_row_and_is_named(tmp_path: Path) -> None:
    make_data(tmp_path)
    shard = tmp_path / "shards" / "000000.tar"
    members = []
    with tarfile.open(shard) as tar:
        for m in tar.getmembers():
            data = tar.extractfile(m).read()
            if m.name == "000000003.png":  # header intact, pixel data corrupt
                data = data[:41] + bytes(len(data) - 41)
            members.append((m, data))
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))
    result = train_method(config(tmp_path, max_steps=4, workers=1))
    assert sorted(h["pairs"] for h in result.history) == [BATCH - 1] + [BATCH] * 3
    assert result.data_summary == ("shards: 4 listed, 24 pairs; skipped 1: 1 image refused "
                                   "(000000.tar:000000003.png: does not decode)")


def test_the_command_line_prints_the_summary_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from otviz.cli.train import main

    make_data(tmp_path)
    flags = {k: v for k, v in dataclasses.asdict(config(tmp_path, max_steps=2)).items()
             if k in ("data", "backbone", "batch_size", "max_steps", "concept_dim", "rank",
                      "threads", "device", "workers", "out", "cache_dir")}
    argv = [x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    assert main([*argv, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "trained conceptot for 2 steps\nshards: 4 listed, 24 pairs, nothing skipped\n" in out
    assert not (tmp_path / "cache").exists()


def test_a_vit_b16_weight_file_trains_from_shards_at_its_reading(vit_heads: VitHeads) -> None:
    """The issue's command on a random-weight ViT-B/16 file (default start: the head starts
    from the ViT's own projections), publishing heads that record its weights and reading:
    the run's shared one (:func:`tests.shared_artifacts.vit_heads`: 2 steps of 4 pairs from 2
    shards, made once a run for this test and the app's)."""
    from otviz.checkpoints.heads import head_meta
    from otviz.checkpoints.identity import backbone_fingerprint

    assert "shards: 2 listed, 8 pairs, nothing skipped" in vit_heads.printed
    assert not vit_heads.cache.exists()
    backbone = Backbone.from_pretrained(VIT, str(vit_heads.weights)).with_features(TRAINED_ON)
    meta = head_meta(vit_heads.heads / "conceptot")
    assert meta["backbone"] == json.loads(json.dumps(backbone_fingerprint(backbone)))
    assert meta["backbone"]["features"] == "clearclip"
    assert meta["method_config"]["start"] == "backbone"  # "auto" on an open_clip ViT
