"""Cost of a phrase heatmap: each explainer (ms per phrase: its own forward and backward
passes) next to each alignment method (ms per pair: the solve on cached backbone features,
plus the backbone's encoding of the pair; one solve gives the heatmap of every phrase of
the caption, so its ms per phrase divides by the phrases per caption). Two regimes: one
pair at a time (an Align click) and batched (the evaluation). Embedded backbone, shipped
heads, world test images, the machine's current load (see the report).

Usage: ``python benchmarks/explainer_cost.py [--n-images 64] [--threads 1] [--out FILE]``;
writes JSON (default ``benchmarks/explainer_cost.json``) and Markdown beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import load_average, machine  # noqa: E402

from otviz.eval.alignment_tables import ms_per_pair, phrase_queries  # noqa: E402
from otviz.eval.runner import EvalConfig, build_suite, load_backbone  # noqa: E402
from otviz.eval.world_set import EvalSet  # noqa: E402
from otviz.explainers import EXPLAINERS, explain_pairs  # noqa: E402
from otviz.suite import ALIGN_METHODS, METHOD_LABELS  # noqa: E402

REPEATS = 5


def _median_ms(fn, repeats: int = REPEATS) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(n_images: int, heads: str, cache_dir: str) -> dict:
    backbone = load_backbone()
    suite = build_suite(backbone, heads, ALIGN_METHODS)
    data = EvalSet.build(backbone, n_images, "test", 0, cache_dir)
    q = phrase_queries(data)
    images = [data.samples[int(j)].image for j in q.image]
    n_phrases = len(q.texts)
    per_caption = n_phrases / data.n_images
    captions = [s.caption for s in data.samples]
    pictures = [s.image for s in data.samples]
    encode_one = _median_ms(lambda: backbone.encode(pictures[:1], captions[:1]))
    encode_batched = _median_ms(lambda: backbone.encode(pictures, captions), 3) / data.n_images
    rows = []
    for name, cls in EXPLAINERS.items():
        one = _median_ms(lambda name=name: explain_pairs(backbone, name, images[:1],
                                                         q.texts[:1]))
        batched = _median_ms(lambda name=name: explain_pairs(backbone, name, images, q.texts),
                             3) / n_phrases
        rows.append({"name": name, "label": cls.label, "kind": "explainer",
                     "ms_per_phrase_one": one, "ms_per_phrase_batched": batched})
    for name, entry in suite.methods.items():
        solve_one = ms_per_pair(entry, data, n_pairs=1, repeats=REPEATS)
        solve_batched = ms_per_pair(entry, data, n_pairs=data.n_images, repeats=3)
        rows.append({"name": name, "label": METHOD_LABELS[name], "kind": "method",
                     "solve_ms_per_pair_one": solve_one,
                     "solve_ms_per_pair_batched": solve_batched,
                     "ms_per_phrase_one": (solve_one + encode_one) / per_caption,
                     "ms_per_phrase_batched": (solve_batched + encode_batched) / per_caption})
    return {"n_images": data.n_images, "n_phrases": n_phrases,
            "phrases_per_caption": per_caption, "encode_ms_per_pair_one": encode_one,
            "encode_ms_per_pair_batched": encode_batched, "rows": rows}


def write_report(result: dict, out: Path) -> None:
    out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Cost of a phrase heatmap: explainers and alignment methods", "",
        f"Embedded backbone, shipped heads, {result['n_images']} world test images "
        f"({result['n_phrases']} gold phrases, {result['phrases_per_caption']:.2f} per "
        f"caption), {result['machine']['torch_threads']} torch thread(s), median of "
        f"{REPEATS} runs (batched: 3). Load average {result['load_before']} before, "
        f"{result['load_after']} after, on a shared {result['machine']['cpus']}-CPU machine; "
        f"{result['machine']['platform']}.", "",
        "An explainer pays its own forward (and backward) pass per phrase. A method solves "
        "once per (image, caption) pair on the backbone's features and reads every phrase "
        "of the caption from that plan: its ms per phrase is (solve + the backbone's "
        f"encoding of the pair: {result['encode_ms_per_pair_one']:.1f} ms alone, "
        f"{result['encode_ms_per_pair_batched']:.2f} ms batched) / phrases per caption.", "",
        "| kind | name | ms / phrase, one at a time | ms / phrase, batched | "
        "solve ms / pair, one | solve ms / pair, batched |",
        "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        solve = ("", "") if r["kind"] == "explainer" else (
            f"{r['solve_ms_per_pair_one']:.2f}", f"{r['solve_ms_per_pair_batched']:.3f}")
        lines.append(f"| {r['kind']} | {r['label']} | {r['ms_per_phrase_one']:.2f} | "
                     f"{r['ms_per_phrase_batched']:.3f} | {solve[0]} | {solve[1]} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-images", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--heads", default=EvalConfig.heads)  # the shipped heads
    parser.add_argument("--cache-dir", default=".cache/otviz-features")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "explainer_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = load_average()
    result = measure(args.n_images, args.heads, args.cache_dir)
    result.update({"load_before": before, "load_after": load_average(), "machine": machine(),
                   "command": "python " + " ".join([os.path.relpath(__file__), *(argv or
                                                                               sys.argv[1:])])})
    write_report(result, args.out)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
