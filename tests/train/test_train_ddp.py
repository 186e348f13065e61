"""Data-parallel training, one engine for heads and pre-training: ``torchrun`` with 2 CPU
processes (gloo, DistributedDataParallel) gives the heads' loss curve of 1 process, through
the API and through the command-line entry; a tiny-CLIP pre-training run in the same
``torchrun`` job gives, bit for bit, the curve of ``pretrain(processes=2)``, which starts its
own job (:func:`otviz.train.distributed.launch`).

The test launches this file under ``python -m torch.distributed.run --nproc-per-node 2``
(one start-up of two processes per part keeps it short); run as a script, it is the worker:
it trains the cases below on the same seeded random features in every process (rank 0
writes the curves to a JSON file) and pre-trains a tiny CLIP, then runs the command-line
entry on the world through a random tiny-CLIP backbone and the feature cache.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from otviz.train.config import TrainConfig
from otviz.train.loop import train_method
from otviz.train.pairs import TensorPairs
from otviz.train.pretrain import pretrain
from otviz.train.pretrain_config import PretrainConfig
from tests import helpers
from tests.train.test_pretrain import SMOKE

# (method, overrides): Eq. 9-10 with mined negatives and a trainable global head (sharded
# positives, gathered mining), QC-Align (sharded QCT), PowerCLIP (replicated C x C loss)
CASES = [
    ("conceptot", {"train_global_head": True, "hard_negatives": 2}),
    ("qc_align", {}),
    ("powerclip", {}),
]


def config(out: Path, method: str, **overrides) -> TrainConfig:
    values = dict(
        method=method,
        batch_size=8,
        max_steps=4,
        concept_dim=16,
        rank=4,
        n_regions=4,
        lr=1e-2,
        warmup_frac=0.25,
        threads=1,
        device="cpu",
        log_every=0,
        out=str(out / method),
        start="random",  # in-memory pairs: no backbone projection to start from
    )
    values.update(overrides)
    return TrainConfig(**values)


#: A short pre-training run (``processes`` 1: under torchrun the job's size wins).
PRETRAIN = dict(SMOKE, steps=6, n_train=128, n_test=16, save_every=0)


def source() -> TensorPairs:
    return TensorPairs.random(16, seed=11)  # 2 batches per epoch


def run_cases(out: Path) -> dict[str, dict]:
    results = {}
    for method, overrides in CASES:
        r = train_method(config(out, method, **overrides), source=source())
        results[method] = {"history": r.history, "notes": r.notes, "status": r.status}
    return results


def cli_args(root: Path) -> list[str]:
    """Flags of a tiny command-line run on the world through a random tiny-CLIP backbone
    (written by the test under ``root / "bb"``)."""
    return ["--method", "dense_uot", "--n-train", "16", "--batch-size", "8", "--max-steps",
            "3", "--concept-dim", "16", "--lr", "0.01", "--threads", "1", "--device", "cpu",
            "--quiet", "--backbone", str(root / "bb"), "--cache-dir", str(root / "cache")]


def worker(out: str, part: str) -> None:
    """One torchrun process. ``part == "cases"``: every case trains data-parallel in a
    process group created here (train_method joins it); ``"cli"``: the command-line entry
    runs as ``torchrun -m otviz train`` would run it, creating its own group (rank 0
    builds the feature cache while the other waits). Each part gets fresh processes: a
    second gloo group in the same processes, on the same torchrun store, can read the
    first group's stale addresses and wait forever to connect."""
    import torch.distributed as dist

    from otviz.cli.train import main

    torch.set_num_threads(1)
    root = Path(out)
    if part == "cli":
        main([*cli_args(root), "--out", str(root / "cli-ddp")])
        return
    dist.init_process_group("gloo")
    results = run_cases(root / "runs")
    if dist.get_rank() == 0:
        (root / "ddp.json").write_text(json.dumps(results))
    pretrain(PretrainConfig(**PRETRAIN, out=str(root / "pretrain-torchrun")))
    dist.destroy_process_group()


def torchrun(*args: str) -> str:
    """``torchrun --standalone --nproc-per-node 2 <args>``; its output. ~20 s on a quiet
    2-core machine; the limit only guards against a hung process group (it took over 180 s
    once while other training jobs shared the two cores)."""
    return helpers.torchrun(list(args), timeout=900)


def test_two_processes_give_the_one_process_curve(tmp_path: Path) -> None:
    from otviz.checkpoints.heads import head_meta
    from otviz.checkpoints.store import load_meta
    from otviz.cli.train import main
    from tests.helpers import random_tiny_clip

    torch.set_num_threads(1)
    random_tiny_clip(tmp_path / "bb", 0)
    torchrun(__file__, str(tmp_path), "cases")
    stdout = torchrun(__file__, str(tmp_path), "cli")
    assert stdout.count("trained dense_uot for 3 steps") == 2  # both processes finished

    assert main([*cli_args(tmp_path), "--out", str(tmp_path / "cli-one")]) == 0
    ddp_cli = head_meta(tmp_path / "cli-ddp" / "head")["metrics"]["final_loss"]
    one_cli = head_meta(tmp_path / "cli-one" / "head")["metrics"]["final_loss"]
    assert ddp_cli == pytest.approx(one_cli, rel=1e-5)

    ddp = json.loads((tmp_path / "ddp.json").read_text())

    launched = dict(PRETRAIN, processes=2)
    pretrain(PretrainConfig(**launched, out=str(tmp_path / "pretrain-launched")))
    job, own = (load_meta(tmp_path / name) for name in ("pretrain-torchrun", "pretrain-launched"))
    assert job["recipe"] == own["recipe"] | {"out": job["recipe"]["out"]}  # processes: 2
    assert [e["loss"] for e in job["log"]] == [e["loss"] for e in own["log"]]

    single = run_cases(tmp_path / "single")
    for method, _ in CASES:
        assert ddp[method]["status"] == single[method]["status"] == "finished"
        assert any("2 process(es)" in n for n in ddp[method]["notes"])
        assert any("1 process(es)" in n for n in single[method]["notes"])
        for key in ("loss", "local", "global", "grad_norm", "lr"):
            got = [h[key] for h in ddp[method]["history"]]
            want = [h[key] for h in single[method]["history"]]
            assert got == pytest.approx(want, rel=1e-5, abs=1e-7), (method, key)
        losses = [h["loss"] for h in single[method]["history"]]
        assert len(set(losses)) > 1  # the curve moves: equality is not trivial


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
