"""Throughput of the synthetic world: ``World.sample`` per second on one core, without
hard negatives (``WorldConfig(negatives=False)``, what training renders), with them (the
default; a sample makes them on first read) and with them read (``sample.negatives``).

Each setting is timed over ``--count`` consecutive fresh indices after a warm-up that fills
the per-config caches (texture bank, shape alphas, tree pieces), ``--repeats`` times; the
best repeat is reported, as wall time (``time.perf_counter``) and as the process's CPU time
(``time.process_time``), which other jobs on a shared machine inflate less. Samples are
dropped as they are made (as a training loader does). The process pins itself to CPU
``--cpu`` (like ``taskset -c 0``) and BLAS to one thread; the load average is recorded.

Usage: ``python benchmarks/world_speed.py [--count 3000] [--repeats 3] [--cpu 0] [--out FILE]``;
prints the JSON it writes (default ``benchmarks/world_speed.json``).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from otviz.world import World, WorldConfig  # noqa: E402

TARGET_PER_S = 2000.0
"""The issue's bar: samples per second on one core."""
_WARMUP = 50
SETTINGS: tuple[tuple[bool, bool], ...] = ((False, False), (True, False), (True, True))
"""``(negatives, read)``: without hard negatives, with them unread, with them read."""


def time_world(
    negatives: bool, read: bool, count: int, repeats: int, split: str = "train", seed: int = 0,
    config: WorldConfig | None = None,
) -> dict[str, float | int | bool]:
    """Best-of-``repeats`` wall and CPU seconds of ``count`` samples of the world ``config``
    (default ``WorldConfig()``; its ``negatives`` replaced), reading each one's negatives if
    ``read``, and the rates; also the wall and CPU seconds of the warm-up (the first
    samples, filling the caches)."""
    wall, cpu = time.perf_counter(), time.process_time()
    world = World(dataclasses.replace(config or WorldConfig(), negatives=negatives), split, seed)
    for i in range(_WARMUP):
        _ = world.sample(i).negatives
    warmup_wall, warmup_cpu = time.perf_counter() - wall, time.process_time() - cpu
    best_wall, best_cpu = float("inf"), float("inf")
    for r in range(repeats):
        start = _WARMUP + r * count
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(start, start + count):
            sample = world.sample(i)
            if read:
                _ = sample.negatives
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return {
        "negatives": negatives,
        "read_negatives": read,
        "count": count,
        "repeats": repeats,
        "wall_s": best_wall,
        "cpu_s": best_cpu,
        "samples_per_s_wall": count / best_wall,
        "samples_per_s_cpu": count / best_cpu,
        "us_per_sample_wall": 1e6 * best_wall / count,
        "us_per_sample_cpu": 1e6 * best_cpu / count,
        "warmup_samples": _WARMUP,
        "warmup_wall_s": warmup_wall,
        "warmup_cpu_s": warmup_cpu,
    }


def run(
    count: int = 3000, repeats: int = 3, cpu: int | None = 0,
    settings: tuple[tuple[bool, bool], ...] = SETTINGS, config: WorldConfig | None = None,
) -> dict:
    """Time the ``(negatives, read)`` settings (default: all three) of the world ``config``
    pinned to ``cpu`` (None: leave the affinity alone; the previous affinity is restored
    afterwards)."""
    pin = cpu is not None and hasattr(os, "sched_setaffinity")
    before = os.sched_getaffinity(0) if pin else None
    if pin:
        os.sched_setaffinity(0, {cpu})
    try:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        rows = [
            time_world(negatives, read, count, repeats, config=config)
            for negatives, read in settings
        ]
    finally:
        if pin:
            os.sched_setaffinity(0, before)
    return {
        "target_samples_per_s": TARGET_PER_S,
        "rows": rows,
        "cpus": cpus,
        "load_average_1_5_15": load,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000, help="samples per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=0, help="CPU to pin to; -1: do not pin")
    parser.add_argument("--out", default=str(Path(__file__).with_name("world_speed.json")))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    result = run(args.count, args.repeats, None if args.cpu < 0 else args.cpu)
    result["command"] = " ".join(["python benchmarks/world_speed.py", *argv])
    text = json.dumps(result, indent=1)
    Path(args.out).write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
