"""Latency of the Align view's Trust panel on the embedded backbone, and of the Align click
without it.

``panel``: for the first world example and its first gold phrase, with the panel's
``SETTINGS``, (1) each metric's cost per map (``trust_scores(...).ms`` of every map of the
panel, all metrics), and (2) the panel's generator as the page sees it, from the click to the
first yield whose table has every map's fast metrics and to the final yield (every metric),
each with a fresh cache; median of ``--runs`` runs.

``align --label before|after``: the Align view's callback (``align_view``: encode, every
method, every figure) on a 224-px upload no earlier click saw, median of ``--runs``; run it
with ``PYTHONPATH`` at the tree to time (``/work/main`` for *before*).

Usage: ``python benchmarks/trust_panel_latency.py panel [--runs 3] [--explainers]`` and
``python benchmarks/trust_panel_latency.py align --label after [--runs 5]`` (a round: run it
again for another); each merges its figures into ``benchmarks/trust_panel_latency.json`` and
rewrites the Markdown report next to it (``.md``), with the load average (1/5/15 min) before
and after each measurement. ``--under TEXT`` names the condition of a panel measurement (e.g.
a background load, or ``before round 2: main``) and keeps it apart from the plain one (by
its words before a colon). For a before/after comparison run the panel alternately with
``PYTHONPATH`` at each tree (``OTVIZ_COMMIT`` names a tree outside git); on shared cores
compare the CPU time, which other processes' load sways far less than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

OUT = Path(__file__).resolve().parent / "trust_panel_latency.json"
UPLOAD_PX = 224
BAR_S = 10.0


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _tree() -> dict:
    """Which otviz is timed: its path and the commit (with a '+' when its tree is dirty), or
    ``$OTVIZ_COMMIT`` for a tree outside git (an export of a commit, say)."""
    import otviz

    root = Path(otviz.__file__).resolve().parent.parent
    if os.environ.get("OTVIZ_COMMIT"):
        return {"otviz": str(root), "commit": os.environ["OTVIZ_COMMIT"]}
    git = ["git", "-C", str(root)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "otviz"], capture_output=True,
                           text=True).stdout.strip()
    return {"otviz": str(root), "commit": commit + ("+" if dirty else "")}


def _context():
    """The app's default context, its first backbone's explainer and suite, and the first
    world example (image, caption)."""
    from otviz.ui.context import AppContext
    from otviz.ui.examples import load_examples

    ctx = AppContext.default()
    checkpoint = ctx.checkpoint_choices()[0]
    example = load_examples()[0]
    rgb = np.asarray(Image.open(example.image_path).convert("RGB"))
    return ctx.explainer(checkpoint), ctx.suite(checkpoint), rgb, example.caption


def metric_costs(explainer, suite, encoded, words, with_explainers: bool, runs: int) -> dict:
    """Median ms per map of each metric (and of the map itself) over ``runs``, by map."""
    from otviz.eval.trust.metrics import trust_scores
    from otviz.ui.trust_panel import SETTINGS, panel_phrases, panel_row, panel_sources

    phrases, target = panel_phrases(encoded, words)
    row = panel_row(explainer, encoded, phrases, target, SETTINGS)
    sources, _ = panel_sources(explainer, suite, with_explainers)
    samples: dict[str, dict[str, list[float]]] = {s.label: {} for s in sources}
    for _ in range(runs):
        for source in sources:
            scores = trust_scores(row.scorer, source, row.pixels, row.targets, row.masks,
                                  SETTINGS)
            for key, ms in scores.ms.items():
                samples[source.label].setdefault(key, []).append(ms)
            if scores.refused:
                samples[source.label]["refused"] = sorted(scores.refused)
    return {label: {k: (v if k == "refused" else float(np.median(v))) for k, v in by.items()}
            for label, by in samples.items()}


def panel_times(explainer, suite, encoded, words, with_explainers: bool, runs: int) -> dict:
    """Seconds from the click to the first table with every map's fast metrics and to the
    complete table, and the process's CPU seconds to the complete table (what a request
    costs the server, less swayed by other processes' load than the wall time), each run
    with a fresh cache; their median and the runs."""
    from otviz.ui.trust_panel import TrustCache, panel_sources, trust_rows

    n = len(panel_sources(explainer, suite, with_explainers)[0])
    fast, full, cpu = [], [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        first = None
        for rows, _note in trust_rows(explainer, suite, encoded, words, with_explainers,
                                      TrustCache()):
            if first is None and len(rows) == n:
                first = time.perf_counter() - start
        fast.append(first)
        full.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"maps": n, "fast_table_s": float(np.median(fast)),
            "complete_table_s": float(np.median(full)), "fast_runs_s": fast,
            "complete_runs_s": full, "complete_cpu_s": float(np.median(cpu)),
            "complete_cpu_runs_s": cpu}


def panel(runs: int, with_explainers: bool) -> dict:
    """The ``panel`` measurement (module docstring)."""
    from otviz.eval.trust.metrics import METRICS
    from otviz.ui.trust_panel import SETTINGS, example_gold

    explainer, suite, rgb, caption = _context()
    encoded = explainer.encode(rgb, caption)
    gold = example_gold()[(encoded.key[0], encoded.caption)]  # warm: read once per process
    words = list(gold[0].words)
    load_before = _load()
    costs = metric_costs(explainer, suite, encoded, words, with_explainers, runs)
    times = panel_times(explainer, suite, encoded, words, with_explainers, runs)
    return {"phrase": gold[0].text, "caption": caption, "explainers": with_explainers,
            "settings": SETTINGS.to_dict(), "runs": runs,
            "slow": [m.key for m in METRICS if m.slow], "costs_ms": costs, **times,
            "load_before": load_before, "load_after": _load(), **_tree()}


def align(runs: int) -> dict:
    """The ``align`` measurement (module docstring)."""
    from otviz.ui.align import align_view

    explainer, suite, rgb, caption = _context()
    image = np.asarray(Image.fromarray(rgb).resize((UPLOAD_PX, UPLOAD_PX)))

    def upload(k: int) -> np.ndarray:
        fresh = image.copy()
        fresh[0, 0, 0] = (int(fresh[0, 0, 0]) + 1 + k) % 256
        return fresh

    align_view(explainer, suite, upload(-1), caption)  # warm-up: first solve
    load_before = _load()
    samples = []
    for k in range(runs):
        start = time.perf_counter()
        align_view(explainer, suite, upload(k), caption)
        samples.append(1000 * (time.perf_counter() - start))
    return {"median_ms": float(np.median(samples)), "runs_ms": samples,
            "load_before": load_before, "load_after": _load(), **_tree()}


def markdown(result: dict) -> str:
    """The report: per-metric cost per map, the panel's times, the Align click."""
    lines = ["# Trust panel latency", "",
             f"Embedded tiny CLIP, {os.cpu_count()} CPUs (shared with another engineer's test "
             f"runs: timings are noisy), torch {torch.__version__}, "
             f"{torch.get_num_threads()} torch threads. Written by "
             "`benchmarks/trust_panel_latency.py`.", ""]
    for name in sorted(k for k in result if k.startswith("panel")):
        lines += _panel_markdown(result[name])
    if "align" in result:
        lines += ["## The Align click (no panel)", "",
                  "`align_view` on a 224-px upload no earlier click saw (encode, every method, "
                  "every figure), median of 5 clicks per round, the rounds of *before* and "
                  "*after* alternating; the panel adds nothing to it (computed on its own "
                  "button).", "",
                  "| tree | commit | median (ms) | runs (ms) | load before / after |",
                  "| --- | --- | ---: | --- | --- |"]
        for label, rounds in sorted(result["align"].items()):
            for a in rounds:
                runs = ", ".join(f"{x:.0f}" for x in a["runs_ms"])
                lines.append(f"| {label} ({a['otviz']}) | {a['commit']} | "
                             f"{a['median_ms']:.0f} | {runs} | {a['load_before']} / "
                             f"{a['load_after']} |")
            pooled = np.median([x for a in rounds for x in a["runs_ms"]])
            lines.append(f"| **{label}, all rounds** | | **{pooled:.0f}** | | |")
        lines.append("")
    if result.get("notes"):  # observations outside the script, written into the JSON by hand
        lines += ["## Notes", "", *[f"- {note}" for note in result["notes"]], ""]
    return "\n".join(lines)


def _panel_markdown(p: dict) -> list[str]:
    from otviz.eval.trust.metrics import METRICS

    maps = list(p["costs_ms"])
    keys = ["maps"] + [m.key for m in METRICS]
    label = {m.key: m.label + (" (slow)" if m.key in p["slow"] else "") for m in METRICS}
    label["maps"] = "the map itself"
    lines = [f"## The panel{' with explainers' if p['explainers'] else ''}"
             f"{', ' + p['under'] if p.get('under') else ''}", "",
             f"First world example, phrase “{p['phrase']}” (gold box: localisation included), "
             f"{p['maps']} maps, the panel's settings {p['settings']}; median of {p['runs']} "
             f"runs; load average {p['load_before']} before and {p['load_after']} after; "
             f"otviz at {p['commit']}.", "",
             f"- **time to the table of fast metrics for every map: {p['fast_table_s']:.1f} s** "
             f"(runs: {', '.join(f'{x:.1f}' for x in p['fast_runs_s'])}; bar {BAR_S:.0f} s)",
             f"- **time to the complete table: {p['complete_table_s']:.1f} s** (runs: "
             f"{', '.join(f'{x:.1f}' for x in p['complete_runs_s'])})",
             *([f"- **CPU time of the complete table: {p['complete_cpu_s']:.1f} s** (runs: "
                f"{', '.join(f'{x:.1f}' for x in p['complete_cpu_runs_s'])})"]
               if "complete_cpu_s" in p else []), "",
             "ms per map of each metric (median of the runs; blank: the map is flat and "
             "Quantus refuses it, nothing computed):", "",
             "| metric | " + " | ".join(maps) + " | median | sum over maps |",
             "| --- |" + " ---: |" * (len(maps) + 2)]
    for key in keys:
        cells = [p["costs_ms"][m].get(key) for m in maps]
        got = [c for c in cells if c is not None]
        lines.append(f"| {label[key]} | " + " | ".join("" if c is None else f"{c:.0f}"
                                                    for c in cells)
                     + f" | {np.median(got):.0f} | {sum(got):.0f} |" if got else
                     f"| {label[key]} |" + " |" * (len(maps) + 2))
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("panel", "align"))
    parser.add_argument("--runs", type=int, default=None, help="3 (panel) or 5 (align)")
    parser.add_argument("--explainers", action="store_true", help="the panel's explainers too")
    parser.add_argument("--label", default="after", help="the align figure's name")
    parser.add_argument("--under", default="", help="the panel figure's condition (its name)")
    args = parser.parse_args(argv)
    result = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.what == "panel":
        name = "_".join(["panel"] + ["explainers"] * args.explainers
                        + args.under.split(":")[0].split()[:3])
        result[name] = {**panel(args.runs or 3, args.explainers), "under": args.under}
    else:
        result.setdefault("align", {}).setdefault(args.label, []).append(align(args.runs or 5))
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    OUT.with_suffix(".md").write_text(markdown(result))
    print(OUT.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
