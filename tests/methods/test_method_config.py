"""Issue 44: :class:`MethodConfig` checks every field when it is made, with an
:class:`otviz.errors.InputError` naming it (the regression: ``eps=0.0`` ended in a bare
``ZeroDivisionError`` inside ``dense_uot``, eps -0.1 or NaN gave NaN scores, a negative
``tau_v`` and ``lowrank_variant='faithfull'`` were accepted); a forward pass refuses an eps
below its dtype's floor with Python numbers only; the forward checks stay."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from otviz.bench.runners import random_batch
from otviz.errors import InputError
from otviz.methods import MethodConfig, PairBatch, build_method
from otviz.ot import SolverInputError
from otviz.ot._knobs import eps_floor
from otviz.ot.costs import COSINE_COST_SCALE

NAN, INF = float("nan"), float("inf")

BAD = {
    "concept_dim": ["256", 2.5, True, None, 0, -3],
    "eps": ["0.07", True, None, NAN, INF, -0.1, 0.0],
    "tau_v": ["0.2", True, None, NAN, -INF, -0.2],
    "tau_t": ["0.2", False, None, NAN, -INF, -1e-9],
    "n_iters": ["5", 2.5, True, None, 0, -1],
    "rank": ["32", 4.0, False, None, 0],
    "kpp_reg": ["1e-2", True, None, NAN, INF, -1e-2],
    "lowrank_variant": ["faithfull", "", None, 1],
    "trainable": [1, 0, "yes", None],
    "start": ["backbon", None, 0],
    "start_rank": ["0", 1.5, True, None, -1],
    "extra": [None, [], "tau=0.1"],
}


@pytest.mark.parametrize(
    ("name", "bad"),
    [pytest.param(n, v, id=f"{n}-{v!r}") for n, values in BAD.items() for v in values],
)
def test_every_field_refuses_each_kind_of_bad_value_by_name(name, bad):
    with pytest.raises(InputError, match=rf"^MethodConfig: .*\b{name}\b"):
        MethodConfig(**{name: bad})


def test_every_field_has_bad_values_under_test():
    assert set(BAD) == set(MethodConfig.__dataclass_fields__)


def test_defaults_and_edge_values_are_accepted():
    MethodConfig()
    MethodConfig(eps=1, tau_v=INF, tau_t=0, kpp_reg=0, start="auto", start_rank=0,
                 lowrank_variant="positive", trainable=False)


def _batch(dtype: torch.dtype, seed: int = 2) -> PairBatch:
    """Two random pairs of 9 patches and 4 tokens (:func:`otviz.bench.runners.random_batch`)
    in ``dtype``."""
    b = random_batch(2, 9, 4, 8, seed)
    return replace(b, patches=b.patches.to(dtype), tokens=b.tokens.to(dtype),
                   image_global=b.image_global.to(dtype), text_global=b.text_global.to(dtype))


def test_the_reported_regression_is_refused_at_the_config():
    for eps in (0.0, -0.1, NAN):
        with pytest.raises(InputError, match="MethodConfig: eps must be > 0"):
            build_method("dense_uot", 8, 8, MethodConfig(trainable=False, eps=eps))
    with pytest.raises(InputError, match="tau_v"):
        MethodConfig(tau_v=-0.5)
    with pytest.raises(InputError, match="unknown lowrank_variant 'faithfull'"):
        MethodConfig(lowrank_variant="faithfull")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["dense_uot", "balanced_ot", "conceptot", "qc_align"])
def test_forward_refuses_eps_below_the_dtype_floor(name, dtype):
    floor = eps_floor(dtype, COSINE_COST_SCALE)
    low = build_method(name, 8, 8, MethodConfig(trainable=False, eps=0.5 * floor)).to(dtype)
    with pytest.raises(SolverInputError, match=rf"^{name}: eps .* below the smallest eps"):
        low(_batch(dtype))
    ok = build_method(name, 8, 8, MethodConfig(trainable=False, eps=2 * floor, rank=4))
    ok = ok.to(dtype)
    batch = _batch(dtype)
    if name == "conceptot":
        ok.fit_training_free(batch)
    out = ok(batch)
    assert bool(torch.isfinite(out.local_score).all())


def test_forward_checks_stay():
    method = build_method("dense_uot", 8, 8, MethodConfig(trainable=False))
    batch = _batch(torch.float32)
    bad = PairBatch(**{**batch.__dict__, "patch_mask": batch.patch_mask.long()})
    with pytest.raises(SolverInputError, match="patch_mask must be a bool tensor"):
        method(bad)


@pytest.mark.parametrize(
    ("extra", "knob"),
    [({"came_temperature": 0.0}, "came_temperature"),
     ({"came_temperature": float("nan")}, "came_temperature"),
     ({"came_negative_slope": float("nan")}, "came_negative_slope"),
     ({"came_negative_slope": -1.0}, "came_negative_slope")],
)
def test_qc_align_refuses_bad_came_knobs_by_name(extra, knob):
    method = build_method("qc_align", 8, 8, MethodConfig(trainable=False, extra=extra))
    with pytest.raises(InputError, match=rf"^qc_align: {knob}"):
        method(_batch(torch.float64))
    with pytest.raises(InputError, match="came_temperature"):
        build_method("qc_align", 8, 8, MethodConfig(trainable=False)).with_came_temperature(-1)
