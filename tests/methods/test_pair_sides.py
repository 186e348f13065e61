"""Batches that repeat images or captions (hard negatives, retrieval candidates) carry
:class:`PairSides`; every method gives the same alignment and the same gradients with and
without them (per-image / per-caption work done once is an optimisation, not a change)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from otviz.bench.runners import random_batch
from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.ot import LowRankSettings
from otviz.ot.lowrank import _pair_products, lowrank_uot
from tests.helpers import moved

# 6 items; 14 pairs repeating images and captions in no particular order
IMAGE_IDX = torch.tensor([0, 1, 2, 3, 4, 5, 0, 0, 2, 5, 5, 1, 3, 4])
TEXT_IDX = torch.tensor([0, 1, 2, 3, 5, 5, 3, 1, 1, 0, 2, 5, 3, 3])


def _items(seed: int) -> PairBatch:
    items = random_batch(6, 16, 7, 12, seed)
    patch_mask, token_mask = items.patch_mask.clone(), items.token_mask.clone()
    patch_mask[2, 11:] = False
    token_mask[3, 5:] = False
    return dataclasses.replace(items, patch_mask=patch_mask, token_mask=token_mask)


def _method(name: str, items: PairBatch, trainable: bool):
    torch.manual_seed(1)
    config = MethodConfig(concept_dim=10, rank=5, trainable=trainable)
    method = build_method(name, 12, 12, config)
    if trainable:  # move the heads off their uniform start so the masses matter
        with torch.no_grad():
            for p in method.parameters():
                p.add_(0.1 * torch.randn_like(p))
    else:
        method.fit_training_free(items)
    return method


def test_index_records_distinct_sides() -> None:
    items = _items(0)
    batch = items.index(IMAGE_IDX, TEXT_IDX)
    sides = batch.sides
    assert sides is not None
    assert sides.patches.shape[0] == 6 and sides.tokens.shape[0] == 5  # caption 4 unused
    assert torch.equal(sides.patches[sides.image], batch.patches)
    assert torch.equal(sides.patch_mask[sides.image], batch.patch_mask)
    assert torch.equal(sides.tokens[sides.text], batch.tokens)
    assert torch.equal(sides.token_mask[sides.text], batch.token_mask)
    distinct = items.index(torch.tensor([2, 0, 1]), torch.tensor([1, 2, 0]))
    assert distinct.sides is None  # nothing repeats: nothing to share


@pytest.mark.parametrize("trainable", [True, False], ids=["trainable", "training_free"])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_methods_agree_with_and_without_sides(
    name: str, trainable: bool, device: torch.device
) -> None:
    items = _items(3)
    shared = moved(items.index(IMAGE_IDX, TEXT_IDX), device)
    plain = dataclasses.replace(shared, sides=None)
    method = _method(name, items, trainable).to(device)
    learns = any(p.requires_grad for p in method.parameters())
    outs, grads = [], []
    for batch in (shared, plain):
        method.zero_grad(set_to_none=True)
        out = method(batch)
        if learns:
            (out.local_score.sum() + method.regulariser()).backward()
            grads.append(
                {k: p.grad.clone() for k, p in method.named_parameters() if p.grad is not None}
            )
        outs.append(out)
    a, b = outs
    for field in ("local_score", "row_marginal", "col_marginal"):
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(a.plan.dense(), b.plan.dense(), rtol=1e-4, atol=1e-7)
    if learns:
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for k in grads[0]:
            torch.testing.assert_close(grads[0][k], grads[1][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("variant", ["faithful", "positive"])
def test_lowrank_with_indices_equals_gathered_call(variant: str) -> None:
    gen = torch.Generator().manual_seed(5)
    dt = torch.float64
    z = torch.nn.functional.normalize(torch.randn(4, 9, 6, generator=gen, dtype=dt), dim=-1)
    y = torch.nn.functional.normalize(torch.randn(3, 5, 6, generator=gen, dtype=dt), dim=-1)
    anchors = torch.nn.functional.normalize(torch.randn(4, 6, generator=gen, dtype=dt), dim=-1)
    row_mask = torch.ones(4, 9, dtype=torch.bool)
    row_mask[1, 6:] = False
    col_mask = torch.ones(3, 5, dtype=torch.bool)
    col_mask[2, 3:] = False
    img, txt = torch.tensor([0, 1, 1, 3, 2, 0, 3]), torch.tensor([2, 0, 1, 1, 2, 2, 0])
    mu = torch.rand(7, 9, generator=gen, dtype=dt) * row_mask[img]
    nu = torch.rand(7, 5, generator=gen, dtype=dt) * col_mask[txt]
    kw = LowRankSettings(eps=0.1, tau_a=0.5, tau_b=0.3, n_iters=6, variant=variant, tol=None)
    shared = lowrank_uot(
        z, y, anchors, mu, nu, kw, row_mask, col_mask, image_index=img, text_index=txt
    )
    plain = lowrank_uot(
        z[img], y[txt], anchors, mu, nu, kw, row_mask=row_mask[img], col_mask=col_mask[txt]
    )
    for field in ("score", "mass", "marginal_error", "log_u", "log_v"):
        torch.testing.assert_close(getattr(shared, field), getattr(plain, field))
    torch.testing.assert_close(shared.factors.dense(), plain.factors.dense())
    for key, value in plain.extras.items():
        torch.testing.assert_close(shared.extras[key], value)
    with pytest.raises(ValueError, match="per-pair anchors"):
        lowrank_uot(z, y, anchors.expand(7, -1, -1), mu, nu, kw, image_index=img, text_index=txt)


@pytest.mark.parametrize(
    "index",
    [
        [0, 1, 1, 2, 0, 2, 1, 0, 2],  # even groups: stacked per distinct x
        [0, 0, 0, 0, 0, 0, 0, 1, 2],  # one big group: gathered in chunks
    ],
    ids=["stacked", "chunked"],
)
def test_pair_products_match_the_gathered_products(index: list[int]) -> None:
    gen = torch.Generator().manual_seed(7)
    idx = torch.tensor(index)
    a = torch.randn(len(index), 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(_pair_products(a, x, idx), a @ x[idx])
    # chunks of one pair exercise the chunked path's loop; gradients reach both inputs
    assert torch.autograd.gradcheck(lambda a, x: _pair_products(a, x, idx, chunk_bytes=1), (a, x))
