"""``otviz bench``: the speed and memory benchmark (:mod:`otviz.bench`) with its grid as
flags; writes ``results.json`` and ``results.md``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from otviz.bench import __doc__ as BENCH_DOC
from otviz.bench.config import BenchConfig, quick_config
from otviz.cli.args import at_least, parser
from otviz.knobs import METHOD_NAMES


def build_parser(prog: str = "otviz bench") -> argparse.ArgumentParser:
    full = BenchConfig()
    count = at_least(int, 1)
    p = parser(prog, BENCH_DOC.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small grid (N=196,576,1024; M=48)")
    p.add_argument("--out", type=Path, default=Path("benchmarks"),
                   help="folder of results.json and results.md")
    p.add_argument("--ns", type=count, nargs="+", help=f"patch counts N (default: {full.ns})")
    p.add_argument("--ms", type=count, nargs="+", help=f"token counts M (default: {full.ms})")
    p.add_argument("--ranks", type=count, nargs="+",
                   help=f"anchor ranks r (default: {full.ranks})")
    p.add_argument("--pairs", type=count, help=f"pairs per forward row (default: {full.pairs})")
    p.add_argument("--backward-pairs", type=count,
                   help=f"pairs per forward+backward row (default: {full.backward_pairs})")
    p.add_argument("--repeats", type=count,
                   help=f"timed runs per row after one warm-up (default: {full.repeats})")
    p.add_argument("--threads", type=count, help=f"torch CPU threads (default: {full.threads})")
    p.add_argument("--methods", nargs="*", choices=METHOD_NAMES, metavar="METHOD",
                   help=f"methods to time (default: all of {', '.join(METHOD_NAMES)})")
    p.add_argument("--no-pot", action="store_true", help="no POT solver rows")
    p.add_argument("--no-backward", action="store_true", help="forward rows only")
    p.add_argument("--no-train-step", action="store_true", help="no training-step rows")
    p.add_argument("--no-shared", action="store_true", help="no rerank/negatives layout rows")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The run's :class:`BenchConfig`: the full or quick grid, then the flags given."""
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
    return cfg


def main(argv: list[str] | None = None, prog: str = "otviz bench") -> int:
    """``otviz bench [--quick] [--out DIR] ...``: writes ``results.json`` and ``results.md``."""
    args = build_parser(prog).parse_args(argv)
    cfg = config_from_args(args)
    from otviz.bench.report import to_markdown
    from otviz.bench.runners import run_benchmark

    result = run_benchmark(cfg, log=lambda s: print(s, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    (args.out / "results.md").write_text(to_markdown(result))
    print(json.dumps(result["summary"], indent=2))
    return 0
