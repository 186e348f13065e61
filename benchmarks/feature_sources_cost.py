"""What each feature source and a larger input cost on a real-size model: the encode of one
image and caption (what an Align click computes before the methods run) on a random-weight
open_clip ViT-B/16 (the compute of the real one), per source at 224 px and at 448 px, CPU;
the ``proxy`` source (ProxyCLIP) with random-weight timm DINO ViT-S/16, DINOv2 ViT-S/14 and
DINO ViT-B/8 (the authors' default second backbone) beside CLIP.

    nice -n 10 python benchmarks/feature_sources_cost.py --threads 1 --repeats 3 \
        --out benchmarks/feature_sources_cost

Each configuration runs in a fresh process (spawned one after another), so its peak
resident memory (``ru_maxrss``) is its own: ``loaded`` after building the models, ``peak``
after the warm-up and the timed encodes (``peak - loaded`` is what encoding adds). Writes
``OUT.json`` and ``OUT.md``: median wall time over ``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import time
from pathlib import Path

SOURCES = ("last", "layer:6", "maskclip", "sclip", "clearclip", "naclip", "resclip-rcs",
           "scclip")
PROXIES = ("vit_small_patch16_224.dino", "vit_small_patch14_dinov2", "vit_base_patch8_224.dino")
CONFIGS = [(s, None, size) for size in (224, 448) for s in SOURCES]
CONFIGS += [("proxy", p, size) for size in (224, 448) for p in PROXIES]
CAPTION = "a red cube left of a blue ball"


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def measure(source: str, proxy: str | None, size: int, threads: int, repeats: int) -> dict:
    """One configuration's row, measured in this (fresh) process."""
    import numpy as np
    import torch
    from PIL import Image

    from otviz.backbone_spec import BackboneSpec

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    backbone = BackboneSpec(model="ViT-B-16").load()
    view = backbone.with_features(source, size, proxy=f"{proxy}:random" if proxy else None)
    loaded = _rss_mb()
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 400, 3), np.uint8))
    view.encode([image], [CAPTION])  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        view.encode([image], [CAPTION])
        times.append(1000 * (time.perf_counter() - start))
    return {"features": source, "proxy": proxy or "", "image_size": view.image_size,
            "grid": list(view.grid), "ms": round(statistics.median(times), 1),
            "loaded_rss_mb": loaded, "peak_rss_mb": _rss_mb()}


def table(rows: list[dict], threads: int, repeats: int) -> list[str]:
    base = rows[0]["ms"]
    lines = [f"**Encode of one image and caption, random ViT-B/16, CPU, {threads} thread(s), "
             f"median of {repeats}; each row a fresh process**", "",
             "| features | proxy | input | grid | ms | x last@224 | RSS loaded (MB) | "
             "peak RSS (MB) | encode adds (MB) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['features']} | {r['proxy'] or '-'} | {r['image_size']} | "
              f"{r['grid'][0]} x {r['grid'][1]} | {r['ms']} | {r['ms'] / base:.2f} | "
              f"{r['loaded_rss_mb']} | {r['peak_rss_mb']} | "
              f"{r['peak_rss_mb'] - r['loaded_rss_mb']:.1f} |" for r in rows]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/feature_sources_cost")
    args = parser.parse_args()
    rows = []
    context = multiprocessing.get_context("spawn")
    for source, proxy, size in CONFIGS:
        with context.Pool(1) as pool:
            rows.append(pool.apply(measure, (source, proxy, size, args.threads, args.repeats)))
        print(rows[-1], flush=True)
    lines = table(rows, args.threads, args.repeats)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(
        {"threads": args.threads, "repeats": args.repeats, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
