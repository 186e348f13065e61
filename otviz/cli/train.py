"""``otviz train``: flags from :class:`~otviz.train.config.TrainConfig`; ``--method all``
trains every comparison method in turn, ``--publish`` ships each finished head with a
manifest entry. Data-parallel under ``torchrun --nproc-per-node 2 -m otviz train ...``
(:mod:`otviz.train.distributed`).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otviz.cli.args import add_dataclass_flags, dataclass_from_args, parser
from otviz.cli.logs import command_logging
from otviz.train.config import TrainConfig, paper_recipe

if TYPE_CHECKING:
    from otviz.train.loop import TrainResult

#: ``--method all``: the methods of the comparison, trained one after another.
ALL = "all"


def build_parser(prog: str = "otviz train") -> argparse.ArgumentParser:
    p = parser(prog, "Train a method head on a frozen backbone (--method all: every method of "
               "the comparison, one after another, each into OUT/<method>).")
    add_dataclass_flags(p, TrainConfig, also={"method": (ALL,)})
    p.add_argument("--paper-recipe", action="store_true",
                   help="ConceptOT Table 6's recipe instead of the fast default: lr 1e-4, "
                   "batch 64, 3 epochs (transport methods) or 8 of ~100K pairs "
                   "(otviz.train.config.paper_recipe; overrides those flags)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--publish", default="", metavar="DIR",
                   help="copy each finished head to DIR/<method> (e.g. checkpoints/heads)")
    p.add_argument("--manifest", default="", metavar="FILE",
                   help="with --publish: record command, wall time and metrics in FILE "
                   "(default: manifest.json next to DIR)")
    return p


def run_configs(config: TrainConfig) -> list[TrainConfig]:
    """The runs of a command: ``config`` itself, or for ``--method all`` one run per
    comparison method (:data:`otviz.suite.ALIGN_METHODS`) in ``out/<method>``."""
    if config.method != ALL:
        return [config]
    from otviz.suite import ALIGN_METHODS

    return [dataclasses.replace(config, method=name, out=str(Path(config.out) / name))
            for name in ALIGN_METHODS]


def _publish(result: TrainResult, config: TrainConfig, args: argparse.Namespace,
             command: str, wall: float) -> None:
    from otviz.checkpoints.heads import head_meta
    from otviz.checkpoints.manifest import publish_head

    manifest = args.manifest or str(Path(args.publish).resolve().parent / "manifest.json")
    meta = head_meta(result.head_checkpoint)
    metrics = {k: v for k, v in meta["metrics"].items() if k != "curve"}
    backbone = {k: meta["backbone"].get(k) for k in ("name", "weights")}
    target = publish_head(result.head_checkpoint, Path(args.publish) / config.method, manifest, {
        "kind": "method-head",
        "method": config.method,
        "backbone": backbone,
        "command": command,
        "wall_time_s": round(wall, 1),
        "seconds_per_step": result.seconds_per_step,
        "train_metrics": metrics,
        "n_train": config.n_train,
        "batch_size": config.batch_size,
        "threads": config.threads,
    })
    print(f"published {target} (manifest {manifest})")


def main(argv: list[str] | None = None, prog: str = "otviz train") -> int:
    """``otviz train``: flags from :class:`TrainConfig` (``--method all`` trains every
    comparison method in turn); Ctrl-C stops after the current step and saves a resumable
    state (a second Ctrl-C aborts)."""
    from tqdm.auto import tqdm

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    from otviz.process_group import is_main_process  # after parsing: --help loads no torch

    command = shlex.join([*shlex.split(prog), *argv])
    command_logging()
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("\nstopping after this step (Ctrl-C again to abort) ...", file=sys.stderr)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_signal) if in_main_thread else None
    try:
        for config in run_configs(dataclass_from_args(TrainConfig, args)):
            if args.paper_recipe:
                config = paper_recipe(config)
            t0 = time.perf_counter()
            result = _train_with_bar(config, stop, tqdm, args.quiet)
            print(result.message)
            if result.data_summary:
                print(result.data_summary)
            if result.seconds_per_step is not None:
                print(f"{result.seconds_per_step:.3f} s/step")
            if result.head_checkpoint:
                print(f"method head: {result.head_checkpoint}")
                if args.publish and is_main_process():
                    _publish(result, config, args, command, time.perf_counter() - t0)
            if result.status == "stopped":
                break
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    return 0


def _train_with_bar(config: TrainConfig, stop: threading.Event, tqdm: Any,
                    quiet: bool) -> TrainResult:
    """:func:`train_method` with a progress bar (shard indexing or feature encoding, then
    steps with their pairs/s; tqdm's own rate and ETA are of the steps)."""
    from otviz.train.loop import ENCODING, INDEXING, train_method

    bar: Any = None
    bar_phase = ""
    units = {ENCODING: "pair", INDEXING: "shard"}
    trained = [0.0, 0.0]  # pairs, seconds of this call's steps

    def on_progress(step: int, total: int, metrics: dict[str, float]) -> None:
        nonlocal bar, bar_phase
        phase = next((key for key in units if key in metrics), config.method)
        if bar is None or bar_phase != phase:
            if bar is not None:
                bar.close()
            unit = units.get(phase, "step")
            bar, bar_phase = tqdm(total=total, desc=phase, unit=unit, disable=quiet), phase
        bar.n = step
        bar.refresh()
        if phase == config.method:
            trained[0] += metrics["pairs"]
            trained[1] += metrics["seconds"]
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", local=f"{metrics['local']:.4f}",
                            pairs_s=f"{trained[0] / max(trained[1], 1e-9):.1f}")

    try:
        return train_method(config, on_progress, stop)
    finally:
        if bar is not None:
            bar.close()
