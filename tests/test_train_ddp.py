"""Data-parallel training: ``torchrun`` with 2 CPU processes (gloo, DistributedDataParallel)
gives the loss curve of 1 process.

The test launches this file under ``python -m torch.distributed.run --nproc-per-node 2``;
run as a script, it is the worker: it trains the cases below on the same seeded random
features in every process and rank 0 writes the curves to a JSON file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from otviz.train.config import TrainConfig
from otviz.train.loop import train_method
from otviz.train.pairs import TensorPairs

ROOT = Path(__file__).resolve().parent.parent

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
    )
    values.update(overrides)
    return TrainConfig(**values)


def source() -> TensorPairs:
    return TensorPairs.random(16, seed=11)  # 2 batches per epoch


def run_cases(out: Path) -> dict[str, dict]:
    results = {}
    for method, overrides in CASES:
        r = train_method(config(out, method, **overrides), source=source())
        results[method] = {"history": r.history, "notes": r.notes, "status": r.status}
    return results


def worker(out: str) -> None:
    """One torchrun process: the process group is created here (train_method then joins
    it) and every case trains data-parallel."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = run_cases(Path(out) / "runs")
    if dist.get_rank() == 0:
        (Path(out) / "ddp.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_two_processes_give_the_one_process_curve(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", __file__, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp = json.loads((tmp_path / "ddp.json").read_text())

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
    worker(sys.argv[1])
