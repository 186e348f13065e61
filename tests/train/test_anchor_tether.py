"""ConceptOT's anchors tethered to the training-free k-means anchors while a head started
from the backbone trains (otviz.train.anchor_tether): held anchors stay bit-equal while the
projections' update moves; the pull adds ``lambda_A ||P - P_0||^2`` to the objective, with
the closed-form gradient ``2 lambda_A (P - P_0)``, and keeps the anchors nearer than free
training does; a tether asked for where it means nothing is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from otviz.checkpoints.heads import load_method_checkpoint
from otviz.errors import InputError
from otviz.methods.base import AlignmentMethod
from otviz.methods.start import AffineMap, BackboneStart
from otviz.train.anchor_tether import AnchorPull
from otviz.train.config import TrainConfig
from otviz.train.loop import _start_method, train_method
from otviz.train.losses import TrainObjective
from otviz.train.negatives import positive_mask
from otviz.train.pairs import TensorPairs
from tests.helpers import tiny_train_config as tiny

JOINT = 12


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


def _source(seed: int = 0) -> TensorPairs:
    """Seeded random pairs with a random affine 'backbone' projection and fit captions (the
    k-means anchors come from those), so a ConceptOT head can start from the backbone."""
    source = TensorPairs.random(8, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)

    def affine(width: int) -> AffineMap:
        return AffineMap(torch.randn(JOINT, width, generator=g),
                         torch.randn(JOINT, generator=g))

    fit = TensorPairs.random(16, seed=seed + 1).pair_batch(torch.arange(16))
    source.start = BackboneStart(affine(source.patch_dim), affine(source.token_dim), fit)
    return source


def _config(tmp_path: Path, **overrides) -> TrainConfig:
    values = dict(method="conceptot", start="backbone", max_steps=4, lr=5e-2)
    values.update(overrides)
    return tiny(tmp_path, **values)


def _kmeans_anchors(config: TrainConfig, source: TensorPairs) -> torch.Tensor:
    """The anchors a backbone start fits (before any step), as a reference."""
    return _start_method(config, source).anchors.detach().clone()


def _trained(config: TrainConfig, source: TensorPairs) -> AlignmentMethod:
    """The head ``config`` trains on ``source``, loaded back from its checkpoint."""
    result = train_method(config, source=source)
    assert result.status == "finished"
    return load_method_checkpoint(result.head_checkpoint, dict(source.identity))


def test_held_anchors_stay_bit_equal_while_the_update_trains(tmp_path):
    source = _source()
    config = _config(tmp_path, anchor_hold=True)
    start = _kmeans_anchors(config, source)
    head = _trained(config, source)
    assert torch.equal(head.anchors.detach().to(start), start)
    assert float(head.proj_v.delta.detach().abs().max()) > 0  # the residual trained
    assert float(head.proj_t.delta.detach().abs().max()) > 0


def test_free_anchors_move_and_the_pull_keeps_them_nearer(tmp_path):
    """Same recipe, three tethers: free anchors move, a strong pull keeps them closer to
    the k-means anchors than a weak one, and both pulls closer than none."""
    source = _source(1)
    distances = {}
    for pull in (0.0, 1e-2, 1e2):
        config = _config(tmp_path / f"pull{pull:g}", anchor_pull=pull)
        start = _kmeans_anchors(config, source)
        anchors = _trained(config, source).anchors.detach().to(start)
        distances[pull] = float((anchors - start).norm())
    assert distances[0.0] > 0
    assert distances[1e2] < distances[1e-2] < distances[0.0]


def test_the_pull_is_lambda_times_the_squared_distance_and_its_gradient_the_closed_form(
    tmp_path,
):
    """``loss(pull) - loss(no pull) = lambda ||P - P_0||^2`` and the anchors' gradient
    differs by ``2 lambda (P - P_0)``, with ``P`` moved off its start by a known step."""
    source, weight = _source(2), 0.7
    idx = torch.arange(8)
    batch = source.pair_batch(idx)
    excluded = positive_mask(source.image_ids[idx], source.text_ids[idx])
    shift = 0.05 * torch.randn(4, JOINT, generator=torch.Generator().manual_seed(3))
    expected = weight * float(shift.double().pow(2).sum())
    losses, grads = {}, {}
    for pull in (0.0, weight):
        config = _config(tmp_path, anchor_pull=pull)
        torch.manual_seed(0)
        method = _start_method(config, source)
        objective = TrainObjective(method, config, source.logit_scale)
        with torch.no_grad():
            method.anchors.add_(shift)
        loss, terms = objective(batch, excluded, idx)
        loss.backward()
        losses[pull], grads[pull] = float(loss.detach()), method.anchors.grad.clone()
        if pull:
            assert isinstance(objective.anchor_pull, AnchorPull)
            assert float(terms.anchor_pull) == pytest.approx(expected, rel=1e-6)
    # float32 losses of order 1: their difference is exact to ~1e-7 absolute
    assert losses[weight] - losses[0.0] == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(grads[weight] - grads[0.0], 2 * weight * shift,
                               atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "knob"),
    [
        ({"anchor_hold": True, "start": "random"}, "--anchor-hold"),
        ({"anchor_pull": 1.0, "start": "random"}, "--anchor-pull"),
        ({"anchor_hold": True, "method": "dense_uot"}, "--anchor-hold"),
        ({"anchor_hold": True, "anchor_pull": 1.0}, "--anchor-hold"),
    ],
)
def test_a_tether_where_it_means_nothing_is_refused_by_name(tmp_path, overrides, knob):
    with pytest.raises(InputError, match=knob):
        train_method(_config(tmp_path, **overrides), source=_source())
