"""Images per second of ``otviz eval --dataset``
(:func:`~otviz.eval.dataset_eval.run_dataset_eval`) on a world test draw exported as
Flickr30k Entities (JPEG, the published layout): end to end (model load and fit included)
on ``n`` and ``2n`` images with an empty feature cache; the marginal rate of the extra
``n`` images (reading, resizing, encoding, scoring: what a large set runs at); and warm on
``2n`` (features cached: scoring alone). Two backbones: the embedded tiny CLIP with its
shipped heads (80 px, 10x10 patches) and ViT-B/16 at 224 px with random weights (no
network here; the speed of an architecture does not depend on its weight values, its
grounding figures do: they are meaningless and not reported), training-free.

Usage: ``python benchmarks/dataset_eval_speed.py [--tiny 96] [--vit 16] [--threads 1]
[--device cpu] [--out benchmarks/dataset_eval_speed.json]``; writes JSON and Markdown
beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import load_average, machine  # noqa: E402

from otviz.data.grounding_sets.export import export_flickr30k, world_draw  # noqa: E402
from otviz.eval.config import TRAINING_FREE, EvalConfig  # noqa: E402
from otviz.eval.dataset_eval import run_dataset_eval  # noqa: E402


def timed(config: EvalConfig) -> tuple[float, int]:
    start = time.perf_counter()
    (table, *_), _ = run_dataset_eval(config)
    return time.perf_counter() - start, int(table.rows[0].get("n", 0))


def measure(label: str, n: int, base: EvalConfig, work: Path) -> dict:
    root = export_flickr30k(world_draw(2 * n, "test", 0), work / f"flickr-{label}")
    config = replace(base, dataset=f"flickr30k:{root}", cache_dir=str(work / f"cache-{label}"))
    half, _ = timed(replace(config, limit=n, out=str(work / f"half-{label}")))
    cold, phrases = timed(replace(config, out=str(work / f"cold-{label}"),
                                  cache_dir=str(work / f"cache2-{label}")))
    warm, _ = timed(replace(config, out=str(work / f"warm-{label}"),
                            cache_dir=str(work / f"cache2-{label}")))
    return {"backbone": label, "images": 2 * n, "phrases": phrases, "cold_n_s": half,
            "cold_2n_s": cold, "warm_2n_s": warm, "end_to_end_images_per_s": 2 * n / cold,
            "marginal_images_per_s": n / max(cold - half, 1e-9),
            "warm_images_per_s": 2 * n / warm}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", type=int, default=96, help="images for the tiny CLIP (0: skip)")
    p.add_argument("--vit", type=int, default=16, help="images for ViT-B/16 (0: skip)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(Path(__file__).with_name("dataset_eval_speed.json")))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    methods = "filip,text_attn,balanced_ot,dense_uot,conceptot,qc_align,powerclip"
    base = EvalConfig(methods=methods, threads=args.threads, device=args.device, shard=256)
    load_before = load_average()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.tiny:
            rows.append(measure("otviz-tiny (shipped heads)", args.tiny, base, work))
        if args.vit:
            vit = replace(base, model="ViT-B-16", pretrained="", heads=TRAINING_FREE)
            rows.append(measure("ViT-B-16 (random weights, training-free)", args.vit, vit,
                                work))
    device = args.device if args.device != "cuda" else torch.cuda.get_device_name()
    result = {"rows": rows, "machine": machine(), "device": device,
              "load_before": load_before, "load_after": load_average(),
              "command": " ".join(["python", *sys.argv])}
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# `otviz eval --dataset`: images per second", "",
             f"`{result['command']}` on {device}; {result['machine']['platform']}; "
             f"{args.threads} torch thread(s); load average {load_before} before, "
             f"{result['load_after']} after (a shared machine).", "",
             "| Backbone | Images (2n) | Phrases | End to end, images/s | Marginal images/s | "
             "Warm images/s |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['backbone']} | {r['images']} | {r['phrases']} | "
              f"{r['end_to_end_images_per_s']:.2f} | {r['marginal_images_per_s']:.2f} | "
              f"{r['warm_images_per_s']:.2f} |" for r in rows]
    lines += ["", "End to end: one command on 2n images, empty feature cache (model load, "
              "training-free fit, read, resize, encode, score every method and baseline). "
              "Marginal: the extra n images of that run over a run on n (what a large set "
              "runs at). Warm: 2n images, features cached, shards recomputed (scoring "
              f"alone, model load included). Methods: {methods}; no explainer."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
