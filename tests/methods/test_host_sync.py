"""A method's forward pass reads nothing back from an accelerator: it checks its batch once
at its boundary (metadata only), calls the solvers' unchecked cores, and takes the
branch-free path wherever a fast path would have to read a flag (:mod:`otviz.ot._sync`).

On CUDA the pass runs under ``torch.cuda.set_sync_debug_mode("error")``; on the CPU the
same paths run with every host read (``bool``, ``item``, ``float``, ``nonzero``, boolean
indexing, ...) refused, and must give the CPU fast paths' alignment."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.overrides import TorchFunctionMode

import otviz.methods.base as base
import otviz.ot._sync as sync
from otviz.bench.runners import random_batch
from otviz.methods import METHODS, MethodConfig, PairBatch, build_method
from otviz.ot import lowrank, sinkhorn, unbalanced

#: Tensor operations that copy a device's values to the host (a synchronisation on CUDA).
HOST_READS = {
    "__bool__", "__float__", "__int__", "__index__", "item", "tolist", "nonzero", "unique",
    "masked_select", "bincount", "argwhere", "repeat_interleave", "unique_consecutive",
}

#: Methods whose forward pass still reads the device (named, with the reason, not hidden).
STILL_SYNCING: dict[str, str] = {}


class _RefuseHostReads(TorchFunctionMode):
    """Raise on any tensor operation of :data:`HOST_READS` and on boolean-mask indexing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
        masks = index if isinstance(index, tuple) else (index,)
        if name in HOST_READS or any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in masks
        ):
            raise AssertionError(f"host read in a forward pass: Tensor.{name}")
        return func(*args, **(kwargs or {}))


def _batch() -> PairBatch:
    batch = random_batch(3, 16, 7, 12, seed=4)
    patch_mask, token_mask = batch.patch_mask.clone(), batch.token_mask.clone()
    patch_mask[1, 12:] = False
    token_mask[2, 5:] = False
    return dataclasses.replace(batch, patch_mask=patch_mask, token_mask=token_mask)


def _method(name: str):
    torch.manual_seed(0)
    method = build_method(name, 12, 12, MethodConfig(concept_dim=10, rank=5, trainable=True))
    with torch.no_grad():  # off the uniform start, so masses and projections matter
        for p in method.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return method


def _on(batch: PairBatch, device: torch.device) -> PairBatch:
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **moved)


def _mark(name: str):
    reason = STILL_SYNCING.get(name)
    return pytest.param(name, marks=pytest.mark.xfail(reason=reason, strict=True) if reason
                        else ())


@pytest.mark.parametrize("name", [_mark(n) for n in sorted(METHODS)])
def test_accelerator_paths_read_nothing_back_and_agree(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_branch_free_agrees(_method(name), _batch(), monkeypatch)


def assert_branch_free_agrees(method, batch: PairBatch, monkeypatch: pytest.MonkeyPatch
                              ) -> None:
    """``method(batch)`` on an accelerator's branch-free path (no host read allowed) equals
    its answer on the CPU's path."""
    with torch.no_grad():
        fast = method(batch)
        monkeypatch.setattr(sync, "HOST_DEVICES", ())
        with _RefuseHostReads():
            branch_free = method(batch)
    for field in ("local_score", "row_marginal", "col_marginal"):
        torch.testing.assert_close(getattr(branch_free, field), getattr(fast, field))
    torch.testing.assert_close(branch_free.plan.dense(), fast.plan.dense())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
@pytest.mark.parametrize("name", [_mark(n) for n in sorted(METHODS)])
def test_forward_has_no_host_sync_on_cuda(name: str) -> None:
    device = torch.device("cuda")
    method, batch = _method(name).to(device), _on(_batch(), device)
    with torch.no_grad():
        method(batch)  # warm-up: lazy CUDA initialisation may synchronise once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = method(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out.local_score.cpu()).all()


@pytest.mark.parametrize("name", ["balanced_ot", "dense_uot", "conceptot", "qc_align"])
def test_methods_check_once_and_call_the_unchecked_solvers(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"boundary": 0, "solver checks": 0}

    def counted(key, fn):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(base, "check_pair_batch", counted("boundary", base.check_pair_batch))
    for module, attr in [(sinkhorn, "clean_problem"), (unbalanced, "clean_problem"),
                         (lowrank, "_clean_inputs")]:
        monkeypatch.setattr(module, attr, counted("solver checks", getattr(module, attr)))
    method, batch = _method(name), _batch()
    method(batch)
    assert calls == {"boundary": 1, "solver checks": 0}
    with pytest.raises(ValueError, match="token_mask"):  # the boundary still refuses
        method(dataclasses.replace(batch, token_mask=batch.token_mask.float()))
