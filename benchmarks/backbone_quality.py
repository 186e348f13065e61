"""Backbone quality against the bars of issue 9: zero-shot on one-object images, linear
probes of box-pooled patch features, the binding test, grounding against model-free
baselines, retrieval, compositional zero-shot and world speed (what each measures:
:mod:`otviz.eval.backbone_quality`).

Usage::

    python benchmarks/backbone_quality.py [--backbone DIR] [--heads DIR|training-free]
        [--quick] [--out PREFIX] [--n-binding 200 ...]

run from the repository root (paths are relative to the current directory), writes
``PREFIX.json`` and ``PREFIX.md`` (default ``benchmarks/backbone_quality``) and prints the
Markdown. ``--quick`` draws fewer samples (about a minute on one core), for
comparing short training runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from world_speed import run as world_speed  # noqa: E402

from otviz.backbone_spec import BackboneSpec  # noqa: E402
from otviz.eval.backbone_quality import QualityConfig, markdown, measure, target_rows  # noqa: E402
from otviz.eval.world_set import world_config_of  # noqa: E402
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT  # noqa: E402

COUNTS = [f.name for f in dataclasses.fields(QualityConfig) if f.name.startswith("n_")]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default=str(DEFAULT_CHECKPOINT))
    parser.add_argument("--heads", default=QualityConfig.heads,
                        help="dir of <method>/ heads, or 'training-free'")
    parser.add_argument("--out", default="benchmarks/backbone_quality",
                        help="output prefix: writes PREFIX.json and PREFIX.md")
    parser.add_argument("--quick", action="store_true", help="fewer samples (~1 min)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--cache-dir", default=".cache/otviz-features")
    parser.add_argument("--world-speed-count", type=int, default=None,
                        help="samples per world-speed repeat (default 3000, quick 500; 0: skip)")
    for name in COUNTS:
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    counts = {n: getattr(args, n) for n in COUNTS if getattr(args, n) is not None}
    common = {"backbone": args.backbone, "heads": args.heads, "seed": args.seed,
              "cache_dir": args.cache_dir, **counts}
    config = QualityConfig.quick(**common) if args.quick else QualityConfig(**common)
    torch.set_num_threads(max(1, args.threads))
    t0 = time.perf_counter()
    backbone = BackboneSpec(checkpoint=config.backbone).load()
    results = measure(config, backbone, lambda stage: print(f"[backbone_quality] {stage}",
                                                            file=sys.stderr))
    count = args.world_speed_count
    count = (500 if args.quick else 3000) if count is None else count
    if count > 0:  # pinned to one CPU: the first this process may use
        cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        speed = world_speed(count, 1 if args.quick else 3, cpu, ((False, False),),
                            world_config_of(backbone, negatives=False))
        results["world_speed"] = speed["rows"][0] | {"cpus": speed["cpus"],
                                                     "load_average": speed["load_average_1_5_15"]}
    results["total_s"] = time.perf_counter() - t0
    results["quick"] = args.quick
    results["threads"] = torch.get_num_threads()
    results["command"] = " ".join(["python benchmarks/backbone_quality.py", *argv])
    results["targets"] = target_rows(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results)
    out.with_suffix(".md").write_text(text)
    print(text)
    return results


if __name__ == "__main__":
    main()
