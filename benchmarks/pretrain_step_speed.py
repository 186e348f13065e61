"""Seconds per pre-training step of the shipped tiny CLIP: fp32 against bfloat16 autocast,
with and without the FILIP local term, interleaved so that a shared machine's load falls on
every variant alike.

Usage::

    python benchmarks/pretrain_step_speed.py [--batch-size 64] [--repeats 3] [--threads 1]

Each timed step is forward, loss and backward on one fixed random batch (real world captions
are not needed for speed); prints one JSON object with the median seconds per variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from otviz.process_group import DistInfo
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT, load_tiny_clip
from otviz.train.local_alignment import EOT_TOKEN, SOT_TOKEN
from otviz.train.pretrain import batch_loss
from otviz.train.pretrain_config import PretrainConfig

VARIANTS = {"fp32": (False, 0.0), "bf16": (True, 0.0), "fp32+filip": (False, 1.0),
            "bf16+filip": (True, 1.0)}


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_tiny_clip(DEFAULT_CHECKPOINT)
    model.train()
    b = args.batch_size
    g = torch.Generator().manual_seed(0)
    images = torch.randn(b, 3, 80, 80, generator=g)
    ids = torch.zeros(3 * b, 32, dtype=torch.long)  # captions + 2 hard negatives each
    ids[:, 0], ids[:, 1:12] = SOT_TOKEN, torch.randint(1, 3000, (3 * b, 11), generator=g)
    ids[:, 12] = EOT_TOKEN
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):
        for name, (bf16, weight) in VARIANTS.items():
            config = PretrainConfig(local_weight=weight, bf16=bf16)
            t0 = time.perf_counter()
            with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                loss = batch_loss(model, images, ids, config, DistInfo(), b)
            loss.backward()
            model.zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - t0)
    result = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({"batch_size": b, "threads": args.threads, "repeats": args.repeats,
                      "median_s_per_step": result}))
    return result


if __name__ == "__main__":
    main()
