"""Early stopping on a validation split: the validation loss is the training objective on
held-out pairs, the published head is the best validation step's, patience ends a run, and
the validation state survives a resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from otviz.checkpoints.heads import head_meta, load_method_checkpoint
from otviz.train.loop import Validation, train_method
from otviz.train.losses import TrainObjective
from otviz.train.pairs import TensorPairs
from otviz.world import World
from otviz.world.vocab import SPLITS
from tests.helpers import tiny_train_config as tiny


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


def test_record_keeps_the_best_and_counts_since() -> None:
    val = Validation(TensorPairs.random(8, seed=1), batch_size=8)
    assert [val.record(s, v) for s, v in [(1, 3.0), (2, 2.0), (3, 2.5), (4, 2.0)]] == [
        True, True, False, False]
    assert (val.best, val.best_step, val.since_best) == (2.0, 2, 2)
    restored = Validation(TensorPairs.random(8, seed=1), batch_size=8)
    restored.restore(val.state())
    assert restored.state() == val.state()


def test_validation_needs_a_full_batch() -> None:
    with pytest.raises(ValueError, match="cannot fill one batch of 16"):
        Validation(TensorPairs.random(8), batch_size=16)


def test_the_loss_is_the_objective_on_the_held_out_pairs(tmp_path: Path) -> None:
    train, held_out = TensorPairs.random(16, seed=2), TensorPairs.random(16, seed=3)
    train.identity = {"name": "tiny", "weights": "0123", "space": "width"}
    config = tiny(tmp_path, method="dense_uot", n_val=16, max_steps=2)
    result = train_method(config, source=train, validation_source=held_out)
    assert result.status == "finished" and result.steps == 2
    # an epoch is 2 steps: one validation, at step 2, equal to the objective recomputed from
    # the published head
    head = load_method_checkpoint(result.head_checkpoint, train.identity)
    objective = TrainObjective(head, config, train.logit_scale)
    again = Validation(held_out, config.batch_size).loss(objective, config, torch.device("cpu"))
    recorded = head_meta(result.head_checkpoint)["metrics"]["validation"]
    assert recorded["curve"] == [[2, pytest.approx(again, rel=1e-5)]]
    assert again != pytest.approx(result.history[-1]["loss"])  # not the training batch's


def test_patience_stops_early_and_publishes_the_best_step(tmp_path: Path) -> None:
    train, held_out = TensorPairs.random(16, seed=4), TensorPairs.random(16, seed=5)
    # a learning rate far too high makes the held-out loss worse after the first epochs
    config = tiny(tmp_path, method="dense_uot", n_val=16, max_steps=40, lr=3.0, patience=2,
                  grad_clip=0.0)
    result = train_method(config, source=train, validation_source=held_out)
    assert result.status == "finished" and "stopped early" in result.message
    curve = result.validation
    losses = [v for _, v in curve]
    best_step = curve[losses.index(min(losses))][0]
    assert head_meta(result.head_checkpoint)["metrics"]["steps"] == best_step
    assert f"the head is step {best_step}'s" in result.message
    # patience 2: the run ends at the second validation (of an epoch of 2 steps) after the best
    assert result.steps == best_step + 2 * 2 < 40


def test_validation_state_survives_a_resume(tmp_path: Path) -> None:
    train, held_out = TensorPairs.random(16, seed=6), TensorPairs.random(16, seed=7)
    straight = train_method(tiny(tmp_path / "a", method="filip", n_val=16, max_steps=6),
                            source=train, validation_source=held_out)
    config = tiny(tmp_path / "b", method="filip", n_val=16, max_steps=6)
    calls: list[int] = []
    first = train_method(config, progress=lambda s, t, m: calls.append(s), source=train,
                         validation_source=held_out, stop=lambda: len(calls) >= 3)
    assert first.status == "stopped"
    second = train_method(config, source=train, validation_source=held_out)
    assert second.losses() == pytest.approx(straight.losses(), rel=1e-6)
    a, b = straight.validation, second.validation
    assert [s for s, _ in b] == [s for s, _ in a] == [2, 4, 6]  # one per epoch of 2 steps
    assert [v for _, v in b] == pytest.approx([v for _, v in a], rel=1e-6)


def test_the_world_has_a_validation_split_apart_from_train() -> None:
    assert "val" in SPLITS
    train = [World(split="train", seed=0).sample(i).image.tobytes() for i in range(20)]
    val = [World(split="val", seed=0).sample(i).image.tobytes() for i in range(20)]
    assert not set(train) & set(val)  # its own random stream, not a copy of train's
