"""Trained heads per reading on the embedded model (issue 51, item 4): for each method, heads
trained on its best training-free reading beside heads trained on ``last``, per world seed,
scored by the pointing game in both conventions (``pointing``: the peak inside a gold box;
``pointing_tol``: within 15 px), mean and 95 % interval over the seeds
(:mod:`otviz.eval.seeds`), and the paired difference best reading - ``last`` judged by its
interval.

Each method's best reading is read from the committed training-free per-source runs
(``benchmarks/eval/feature_sources/<source>.json``, made by
``benchmarks/feature_sources_grounding.py``): the source of highest pointing other than
``last`` (where ``last`` itself is the best, the runner-up, so that two readings are compared).
Each head is trained by the method's recipe of the Makefile's ``remake`` target
(``HEAD_RECIPES``, the shipped heads' recipe) with ``--features SOURCE --seed S``, then scored
on the world's test draw of seed S at that reading::

    otviz train --method M <recipe> --n-train N --features SOURCE --seed S --threads 1 \\
        --out RUNS/train/M/SOURCE/sS --publish RUNS/heads/SOURCE-sS \\
        --manifest RUNS/train/M/SOURCE/sS/manifest.json
    otviz eval --heads RUNS/heads/SOURCE-sS --methods M --features SOURCE --tables grounding \\
        --n-test N_TEST --n-compositional 0 --also-candidates '' --seed S --threads 1 \\
        --out RUNS/eval/M/SOURCE/sS

run as at most ``--jobs`` processes at once (``nice -n 10``), methods in the order given; a
finished run (its ``tables.json``) is not run again, so the script resumes. ``--collect`` only
gathers the finished runs into ``OUT.json`` / ``OUT.md``: a method is reported where all its
(reading, seed) runs have finished.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from otviz.eval.seeds import Interval, judge, seed_interval
from otviz.methods.base import method_class

SOURCES_DIR = Path("benchmarks/eval/feature_sources")
METRICS = ("pointing", "pointing_tol")


def recipes(makefile: Path = Path("Makefile")) -> dict[str, list[str]]:
    """Each method's training flags from the Makefile's ``HEAD_RECIPES`` (the ``remake``
    target's recipe of the shipped heads), by method name."""
    block = re.search(r"HEAD_RECIPES := \\\n((?:\t\".*\"(?: \\)?\n)+)", makefile.read_text())
    if block is None:
        raise SystemExit(f"no HEAD_RECIPES block in {makefile}")
    flags = [line.split() for line in re.findall(r'"([^"]+)"', block.group(1))]
    return {words[0]: words[1:] for words in flags}


def training_free(label: str) -> dict[str, tuple[float, int]]:
    """The training-free pointing of the method labelled ``label`` per source, with the images
    a seed of its run, from the committed per-source runs."""
    out = {}
    for path in sorted(SOURCES_DIR.glob("*.json")):
        record = json.loads(path.read_text())
        source = "last" if path.stem == "last" else re.sub(r"(layer)(\d+)", r"\1:\2", path.stem)
        out.update((source, (r["pointing"], record["config"]["n_test"]))
                   for r in record["tables"]["grounding"]["rows"] if r["method"] == label)
    return out


def best_reading(label: str, chosen: dict[str, str] | None = None) -> str:
    """The best training-free source of ``label`` other than ``last`` (module docstring), or
    the one ``chosen`` names for it (``--best``: a choice made on earlier per-source runs)."""
    if chosen and label in chosen:
        return chosen[label]
    scores = training_free(label)
    return max((s for s in scores if s != "last"), key=lambda s: scores[s][0])


def _name(source: str) -> str:
    return source.replace(":", "")


def _job(method: str, source: str, seed: int, flags: list[str], args: argparse.Namespace
         ) -> str:
    """Train (unless published) and evaluate (unless scored) one (method, reading, seed)."""
    heads = args.runs / "heads" / f"{_name(source)}-s{seed}"
    scored = args.runs / "eval" / method / _name(source) / f"s{seed}"
    run = args.runs / "train" / method / _name(source) / f"s{seed}"
    common = ["--features", source, "--seed", str(seed), "--threads", "1", "--quiet"]
    nice = ["nice", "-n", "10", str(Path(sys.executable).parent / "otviz")]
    started = time.time()
    if not (heads / method / "model.safetensors").exists():
        subprocess.run([*nice, "train", "--method", method, *flags, "--n-train",
                        str(args.n_train.get(method, args.default_n_train)), *common,
                        "--out", str(run),
                        "--publish", str(heads), "--manifest", str(run / "manifest.json")],
                       check=True, capture_output=True)
    trained = time.time()
    if not (scored / "tables.json").exists():
        subprocess.run([*nice, "eval", "--heads", str(heads), "--methods", method,
                        "--tables", "grounding", "--n-test", str(args.n_test),
                        "--n-compositional", "0", "--also-candidates", "", *common,
                        "--out", str(scored)], check=True, capture_output=True)
    line = (f"{method} {source} s{seed}: train {trained - started:.0f} s, "
            f"eval {time.time() - trained:.0f} s")
    print(line, flush=True)
    return line


def _scores(method: str, source: str, seeds: list[int], runs: Path
            ) -> dict[str, list[float]] | None:
    """Per-seed pointing (both conventions) of the trained ``method`` at ``source``, or None
    where a seed's run has not finished."""
    label = method_class(method).label
    out: dict[str, list[float]] = {m: [] for m in METRICS}
    for seed in seeds:
        path = runs / "eval" / method / _name(source) / f"s{seed}" / "tables.json"
        if not path.exists():
            return None
        record = json.loads(path.read_text())
        row = next(r for r in record["tables"]["grounding"]["rows"] if r["method"] == label)
        for metric in METRICS:
            out[metric].append(100 * row[metric])
    return out


def _cell(interval: Interval, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return (f"{interval.mean:{sign}.1f} [{interval.low:{sign}.1f}, "
            f"{interval.high:{sign}.1f}]")


def collect(methods: list[str], seeds: list[int], args: argparse.Namespace) -> None:
    """``OUT.json`` and ``OUT.md``: per method, the trained heads' pointing at ``last`` and at
    the best reading, the paired difference and its verdict, beside the training-free
    figures of the per-source runs."""
    rows, missing = [], []
    for method in methods:
        label = method_class(method).label
        best = best_reading(label, args.best)
        scores = {s: _scores(method, s, seeds, args.runs) for s in ("last", best)}
        if any(v is None for v in scores.values()):
            missing.append(method)
            continue
        row = {"method": label, "best_reading": best,
               "training_free": {s: {"pointing": 100 * v, "n_test": n}
                                 for s, (v, n) in training_free(label).items()
                                 if s in ("last", best)}, "per_seed": scores}
        for metric in METRICS:
            last, other = (seed_interval(scores[s][metric]) for s in ("last", best))
            gain = seed_interval([b - a for a, b in zip(scores["last"][metric],
                                                         scores[best][metric], strict=True)])
            row[metric] = {"last": vars(last), best: vars(other), "gain": vars(gain),
                           "verdict": judge(gain)}
        rows.append(row)
    config = {"seeds": seeds, "n_test": args.n_test, "n_train": args.default_n_train,
              "n_train_per_method": args.n_train, "recipes": {m: recipes()[m] for m in methods},
              "not_finished": missing}
    Path(f"{args.out}.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1))
    lines = ["**Pointing game (%) of heads trained per reading, tiny CLIP, world test draws; "
             f"mean [95 % interval] over seeds {','.join(map(str, seeds))}, {args.n_test} "
             "images a seed** (`pointing`: the peak in a gold box; `pointing_tol`: within "
             "15 px; gain: best reading - `last`, paired by seed, and whether the best "
             "reading beats `last` by its interval; training-free: the per-source runs' "
             "`pointing`, images a seed in brackets)", "",
             "| method | best reading | training-free `last` / best | trained `last` | "
             "trained best | gain | best > `last`? | trained `last` (tol) | "
             "trained best (tol) | gain (tol) | best > `last`? (tol) |",
             "|---|---|---:|" + "---:|" * 8]
    for row in rows:
        best, free = row["best_reading"], row["training_free"]
        cells = [f"{row['method']}", f"`{best}`",
                 " / ".join(f"{free[s]['pointing']:.1f} ({free[s]['n_test']})"
                            for s in ("last", best))]
        for metric in METRICS:
            figures = row[metric]
            cells += [_cell(Interval(**figures["last"])), _cell(Interval(**figures[best])),
                      _cell(Interval(**figures["gain"]), signed=True), figures["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    if missing:
        lines += ["", f"Not finished (no row): {', '.join(missing)}."]
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="qc_align,dense_uot,conceptot,powerclip,filip,"
                        "text_attn,balanced_ot")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--n-test", type=int, default=1000)
    parser.add_argument("--default-n-train", type=int, default=4000)
    parser.add_argument("--n-train", default="", help="per-method training pairs, "
                        "e.g. powerclip=1000 (else --default-n-train)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs", type=Path, default=Path("runs/heads-reading"))
    parser.add_argument("--out", default="benchmarks/heads_per_reading")
    parser.add_argument("--collect", action="store_true", help="only gather finished runs")
    parser.add_argument("--best", default="", help="per-method best reading instead of the "
                        "per-source runs' choice, e.g. conceptot=layer:2 (the committed table: "
                        "its choices were made on the 100-image runs)")
    args = parser.parse_args()
    args.n_train = {k: int(v) for k, v in (p.split("=") for p in args.n_train.split(",") if p)}
    args.best = {method_class(k).label: v
                 for k, v in (p.split("=", 1) for p in args.best.split(",") if p)}
    methods, seeds = args.methods.split(","), [int(s) for s in args.seeds.split(",")]
    if not args.collect:
        flags = recipes()
        plan = [(m, s, seed, flags[m]) for m in methods for seed in seeds
                for s in ("last", best_reading(method_class(m).label, args.best))]
        with ThreadPoolExecutor(args.jobs) as pool:
            for future in [pool.submit(_job, *job, args) for job in plan]:
                future.result()
    collect(methods, seeds, args)


if __name__ == "__main__":
    main()
