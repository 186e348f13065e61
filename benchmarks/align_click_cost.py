"""What an Align click costs per feature source and input size (issue 41, item 5), on a
real-size model with random weights (open_clip ViT-B-16: the same compute as real ones),
old tree against new in one run.

A click is the app's Align callback without the browser (``align_view``: encode a new
upload, every method plus Global-only, every figure), on a picker value that asks for the
source and size (``"... · features sclip · 448 px"``, :mod:`otviz.ui.reading`). Each
configuration runs in a subprocess of its own (a fresh interpreter on the tree under test:
``PYTHONPATH``), which loads the model, clicks once to warm up (suite, caches) and then
``--clicks`` times on uploads no earlier click saw (one pixel changed). Its peak memory is
the process's peak resident set (``getrusage``'s ``ru_maxrss``) and the rise of that peak
over the resident set before the first click (torch allocates outside ``tracemalloc``'s
view). The old tree (``--old``, e.g. ``git worktree add /tmp/old 801c3ef``) has only the
default reading, run alternately with the new tree's default ``--rounds`` times; the other
readings (:data:`READINGS`) run on the new tree, once each; the JSON and table are
rewritten after every process, so a run cut short keeps what it measured.

Usage: ``python benchmarks/align_click_cost.py --old /tmp/old [--model ViT-B-16]
[--clicks 5] [--rounds 3] [--out benchmarks/align_click_cost.json]``; writes the JSON and
a Markdown table beside it (medians with bootstrap 95 % intervals over the clicks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: The readings timed on the new tree, in this order (what matters most first, so that a
#: run cut short still says it): the default at 448 px (14 x 14 -> 28 x 28 tokens), every
#: other source (``layer:6``: block 6 of 12) at the native 224 px, then two at 448 px.
READINGS = (("last", 448), ("layer:6", 224), ("maskclip", 224), ("sclip", 224),
            ("clearclip", 224), ("naclip", 224), ("sclip", 448), ("layer:6", 448))
SEED = 0


# --------------------------------------------------------------------- child process
def click_cost(model: str, features: str, size: int, clicks: int) -> dict:
    """In the tree on ``PYTHONPATH``: seconds per Align click and memory (MiB) for one
    reading of a random ``model`` (seeded)."""
    import psutil
    import torch
    from PIL import Image

    from otviz.backbone_spec import BackboneSpec
    from otviz.ui.align import align_view
    from otviz.ui.context import COMMON_CONCEPTS, AppContext, BackboneChoice
    from otviz.ui.examples import load_examples

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    ctx = AppContext([BackboneChoice(model, lambda: BackboneSpec(model=model).load(),
                                     COMMON_CONCEPTS, model)])
    value = ctx.checkpoint_choices()[0]
    if features != "last":
        value += f" · features {features}"
    if size != 224:
        value += f" · {size} px"
    example = load_examples()[0]
    image = np.asarray(Image.open(example.image_path).convert("RGB").resize((224, 224)))
    explainer, suite = ctx.explainer(value), ctx.suite(value)
    rss_loaded = psutil.Process().memory_info().rss
    seconds = []
    for k in range(clicks + 1):
        upload = image.copy()
        upload[0, 0, 0] = (int(upload[0, 0, 0]) + 1 + k) % 256  # never seen: encodes afresh
        start = time.perf_counter()
        align_view(explainer, suite, upload, example.caption)
        seconds.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"seconds": seconds[1:], "warm_up_s": seconds[0],
            "grid": list(explainer.backbone.grid),
            "peak_rss_mib": peak / 2**20, "peak_over_loaded_mib": (peak - rss_loaded) / 2**20}


# --------------------------------------------------------------------- driver
def run_child(tree: Path, model: str, features: str, size: int, clicks: int) -> dict:
    """:func:`click_cost` in a fresh interpreter on ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", model, features, str(size), str(clicks)],
        env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_interval(samples: list[float], seed: int = SEED) -> tuple[float, float, float]:
    """Median and its bootstrap 95 % interval (2,000 resamples, seeded)."""
    x = np.asarray(samples)
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(x, size=(2000, len(x))), axis=1)
    return float(np.median(x)), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def measure(old: Path, model: str, clicks: int, rounds: int,
            done: Callable[[list[dict]], None], readings: bool = True) -> list[dict]:
    """Every configuration's runs: old and new default alternated ``rounds`` times, then
    each of :data:`READINGS` on the new tree once (unless ``readings`` is false);
    ``done`` gets the runs so far after each."""
    plan = [(tree, name, "last", 224, r) for r in range(rounds)
            for tree, name in ((old, "old"), (ROOT, "new"))]
    plan += [(ROOT, "new", features, size, 0) for features, size in READINGS if readings]
    runs: list[dict] = []
    for tree, name, features, size, r in plan:
        runs.append({"tree": name, "features": features, "size": size, "round": r,
                     **run_child(tree, model, features, size, clicks)})
        print(f"{name} {features} {size} round {r}: {np.median(runs[-1]['seconds']):.3f} s",
              file=sys.stderr)
        done(runs)
    return runs


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (tree, source, size): median click (ms) with its interval over all its
    clicks, and the largest peak memory of its processes."""
    rows = []
    keys = list(dict.fromkeys((r["tree"], r["features"], r["size"]) for r in runs))
    for tree, features, size in keys:
        mine = [r for r in runs if (r["tree"], r["features"], r["size"]) == (tree, features, size)]
        seconds = [s for r in mine for s in r["seconds"]]
        med, lo, hi = median_interval(seconds)
        rows.append({"tree": tree, "features": features, "size": size, "grid": mine[0]["grid"],
                     "clicks": len(seconds), "median_ms": 1000 * med, "low_ms": 1000 * lo,
                     "high_ms": 1000 * hi,
                     "peak_rss_mib": max(r["peak_rss_mib"] for r in mine),
                     "peak_over_loaded_mib": max(r["peak_over_loaded_mib"] for r in mine)})
    return rows


def markdown(result: dict) -> str:
    rows = result["rows"]
    base = next((r for r in rows if r["tree"] == "new" and r["features"] == "last"
                 and r["size"] == 224), rows[0])
    lines = [
        "# Align click cost per feature source and input size",
        "",
        f"open_clip {result['model']} with random weights (seed {SEED}; the compute of the "
        f"real one), the app's Align callback (`align_view`: encode a new 224-px upload, "
        f"every method and Global-only, every figure) on the first world example; "
        f"{result['clicks']} clicks per process after one warm-up click, 1 torch thread, "
        f"a fresh process per configuration; old tree (main at 801c3ef) and new alternated "
        f"{result['rounds']} times on the default. Medians with bootstrap 95 % intervals "
        f"over the clicks. {result['machine']}; load average {result['load_before']} "
        f"before, {result['load_after']} after (1/5/15 min: the machine is shared).",
        "",
        "| tree | features | input | tokens | click median (ms) | 95 % interval | "
        "x new default | peak RSS (MiB) | peak over loaded (MiB) |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['tree']} | {r['features']} | {r['size']} px | {r['grid'][0]} x {r['grid'][1]} "
            f"| {r['median_ms']:.0f} | {r['low_ms']:.0f}-{r['high_ms']:.0f} | "
            f"{r['median_ms'] / base['median_ms']:.2f} | {r['peak_rss_mib']:.0f} | "
            f"{r['peak_over_loaded_mib']:.0f} |")
    lines += ["", "*peak RSS*: the process's peak resident set (`ru_maxrss`); *peak over "
              "loaded*: its rise over the resident set once the model and suite were loaded, "
              "i.e. what the clicks themselves added at their peak.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        model, features, size, clicks = argv[1:5]
        print(json.dumps(click_cost(model, features, int(size), int(clicks))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the old tree (a worktree)")
    parser.add_argument("--model", default="ViT-B-16")
    parser.add_argument("--clicks", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--default-only", action="store_true",
                        help="only the old and new default, alternated")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/align_click_cost.json")
    args = parser.parse_args(argv)
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())

    def write(runs: list[dict]) -> str:
        result = {"model": args.model, "clicks": args.clicks, "rounds": args.rounds,
                  "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, Python "
                             f"{platform.python_version()}",
                  "load_before": load_before,
                  "load_after": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
                  "rows": summarise(runs), "runs": runs}
        args.out.write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
        return markdown(result)

    print(write(measure(args.old, args.model, args.clicks, args.rounds, write,
                        not args.default_only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
