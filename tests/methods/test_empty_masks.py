"""Issue 50 at the methods' boundary: a pair with an all-False token or patch mask is "no
alignment" in every method (local score ``NO_ALIGNMENT``, zero plan and marginals, the
other pairs untouched) and ranks last in retrieval; half precision is refused with the
reason; an empty batch is an empty alignment."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from otviz.bench.runners import random_batch
from otviz.errors import InputError
from otviz.eval.retrieval import rerank
from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.methods.base import NO_ALIGNMENT, no_alignment
from otviz.methods.checks import PrecisionError
from tests.methods.test_host_sync import assert_branch_free_agrees

NAMES = sorted(METHODS)
EMPTY = 1  # the pair whose mask is all False


def _batch(dtype: torch.dtype = torch.float64, b: int = 3) -> PairBatch:
    batch = random_batch(b, 9, 4, 8, seed=5)
    return dataclasses.replace(
        batch, patches=batch.patches.to(dtype), tokens=batch.tokens.to(dtype),
        image_global=batch.image_global.to(dtype), text_global=batch.text_global.to(dtype),
    )


def _emptied(batch: PairBatch, side: str) -> PairBatch:
    mask = getattr(batch, side).clone()
    mask[EMPTY] = False
    return dataclasses.replace(batch, **{side: mask})


def _method(name: str, trainable: bool = False):
    torch.manual_seed(0)
    return build_method(name, 8, 8, MethodConfig(trainable=trainable, rank=4)).double()


def test_all_nine_methods_are_covered():
    assert len(NAMES) == 9


@pytest.mark.parametrize("side", ["token_mask", "patch_mask"])
@pytest.mark.parametrize("name", NAMES)
def test_an_all_false_mask_is_no_alignment(name, side):
    """The issue's reproducer (Balanced OT scored the empty caption first, 1.0): the pair
    scores NO_ALIGNMENT, its plan, readout and marginals are zero, its masks are the
    batch's, and the other pairs equal their alignment in a batch without it."""
    method = _method(name)
    batch = _emptied(_batch(), side)
    out = method(batch)
    assert float(out.local_score[EMPTY]) == NO_ALIGNMENT
    assert no_alignment(out.local_score).tolist() == [False, True, False]
    assert int(out.local_score.argmin()) == EMPTY
    assert torch.equal(out.plan.dense()[EMPTY], torch.zeros(9, 4, dtype=torch.float64))
    if out.readout is not None:
        assert not bool(out.readout.dense()[EMPTY].any())
    assert not bool(out.row_marginal[EMPTY].any()) and not bool(out.col_marginal[EMPTY].any())
    assert torch.equal(getattr(out, side), getattr(batch, side))
    heat = out.heatmap(torch.ones(4, dtype=torch.bool))
    assert not bool(heat[EMPTY].any())
    rest = torch.tensor([0, 2])
    alone = method(batch.index(rest, rest))
    torch.testing.assert_close(out.local_score[rest], alone.local_score, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.plan.dense()[rest], alone.plan.dense(), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_no_alignment_reads_nothing_back_on_an_accelerator(name, monkeypatch):
    """The branch-free path (an accelerator's: no host read) gives the CPU's answer."""
    assert_branch_free_agrees(_method(name), _emptied(_batch(), "patch_mask"), monkeypatch)


@pytest.mark.parametrize("lambda_l", [0.0, 1e-3, 1.0, 100.0])
@pytest.mark.parametrize("name", NAMES)
def test_no_alignment_survives_the_combined_score_and_ranks_last(name, lambda_l):
    out = _method(name)(_emptied(_batch(), "token_mask"))
    combined = out.combined_score(lambda_l)
    assert bool(torch.isfinite(combined).all())
    if lambda_l > 0:
        assert int(combined.argmin()) == EMPTY
    # retrieval: one image against the three captions; the empty one ranks last at every
    # lambda, lambda = 0 included (ranked below every candidate)
    scores = rerank(out.global_score[None], out.local_score[None].float(),
                    torch.ones(1, 3, dtype=torch.bool), lambda_l)
    assert float(scores[0, EMPTY]) == float("-inf")
    assert bool(torch.isfinite(scores[0, [0, 2]]).all())


#: The methods with something to train (Global-only has no parameter).
TRAINED = [n for n in NAMES if any(True for _ in build_method(n, 8, 8).parameters())]


@pytest.mark.parametrize("name", TRAINED)
def test_an_empty_pair_leaves_the_gradients_finite(name):
    method = _method(name, trainable=True)
    batch = _emptied(_emptied(_batch(), "token_mask"), "patch_mask")
    batch = dataclasses.replace(  # masked features may hold anything
        batch, tokens=batch.tokens.masked_fill(~batch.token_mask[..., None], float("nan")),
        patches=batch.patches.masked_fill(~batch.patch_mask[..., None], float("nan")))
    out = method(batch)
    (out.local_score.masked_fill(no_alignment(out.local_score), 0.0).sum()
     + method.regulariser()).backward()
    trained = [p for p in method.parameters() if p.requires_grad]
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in trained)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_is_refused_with_the_reason(name, dtype):
    """ConceptOT raised a bare NotImplementedError (no half Cholesky), four methods ran
    0.3-7.6 % off their float64 plans: refused, features or parameters."""
    with pytest.raises(PrecisionError, match=rf"^{name}: patches are {dtype}.*half precision"):
        _method(name)(_batch(dtype))
    method = build_method(name, 8, 8, MethodConfig(trainable=True, rank=4)).to(dtype)
    if not any(p.is_floating_point() for p in method.parameters()):
        return  # Global-only has no parameters
    with pytest.raises(InputError, match=rf"^{name}: the method's parameters are {dtype}"):
        method(_batch(torch.float32))


@pytest.mark.parametrize("name", NAMES)
def test_an_empty_batch_is_an_empty_alignment(name):
    out = _method(name)(_batch(b=3).index(torch.arange(0), torch.arange(0)))
    assert out.local_score.shape == (0,) and out.plan.dense().shape == (0, 9, 4)
