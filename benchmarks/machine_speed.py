"""How fast this machine's CPU is right now: the CPU seconds of a fixed single-threaded
workload (a pure-Python loop and small numpy matrix products), the median of a few repeats.

The project's 2-core machine changes speed within a session (docs/testing.md: the same
commit and seed of the test suite took 6 min 12 s at one time and 4 min 42 s 15 minutes
later), so a timing means little without this beside it. Run it with nothing else running
(a busy second core slows this one too), right before a timed run:

    python benchmarks/machine_speed.py            # e.g. "0.83 s (median of 3)"
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread, before numpy loads OpenBLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def workload_seconds() -> float:
    """CPU seconds of one pass of the fixed workload (single-threaded)."""
    start = time.process_time()
    total = 0
    for i in range(6_000_000):
        total += i * i % 7
    a = np.random.default_rng(0).random((300, 300))
    for _ in range(30):
        a = np.tanh(a @ a.T / 300)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="passes (default: 3)")
    args = parser.parse_args()
    runs = [workload_seconds() for _ in range(max(1, args.repeats))]
    print(f"{statistics.median(runs):.2f} s (median of {len(runs)})")


if __name__ == "__main__":
    main()
