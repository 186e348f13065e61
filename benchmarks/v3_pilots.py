"""Embedded model v3: the from-scratch pilots and the long runs, run side by side.

Every arm is one ``otviz pretrain`` command (its flags below); the arms of one group share
their data, seed and schedule, and differ only in the named architecture or loss levers.
The training set is rendered once into a cache that every arm reads (``--data-cache``),
then the arms train as concurrent processes (on one GPU they share it; on a CPU run one at
a time with ``--only``). Each finished checkpoint is measured with
``benchmarks/backbone_quality.py --quick --heads training-free``.

Usage::

    python benchmarks/v3_pilots.py --work runs/v3 --device cuda --group pilots,long \
        [--deadline 520] [--only b,c]

Writes ``WORK/<arm>/`` checkpoints (or ``WORK/<arm>.resume/`` when stopped at the
deadline: ``otviz pretrain`` continues from it with the same command), ``WORK/<arm>.log``
and ``WORK/<arm>-quality.json``. ``benchmarks/v3_table.py`` makes the committed table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PILOT = ["--steps", "1500", "--batch-size", "128", "--n-train", "100000", "--eval-every", "500",
         "--save-every", "0"]
LONG = ["--steps", "6000", "--batch-size", "256", "--n-train", "200000", "--eval-every", "1000",
        "--save-every", "500"]


def levers(stem: str = "patch", pool: str = "tok", local: str = "0", patch: str = "8") -> list[str]:
    """Every lever spelled out (v2's values by default), so that an arm's command means the
    same whatever ``otviz pretrain``'s defaults are."""
    return ["--vision-stem", stem, "--vision-pool", pool, "--local-weight", local,
            "--patch-size", patch]


ARMS: dict[str, dict[str, list[str]]] = {
    "pilots": {
        "a-control": levers(),
        "b-conv": levers(stem="conv"),
        "c-conv-local": levers(stem="conv", local="1"),
        "d-conv-4px": levers(stem="conv", patch="4"),
        "e-conv-avg": levers(stem="conv", pool="avg"),
        "f-conv-avg-local": levers(stem="conv", pool="avg", local="1"),
    },
    "long": {
        "L-conv": levers(stem="conv"),
        "L-conv-local": levers(stem="conv", local="1"),
        "L-conv-avg-local": levers(stem="conv", pool="avg", local="1"),
    },
}
"""Each group's arms: the flags that differ from the group's common ones."""


def arm_flags(group: str, arm: str) -> list[str]:
    return (PILOT if group == "pilots" else LONG) + ARMS[group][arm]


def command(group: str, arm: str, work: Path, device: str, cache: Path) -> list[str]:
    """The arm's ``otviz pretrain`` flags."""
    return [*arm_flags(group, arm), "--processes", "1", "--threads", "1", "--device", device,
            "--data-cache", str(cache), "--out", str(work / arm)]


def pretrain_from_flags(flags: list[str]) -> None:
    """``otviz pretrain FLAGS`` without the rest of the command line's imports (a GPU
    machine may lack the app's packages)."""
    from otviz.cli.args import add_dataclass_flags, dataclass_from_args
    from otviz.train.pretrain import pretrain
    from otviz.train.pretrain_config import PretrainConfig

    parser = argparse.ArgumentParser(prog="otviz pretrain")
    add_dataclass_flags(parser, PretrainConfig)
    metrics = pretrain(dataclass_from_args(PretrainConfig, parser.parse_args(flags)))
    for key, value in metrics.items():
        print(f"{key}: {value}")


def render_caches(groups: list[str], cache: Path, workers: int) -> None:
    """Render each group's training set once (the arms then load it from ``cache``)."""
    from otviz.cli.args import add_dataclass_flags, dataclass_from_args
    from otviz.train.pretrain import training_split
    from otviz.train.pretrain_config import PretrainConfig

    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, PretrainConfig)
    for group in groups:
        arm = next(iter(ARMS[group]))
        args = parser.parse_args([*arm_flags(group, arm), "--processes", "1",
                                  "--data-cache", str(cache),
                                  "--render-workers", str(workers)])
        t = time.perf_counter()
        data = training_split(dataclass_from_args(PretrainConfig, args))
        print(f"[v3] {group}: rendered {len(data)} samples in {time.perf_counter() - t:.0f} s",
              flush=True)


def quality(arm_dir: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "benchmarks/backbone_quality.py", "--quick", "--heads", "training-free",
         "--world-speed-count", "0", "--threads", "1", "--backbone", str(arm_dir),
         "--cache-dir", str(out.parent / ".features" / arm_dir.name), "--out", str(out)],
        stdout=open(str(out) + ".log", "w"), stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--pretrain"]:
        pretrain_from_flags(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/v3")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--group", default="pilots", help="comma-separated: pilots, long")
    parser.add_argument("--only", default="", help="comma-separated arm names (default: all)")
    parser.add_argument("--deadline", type=float, default=0.0,
                        help="seconds after which unfinished arms are stopped (0: none)")
    parser.add_argument("--render-workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cache = work / ".data"
    groups = args.group.split(",")
    only = set(filter(None, args.only.split(",")))
    render_caches(groups, cache, args.render_workers)
    procs: dict[str, subprocess.Popen] = {}
    for group in groups:
        for arm in ARMS[group]:
            if only and arm not in only:
                continue
            flags = command(group, arm, work, args.device, cache)
            (work / f"{arm}.cmd").write_text("otviz pretrain " + " ".join(flags) + "\n")
            procs[arm] = subprocess.Popen([sys.executable, __file__, "--pretrain", *flags],
                                          stdout=open(work / f"{arm}.log", "w"),
                                          stderr=subprocess.STDOUT)
    evals: dict[str, subprocess.Popen] = {}
    while procs or evals:
        for arm, p in list(procs.items()):
            if p.poll() is not None:
                print(f"[v3] {arm} ended with {p.returncode} at {time.perf_counter() - t0:.0f} s",
                      flush=True)
                del procs[arm]
                if p.returncode == 0:
                    evals[arm] = quality(work / arm, work / f"{arm}-quality")
        for arm, p in list(evals.items()):
            if p.poll() is not None:
                print(f"[v3] {arm} measured ({p.returncode}) at {time.perf_counter() - t0:.0f} s",
                      flush=True)
                del evals[arm]
        if args.deadline and time.perf_counter() - t0 > args.deadline:
            for arm, p in {**procs, **evals}.items():
                print(f"[v3] deadline: stopping {arm}", flush=True)
                p.send_signal(signal.SIGTERM)
            for p in {**procs, **evals}.values():
                p.wait()
            break
        time.sleep(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
