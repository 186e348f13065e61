"""Run the otviz benchmark and write ``benchmarks/results.json`` and ``results.md``.

Usage: ``python benchmarks/run_bench.py [--quick] [--out DIR] [--pairs P] [--repeats R]
[--threads T] [--methods NAME ...] [--no-pot]`` (same as ``otviz bench``); see
:mod:`otviz.bench` for what is measured and how.
"""

import sys
from pathlib import Path

from otviz.cli.bench import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--out" not in argv:
        argv += ["--out", str(Path(__file__).resolve().parent)]
    sys.exit(main(argv))
