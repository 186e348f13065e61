"""Data-parallel training, one engine for heads, pre-training and streamed shards: one
``torchrun`` job of 2 CPU processes (gloo) gives, part after part,

- through the command-line entry, run as ``torchrun -m otviz train`` runs it (its own
  process group; rank 0 builds the feature cache while the other waits), the final loss of
  the same command in one process;
- in a second process group of the same job (:func:`tests.helpers.fresh_process_group`):
  the heads' loss curves of 1 process through the API (DistributedDataParallel); a tiny-CLIP
  pre-training run with, bit for bit, the curve of ``pretrain(processes=2)``, which starts
  its own job (:func:`otviz.train.distributed.launch`: every step reported, the held-out
  retrieval on rank 0, the token rows one union over the processes); and training streamed from
  webdataset shards (``tests/train/test_streamed.py``'s data), each process decoding its
  own rows, with the 1-process curve.

One job for all the parts: each start-up of a ``torchrun`` job (its launcher and two
interpreters importing torch and open_clip) costs about 14 s of CPU on the 2-core machine.
Run as a script, this file is one process of that job.
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
from tests.train import test_streamed
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


#: A short pre-training run (``processes`` 1: under torchrun the job's size wins): 4 steps
#: of 32 pairs, 2 batches an epoch.
PRETRAIN = dict(SMOKE, steps=4, n_train=64, n_test=16, save_every=0)


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


def streamed_config(root: Path, out: str, workers: int) -> TrainConfig:
    """3 streamed steps on ``tests/train/test_streamed.py``'s shards."""
    return test_streamed.config(root / "streamed", out=str(root / "streamed" / out),
                                max_steps=3, workers=workers)


def worker(out: str) -> None:
    """One torchrun process: the command-line run, then the API's parts in a second group
    (rank 0 writes the heads' and the streamed curves to ``ddp.json``)."""
    import torch.distributed as dist

    from otviz.cli.train import main

    torch.set_num_threads(1)
    root = Path(out)
    main([*cli_args(root), "--out", str(root / "cli-ddp")])  # its group ends with it
    helpers.fresh_process_group("api")
    results = run_cases(root / "runs")
    pretrain(PretrainConfig(**PRETRAIN, out=str(root / "pretrain-torchrun")))
    streamed = train_method(streamed_config(root, "ddp", workers=1))
    results["streamed"] = {"history": streamed.history, "notes": streamed.notes}
    if dist.get_rank() == 0:
        (root / "ddp.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_two_processes_give_the_one_process_curves(tmp_path: Path) -> None:
    from otviz.checkpoints.heads import head_meta
    from otviz.checkpoints.store import load_meta
    from otviz.cli.train import main
    from otviz.eval.held_out import HeldOutRetrieval
    from otviz.tiny_clip.model import load_tiny_clip
    from tests.helpers import random_tiny_clip

    torch.set_num_threads(1)
    random_tiny_clip(tmp_path / "bb", 0)
    test_streamed.make_data(tmp_path / "streamed")
    # ~25 s on a quiet 2-core machine; the limit only guards against a hung process group
    stdout = helpers.torchrun([__file__, str(tmp_path)], timeout=900)
    assert stdout.count("trained dense_uot for 3 steps") == 2  # both processes finished

    assert main([*cli_args(tmp_path), "--out", str(tmp_path / "cli-one")]) == 0
    ddp_cli = head_meta(tmp_path / "cli-ddp" / "head")["metrics"]["final_loss"]
    one_cli = head_meta(tmp_path / "cli-one" / "head")["metrics"]["final_loss"]
    assert ddp_cli == pytest.approx(one_cli, rel=1e-5)

    ddp = json.loads((tmp_path / "ddp.json").read_text())

    steps = []
    launched = PretrainConfig(**dict(PRETRAIN, processes=2),
                              out=str(tmp_path / "pretrain-launched"))
    metrics = pretrain(launched, progress=lambda step, total, info: steps.append(step),
                       held_out=HeldOutRetrieval)
    assert steps == list(range(1, PRETRAIN["steps"] + 1))  # rank 0's reports, relayed
    assert metrics["processes"] == 2 and "i2t_r1" in metrics  # held out on rank 0
    job, own = (load_meta(tmp_path / name) for name in ("pretrain-torchrun", "pretrain-launched"))
    assert own["recipe"]["processes"] == 2
    assert job["recipe"] == own["recipe"] | {"out": job["recipe"]["out"]}
    assert [e["loss"] for e in job["log"]] == [e["loss"] for e in own["log"]]
    assert len({e["loss"] for e in own["log"]}) > 1
    # every token row either of the world's vocabulary or zero: one union over processes
    model, _ = load_tiny_clip(tmp_path / "pretrain-launched")
    rows = model.text.token_embedding.weight.abs().sum(1) > 0
    assert 20 < int(rows.sum()) < 200

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

    # streamed: the tolerance of test_streamed.py (the backbone encodes each process's rows
    # in batches of another size, which moves float32 sums in their last digits)
    one = train_method(streamed_config(tmp_path, "one", workers=0))
    assert ddp["streamed"]["notes"][0].endswith("2 process(es)")
    for key in ("loss", "local", "global", "grad_norm"):
        got = [h[key] for h in ddp["streamed"]["history"]]
        assert got == pytest.approx(test_streamed.curve(one, key), rel=1e-4), key
    assert len(set(test_streamed.curve(one))) > 1


if __name__ == "__main__":
    worker(sys.argv[1])
