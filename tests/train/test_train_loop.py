"""Method-head training on tiny seeded random features: every trainable method's step lowers
its loss, the local loss matches its closed form, the frozen global term is constant and
reported, resumption continues the same curve, checkpoints round-trip and refuse a foreign
backbone."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import otviz.methods  # noqa: F401  (registers every method)
from otviz.checkpoints.heads import head_meta, load_method_checkpoint
from otviz.checkpoints.store import CheckpointError, load_checkpoint
from otviz.cli.train import build_parser, main
from otviz.errors import InputError
from otviz.methods.base import METHODS, build_method
from otviz.patch_grid.masks import random_boxes
from otviz.train.config import TrainConfig
from otviz.train.global_head import GlobalHead, load_global_head
from otviz.train.loop import ResumeConflictError, train_method
from otviz.train.losses import (
    LOCAL_CONTRASTIVE,
    TrainObjective,
    local_contrastive_loss,
    local_objective,
)
from otviz.train.negatives import positive_mask
from otviz.train.pairs import TensorPairs
from otviz.train.schedule import lr_factor
from tests.helpers import random_tiny_clip
from tests.helpers import tiny_train_config as tiny

TRAINABLE = sorted(m for m in METHODS if m != "global_only")


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


def objective_for(config: TrainConfig, source: TensorPairs) -> TrainObjective:
    torch.manual_seed(0)
    method = build_method(config.method, source.patch_dim, source.token_dim,
                          config.method_config())
    head = (
        GlobalHead(source.embed_dim, source.logit_scale) if config.train_global_head else None
    )
    return TrainObjective(method, config, source.logit_scale, head).double()


def fixed_batch(config: TrainConfig, source: TensorPairs):
    idx = torch.arange(config.batch_size)
    batch = source.pair_batch(idx)
    batch.regions = random_boxes(batch.grid, config.n_regions, seed=0, batch_size=batch.size)
    excluded = positive_mask(source.image_ids[idx], source.text_ids[idx])
    return batch, excluded, idx


@pytest.mark.parametrize("mask", ["token_mask", "patch_mask"])
def test_a_batch_pair_with_nothing_to_align_is_refused_by_its_row(tmp_path: Path, mask: str):
    config = tiny(tmp_path, method="dense_uot")
    source = TensorPairs.random(8, seed=3, dtype=torch.float64)
    objective = objective_for(config, source)
    batch, excluded, rows = fixed_batch(config, source)
    assert torch.isfinite(objective(batch, excluded, rows)[0])
    getattr(batch, mask)[5] = False
    with pytest.raises(InputError, match=r"pair\(s\) \[5\] have no content token or no patch"):
        objective(batch, excluded, rows)


@pytest.mark.parametrize(
    "method, head", [(m, False) for m in TRAINABLE] + [("global_only", True)]
)
def test_one_step_lowers_the_loss_on_a_fixed_batch(tmp_path: Path, method: str, head: bool):
    config = tiny(tmp_path, method=method, train_global_head=head, lr=1e-3)
    source = TensorPairs.random(8, seed=3, dtype=torch.float64)
    objective = objective_for(config, source)
    batch, excluded, rows = fixed_batch(config, source)
    params = [p for p in objective.parameters() if p.requires_grad]
    assert params
    before, terms = objective(batch, excluded, rows)
    before.backward()
    assert all(p.grad is not None for p in params)
    torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay).step()
    with torch.no_grad():
        after, terms_after = objective(batch, excluded, rows)
    assert after < before - 1e-6, (method, float(before), float(after))
    if not head:  # the frozen global term cannot move; the decrease is the local term's
        assert terms_after.global_loss == terms.global_loss
        assert terms_after.local_part < terms.local_part


@pytest.mark.parametrize("method", [m for m in TRAINABLE if local_objective(m) ==
                                    LOCAL_CONTRASTIVE])
def test_positives_and_negatives_go_through_one_method_call(tmp_path: Path, method: str):
    config = tiny(tmp_path, method=method, hard_negatives=3)
    source = TensorPairs.random(8, seed=1)
    objective = objective_for(config, source).float()
    sizes = []
    real_align = objective.method.align
    objective.method.align = lambda b: sizes.append(b.size) or real_align(b)
    objective(*fixed_batch(config, source))
    assert sizes == [8 + 2 * 8 * 3]


def test_local_contrastive_closed_form() -> None:
    """K = 1: l = (softplus((t - s)/tau) + softplus((u - s)/tau)) / 2 (Eq. 9 both ways);
    masked negatives drop out of the softmax."""
    pos = torch.tensor([0.5, -0.2])
    nt = torch.tensor([[0.3], [0.1]])
    ni = torch.tensor([[0.6], [-0.4]])
    tau = 0.07
    want = 0.5 * (F.softplus((nt[:, 0] - pos) / tau) + F.softplus((ni[:, 0] - pos) / tau))
    torch.testing.assert_close(local_contrastive_loss(pos, nt, ni, tau), want)
    padded_t = torch.cat([nt, torch.full((2, 2), 9.0)], 1)
    padded_i = torch.cat([ni, torch.full((2, 2), 9.0)], 1)
    valid = torch.tensor([[True, False, False]] * 2)
    got = local_contrastive_loss(pos, padded_t, padded_i, tau, valid, valid)
    torch.testing.assert_close(got, want)


def test_frozen_global_term_is_constant_and_reported(tmp_path: Path) -> None:
    source = TensorPairs.random(8, seed=2)
    result = train_method(tiny(tmp_path, method="dense_uot", max_steps=3), source=source)
    assert not result.global_term_trains
    assert any("constant" in n for n in result.notes)
    img = F.normalize(source.image_global, dim=-1)
    txt = F.normalize(source.text_global, dim=-1)
    logits = source.logit_scale * img @ txt.T
    target = torch.arange(8)
    infonce = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))
    for h in result.history:  # the whole set every step: the same symmetric InfoNCE
        assert h["global"] == pytest.approx(float(infonce), rel=1e-5)
        assert h["loss"] == pytest.approx(h["global"] + 0.5 * h["local"], rel=1e-6)


def test_global_head_makes_the_global_term_train(tmp_path: Path) -> None:
    source = TensorPairs.random(8, seed=2)
    config = tiny(tmp_path, method="global_only", train_global_head=True, max_steps=8)
    result = train_method(config, source=source)
    assert result.status == "finished" and result.global_term_trains
    globals_ = [h["global"] for h in result.history]
    assert globals_[-1] < globals_[0] - 1e-3
    head = load_global_head(result.head_checkpoint)
    assert head is not None
    assert not torch.allclose(head.image.weight, torch.eye(source.embed_dim))


def test_global_only_without_a_head_is_skipped(tmp_path: Path) -> None:
    result = train_method(tiny(tmp_path, method="global_only"), source=TensorPairs.random(8))
    assert result.status == "skipped" and "nothing to train" in result.message
    assert result.history == [] and not (tmp_path / "run").exists()


def test_learning_rate_follows_warmup_then_cosine(tmp_path: Path) -> None:
    config = tiny(tmp_path, method="filip", max_steps=8, warmup_frac=0.25, lr=0.1)
    result = train_method(config, source=TensorPairs.random(8))
    want = [0.05, 0.1] + [0.05 * (1 + math.cos(math.pi * s / 6)) for s in range(6)]
    assert [h["lr"] for h in result.history] == pytest.approx(want)
    assert lr_factor(7, 8, 2) == pytest.approx(0.5 * (1 + math.cos(5 * math.pi / 6)))


RESUME_CASES = [
    ("conceptot", {"train_global_head": True}),
    ("powerclip", {}),
    ("qc_align", {}),
]


@pytest.mark.parametrize("method, extra", RESUME_CASES)
def test_stop_and_resume_continue_the_same_curve(tmp_path: Path, method: str, extra: dict):
    source = TensorPairs.random(24, seed=4)  # 3 batches per epoch, 2 epochs
    straight = train_method(tiny(tmp_path / "a", method=method, **extra), source=source)
    assert straight.status == "finished" and straight.steps == 6

    config = tiny(tmp_path / "b", method=method, **extra)
    calls = []
    first = train_method(config, progress=lambda s, t, m: calls.append(s), source=source,
                         stop=lambda: len(calls) >= 4)  # in the middle of epoch 2
    assert first.status == "stopped" and first.steps == 4 and calls == [1, 2, 3, 4]
    second = train_method(config, source=source)
    assert second.status == "finished" and second.steps == 6
    assert any("resumed" in n for n in second.notes)
    for key in ("loss", "local", "global", "lr", "grad_norm"):
        got = [h[key] for h in second.history]
        want = [h[key] for h in straight.history]
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9), key


def test_a_crash_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    source = TensorPairs.random(24, seed=5)
    straight = train_method(tiny(tmp_path / "a", method="dense_uot"), source=source)
    config = tiny(tmp_path / "b", method="dense_uot", checkpoint_every=2)

    def crash(step: int, total: int, metrics: dict) -> None:
        if step == 5:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train_method(config, progress=crash, source=source)
    _, meta = load_checkpoint(tmp_path / "b" / "run" / "state")
    assert meta["progress"]["step"] == 4  # steps 1-4 kept, step 5 is lost with the crash
    resumed = train_method(config, source=source)
    assert resumed.losses() == pytest.approx(straight.losses(), rel=1e-6)


def test_resume_refuses_another_recipe(tmp_path: Path) -> None:
    source = TensorPairs.random(8)
    train_method(tiny(tmp_path, method="filip", max_steps=2), source=source)
    with pytest.raises(ResumeConflictError, match="lr"):
        train_method(tiny(tmp_path, method="filip", max_steps=2, lr=0.5), source=source)
    fresh = train_method(tiny(tmp_path, method="filip", max_steps=2, lr=0.5, resume=False),
                         source=source)
    assert fresh.status == "finished" and fresh.steps == 2


def test_method_checkpoint_round_trip_and_refusals(tmp_path: Path) -> None:
    source = TensorPairs.random(8, seed=6)
    source.identity = {"name": "tiny", "weights": "0123", "space": "width"}
    config = tiny(tmp_path, method="conceptot", max_steps=2)
    result = train_method(config, source=source)
    method = load_method_checkpoint(result.head_checkpoint, dict(source.identity))
    meta = head_meta(result.head_checkpoint)
    assert meta["method"] == "conceptot" and meta["method_config"]["rank"] == 4
    assert meta["train_config"] == config.to_dict() and meta["backbone"] == source.identity
    assert meta["metrics"]["final_loss"] == pytest.approx(result.history[-1]["loss"])
    state, _ = load_checkpoint(Path(result.state_checkpoint))
    for k, v in method.state_dict().items():
        torch.testing.assert_close(v, state[f"model.method.{k}"], rtol=0, atol=0)
    assert not method.training
    assert torch.isfinite(method(source.pair_batch(torch.arange(4))).local_score).all()

    for key, value in (("weights", "abcd"), ("space", "projected")):
        with pytest.raises(CheckpointError, match=f"{key}.*backbone|backbone.*{key}"):
            load_method_checkpoint(result.head_checkpoint, {**source.identity, key: value})
    tensor_file = Path(result.head_checkpoint) / "model.safetensors"
    data = bytearray(tensor_file.read_bytes())
    data[-5] ^= 0xFF
    tensor_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        load_method_checkpoint(result.head_checkpoint, source.identity)


def test_config_fields_are_command_line_flags() -> None:
    args = build_parser().parse_args(
        ["--method", "dense_uot", "--hard-negatives", "2", "--no-resume", "--train-global-head",
         "--global-loss", "entropic_ot", "--lambda-local", "0.25"]
    )
    from otviz.cli.args import dataclass_from_args

    config = dataclass_from_args(TrainConfig, args)
    assert (config.method, config.hard_negatives, config.resume) == ("dense_uot", 2, False)
    assert config.train_global_head and config.global_loss == "entropic_ot"
    assert config.lambda_local == 0.25 and config.eps == 0.07 and config.tau_local == 0.07


@pytest.fixture(scope="module")
def world_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("world")
    return {"backbone": str(random_tiny_clip(root / "bb", 0)), "cache_dir": str(root / "cache")}


def test_world_through_the_feature_cache_with_a_random_tiny_clip(
    tmp_path: Path, world_setup: dict[str, str]
) -> None:
    """The default data path end to end: world samples encoded by a (random, tiny) backbone
    checkpoint into the feature cache, PowerCLIP trained with the world's gold trees; the
    head loads for that backbone and is refused by another."""
    from otviz.backbone import Backbone

    config = tiny(tmp_path, method="powerclip", max_steps=2, n_train=16,
                  backbone=world_setup["backbone"], cache_dir=str(tmp_path / "cache"))
    calls = []
    result = train_method(config, progress=lambda s, t, m: calls.append((s, t, sorted(m))))
    assert result.status == "finished" and result.steps == 2
    encoding = [c for c in calls if c[2] == ["encoding"]]  # the cache was built: 16 pairs
    assert encoding and encoding[-1][:2] == (16, 16) and calls[-1][:2] == (2, 2)
    assert not any("no parse trees" in n for n in result.notes)
    backbone = Backbone.from_checkpoint(config.backbone)
    method = load_method_checkpoint(result.head_checkpoint, backbone)
    assert method.name == "powerclip"
    other = Backbone.from_checkpoint(random_tiny_clip(tmp_path / "other", 1))
    with pytest.raises(CheckpointError, match="weights"):
        load_method_checkpoint(result.head_checkpoint, other)


def test_command_line_entry(
    tmp_path: Path, world_setup: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    argv = ["--method", "dense_uot", "--n-train", "16", "--batch-size", "8", "--max-steps",
            "2", "--concept-dim", "16", "--threads", "1", "--device", "cpu", "--quiet",
            "--backbone", world_setup["backbone"], "--cache-dir", world_setup["cache_dir"],
            "--out", str(out)]
    assert main(argv) == 0
    assert "trained dense_uot for 2 steps" in capsys.readouterr().out
    assert head_meta(out / "head")["train_config"]["n_train"] == 16
    assert main(["--method", "global_only", "--out", str(tmp_path / "g")]) == 0
    assert "nothing to train" in capsys.readouterr().out
