"""``otviz bench``: the speed and memory benchmark (:mod:`otviz.bench`) with its grid as
flags; writes ``results.json`` and ``results.md``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from otviz.bench import __doc__ as BENCH_DOC
from otviz.bench.config import BenchConfig, quick_config
from otviz.bench.report import to_markdown
from otviz.bench.runners import run_benchmark


def main(argv: list[str] | None = None) -> int:
    """``otviz bench [--quick] [--out DIR] ...``: writes ``results.json`` and ``results.md``."""
    p = argparse.ArgumentParser(prog="otviz bench", description=BENCH_DOC.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small grid (N=196,576,1024; M=48)")
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    p.add_argument("--ns", type=int, nargs="+", help="patch counts N (default: the full grid)")
    p.add_argument("--ms", type=int, nargs="+", help="token counts M")
    p.add_argument("--ranks", type=int, nargs="+", help="anchor ranks r")
    p.add_argument("--pairs", type=int)
    p.add_argument("--backward-pairs", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--methods", nargs="*")
    p.add_argument("--no-pot", action="store_true")
    p.add_argument("--no-backward", action="store_true", help="forward rows only")
    p.add_argument("--no-train-step", action="store_true")
    p.add_argument("--no-shared", action="store_true", help="no rerank/negatives layout rows")
    args = p.parse_args(argv)
    cfg = quick_config() if args.quick else BenchConfig()
    for key in ("ns", "ms", "ranks"):
        if getattr(args, key) is not None:
            setattr(cfg, key, tuple(getattr(args, key)))
    for key in ("pairs", "backward_pairs", "repeats", "threads"):
        if getattr(args, key) is not None:
            setattr(cfg, key, getattr(args, key))
    if args.methods:
        cfg.methods = tuple(args.methods)
    cfg.pot = not args.no_pot
    cfg.backward = not args.no_backward
    cfg.train_step = not args.no_train_step
    cfg.shared = not args.no_shared
    result = run_benchmark(cfg, log=lambda s: print(s, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    (args.out / "results.md").write_text(to_markdown(result))
    print(json.dumps(result["summary"], indent=2))
    return 0
